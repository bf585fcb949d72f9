/* Data-parallel training on the CPU backend (in-process groups, ranks as threads): N ranks of
 * batch B update as one rank of batch N*B, for SGD and AdamW, with and without ZeRO-1, clipping
 * and gradient accumulation; the reported loss is the mean over ranks; a group checkpoint
 * resumes with another number of ranks; mismatched ranks, a rank that never joins or stops,
 * and a missing NCCL are clear errors within the timeout. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "host/data_parallel.h"
#include "host/nccl.h"
#include "session/session.h"
#include "tests/support/mn_test.h"
#include "tests/support/session_util.h"
#include "tests/support/tmp_dir.h"

enum { TOTAL = 12, IN = 5, HID = 16, OUT = 3, MAX_RANKS = 4, ROUNDS = 4 };

/* tanh(x w1 + b1) w2 + b2 against t, mean squared error over `batch` rows. */
static mn_graph *mlp(int64_t batch, int64_t hid) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(batch, IN)), t = mn_input(g, "t", MN_SHAPE(batch, OUT));
  mn_node w1 = mn_parameter(g, "w1", MN_SHAPE(IN, hid)), b1 = mn_parameter(g, "b1", MN_SHAPE(hid));
  mn_node w2 = mn_parameter(g, "w2", MN_SHAPE(hid, OUT)), b2 = mn_parameter(g, "b2", MN_SHAPE(OUT));
  mn_node h = mn_tanh(g, mn_bias_add(g, mn_matmul(g, x, w1), b1));
  mn_node y = mn_bias_add(g, mn_matmul(g, h, w2), b2);
  mn_set_outputs(g, (mn_node[]){mn_mse_loss(g, y, t)}, 1);
  cr_assert_eq(mn_graph_status(g), MN_OK, "%s", mn_graph_error(g));
  return g;
}

static const char *const names[] = {"w1", "b1", "w2", "b2"};
static const size_t sizes[] = {IN * HID, HID, HID *OUT, OUT};
#define NUM_PARAMS (IN * HID + HID + HID * OUT + OUT)

typedef enum optim { SGD, ADAMW } optim;

/* One run's settings: every rank and the single-rank reference use them. */
typedef struct setup {
  int ranks, accum, rounds, first_round;
  optim opt;
  bool zero1, clip;
  bool apart;       /* ranks other than 0 start from other parameters */
  bool f16;         /* F16 training with its loss scaler */
  int blowup_round; /* > 0: rank 1's inputs of round blowup_round - 1 are huge (it overflows) */
  const char *load, *save; /* checkpoint to start from / to write at the end (NULL: none) */
} setup;

/* The initial parameters: seed 11 is the reference's. */
static mn_status init_params(mn_session *s, uint64_t seed) {
  mn_rng r = mn_rng_new(seed);
  float buf[IN * HID];
  for (int i = 0; i < 4; i++) {
    mn_rng_fill(&r, buf, sizes[i], -0.5f, 0.5f);
    mn_status st = mn_session_set_parameter(s, names[i], buf, sizes[i]);
    if (st != MN_OK) return st;
  }
  return MN_OK;
}

static mn_status configure(mn_session *s, const setup *u) {
  mn_status st = u->opt == SGD ? mn_session_set_learning_rate(s, 0.1f)
                               : mn_session_set_adamw(s, 1e-2f, 0.9f, 0.999f, 1e-8f, 0.05f);
  if (st == MN_OK && u->clip) st = mn_session_set_grad_clip(s, 0.05f);
  if (st == MN_OK && u->accum > 1) st = mn_session_set_grad_accumulation(s, u->accum);
  return st;
}

/* Rows [first, first + n) of round r's data (accum * TOTAL rows of x and t). */
static mn_status feed(mn_session *s, int round, int accum, int first, int n) {
  float x[2 * TOTAL * IN], t[2 * TOTAL * OUT];
  mn_rng r = mn_rng_new(40 + (uint64_t)round);
  mn_rng_fill(&r, x, (size_t)(accum * TOTAL * IN), -1, 1);
  mn_rng_fill(&r, t, (size_t)(accum * TOTAL * OUT), -1, 1);
  mn_status st = mn_session_set_input(s, "x", x + first * IN, (size_t)(n * IN));
  if (st == MN_OK) st = mn_session_set_input(s, "t", t + first * OUT, (size_t)(n * OUT));
  return st;
}

static mn_status step(mn_session *s, float *loss) {
  mn_status st = mn_session_step(s);
  if (st == MN_OK) st = mn_session_wait(s);
  if (loss) *loss = mn_session_read_loss(s);
  return st;
}

static mn_status read_all(mn_session *s, float *out) {
  for (int i = 0; i < 4; i++) {
    mn_status st = mn_session_read_param(s, names[i], out, sizes[i]);
    if (st != MN_OK) return st;
    out += sizes[i];
  }
  return MN_OK;
}

/* One rank's run and what it saw; the thread reports instead of asserting. */
typedef struct rank_run {
  const setup *u;
  mn_group *group;
  int rank, world_size; /* world_size: what the options claim */
  int64_t hid;
  bool stop_early; /* leaves after building, as a rank that dies */
  double timeout_s;
  mn_status status;
  char error[512];
  float params[NUM_PARAMS];
  float loss[8];
  size_t adam_bytes; /* the memory summary's Adam state */
  size_t flat;       /* elements of the flat update block, alignment padding included */
  float loss_scale;  /* F16: the scaler after the run */
  uint64_t skipped;  /* F16: the steps it skipped */
} rank_run;

static void *rank_main(void *arg) {
  rank_run *r = arg;
  const setup *u = r->u;
  int b = TOTAL / u->ranks;
  mn_graph *g = mlp(b, r->hid);
  mn_session_options o = mn_session_options_default();
  o.backend = MN_BACKEND_CPU;
  o.group = r->group;
  o.rank = r->rank;
  o.world_size = r->world_size;
  o.zero1 = u->zero1;
  if (u->f16) o.precision = MN_PRECISION_F16;
  mn_session *s = NULL;
  mn_status st = mn_build_session(g, &o, &s);
  uint64_t seed = u->apart && r->rank ? 12 : 11;
  if (st == MN_OK) st = u->load ? mn_session_load_checkpoint(s, u->load) : init_params(s, seed);
  if (st == MN_OK) st = configure(s, u);
  if (st == MN_OK) r->adam_bytes = mn_session_memory_summary(s).adam_state_bytes;
  if (st == MN_OK) r->flat = s->plan->update_bytes / sizeof(float);
  if (r->stop_early) goto out;
  for (int round = u->first_round; st == MN_OK && round < u->first_round + u->rounds; round++)
    for (int m = 0; st == MN_OK && m < u->accum; m++) {
      st = feed(s, round, u->accum, (m * u->ranks + r->rank) * b, b);
      if (st == MN_OK && r->rank == 1 && round + 1 == u->blowup_round) {
        float huge[TOTAL * IN];
        for (int i = 0; i < b * IN; i++)
          huge[i] = 3.0e38f;
        st = mn_session_set_input(s, "x", huge, (size_t)(b * IN));
      }
      if (st == MN_OK) st = step(s, &r->loss[round - u->first_round]);
    }
  if (st == MN_OK) st = read_all(s, r->params);
  mn_session_stats stats;
  if (st == MN_OK) st = mn_session_get_stats(s, &stats);
  if (st == MN_OK) {
    r->loss_scale = stats.loss_scale;
    r->skipped = stats.skipped_steps;
  }
  if (st == MN_OK && u->save) st = mn_session_save_checkpoint(s, u->save);
out:
  r->status = st;
  if (st != MN_OK) snprintf(r->error, sizeof r->error, "%s", mn_last_error());
  mn_session_free(s);
  mn_graph_free(g);
  return NULL;
}

/* Runs every rank of runs[0, n) on its own thread in a group of `world` ranks. */
static void run_group(rank_run *runs, int n, int world, double timeout_s) {
  mn_group *group = NULL;
  cr_assert_eq(mn_group_new_local(world, timeout_s, &group), MN_OK, "%s", mn_last_error());
  pthread_t threads[MAX_RANKS + 1];
  for (int i = 0; i < n; i++) {
    runs[i].group = group;
    cr_assert_eq(pthread_create(&threads[i], NULL, rank_main, &runs[i]), 0);
  }
  for (int i = 0; i < n; i++)
    pthread_join(threads[i], NULL);
  mn_group_free(group);
}

static void run_ranks(const setup *u, rank_run *runs) {
  for (int i = 0; i < u->ranks; i++)
    runs[i] = (rank_run){.u = u, .rank = i, .world_size = u->ranks, .hid = HID};
  run_group(runs, u->ranks, u->ranks, 30);
  for (int i = 0; i < u->ranks; i++)
    cr_assert_eq(runs[i].status, MN_OK, "rank %d of %d: %s", i, u->ranks, runs[i].error);
}

/* The reference: one plain session of batch accum * TOTAL, one step per round. */
static void run_one(const setup *u, float *params, float *loss) {
  mn_graph *g = mlp(u->accum * TOTAL, HID);
  mn_session *s = mn_test_session(g, MN_BACKEND_CPU, true);
  cr_assert_eq(init_params(s, 11), MN_OK, "%s", mn_last_error());
  setup one = *u;
  one.accum = 1;
  cr_assert_eq(configure(s, &one), MN_OK, "%s", mn_last_error());
  for (int round = 0; round < u->rounds; round++) {
    cr_assert_eq(feed(s, round, u->accum, 0, u->accum * TOTAL), MN_OK, "%s", mn_last_error());
    cr_assert_eq(step(s, &loss[round]), MN_OK, "%s", mn_last_error());
  }
  cr_assert_eq(read_all(s, params), MN_OK, "%s", mn_last_error());
  mn_session_free(s);
  mn_graph_free(g);
}

static double max_rel_error(const float *a, const float *b, size_t n) {
  double worst = 0;
  for (size_t i = 0; i < n; i++) {
    double e = fabs((double)a[i] - b[i]) / (fabs((double)b[i]) + 1e-3);
    if (e > worst) worst = e;
  }
  return worst;
}

/* fp32 reduction order only: the ranks' means of means against one mean. */
#define TOL 2e-5

static void check_against_one_rank(const setup *u) {
  rank_run runs[MAX_RANKS];
  float ref[NUM_PARAMS], ref_loss[8];
  run_ranks(u, runs);
  run_one(u, ref, ref_loss);
  for (int i = 1; i < u->ranks; i++)
    cr_expect(memcmp(runs[i].params, runs[0].params, sizeof ref) == 0,
              "%d ranks: rank %d's parameters differ from rank 0's", u->ranks, i);
  double e = max_rel_error(runs[0].params, ref, NUM_PARAMS);
  cr_expect(e <= TOL, "%d ranks, %s%s%s, accum %d: max relative error %.3g against one rank",
            u->ranks, u->opt == SGD ? "SGD" : "AdamW", u->zero1 ? ", ZeRO-1" : "",
            u->clip ? ", clipped" : "", u->accum, e);
  /* ZeRO-1 keeps a shard of the moments: the flat update block (parameters and the padding
   * between them) rounded up to a multiple of the ranks, divided by them. */
  if (u->opt == ADAMW)
    for (int i = 0; i < u->ranks; i++) {
      size_t shard = (runs[i].flat + (size_t)u->ranks - 1) / (size_t)u->ranks;
      size_t want = 2 * (u->zero1 ? shard : NUM_PARAMS) * sizeof(float);
      cr_expect_eq(runs[i].adam_bytes, want, "rank %d of %d%s: %zu bytes of Adam state, want %zu",
                   i, u->ranks, u->zero1 ? " (ZeRO-1)" : "", runs[i].adam_bytes, want);
    }
  if (u->accum > 1) return;
  /* Every rank reports the mean of the ranks' losses: one rank's loss over the whole batch. */
  for (int i = 0; i < u->ranks; i++)
    for (int r = 0; r < u->rounds; r++)
      cr_expect(fabsf(runs[i].loss[r] - ref_loss[r]) <= 1e-5f * fabsf(ref_loss[r]),
                "%d ranks, rank %d, step %d: loss %.9g, one rank %.9g", u->ranks, i, r,
                (double)runs[i].loss[r], (double)ref_loss[r]);
}

static void sweep(optim opt, bool zero1, bool clip, int accum) {
  for (int n = 2; n <= MAX_RANKS; n++)
    check_against_one_rank(&(setup){
        .ranks = n, .accum = accum, .rounds = ROUNDS, .opt = opt, .zero1 = zero1, .clip = clip});
}

Test(data_parallel, sgd_ranks_match_one_rank_with_the_whole_batch) { sweep(SGD, false, false, 1); }
Test(data_parallel, adamw_ranks_match_one_rank_with_the_whole_batch) {
  sweep(ADAMW, false, false, 1);
}
Test(data_parallel, clipping_uses_the_global_norm) {
  sweep(SGD, false, true, 1);
  sweep(ADAMW, false, true, 1);
}
Test(data_parallel, zero1_sgd_and_adamw_match_one_rank) {
  sweep(SGD, true, false, 1);
  sweep(ADAMW, true, false, 1);
}
Test(data_parallel, zero1_with_clipping_matches_one_rank) {
  sweep(SGD, true, true, 1);
  sweep(ADAMW, true, true, 1);
}
Test(data_parallel, gradient_accumulation_reduces_once_per_update) {
  sweep(SGD, false, false, 2);
  sweep(ADAMW, false, true, 2);
  sweep(ADAMW, true, true, 2);
}
Test(data_parallel, the_first_step_starts_every_rank_from_rank_0s_parameters) {
  for (int n = 2; n <= MAX_RANKS; n++)
    check_against_one_rank(&(setup){
        .ranks = n, .accum = 1, .rounds = ROUNDS, .opt = ADAMW, .zero1 = n == 3, .apart = true});
}
Test(data_parallel, one_rank_group_is_the_plain_session) {
  check_against_one_rank(&(setup){.ranks = 1, .accum = 1, .rounds = ROUNDS, .opt = ADAMW});
}

/* Two rounds on `from` ranks, a checkpoint, two more on `to` ranks from it: the parameters of
 * four uninterrupted rounds on one rank. */
static void resume(int from, int to, bool zero1) {
  mn_tmp_dir t = mn_tmp_dir_make("mn_dp");
  const char *path = mn_tmp_path(&t, "group.safetensors");
  setup first = {.ranks = from,
                 .accum = 1,
                 .rounds = 2,
                 .opt = ADAMW,
                 .zero1 = zero1,
                 .clip = true,
                 .save = path};
  setup second = first;
  second.ranks = to;
  second.first_round = 2;
  second.save = NULL;
  second.load = path;
  rank_run a[MAX_RANKS], b[MAX_RANKS];
  run_ranks(&first, a);
  run_ranks(&second, b);
  float ref[NUM_PARAMS], ref_loss[8];
  setup whole = first;
  whole.rounds = 4;
  run_one(&whole, ref, ref_loss);
  double e = max_rel_error(b[0].params, ref, NUM_PARAMS);
  cr_expect(e <= TOL, "%d ranks%s, then %d from the checkpoint: max relative error %.3g", from,
            zero1 ? " (ZeRO-1)" : "", to, e);
  cr_expect_eq(mn_tmp_dir_count(&t, ".tmp"), 0, "a temporary file was left behind");
  mn_tmp_dir_remove(&t);
}

Test(data_parallel, a_group_checkpoint_resumes_with_another_number_of_ranks) {
  resume(2, 3, true);
  resume(4, 2, true);
  resume(3, 2, false);
  resume(2, 4, false);
}

/* ------------------------------------------------------------------ bad input */

static void expect_all_fail(rank_run *runs, int n, mn_status want, const char *fragment) {
  for (int i = 0; i < n; i++) {
    cr_expect_eq(runs[i].status, want, "rank %d: status %d, want %d (%s)", i, runs[i].status, want,
                 runs[i].error);
    cr_expect(strstr(runs[i].error, fragment) != NULL, "rank %d: \"%s\" lacks \"%s\"", i,
              runs[i].error, fragment);
  }
}

static double seconds_since(const struct timespec *t0) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)(t.tv_sec - t0->tv_sec) + (double)(t.tv_nsec - t0->tv_nsec) / 1e9;
}

Test(data_parallel, a_mismatched_world_size_is_refused_by_every_rank) {
  setup u = {.ranks = 2, .accum = 1, .rounds = 1, .opt = SGD};
  rank_run runs[2] = {{.u = &u, .rank = 0, .world_size = 2, .hid = HID},
                      {.u = &u, .rank = 1, .world_size = 3, .hid = HID}};
  run_group(runs, 2, 2, 10);
  cr_expect_eq(runs[0].status, MN_ERR_INVALID_ARGUMENT, "%s", runs[0].error);
  cr_expect(strstr(runs[0].error, "rank 1") != NULL, "%s", runs[0].error);
  cr_expect_eq(runs[1].status, MN_ERR_INVALID_ARGUMENT, "%s", runs[1].error);
  cr_expect(strstr(runs[1].error, "world_size = 3") != NULL, "%s", runs[1].error);
}

Test(data_parallel, a_different_model_on_one_rank_is_refused_by_every_rank) {
  setup u = {.ranks = 3, .accum = 1, .rounds = 1, .opt = SGD};
  rank_run runs[3];
  for (int i = 0; i < 3; i++)
    runs[i] = (rank_run){.u = &u, .rank = i, .world_size = 3, .hid = i == 2 ? HID + 1 : HID};
  run_group(runs, 3, 3, 10);
  expect_all_fail(runs, 3, MN_ERR_INVALID_ARGUMENT, "rank 2's world size, graph or options");
}

Test(data_parallel, a_rank_that_never_joins_times_out) {
  setup u = {.ranks = 3, .accum = 1, .rounds = 1, .opt = SGD};
  rank_run runs[2];
  for (int i = 0; i < 2; i++)
    runs[i] = (rank_run){.u = &u, .rank = i, .world_size = 3, .hid = HID};
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  run_group(runs, 2, 3, 0.3);
  expect_all_fail(runs, 2, MN_ERR_STATE, "rank(s) 2 of 3");
  cr_expect(seconds_since(&t0) < 10, "took %.1f s", seconds_since(&t0));
}

Test(data_parallel, a_rank_that_stops_stepping_times_out_the_others) {
  setup u = {.ranks = 2, .accum = 1, .rounds = 2, .opt = SGD};
  rank_run runs[2] = {{.u = &u, .rank = 0, .world_size = 2, .hid = HID},
                      {.u = &u, .rank = 1, .world_size = 2, .hid = HID, .stop_early = true}};
  run_group(runs, 2, 2, 0.3);
  cr_expect_eq(runs[1].status, MN_OK, "%s", runs[1].error);
  cr_expect_eq(runs[0].status, MN_ERR_STATE, "%s", runs[0].error);
  cr_expect(strstr(runs[0].error, "timed out") != NULL, "%s", runs[0].error);
}

Test(data_parallel, an_aborted_group_fails_its_waiting_ranks_at_once) {
  setup u = {.ranks = 2, .accum = 1, .rounds = 1, .opt = SGD};
  rank_run run = {.u = &u, .rank = 0, .world_size = 2, .hid = HID};
  cr_assert_eq(mn_group_new_local(2, 60, &run.group), MN_OK);
  struct timespec t0, pause = {0, 100 * 1000 * 1000};
  clock_gettime(CLOCK_MONOTONIC, &t0);
  pthread_t thread;
  cr_assert_eq(pthread_create(&thread, NULL, rank_main, &run), 0);
  nanosleep(&pause, NULL);
  mn_group_abort(run.group, "rank 1 cannot load its data");
  pthread_join(thread, NULL);
  cr_expect_eq(run.status, MN_ERR_STATE, "%s", run.error);
  cr_expect(strstr(run.error, "aborted: rank 1 cannot load its data") != NULL, "%s", run.error);
  cr_expect(seconds_since(&t0) < 10, "took %.1f s", seconds_since(&t0));
  mn_group_free(run.group);
}

typedef struct call {
  mn_group *group;
  int rank;
  size_t n;
  mn_status status;
  char error[512];
} call;

static void *all_reduce_main(void *arg) {
  call *c = arg;
  float buf[8] = {0};
  c->status = mn_all_reduce(c->group, c->rank, buf, c->n, MN_REDUCE_SUM);
  if (c->status != MN_OK) snprintf(c->error, sizeof c->error, "%s", mn_last_error());
  return NULL;
}

/* Ranks whose steps went apart fail instead of reading past each other's buffers. */
Test(data_parallel, ranks_calling_different_collectives_fail) {
  mn_group *group = NULL;
  cr_assert_eq(mn_group_new_local(2, 10, &group), MN_OK);
  call c[2] = {{.group = group, .rank = 0, .n = 3}, {.group = group, .rank = 1, .n = 4}};
  pthread_t t[2];
  for (int i = 0; i < 2; i++)
    cr_assert_eq(pthread_create(&t[i], NULL, all_reduce_main, &c[i]), 0);
  for (int i = 0; i < 2; i++)
    pthread_join(t[i], NULL);
  for (int i = 0; i < 2; i++) {
    cr_expect_eq(c[i].status, MN_ERR_STATE, "rank %d: %s", i, c[i].error);
    cr_expect(strstr(c[i].error, "different collectives") != NULL, "%s", c[i].error);
  }
  /* The group stays broken. */
  float x = 0;
  cr_expect_eq(mn_all_reduce(group, 0, &x, 1, MN_REDUCE_SUM), MN_ERR_STATE);
  mn_group_free(group);
}

Test(data_parallel, two_sessions_of_one_rank_are_refused) {
  setup u = {.ranks = 2, .accum = 1, .rounds = 1, .opt = SGD};
  rank_run runs[2] = {{.u = &u, .rank = 0, .world_size = 2, .hid = HID},
                      {.u = &u, .rank = 0, .world_size = 2, .hid = HID}};
  run_group(runs, 2, 2, 0.3);
  bool twice = strstr(runs[0].error, "joined twice") || strstr(runs[1].error, "joined twice");
  cr_expect(twice, "\"%s\" / \"%s\"", runs[0].error, runs[1].error);
}

Test(data_parallel, options_a_group_cannot_take) {
  mn_group *group = NULL;
  cr_assert_eq(mn_group_new_local(1, 1, &group), MN_OK);
  mn_graph *g = mlp(TOTAL, HID);
  mn_session_options o = mn_session_options_default();
  o.backend = MN_BACKEND_CPU;
  o.group = group;
  o.world_size = 1;
  mn_session *s = NULL;
  cr_expect_eq(mn_build_inference_session(g, &o, &s), MN_ERR_INVALID_ARGUMENT);
  cr_expect(strstr(mn_last_error(), "inference") != NULL, "%s", mn_last_error());
  o.rank = 1;
  cr_expect_eq(mn_build_session(g, &o, &s), MN_ERR_INVALID_ARGUMENT);
  cr_expect(strstr(mn_last_error(), "rank = 1") != NULL, "%s", mn_last_error());
  cr_expect_eq(mn_group_new_local(0, 1, &group), MN_ERR_INVALID_ARGUMENT);
  mn_graph_free(g);
  mn_group_free(o.group);
}

/* F16: a step whose gradients overflow on one rank is skipped by every rank, so the ranks keep
 * one loss scale and one model; the steps that do not overflow train as in F32. */
Test(data_parallel, f16_ranks_skip_the_steps_any_rank_overflows) {
  setup u = {.ranks = 2, .accum = 1, .rounds = ROUNDS, .opt = SGD, .f16 = true};
  rank_run runs[MAX_RANKS];
  run_ranks(&u, runs);
  uint64_t calm = runs[0].skipped;
  cr_expect_eq(runs[1].skipped, calm);
  cr_expect(memcmp(runs[0].params, runs[1].params, sizeof runs[0].params) == 0,
            "F16 ranks' parameters differ");
  u.blowup_round = 2;
  run_ranks(&u, runs);
  cr_expect_gt(runs[0].skipped, calm, "rank 1's overflow skipped nothing on rank 0 (%llu, %llu)",
               (unsigned long long)runs[0].skipped, (unsigned long long)calm);
  cr_expect_eq(runs[0].skipped, runs[1].skipped, "skipped steps %llu and %llu",
               (unsigned long long)runs[0].skipped, (unsigned long long)runs[1].skipped);
  cr_expect_eq(runs[0].loss_scale, runs[1].loss_scale, "loss scales %g and %g",
               (double)runs[0].loss_scale, (double)runs[1].loss_scale);
  cr_expect(memcmp(runs[0].params, runs[1].params, sizeof runs[0].params) == 0,
            "the ranks' parameters differ after an overflow on one of them");
}

/* ------------------------------------------------------------------ the plan and NCCL */

/* Buckets cover every gradient element once, become final in order, and start with the last
 * layer's gradients, which the backward pass finishes first. */
Test(data_parallel, the_bucket_plan_follows_the_backward_pass) {
  mn_graph *g = mlp(TOTAL, HID);
  mn_session *s = mn_test_session(g, MN_BACKEND_CPU, true);
  mn_group *group = NULL;
  cr_assert_eq(mn_group_new_local(1, 1, &group), MN_OK);
  const mn_plan *p = s->plan;
  for (size_t bytes = 4; bytes <= MN_DP_BUCKET_BYTES; bytes *= 1024) {
    mn_dp *dp = NULL;
    cr_assert_eq(mn_dp_new(p, group, 0, false, bytes, &dp), MN_OK);
    unsigned char *seen = calloc(dp->flat, 1);
    size_t covered = 0;
    for (size_t b = 0; b < dp->num_buckets; b++) {
      const mn_dp_bucket *k = &dp->buckets[b];
      if (b) cr_expect_geq(k->ready_after, dp->buckets[b - 1].ready_after);
      for (size_t r = k->first; r < k->first + k->num; r++)
        for (size_t i = 0; i < dp->ranges[r].count; i++) {
          cr_expect_eq(seen[dp->ranges[r].offset + i]++, 0, "element covered twice");
          covered++;
        }
    }
    cr_expect_eq(covered, (size_t)NUM_PARAMS);
    if (bytes == 4) cr_expect_eq(dp->num_buckets, 4u, "one gradient a bucket");
    if (bytes == MN_DP_BUCKET_BYTES) cr_expect_eq(dp->num_buckets, 1u);
    /* The first gradient final is b2's or w2's. */
    size_t first = dp->ranges[0].count;
    cr_expect(first == OUT || first == HID * OUT, "first bucket starts with %zu elements", first);
    free(seen);
    mn_dp_free(dp);
  }
  mn_group_free(group);
  mn_session_free(s);
  mn_graph_free(g);
}

Test(data_parallel, a_missing_nccl_is_named) {
  mn_nccl api;
  cr_expect_eq(mn_nccl_open("libnccl-absent.so.2", &api), MN_ERR_UNSUPPORTED);
  cr_expect(strstr(mn_last_error(), "libnccl-absent.so.2") != NULL, "%s", mn_last_error());
  cr_expect_null(api.handle);
  /* Criterion runs each test in its own process: this one's NCCL is the missing library. */
  setenv("MN_NCCL_LIBRARY", "/nonexistent/libnccl.so.2", 1);
  mn_group_id id;
  cr_expect_eq(mn_group_id_new(&id), MN_ERR_UNSUPPORTED);
  cr_expect(strstr(mn_last_error(), "libnccl.so.2") != NULL, "%s", mn_last_error());
  const mn_nccl *n = NULL;
  cr_expect_eq(mn_nccl_get(&n), MN_ERR_UNSUPPORTED);
  cr_expect(strstr(mn_nccl_error(), "NCCL is not available") != NULL, "%s", mn_nccl_error());
}

/* Where NCCL is installed, every function resolves and an id can be made. */
Test(data_parallel, an_installed_nccl_resolves_every_function) {
  mn_nccl api;
  if (mn_nccl_open(MN_NCCL_LIBRARY, &api) != MN_OK) {
    cr_expect(strstr(mn_last_error(), MN_NCCL_LIBRARY) != NULL, "%s", mn_last_error());
    return;
  }
  cr_expect_not_null(api.get_error_string);
  cr_expect_not_null(api.comm_init_rank);
  cr_expect_str_eq(api.get_error_string(0), "no error");
  /* ncclGetUniqueId needs no device: rank 0's id for the others. */
  mn_group_id id = {{0}}, zero = {{0}};
  cr_expect_eq(mn_group_id_new(&id), MN_OK, "%s", mn_last_error());
  cr_expect(memcmp(id.bytes, zero.bytes, sizeof id.bytes) != 0, "the id is all zeros");
}

Test(data_parallel, mn_group_new_nccl_checks_its_arguments) {
  mn_group_id id = {{0}};
  mn_group *g = (mn_group *)&id;
  cr_expect_eq(mn_group_new_nccl(&id, 2, 0, 0, 1, NULL), MN_ERR_INVALID_ARGUMENT);
  cr_expect(strstr(mn_last_error(), "out is NULL") != NULL, "%s", mn_last_error());
  cr_expect_eq(mn_group_new_nccl(NULL, 2, 0, 0, 1, &g), MN_ERR_INVALID_ARGUMENT);
  cr_expect_null(g, "a failed call leaves *out NULL");
  cr_expect(strstr(mn_last_error(), "id is NULL") != NULL, "%s", mn_last_error());
  cr_expect_eq(mn_group_new_nccl(&id, 0, 0, 0, 1, &g), MN_ERR_INVALID_ARGUMENT);
  cr_expect(strstr(mn_last_error(), "world_size = 0") != NULL, "%s", mn_last_error());
  cr_expect_eq(mn_group_new_nccl(&id, 2, 2, 0, 1, &g), MN_ERR_INVALID_ARGUMENT);
  cr_expect(strstr(mn_last_error(), "rank = 2") != NULL, "%s", mn_last_error());
  cr_expect_eq(mn_group_new_nccl(&id, 2, -1, 0, 1, &g), MN_ERR_INVALID_ARGUMENT);
  /* Valid arguments need NCCL, then CUDA, then a usable device. */
  mn_status st = mn_group_new_nccl(&id, 1, 0, 1 << 20, 1, &g);
  cr_expect(st == MN_ERR_UNSUPPORTED || st == MN_ERR_DEVICE, "status %d: %s", st, mn_last_error());
  cr_expect_null(g);
}

Test(data_parallel, a_group_id_is_shared_through_a_file) {
  mn_tmp_dir t = mn_tmp_dir_make("mn_dp_id");
  const char *path = mn_tmp_path(&t, "id");
  mn_group_id none;
  cr_expect_eq(mn_group_id_share_file(path, 1, 0.1, &none), MN_ERR_STATE);
  cr_expect(strstr(mn_last_error(), "waited") != NULL, "%s", mn_last_error());
  mn_group_id id, got;
  for (size_t i = 0; i < sizeof id.bytes; i++)
    id.bytes[i] = (unsigned char)(i * 7 + 1);
  cr_assert_eq(mn_group_id_share_file(path, 0, 1, &id), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_group_id_share_file(path, 1, 1, &got), MN_OK, "%s", mn_last_error());
  cr_expect(memcmp(id.bytes, got.bytes, sizeof id.bytes) == 0);
  cr_expect_eq(mn_tmp_dir_count(&t, ".tmp"), 0);
  mn_tmp_dir_remove(&t);
}

static void clear_launcher_env(void) {
  const char *vars[] = {"RANK",
                        "WORLD_SIZE",
                        "LOCAL_RANK",
                        "MASTER_ADDR",
                        "MASTER_PORT",
                        "SLURM_PROCID",
                        "SLURM_NTASKS",
                        "SLURM_LOCALID",
                        "OMPI_COMM_WORLD_RANK",
                        "OMPI_COMM_WORLD_SIZE",
                        "OMPI_COMM_WORLD_LOCAL_RANK"};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
    unsetenv(vars[i]);
}

Test(data_parallel, the_launcher_environment_is_read) {
  clear_launcher_env();
  mn_launch_env e;
  cr_expect_eq(mn_launch_env_read(&e), MN_ERR_NOT_FOUND);
  setenv("SLURM_PROCID", "3", 1);
  setenv("SLURM_NTASKS", "8", 1);
  setenv("SLURM_LOCALID", "1", 1);
  cr_assert_eq(mn_launch_env_read(&e), MN_OK, "%s", mn_last_error());
  cr_expect_str_eq(e.launcher, "slurm");
  cr_expect(e.rank == 3 && e.world_size == 8 && e.local_rank == 1);
  /* torchrun's variables come first. */
  setenv("RANK", "1", 1);
  setenv("WORLD_SIZE", "2", 1);
  setenv("MASTER_ADDR", "node7", 1);
  setenv("MASTER_PORT", "29500", 1);
  cr_assert_eq(mn_launch_env_read(&e), MN_OK, "%s", mn_last_error());
  cr_expect_str_eq(e.launcher, "torchrun");
  cr_expect(e.rank == 1 && e.world_size == 2 && e.local_rank == 0);
  cr_expect_str_eq(e.master_addr, "node7");
  cr_expect_eq(e.master_port, 29500);
  setenv("RANK", "2", 1);
  cr_expect_eq(mn_launch_env_read(&e), MN_ERR_INVALID_ARGUMENT);
  cr_expect(strstr(mn_last_error(), "RANK=2") != NULL, "%s", mn_last_error());
  setenv("RANK", "x", 1);
  cr_expect_eq(mn_launch_env_read(&e), MN_ERR_INVALID_ARGUMENT);
  cr_expect(strstr(mn_last_error(), "RANK=\"x\"") != NULL, "%s", mn_last_error());
  clear_launcher_env();
  setenv("OMPI_COMM_WORLD_RANK", "0", 1);
  setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
  cr_assert_eq(mn_launch_env_read(&e), MN_OK, "%s", mn_last_error());
  cr_expect_str_eq(e.launcher, "mpi");
  cr_expect_eq(e.world_size, 4);
  clear_launcher_env();
}
