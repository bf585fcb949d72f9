/* Timing for the step benchmarks: CUDA events on the session's stream around batches of
 * steps, after a warm-up, reporting the median per-step time. On a CPU session (no CUDA
 * build or no device) a monotonic host clock is used instead. */
#ifndef MN_BENCH_UTIL_H
#define MN_BENCH_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "meganeura.h"
#ifdef MN_WITH_CUDA
#include <cuda_runtime_api.h>

#include "cuda/cuda_backend.h"
#endif

static inline double bench_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static inline int bench_cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static inline void bench_check(mn_status st, const char *what) {
  if (st == MN_OK) return;
  fprintf(stderr, "%s: %s (%s)\n", what, mn_status_string(st), mn_last_error());
  exit(1);
}

/* Median milliseconds per step over `reps` batches of `batch` steps. */
static inline double bench_steps_ms(mn_session *s, int warmup, int reps, int batch) {
  for (int i = 0; i < warmup; i++)
    bench_check(mn_session_step(s), "step");
  bench_check(mn_session_wait(s), "wait");
  double *ms = malloc((size_t)reps * sizeof *ms);
#ifdef MN_WITH_CUDA
  cudaStream_t stream = (cudaStream_t)mn_cuda_session_stream(s);
  cudaEvent_t start, stop;
  if (stream) {
    cudaEventCreate(&start);
    cudaEventCreate(&stop);
  }
#endif
  for (int r = 0; r < reps; r++) {
    double t0 = bench_now_ms();
#ifdef MN_WITH_CUDA
    if (stream) cudaEventRecord(start, stream);
#endif
    for (int i = 0; i < batch; i++)
      bench_check(mn_session_step(s), "step");
#ifdef MN_WITH_CUDA
    if (stream) cudaEventRecord(stop, stream);
#endif
    bench_check(mn_session_wait(s), "wait");
    ms[r] = (bench_now_ms() - t0) / batch;
#ifdef MN_WITH_CUDA
    if (stream) {
      float elapsed = 0;
      cudaEventElapsedTime(&elapsed, start, stop);
      ms[r] = elapsed / batch;
    }
#endif
  }
#ifdef MN_WITH_CUDA
  if (stream) {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
  }
#endif
  qsort(ms, (size_t)reps, sizeof *ms, bench_cmp);
  double median = ms[reps / 2];
  free(ms);
  return median;
}

/* Session build time with an empty kernel cache (cold) and with the cache it filled
 * (warm), in a private cache folder so other runs do not interfere. */
typedef mn_graph *(*bench_graph_fn)(void);
static inline void bench_build_times(bench_graph_fn make, const mn_session_options *o,
                                     double *cold_ms, double *warm_ms, bool *warm_hit) {
  char dir[] = "/tmp/mn-bench-cache-XXXXXX";
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    exit(1);
  }
  const char *old = getenv("MN_CACHE_DIR");
  char *saved = old ? strdup(old) : NULL;
  setenv("MN_CACHE_DIR", dir, 1);
  mn_graph *g = make();
  for (int pass = 0; pass < 2; pass++) {
    mn_session *s = NULL;
    double t0 = bench_now_ms();
    bench_check(mn_build_session(g, o, &s), "build");
    double t = bench_now_ms() - t0;
    mn_session_stats st;
    mn_session_get_stats(s, &st);
    if (pass == 0)
      *cold_ms = t;
    else {
      *warm_ms = t;
      *warm_hit = st.kernel_cache_hit;
    }
    mn_session_free(s);
  }
  mn_graph_free(g);
  if (saved) {
    setenv("MN_CACHE_DIR", saved, 1);
    free(saved);
  } else {
    unsetenv("MN_CACHE_DIR");
  }
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

#endif
