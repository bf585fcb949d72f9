/* Data-parallel training on CUDA through NCCL (docs/distributed.md): one rank through NCCL
 * steps bit for bit as the plain session; two ranks (two threads, devices 0 and 1) of batch
 * B train as one rank of batch 2B to fp32 reduction order, for SGD and AdamW, with and
 * without ZeRO-1, clipping and accumulation, in fp32, bf16 and f16; f16 ranks skip together
 * every step that overflows on either, as the CPU backend's ranks do, also with steps in
 * flight; a group checkpoint of two ranks resumes on one; a rank that never steps makes the
 * other fail within the timeout; a graph that differs between ranks is refused by both. The two-rank cases skip with fewer
 * than two devices or without NCCL, saying so. Measured errors are printed ("DP ..." on
 * stderr). */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "host/nccl.h"
#include "tests/support/cuda_check.h"
#include "tests/support/mn_test.h"
#include "tests/support/session_util.h"
#include "tests/support/tmp_dir.h"
#ifdef MN_WITH_CUDA
#include "cuda/cuda_backend.h"
#endif

enum { TOTAL = 8, MAX_ROUNDS = 8 };

typedef enum optim { SGD, ADAMW } optim;

/* One run's settings, shared by every rank and by the reference. */
typedef struct setup {
  int64_t in, hid, out;
  int ranks, accum, rounds, first_round;
  optim opt;
  bool zero1, clip, apart;
  /* Compare norm-wise: AdamW moves a weight whose gradient is near zero by about lr whatever
   * its sign, so on millions of weights a few of those move apart by a rounding's flip. */
  bool normwise;
  mn_precision precision;
  int blowup_round; /* > 0: rank 1's inputs of that round's first step overflow f16 */
  const char *load, *save;
} setup;

static const char *const names[] = {"w1", "b1", "w2", "b2"};

static void sizes_of(const setup *u, int64_t hid, size_t *n) {
  n[0] = (size_t)(u->in * hid);
  n[1] = (size_t)hid;
  n[2] = (size_t)(hid * u->out);
  n[3] = (size_t)u->out;
}

static size_t num_params(const setup *u) {
  size_t n[4];
  sizes_of(u, u->hid, n);
  return n[0] + n[1] + n[2] + n[3];
}

/* tanh(x w1 + b1) w2 + b2 against t, mean squared error over `batch` rows. */
static mn_graph *mlp(const setup *u, int64_t batch, int64_t hid) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(batch, u->in));
  mn_node t = mn_input(g, "t", MN_SHAPE(batch, u->out));
  mn_node w1 = mn_parameter(g, "w1", MN_SHAPE(u->in, hid)),
          b1 = mn_parameter(g, "b1", MN_SHAPE(hid));
  mn_node w2 = mn_parameter(g, "w2", MN_SHAPE(hid, u->out));
  mn_node b2 = mn_parameter(g, "b2", MN_SHAPE(u->out));
  mn_node h = mn_tanh(g, mn_bias_add(g, mn_matmul(g, x, w1), b1));
  mn_node y = mn_bias_add(g, mn_matmul(g, h, w2), b2);
  mn_set_outputs(g, (mn_node[]){mn_mse_loss(g, y, t)}, 1);
  return g;
}

/* One rank's (or the reference's) run; threads report instead of asserting. */
typedef struct run {
  const setup *u;
  const mn_group_id *id; /* NULL: a plain session */
  mn_group *cpu_group;   /* set: a CPU rank of this in-process group (the CUDA ranks' oracle) */
  int rank, world, device;
  int rows, accum; /* rows per step, steps per update */
  int64_t hid;
  bool never_steps; /* builds, then waits for `released` without stepping */
  bool in_flight;   /* steps without waiting, reading nothing until the last */
  double timeout_s;
  mn_status status;
  char error[600];
  double seconds;      /* the last step's duration (step and wait) */
  double step_seconds; /* every step's */
  float *params;
  float loss[MAX_ROUNDS];
  float loss_scale; /* f16: the scaler after the run */
  uint64_t skipped; /* f16: the steps it skipped */
  pthread_mutex_t *mu;
  pthread_cond_t *cv;
  bool *released;
} run;

static mn_status init_params(mn_session *s, const setup *u, int64_t hid, uint64_t seed) {
  size_t n[4];
  sizes_of(u, hid, n);
  mn_rng r = mn_rng_new(seed);
  mn_status st = MN_OK;
  for (int i = 0; i < 4 && st == MN_OK; i++) {
    float *buf = malloc(n[i] * sizeof *buf);
    if (!buf) return MN_ERR_OUT_OF_MEMORY;
    mn_rng_fill(&r, buf, n[i], -0.5f, 0.5f);
    st = mn_session_set_parameter(s, names[i], buf, n[i]);
    free(buf);
  }
  return st;
}

static mn_status configure(mn_session *s, const setup *u, int accum) {
  mn_status st = u->opt == SGD ? mn_session_set_learning_rate(s, 0.1f)
                               : mn_session_set_adamw(s, 1e-2f, 0.9f, 0.999f, 1e-8f, 0.05f);
  if (st == MN_OK && u->clip) st = mn_session_set_grad_clip(s, 0.05f);
  if (st == MN_OK && accum > 1) st = mn_session_set_grad_accumulation(s, (unsigned)accum);
  return st;
}

/* Rows [first, first + n) of round r's data (accum * TOTAL rows). */
static mn_status feed(mn_session *s, const setup *u, int round, int first, int n) {
  size_t rows = (size_t)(u->accum * TOTAL);
  float *x = malloc(rows * (size_t)u->in * sizeof *x),
        *t = malloc(rows * (size_t)u->out * sizeof *t);
  mn_status st = x && t ? MN_OK : MN_ERR_OUT_OF_MEMORY;
  mn_rng r = mn_rng_new(40 + (uint64_t)round);
  if (st == MN_OK) {
    mn_rng_fill(&r, x, rows * (size_t)u->in, -1, 1);
    mn_rng_fill(&r, t, rows * (size_t)u->out, -1, 1);
    st = mn_session_set_input(s, "x", x + (size_t)first * (size_t)u->in, (size_t)n * (size_t)u->in);
  }
  if (st == MN_OK)
    st = mn_session_set_input(s, "t", t + (size_t)first * (size_t)u->out,
                              (size_t)n * (size_t)u->out);
  free(x);
  free(t);
  return st;
}

/* Inputs far beyond f16's range: every gradient of the step is infinite or NaN. */
static mn_status blow_up(mn_session *s, const setup *u, int rows) {
  size_t n = (size_t)rows * (size_t)u->in;
  float *x = malloc(n * sizeof *x);
  if (!x) return MN_ERR_OUT_OF_MEMORY;
  for (size_t i = 0; i < n; i++)
    x[i] = 3.0e38f;
  mn_status st = mn_session_set_input(s, "x", x, n);
  free(x);
  return st;
}

static double since(const struct timespec *t0) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)(t.tv_sec - t0->tv_sec) + (double)(t.tv_nsec - t0->tv_nsec) / 1e9;
}

static void wait_released(run *r) {
  pthread_mutex_lock(r->mu);
  while (!*r->released)
    pthread_cond_wait(r->cv, r->mu);
  pthread_mutex_unlock(r->mu);
}

static mn_status train(run *r, mn_session *s) {
  const setup *u = r->u;
  mn_status st = MN_OK;
  for (int round = u->first_round; st == MN_OK && round < u->first_round + u->rounds; round++)
    for (int m = 0; st == MN_OK && m < r->accum; m++) {
      st = feed(s, u, round, (m * r->world + r->rank) * r->rows, r->rows);
      if (st == MN_OK && r->rank == 1 && m == 0 && round + 1 == u->blowup_round)
        st = blow_up(s, u, r->rows);
      struct timespec t0;
      clock_gettime(CLOCK_MONOTONIC, &t0);
      if (st == MN_OK) st = mn_session_step(s);
      if (st == MN_OK && !r->in_flight) st = mn_session_wait(s);
      r->seconds = since(&t0);
      /* The first steps capture the graphs. */
      if (round > u->first_round + 1) r->step_seconds += r->seconds;
      if (st == MN_OK && !r->in_flight) r->loss[round - u->first_round] = mn_session_read_loss(s);
    }
  if (st == MN_OK && r->in_flight) st = mn_session_wait(s);
  mn_session_stats stats;
  if (st == MN_OK) st = mn_session_get_stats(s, &stats);
  if (st == MN_OK) {
    r->loss_scale = stats.loss_scale;
    r->skipped = stats.skipped_steps;
  }
  size_t n[4];
  sizes_of(u, r->hid, n);
  float *at = r->params;
  for (int i = 0; st == MN_OK && i < 4; at += n[i], i++)
    st = mn_session_read_param(s, names[i], at, n[i]);
  return st;
}

static void *rank_main(void *arg) {
  run *r = arg;
  const setup *u = r->u;
  mn_group *group = NULL;
  mn_session *s = NULL;
  mn_graph *g = mlp(u, r->rows, r->hid);
  mn_status st = MN_OK;
  if (r->cpu_group)
    group = r->cpu_group;
  else if (r->id)
    st = mn_group_new_nccl(r->id, r->world, r->rank, r->device, r->timeout_s, &group);
  mn_session_options o = mn_session_options_default();
  o.backend = r->cpu_group ? MN_BACKEND_CPU : MN_BACKEND_CUDA;
  o.device = r->cpu_group ? 0 : r->device;
  o.precision = u->precision;
  o.group = group;
  o.rank = r->rank;
  o.world_size = r->world;
  o.zero1 = u->zero1;
  if (st == MN_OK) st = mn_build_session(g, &o, &s);
  uint64_t seed = u->apart && r->rank ? 12 : 11;
  if (st == MN_OK)
    st = u->load ? mn_session_load_checkpoint(s, u->load) : init_params(s, u, r->hid, seed);
  if (st == MN_OK) st = configure(s, u, r->accum);
  if (st == MN_OK && r->never_steps)
    wait_released(r);
  else if (st == MN_OK)
    st = train(r, s);
  if (st == MN_OK && u->save) st = mn_session_save_checkpoint(s, u->save);
  r->status = st;
  if (st != MN_OK) snprintf(r->error, sizeof r->error, "%s", mn_last_error());
  /* The rank that outlived the failing one leaves its communicator behind at once. */
  if (r->never_steps && group) mn_group_abort(group, "the test is over");
  mn_session_free(s);
  if (!r->cpu_group) mn_group_free(group);
  mn_graph_free(g);
  return NULL;
}

/* ------------------------------------------------------------------ helpers */

static void require_ranks(int n) {
  mn_test_require_cuda_device();
  const mn_nccl *api = NULL;
  if (mn_nccl_get(&api) != MN_OK) cr_skip_test("NCCL is missing: %s", mn_nccl_error());
#ifdef MN_WITH_CUDA
  int have = mn_cuda_usable_devices();
  if (have < n) cr_skip_test("needs %d CUDA devices, %d usable", n, have);
#else
  (void)n;
#endif
}

static void init_run(run *r, const setup *u, int world, int rank, int rows, int accum) {
  *r = (run){.u = u,
             .rank = rank,
             .world = world,
             .device = rank,
             .rows = rows,
             .accum = accum,
             .hid = u->hid,
             .timeout_s = 60};
  r->params = calloc(num_params(u), sizeof(float));
  cr_assert_not_null(r->params);
}

/* Every run of runs[0, n) on its own thread, sharing one NCCL id when `grouped`. */
static void run_threads(run *runs, int n, bool grouped) {
  mn_group_id id;
  if (grouped) cr_assert_eq(mn_group_id_new(&id), MN_OK, "%s", mn_last_error());
  pthread_t threads[4];
  for (int i = 0; i < n; i++) {
    runs[i].id = grouped ? &id : NULL;
    cr_assert_eq(pthread_create(&threads[i], NULL, rank_main, &runs[i]), 0);
  }
  for (int i = 0; i < n; i++)
    pthread_join(threads[i], NULL);
}

/* runs[0, n) as CPU ranks of one in-process group. */
static void run_cpu_ranks(run *runs, int n) {
  mn_group *g = NULL;
  cr_assert_eq(mn_group_new_local(n, 60, &g), MN_OK, "%s", mn_last_error());
  for (int i = 0; i < n; i++)
    runs[i].cpu_group = g;
  run_threads(runs, n, false);
  mn_group_free(g);
}

static void free_runs(run *runs, int n) {
  for (int i = 0; i < n; i++)
    free(runs[i].params);
}

static const char *describe(const setup *u, char *buf, size_t size) {
  snprintf(buf, size, "%s%s%s%s, accum %d, hid %lld", u->opt == SGD ? "SGD" : "AdamW",
           u->zero1 ? ", ZeRO-1" : "", u->clip ? ", clipped" : "",
           u->precision == MN_PRECISION_BF16  ? ", bf16"
           : u->precision == MN_PRECISION_F16 ? ", f16"
                                              : "",
           u->accum, (long long)u->hid);
  return buf;
}

static double max_rel_error(const float *a, const float *b, size_t n) {
  double worst = 0;
  for (size_t i = 0; i < n; i++) {
    double e = fabs((double)a[i] - b[i]) / (fabs((double)b[i]) + 1e-3);
    if (e > worst || isnan(e)) worst = isnan(e) ? INFINITY : e;
  }
  return worst;
}

static double norm_error(const float *a, const float *b, size_t n) {
  double d = 0, r = 0;
  for (size_t i = 0; i < n; i++) {
    d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
    r += (double)b[i] * b[i];
  }
  return isnan(d) ? INFINITY : sqrt(d / (r > 0 ? r : 1));
}

/* fp32: the ranks' mean of means against one mean (and cuBLASLt's sums over other batch
 * sizes); bf16 and f16: a weight whose rounded copy went the other way moves what follows. On
 * the CPU, f16 against f32 differs by at most 5.2e-5 norm-wise on the small runs and 7.8e-4 on
 * large(ADAMW), two f16 ranks against one by 2.0e-5. */
#define TOL_F32  1e-4
#define TOL_BF16 0x1p-7
#define TOL_F16  0x1p-8

/* The reference: a plain session of `rows` rows per step and `accum` steps per update. */
static void run_plain(const setup *u, int rows, int accum, run *out) {
  init_run(out, u, 1, 0, rows, accum);
  run_threads(out, 1, false);
  cr_assert_eq(out->status, MN_OK, "plain session: %s", out->error);
}

static void check_two_ranks(setup copy) {
  const setup *u = &copy;
  char what[128];
  describe(u, what, sizeof what);
  run ranks[2], one;
  for (int i = 0; i < 2; i++)
    init_run(&ranks[i], u, 2, i, TOTAL / 2, u->accum);
  run_threads(ranks, 2, true);
  for (int i = 0; i < 2; i++)
    cr_assert_eq(ranks[i].status, MN_OK, "%s: rank %d: %s", what, i, ranks[i].error);
  run_plain(u, u->accum * TOTAL, 1, &one);
  size_t n = num_params(u);
  cr_expect(memcmp(ranks[0].params, ranks[1].params, n * sizeof(float)) == 0,
            "%s: rank 1's parameters differ from rank 0's", what);
  bool low = u->precision != MN_PRECISION_F32;
  double tol = u->precision == MN_PRECISION_BF16  ? TOL_BF16
               : u->precision == MN_PRECISION_F16 ? TOL_F16
                                                  : TOL_F32;
  double rel = max_rel_error(ranks[0].params, one.params, n);
  double norm = norm_error(ranks[0].params, one.params, n);
  double e = low || u->normwise ? norm : rel;
  int timed = u->rounds - 2 > 0 ? u->rounds - 2 : 1;
  fprintf(stderr,
          "DP 2 ranks against one, %s: max relative error %.3g, norm-wise %.3g; %.3f ms a step "
          "on 2 ranks (batch %d each), %.3f ms on one (batch %d)\n",
          what, rel, norm, 1e3 * ranks[0].step_seconds / (timed * u->accum), TOTAL / 2,
          1e3 * one.step_seconds / timed, u->accum * TOTAL);
  cr_expect(e <= tol, "%s: %s error %.3g against one rank of the whole batch", what,
            low || u->normwise ? "norm-wise" : "max relative", e);
  /* The steps compared must be the same updates: no scale differs. */
  for (int i = 0; i < 2; i++)
    cr_expect(ranks[i].loss_scale == one.loss_scale && ranks[i].skipped == one.skipped,
              "%s: rank %d: loss scale %g, %llu skipped; one rank: %g, %llu skipped", what, i,
              (double)ranks[i].loss_scale, (unsigned long long)ranks[i].skipped,
              (double)one.loss_scale, (unsigned long long)one.skipped);
  for (int i = 0; i < 2 && u->accum == 1 && !low; i++)
    for (int r = 0; r < u->rounds; r++)
      cr_expect(fabsf(ranks[i].loss[r] - one.loss[r]) <= 1e-5f * fabsf(one.loss[r]),
                "%s: rank %d, step %d: loss %.9g, one rank %.9g", what, i, r,
                (double)ranks[i].loss[r], (double)one.loss[r]);
  free_runs(ranks, 2);
  free_runs(&one, 1);
}

static setup small(optim opt, bool zero1, bool clip, int accum) {
  return (setup){.in = 5,
                 .hid = 16,
                 .out = 3,
                 .ranks = 2,
                 .accum = accum,
                 .rounds = 4,
                 .opt = opt,
                 .zero1 = zero1,
                 .clip = clip,
                 .precision = MN_PRECISION_F32};
}

/* Two 16 MiB weights: more than one 25 MiB bucket, so buckets are reduced while the backward
 * pass still runs. */
static setup large(optim opt) {
  setup u = small(opt, false, true, 1);
  u.in = 512;
  u.hid = 8192;
  u.out = 512;
  u.rounds = 8;
  return u;
}

static setup f16(setup u) {
  u.precision = MN_PRECISION_F16;
  return u;
}

/* ------------------------------------------------------------------ tests */

Test(cuda_data_parallel, one_rank_through_nccl_is_bitwise_the_plain_session) {
  require_ranks(1);
  const setup cases[] = {
      small(SGD, false, false, 1),       small(ADAMW, false, true, 1),
      small(ADAMW, true, true, 1),       small(SGD, true, false, 2),
      small(ADAMW, false, true, 2),      f16(small(SGD, false, false, 1)),
      f16(small(ADAMW, false, true, 1)), f16(small(ADAMW, true, true, 1)),
      f16(small(SGD, true, false, 2)),   f16(small(ADAMW, false, true, 2)),
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    setup u = cases[c];
    u.ranks = 1;
    char what[128];
    describe(&u, what, sizeof what);
    run rank, one;
    init_run(&rank, &u, 1, 0, TOTAL, u.accum);
    run_threads(&rank, 1, true);
    cr_assert_eq(rank.status, MN_OK, "%s: %s", what, rank.error);
    run_plain(&u, TOTAL, u.accum, &one);
    cr_expect(memcmp(rank.params, one.params, num_params(&u) * sizeof(float)) == 0,
              "%s: one rank through NCCL differs from the plain session (max relative %.3g)", what,
              max_rel_error(rank.params, one.params, num_params(&u)));
    for (int r = 0; r < u.rounds; r++)
      cr_expect(memcmp(&rank.loss[r], &one.loss[r], sizeof(float)) == 0,
                "%s: step %d: loss %.9g, plain %.9g", what, r, (double)rank.loss[r],
                (double)one.loss[r]);
    cr_expect(rank.loss_scale == one.loss_scale && rank.skipped == one.skipped,
              "%s: loss scale %g, %llu skipped; plain %g, %llu skipped", what,
              (double)rank.loss_scale, (unsigned long long)rank.skipped, (double)one.loss_scale,
              (unsigned long long)one.skipped);
    free_runs(&rank, 1);
    free_runs(&one, 1);
  }
}

Test(cuda_data_parallel, two_ranks_train_as_one_rank_of_the_whole_batch) {
  require_ranks(2);
  check_two_ranks(small(SGD, false, false, 1));
  setup apart = small(ADAMW, false, false, 1);
  apart.apart = true;
  check_two_ranks(apart);
}

Test(cuda_data_parallel, clipping_and_zero1_use_every_ranks_gradients) {
  require_ranks(2);
  check_two_ranks(small(SGD, false, true, 1));
  check_two_ranks(small(ADAMW, false, true, 1));
  check_two_ranks(small(SGD, true, false, 1));
  check_two_ranks(small(ADAMW, true, false, 1));
  check_two_ranks(small(ADAMW, true, true, 1));
}

Test(cuda_data_parallel, accumulation_reduces_on_the_applying_step_only) {
  require_ranks(2);
  check_two_ranks(small(SGD, false, false, 2));
  check_two_ranks(small(ADAMW, false, true, 2));
  check_two_ranks(small(ADAMW, true, true, 2));
}

Test(cuda_data_parallel, several_buckets_overlap_the_backward_pass) {
  require_ranks(2);
  setup u = large(SGD);
  check_two_ranks(u);
  u.opt = ADAMW;
  u.normwise = true;
  check_two_ranks(u);
  u.zero1 = true;
  check_two_ranks(u);
}

/* MN_DP_OVERLAP=0 (bench_dp_step's baseline) issues the same collectives in the same order
 * after the backward pass: the same bits as the overlapped step. */
Test(cuda_data_parallel, buckets_after_the_backward_pass_give_the_overlapped_bits) {
  require_ranks(2);
  setup u = large(ADAMW);
  run overlapped[2], serial[2];
  for (int i = 0; i < 2; i++)
    init_run(&overlapped[i], &u, 2, i, TOTAL / 2, 1);
  run_threads(overlapped, 2, true);
  setenv("MN_DP_OVERLAP", "0", 1);
  for (int i = 0; i < 2; i++)
    init_run(&serial[i], &u, 2, i, TOTAL / 2, 1);
  run_threads(serial, 2, true);
  unsetenv("MN_DP_OVERLAP");
  for (int i = 0; i < 2; i++) {
    cr_assert_eq(overlapped[i].status, MN_OK, "overlapped rank %d: %s", i, overlapped[i].error);
    cr_assert_eq(serial[i].status, MN_OK, "serial rank %d: %s", i, serial[i].error);
    cr_expect(memcmp(overlapped[i].params, serial[i].params, num_params(&u) * sizeof(float)) == 0,
              "rank %d: buckets after the backward pass differ from the overlapped step (max "
              "relative %.3g)",
              i, max_rel_error(overlapped[i].params, serial[i].params, num_params(&u)));
  }
  free_runs(overlapped, 2);
  free_runs(serial, 2);
}

Test(cuda_data_parallel, bf16_ranks_refresh_their_weights_copies) {
  require_ranks(2);
  setup u = small(ADAMW, false, true, 1);
  u.precision = MN_PRECISION_BF16;
  u.apart = true;
  check_two_ranks(u);
  u.zero1 = true;
  check_two_ranks(u);
}

/* F16: the buckets overlap the backward pass as in bf16, and the unscale reads their mean. */
Test(cuda_data_parallel, f16_ranks_train_as_one_rank_of_the_whole_batch) {
  mn_test_require_cuda_build();
  setup u = small(SGD, false, false, 1);
  mn_graph *g = mlp(&u, TOTAL / 2, u.hid);
  mn_test_assert_compiles_precision(g, true, MN_PRECISION_F16);
  mn_graph_free(g);
  require_ranks(2);
  check_two_ranks(f16(small(SGD, false, false, 1)));
  setup apart = f16(small(ADAMW, false, true, 1));
  apart.apart = true;
  check_two_ranks(apart);
  check_two_ranks(f16(small(ADAMW, true, true, 1)));
  check_two_ranks(f16(small(SGD, false, false, 2)));
  check_two_ranks(f16(small(ADAMW, false, true, 2)));
  check_two_ranks(f16(small(ADAMW, true, true, 2)));
  setup big = f16(large(ADAMW));
  big.normwise = true;
  check_two_ranks(big);
}

static bool all_finite(const float *x, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (!isfinite(x[i])) return false;
  return true;
}

/* Two f16 ranks of u (rank 1 overflowing in u.blowup_round), stepping without waiting when
 * `in_flight`: both must succeed, skip the same steps, at least one, and end with one scale
 * and one model. */
static void run_blown_up(const setup *u, bool in_flight, run *ranks) {
  char what[128];
  describe(u, what, sizeof what);
  for (int i = 0; i < 2; i++) {
    init_run(&ranks[i], u, 2, i, TOTAL / 2, u->accum);
    ranks[i].in_flight = in_flight;
  }
  run_threads(ranks, 2, true);
  for (int i = 0; i < 2; i++)
    cr_assert_eq(ranks[i].status, MN_OK, "%s: rank %d: %s", what, i, ranks[i].error);
  fprintf(stderr,
          "DP f16, %s%s: rank 1 overflowed in round %d; skipped %llu and %llu, scales %g "
          "and %g\n",
          what, in_flight ? ", steps in flight" : "", u->blowup_round,
          (unsigned long long)ranks[0].skipped, (unsigned long long)ranks[1].skipped,
          (double)ranks[0].loss_scale, (double)ranks[1].loss_scale);
  cr_expect_gt(ranks[0].skipped, 0u, "%s: rank 1's overflow skipped nothing on rank 0", what);
  cr_expect_eq(ranks[0].skipped, ranks[1].skipped, "%s: skipped steps %llu and %llu", what,
               (unsigned long long)ranks[0].skipped, (unsigned long long)ranks[1].skipped);
  cr_expect_eq(ranks[0].loss_scale, ranks[1].loss_scale, "%s: loss scales %g and %g", what,
               (double)ranks[0].loss_scale, (double)ranks[1].loss_scale);
  size_t n = num_params(u);
  cr_expect(all_finite(ranks[0].params, n), "%s: the overflow reached the parameters", what);
  cr_expect(memcmp(ranks[0].params, ranks[1].params, n * sizeof(float)) == 0,
            "%s: the ranks' parameters differ after an overflow on rank 1", what);
}

/* The CPU backend's two ranks of u (test_data_parallel's F16 semantics): the same skipped
 * steps and scale as the CUDA ranks', and parameters within f16's tolerance. */
static void check_against_cpu_ranks(const setup *u, const run *ranks) {
  char what[128];
  describe(u, what, sizeof what);
  run cpu[2];
  for (int i = 0; i < 2; i++)
    init_run(&cpu[i], u, 2, i, TOTAL / 2, u->accum);
  run_cpu_ranks(cpu, 2);
  for (int i = 0; i < 2; i++)
    cr_assert_eq(cpu[i].status, MN_OK, "%s: CPU rank %d: %s", what, i, cpu[i].error);
  double e = norm_error(ranks[0].params, cpu[0].params, num_params(u));
  fprintf(stderr, "DP f16, %s: CUDA ranks against the CPU's: norm-wise %.3g\n", what, e);
  cr_expect(ranks[0].skipped == cpu[0].skipped && ranks[0].loss_scale == cpu[0].loss_scale,
            "%s: CUDA ranks skipped %llu (scale %g), the CPU's %llu (scale %g)", what,
            (unsigned long long)ranks[0].skipped, (double)ranks[0].loss_scale,
            (unsigned long long)cpu[0].skipped, (double)cpu[0].loss_scale);
  cr_expect(e <= TOL_F16, "%s: norm-wise %.3g against the CPU's ranks", what, e);
  free_runs(cpu, 2);
}

/* F16: rank 1's inputs of one step overflow, rank 0's do not; both skip that step (the
 * overflow flag is all-reduced before the scaler's end kernel reads it), with and without
 * accumulation (whose steps unscale the rank's own gradients) and ZeRO-1, as the CPU's ranks
 * do. */
Test(cuda_data_parallel, f16_ranks_skip_the_steps_either_rank_overflows) {
  require_ranks(2);
  const setup cases[] = {
      f16(small(SGD, false, false, 1)),  f16(small(ADAMW, false, true, 1)),
      f16(small(ADAMW, true, true, 1)),  f16(small(SGD, false, false, 2)),
      f16(small(ADAMW, true, false, 2)),
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    setup u = cases[c];
    u.blowup_round = 2;
    run ranks[2];
    run_blown_up(&u, false, ranks);
    check_against_cpu_ranks(&u, ranks);
    free_runs(ranks, 2);
  }
}

/* F16 with accumulation, steps submitted without waiting: the overflow keeps the device's
 * round open, so the updates come one step later than the host guessed; each rank still picks
 * the graph with the gradients' all-reduce for the step that applies, and the run gives the
 * bits of one that waits after every step. */
Test(cuda_data_parallel, f16_steps_in_flight_reduce_on_the_devices_applying_step) {
  require_ranks(2);
  for (int zero1 = 0; zero1 < 2; zero1++) {
    setup u = f16(small(ADAMW, zero1, true, 2));
    u.blowup_round = 2;
    char what[128];
    describe(&u, what, sizeof what);
    run waited[2], flying[2];
    run_blown_up(&u, false, waited);
    run_blown_up(&u, true, flying);
    for (int i = 0; i < 2; i++) {
      cr_expect_eq(flying[i].skipped, waited[i].skipped, "%s: rank %d", what, i);
      cr_expect_eq(flying[i].loss_scale, waited[i].loss_scale, "%s: rank %d", what, i);
      cr_expect(memcmp(flying[i].params, waited[i].params, num_params(&u) * sizeof(float)) == 0,
                "%s: rank %d: steps in flight differ from steps waited for (max relative %.3g)",
                what, i, max_rel_error(flying[i].params, waited[i].params, num_params(&u)));
    }
    free_runs(waited, 2);
    free_runs(flying, 2);
  }
}

Test(cuda_data_parallel, a_checkpoint_of_two_ranks_resumes_on_one) {
  require_ranks(2);
  mn_tmp_dir t = mn_tmp_dir_make("mn_cuda_dp");
  const char *path = mn_tmp_path(&t, "group.safetensors");
  for (int zero1 = 0; zero1 < 2; zero1++) {
    setup first = small(ADAMW, zero1, true, 1);
    first.rounds = 2;
    first.save = path;
    run ranks[2];
    for (int i = 0; i < 2; i++)
      init_run(&ranks[i], &first, 2, i, TOTAL / 2, 1);
    run_threads(ranks, 2, true);
    for (int i = 0; i < 2; i++)
      cr_assert_eq(ranks[i].status, MN_OK, "rank %d: %s", i, ranks[i].error);
    /* One rank of the whole batch goes on from the file ... */
    setup second = first;
    second.ranks = 1;
    second.first_round = 2;
    second.save = NULL;
    second.load = path;
    run resumed, whole;
    run_plain(&second, TOTAL, 1, &resumed);
    /* ... as four rounds of it without a break. */
    setup all = first;
    all.rounds = 4;
    all.save = NULL;
    run_plain(&all, TOTAL, 1, &whole);
    double e = max_rel_error(resumed.params, whole.params, num_params(&first));
    fprintf(stderr, "DP checkpoint of 2 ranks%s resumed on 1: max relative error %.3g\n",
            zero1 ? " (ZeRO-1)" : "", e);
    cr_expect(e <= TOL_F32, "2 ranks%s, then 1 from the checkpoint: max relative error %.3g",
              zero1 ? " (ZeRO-1)" : "", e);
    free_runs(ranks, 2);
    free_runs(&resumed, 1);
    free_runs(&whole, 1);
  }
  cr_expect_eq(mn_tmp_dir_count(&t, ".tmp"), 0, "a temporary file was left behind");
  mn_tmp_dir_remove(&t);
}

Test(cuda_data_parallel, a_rank_that_never_steps_fails_the_other_within_the_timeout) {
  require_ranks(2);
  setup u = small(SGD, false, false, 1);
  u.rounds = 1;
  pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
  bool released = false;
  run ranks[2];
  for (int i = 0; i < 2; i++) {
    init_run(&ranks[i], &u, 2, i, TOTAL / 2, 1);
    ranks[i].timeout_s = 3;
    ranks[i].mu = &mu;
    ranks[i].cv = &cv;
    ranks[i].released = &released;
  }
  ranks[1].never_steps = true;
  mn_group_id id;
  cr_assert_eq(mn_group_id_new(&id), MN_OK, "%s", mn_last_error());
  pthread_t threads[2];
  for (int i = 0; i < 2; i++) {
    ranks[i].id = &id;
    cr_assert_eq(pthread_create(&threads[i], NULL, rank_main, &ranks[i]), 0);
  }
  pthread_join(threads[0], NULL);
  pthread_mutex_lock(&mu);
  released = true;
  pthread_cond_broadcast(&cv);
  pthread_mutex_unlock(&mu);
  pthread_join(threads[1], NULL);
  fprintf(stderr, "DP a rank that never steps: the other failed after %.2f s: %s\n",
          ranks[0].seconds, ranks[0].error);
  cr_expect_eq(ranks[0].status, MN_ERR_STATE, "%s", ranks[0].error);
  cr_expect(strstr(ranks[0].error, "waited") != NULL, "%s", ranks[0].error);
  cr_expect(ranks[0].seconds >= 2.5 && ranks[0].seconds <= 20, "failed after %.2f s",
            ranks[0].seconds);
  cr_expect_eq(ranks[1].status, MN_OK, "%s", ranks[1].error);
  free_runs(ranks, 2);
}

Test(cuda_data_parallel, a_different_graph_on_one_rank_is_refused_by_both) {
  require_ranks(2);
  setup u = small(SGD, false, false, 1);
  run ranks[2];
  for (int i = 0; i < 2; i++)
    init_run(&ranks[i], &u, 2, i, TOTAL / 2, 1);
  ranks[1].hid = 8;
  run_threads(ranks, 2, true);
  for (int i = 0; i < 2; i++) {
    cr_expect_eq(ranks[i].status, MN_ERR_INVALID_ARGUMENT, "rank %d: %s", i, ranks[i].error);
    cr_expect(strstr(ranks[i].error, "plan hash") != NULL, "rank %d: %s", i, ranks[i].error);
  }
  free_runs(ranks, 2);
}

Test(cuda_data_parallel, a_cuda_session_needs_an_nccl_group) {
  mn_test_require_cuda_device();
  setup u = small(SGD, false, false, 1);
  mn_group *group = NULL;
  cr_assert_eq(mn_group_new_local(1, 1, &group), MN_OK);
  mn_graph *g = mlp(&u, TOTAL, u.hid);
  mn_session_options o = mn_session_options_default();
  o.backend = MN_BACKEND_CUDA;
  o.group = group;
  o.world_size = 1;
  mn_session *s = NULL;
  mn_status st = mn_build_session(g, &o, &s);
  cr_expect_eq(st, MN_ERR_UNSUPPORTED, "%s", mn_last_error());
  const mn_nccl *api = NULL;
  if (mn_nccl_get(&api) == MN_OK)
    cr_expect(strstr(mn_last_error(), "mn_group_new_nccl") != NULL, "%s", mn_last_error());
  mn_graph_free(g);
  mn_group_free(group);
}
