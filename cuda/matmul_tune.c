#include "cuda/matmul_tune.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "host/error.h"

#define TUNE_KEY     192
#define TUNE_ENTRIES 512
#define TUNE_RUNS    5

typedef struct tune_entry {
  char key[TUNE_KEY];
  cublasLtMatmulAlgo_t algo;
} tune_entry;

static tune_entry entries[TUNE_ENTRIES];
static size_t num_entries;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

bool mn_cu_tune_on(void) {
  const char *v = getenv("MN_MATMUL_TUNE");
  return v && strcmp(v, "1") == 0;
}

static bool recall(const char *key, cublasLtMatmulAlgo_t *algo) {
  bool found = false;
  pthread_mutex_lock(&lock);
  for (size_t i = 0; i < num_entries && !found; i++)
    if (strcmp(entries[i].key, key) == 0) {
      *algo = entries[i].algo;
      found = true;
    }
  pthread_mutex_unlock(&lock);
  return found;
}

/* A full table keeps what it has: later products are timed again, not forgotten. */
static void remember(const char *key, const cublasLtMatmulAlgo_t *algo) {
  pthread_mutex_lock(&lock);
  if (num_entries < TUNE_ENTRIES) {
    snprintf(entries[num_entries].key, TUNE_KEY, "%s", key);
    entries[num_entries++].algo = *algo;
  }
  pthread_mutex_unlock(&lock);
}

/* Mean milliseconds of TUNE_RUNS runs after one untimed; a negative value when it fails. */
static float time_candidate(cuda_state *st, mn_cu_tune_run run, void *ctx,
                            const cublasLtMatmulAlgo_t *algo, cudaEvent_t t0, cudaEvent_t t1) {
  if (run(ctx, algo) != CUBLAS_STATUS_SUCCESS) return -1.0f;
  cudaEventRecord(t0, st->stream);
  for (int i = 0; i < TUNE_RUNS; i++)
    if (run(ctx, algo) != CUBLAS_STATUS_SUCCESS) return -1.0f;
  cudaEventRecord(t1, st->stream);
  float ms = -1.0f;
  if (cudaEventSynchronize(t1) != cudaSuccess || cudaEventElapsedTime(&ms, t0, t1) != cudaSuccess)
    return -1.0f;
  return ms / TUNE_RUNS;
}

mn_status mn_cu_tune_pick(cuda_state *st, const char *key,
                          const cublasLtMatmulHeuristicResult_t *cand, int n, mn_cu_tune_run run,
                          void *ctx, cublasLtMatmulAlgo_t *algo) {
  if (recall(key, algo)) return MN_OK;
  cudaEvent_t t0 = NULL, t1 = NULL;
  if (cudaEventCreate(&t0) != cudaSuccess || cudaEventCreate(&t1) != cudaSuccess) {
    if (t0) cudaEventDestroy(t0);
    cudaGetLastError();
    return mn_fail(MN_ERR_DEVICE, "cuda backend: timing matmul candidates: no events");
  }
  float best = -1.0f;
  for (int i = 0; i < n; i++) {
    if (cand[i].state != CUBLAS_STATUS_SUCCESS || cand[i].workspaceSize > st->workspace_bytes)
      continue;
    float ms = time_candidate(st, run, ctx, &cand[i].algo, t0, t1);
    if (ms >= 0.0f && (best < 0.0f || ms < best)) {
      best = ms;
      *algo = cand[i].algo;
    }
  }
  cudaEventDestroy(t0);
  cudaEventDestroy(t1);
  /* A candidate that failed to run may leave an error behind; the chosen one ran. */
  cudaGetLastError();
  if (best >= 0.0f) remember(key, algo);
  return MN_OK;
}
