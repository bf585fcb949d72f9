/* Data-parallel training steps on several GPUs of one machine (issue 21): GPT-2 124M (or the
 * SmolLM2-135M shape), AdamW, per-GPU batch 16 x 1024 in bf16 by default, N ranks as N
 * threads of this process, each with its own CUDA device (rank r on device r), session and
 * NCCL group (one mn_group_id_new per world size, mn_group_new_nccl on every thread).
 *
 * usage: bench_dp_step [gpt2|smollm2] [--gpus LIST] [--batch B] [--seq T] [--steps N]
 *        [--warmup W] [--precision f32|tf32|bf16] [--zero1]
 * --gpus is a comma-separated list of world sizes (default 1,2,4); one rank is always run
 * first, as the baseline, and a size above the usable devices is skipped. Each size prints a
 * BENCH line: the median step time over N steps (default 10) after W (default 3), taken with
 * CUDA events on each rank's session stream and the slowest rank's median kept; tokens/s of
 * the whole group; the speed-up over one GPU; and the exposed communication, the step time
 * at N ranks minus at one (what NCCL adds that the backward pass does not hide), beside the
 * all-reduce of the whole gradient block alone through the same group (median over as many
 * calls). Each size of 2 or more ranks is then run again with MN_DP_OVERLAP=0 (every bucket
 * reduced after the backward pass, on the compute stream): hidden_ms, that step minus the
 * overlapped one, is what the overlap hides. A table of the same comes last. Needs NCCL
 * (libnccl.so.2 or MN_NCCL_LIBRARY); set NCCL_NVLS_ENABLE=0 where NVLink multicast is not
 * available. */
#include <pthread.h>

#include "benchmarks/bench_util.h"
#include "benchmarks/lm_configs.h"
#include "host/collective.h"
#include "host/error.h"
#include "session/session.h"
#ifdef MN_WITH_CUDA
#include "cuda/nccl_group.h"
#endif

#ifndef MN_WITH_CUDA
int main(void) {
  fprintf(stderr, "bench_dp_step: needs a build with the CUDA backend\n");
  return 1;
}
#else

enum { MAX_WORLDS = 8, MAX_RANKS = 16 };

typedef struct bench_args {
  const char *model;
  long batch, seq, steps, warmup;
  mn_precision precision;
  bool tf32, zero1;
  const char *precision_name;
} bench_args;

typedef struct rank_job {
  pthread_t thread;
  int rank, world;
  const mn_group_id *id;
  const bench_args *b;
  const mn_model_config *cfg;
  double step_ms;
  double allreduce_ms; /* the whole gradient block all-reduced alone, on the session's stream */
  float loss;
  bool ok;
  char error[512];
} rank_job;

/* Records why this rank stopped and breaks the group, so that the other ranks stop too. */
static void *fail(rank_job *j, mn_group *g, const char *what) {
  snprintf(j->error, sizeof j->error, "rank %d: %s: %s", j->rank, what, mn_last_error());
  mn_group_abort(g, j->error);
  return NULL;
}

static int by_value(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return (x > y) - (x < y);
}

/* What the step's collectives cost with nothing to hide behind: the session's whole flat
 * gradient block (what its buckets carry) all-reduced (mean) through the group on the session's
 * stream, the median of `steps` after `warmup`. Every rank makes the same calls. */
static mn_status time_allreduce(rank_job *j, mn_group *g, mn_session *s) {
  size_t n = s->plan->update_bytes / sizeof(float);
  cudaStream_t stream = mn_cuda_session_stream(s);
  float *buf = NULL, *ms = calloc((size_t)j->b->steps, sizeof *ms);
  cudaEvent_t ev[2] = {NULL, NULL};
  mn_status st = ms && n && cudaMalloc((void **)&buf, n * sizeof *buf) == cudaSuccess &&
                         cudaMemsetAsync(buf, 0, n * sizeof *buf, stream) == cudaSuccess &&
                         cudaEventCreate(&ev[0]) == cudaSuccess &&
                         cudaEventCreate(&ev[1]) == cudaSuccess
                     ? MN_OK
                     : mn_fail(MN_ERR_DEVICE, "cannot set up %zu floats to all-reduce", n);
  for (long r = -j->b->warmup; st == MN_OK && r < j->b->steps; r++) {
    cudaEventRecord(ev[0], stream);
    st = mn_all_reduce(g, j->rank, buf, n, MN_REDUCE_MEAN);
    cudaEventRecord(ev[1], stream);
    /* The group's watchdog wait: a rank that failed before its call is an error, not a hang. */
    if (st == MN_OK) st = mn_cu_nccl_wait(g, stream, "the all-reduce alone");
    if (st == MN_OK && r >= 0) cudaEventElapsedTime(&ms[r], ev[0], ev[1]);
  }
  if (st == MN_OK) {
    qsort(ms, (size_t)j->b->steps, sizeof *ms, by_value);
    j->allreduce_ms = ms[j->b->steps / 2];
  }
  for (int i = 0; i < 2; i++)
    if (ev[i]) cudaEventDestroy(ev[i]);
  cudaFree(buf);
  free(ms);
  return st;
}

static void *rank_main(void *arg) {
  rank_job *j = arg;
  const bench_args *b = j->b;
  mn_group *g = NULL;
  if (mn_group_new_nccl(j->id, j->world, j->rank, j->rank, 120, &g) != MN_OK)
    return fail(j, NULL, "mn_group_new_nccl");
  mn_graph *graph = NULL;
  mn_session *s = NULL;
  mn_model_options mo = {.loss_only = true};
  mn_session_options o = mn_session_options_default();
  o.backend = MN_BACKEND_CUDA;
  o.device = j->rank;
  o.precision = b->precision;
  o.allow_tf32 = b->tf32;
  o.group = g;
  o.rank = j->rank;
  o.world_size = j->world;
  o.zero1 = b->zero1;
  size_t bt = (size_t)(b->batch * b->seq);
  uint32_t *ids = malloc(2 * bt * sizeof *ids);
  if (!ids) {
    snprintf(j->error, sizeof j->error, "rank %d: out of memory", j->rank);
    mn_group_abort(g, j->error);
  } else if (mn_model_build_with(j->cfg, b->batch, b->seq, &mo, &graph) != MN_OK) {
    fail(j, g, "model");
  } else if (mn_build_session(graph, &o, &s) != MN_OK) {
    fail(j, g, "build");
  } else if (mn_model_init_parameters(j->cfg, graph, s, 1) != MN_OK ||
             mn_session_set_adamw(s, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f) != MN_OK) {
    fail(j, g, "init");
  } else {
    /* Each rank its own batch. */
    uint64_t rng = 42 + (uint64_t)j->rank;
    for (size_t i = 0; i < 2 * bt; i++) {
      rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
      ids[i] = (uint32_t)((rng >> 33) % (uint64_t)j->cfg->vocab_size);
    }
    if (mn_session_set_input_u32(s, "input_ids", ids, bt) != MN_OK ||
        mn_session_set_input_u32(s, "labels", ids + bt, bt) != MN_OK) {
      fail(j, g, "inputs");
    } else {
      /* The events of bench_steps_ms live on this thread's current device. */
      cudaSetDevice(j->rank);
      j->step_ms = bench_steps_ms(s, (int)b->warmup, (int)b->steps, 1);
      j->loss = mn_session_read_loss(s);
      /* ZeRO-1 steps reduce-scatter and gather instead (never overlapped): nothing to compare. */
      j->ok = j->world == 1 || b->zero1 || time_allreduce(j, g, s) == MN_OK;
      if (!j->ok) fail(j, g, "the all-reduce alone");
    }
  }
  free(ids);
  mn_session_free(s);
  mn_graph_free(graph);
  mn_group_free(g);
  return NULL;
}

/* One world size: the slowest rank's median step time, or a negative value on failure. */
static double run_world(const bench_args *b, const mn_model_config *cfg, int world, float *loss,
                        double *allreduce_ms) {
  mn_group_id id;
  bench_check(mn_group_id_new(&id), "mn_group_id_new");
  rank_job jobs[MAX_RANKS] = {{0}};
  int started = 0;
  for (; started < world; started++) {
    rank_job *j = &jobs[started];
    *j = (rank_job){.rank = started, .world = world, .id = &id, .b = b, .cfg = cfg};
    if (pthread_create(&j->thread, NULL, rank_main, j) != 0) {
      fprintf(stderr, "bench_dp_step: cannot start rank %d's thread\n", started);
      break;
    }
  }
  double worst = started == world ? 0 : -1;
  for (int r = 0; r < started; r++) {
    pthread_join(jobs[r].thread, NULL);
    if (!jobs[r].ok) {
      fprintf(stderr, "bench_dp_step: %d ranks: %s\n", world,
              jobs[r].error[0] ? jobs[r].error : "stopped by another rank");
      worst = -1;
    } else if (worst >= 0 && jobs[r].step_ms > worst) {
      worst = jobs[r].step_ms;
    }
    if (jobs[r].ok && jobs[r].allreduce_ms > *allreduce_ms) *allreduce_ms = jobs[r].allreduce_ms;
  }
  *loss = jobs[0].loss;
  return worst;
}

static int parse_worlds(const char *list, int *worlds) {
  int n = 0;
  worlds[n++] = 1;
  for (const char *p = list; *p;) {
    char *end = NULL;
    long w = strtol(p, &end, 10);
    if (end == p || w < 1 || w > MAX_RANKS || (*end && *end != ',')) return -1;
    bool seen = false;
    for (int i = 0; i < n; i++)
      seen = seen || worlds[i] == w;
    if (!seen && n < MAX_WORLDS) worlds[n++] = (int)w;
    p = *end ? end + 1 : end;
  }
  return n;
}

static const char USAGE[] =
    "usage: bench_dp_step [gpt2|smollm2] [--gpus LIST] [--batch B] [--seq T] [--steps N] "
    "[--warmup W] [--precision f32|tf32|bf16] [--zero1]\n";

static int parse_args(int argc, char **argv, bench_args *b, const char **gpus) {
  int i = 1;
  if (i < argc && argv[i][0] != '-') b->model = argv[i++];
  if (strcmp(b->model, "gpt2") && strcmp(b->model, "smollm2")) return -1;
  for (; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(a, "--zero1") == 0) {
      b->zero1 = true;
      continue;
    }
    if (!v) return -1;
    i++;
    if (strcmp(a, "--gpus") == 0)
      *gpus = v;
    else if (strcmp(a, "--batch") == 0)
      b->batch = atol(v);
    else if (strcmp(a, "--seq") == 0)
      b->seq = atol(v);
    else if (strcmp(a, "--steps") == 0)
      b->steps = atol(v);
    else if (strcmp(a, "--warmup") == 0)
      b->warmup = atol(v);
    else if (strcmp(a, "--precision") == 0 &&
             (!strcmp(v, "f32") || !strcmp(v, "tf32") || !strcmp(v, "bf16"))) {
      b->precision_name = v;
      b->tf32 = strcmp(v, "tf32") == 0;
      b->precision = strcmp(v, "bf16") == 0 ? MN_PRECISION_BF16 : MN_PRECISION_F32;
    } else
      return -1;
  }
  return b->batch > 0 && b->seq > 0 && b->steps > 0 && b->warmup >= 0 ? 0 : -1;
}

int main(int argc, char **argv) {
  bench_args b = {.model = "gpt2",
                  .batch = 16,
                  .seq = 1024,
                  .steps = 10,
                  .warmup = 3,
                  .precision = MN_PRECISION_BF16,
                  .precision_name = "bf16"};
  const char *gpus = "1,2,4";
  int worlds[MAX_WORLDS];
  int n_worlds = -1;
  if (parse_args(argc, argv, &b, &gpus) != 0 || (n_worlds = parse_worlds(gpus, worlds)) < 0) {
    fputs(USAGE, stderr);
    return 2;
  }
  mn_model_config cfg;
  bench_check(
      mn_model_config_parse(strcmp(b.model, "gpt2") == 0 ? MN_BENCH_GPT2 : MN_BENCH_SMOLLM2, &cfg),
      "config");
  int devices = mn_cuda_usable_devices();
  double ms[MAX_WORLDS], comm[MAX_WORLDS] = {0}, serial[MAX_WORLDS] = {0};
  int failed = 0;
  for (int w = 0; w < n_worlds; w++) {
    ms[w] = -1;
    if (worlds[w] > devices) {
      printf("SKIP dp_%s ranks=%d: %d usable CUDA device%s\n", b.model, worlds[w], devices,
             devices == 1 ? "" : "s");
      continue;
    }
    float loss = 0;
    ms[w] = run_world(&b, &cfg, worlds[w], &loss, &comm[w]);
    if (ms[w] < 0) {
      printf("BENCH-FAILED dp_%s ranks=%d\n", b.model, worlds[w]);
      failed = 1;
      continue;
    }
    if (worlds[w] > 1 && !b.zero1) { /* ZeRO-1 never overlaps: nothing to compare */
      float serial_loss = 0;
      double unused = 0;
      setenv("MN_DP_OVERLAP", "0", 1);
      serial[w] = run_world(&b, &cfg, worlds[w], &serial_loss, &unused);
      unsetenv("MN_DP_OVERLAP");
      if (serial[w] < 0) {
        printf("BENCH-FAILED dp_%s ranks=%d with MN_DP_OVERLAP=0\n", b.model, worlds[w]);
        failed = 1;
        serial[w] = 0;
      }
    }
    double tps = (double)worlds[w] * (double)(b.batch * b.seq) / (ms[w] * 1e-3);
    double one = ms[0] > 0 ? (double)(b.batch * b.seq) / (ms[0] * 1e-3) : 0;
    double exposed = ms[0] > 0 ? ms[w] - ms[0] : 0.0;
    printf("BENCH dp_%s_%s%s ranks=%d batch=%ld seq=%ld step_ms=%.3f tokens_per_s=%.0f "
           "scaling=%.3f exposed_comm_ms=%.3f allreduce_alone_ms=%.3f serial_step_ms=%.3f "
           "hidden_ms=%.3f loss=%.4f\n",
           b.model, b.precision_name, b.zero1 ? "_zero1" : "", worlds[w], b.batch, b.seq, ms[w],
           tps, one > 0 ? tps / one : 0.0, exposed, comm[w], serial[w],
           serial[w] > 0 ? serial[w] - ms[w] : 0.0, loss);
    fflush(stdout);
  }
  printf("\n%s %s%s, per-GPU batch %ld x %ld, median of %ld steps after %ld\n", b.model,
         b.precision_name, b.zero1 ? " ZeRO-1" : "", b.batch, b.seq, b.steps, b.warmup);
  printf("%6s %10s %12s %10s %11s %16s %14s %14s %10s\n", "ranks", "step ms", "tokens/s",
         "x one GPU", "efficiency", "exposed comm ms", "all-reduce ms", "serial step ms",
         "hidden ms");
  for (int w = 0; w < n_worlds; w++) {
    if (ms[w] < 0) {
      printf("%6d %10s\n", worlds[w], worlds[w] > devices ? "skipped" : "failed");
      continue;
    }
    double tps = (double)worlds[w] * (double)(b.batch * b.seq) / (ms[w] * 1e-3);
    double x = ms[0] > 0 ? tps / ((double)(b.batch * b.seq) / (ms[0] * 1e-3)) : 0;
    double exposed = ms[0] > 0 ? ms[w] - ms[0] : 0.0;
    printf("%6d %10.2f %12.0f %10.2f %10.0f%% %16.2f %14.2f %14.2f %10.2f\n", worlds[w], ms[w], tps,
           x, 100.0 * x / worlds[w], exposed, comm[w], serial[w],
           serial[w] > 0 ? serial[w] - ms[w] : 0.0);
  }
  return failed;
}
#endif
