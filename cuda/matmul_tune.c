#include "cuda/matmul_tune.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/jit.h"
#include "host/error.h"

#define TUNE_KEY     320
#define TUNE_ENTRIES 1024
#define TUNE_RUNS    5
/* A product whose runs take less than TUNE_SMALL_MS each is timed again over TUNE_RUNS_SMALL
 * runs, so that the events' resolution does not decide between candidates microseconds apart. */
#define TUNE_SMALL_MS   0.02f
#define TUNE_RUNS_SMALL 50
#define TUNE_FILE       "matmul-tune-v1.txt"

typedef struct tune_entry {
  char key[TUNE_KEY];
  cublasLtMatmulAlgo_t algo;
} tune_entry;

static tune_entry entries[TUNE_ENTRIES];
static size_t num_entries;
static bool file_read;
static size_t timings;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

double mn_cu_tune_min_flops(void) {
  const char *v = getenv("MN_MATMUL_TUNE");
  if (v && strcmp(v, "0") == 0) return INFINITY;
  return v && strcmp(v, "all") == 0 ? 0.0 : MN_TUNE_MIN_FLOPS;
}

int mn_cu_tune_candidates(void) {
  const char *v = getenv("MN_MATMUL_TUNE_CANDIDATES");
  int n = v ? atoi(v) : MN_TUNE_CANDIDATES;
  return n < 1 ? MN_TUNE_CANDIDATES : n > MN_TUNE_MAX_CANDIDATES ? MN_TUNE_MAX_CANDIDATES : n;
}

/* Per device ordinal, its card string once known (cudaGetDeviceProperties is slow to ask for
 * every product). */
#define TUNE_DEVICES 64
static char cards[TUNE_DEVICES][160];

void mn_cu_tune_card(int device, char *out, size_t size) {
  bool cached = device >= 0 && device < TUNE_DEVICES;
  pthread_mutex_lock(&lock);
  if (cached && cards[device][0]) {
    snprintf(out, size, "%s", cards[device]);
    pthread_mutex_unlock(&lock);
    return;
  }
  pthread_mutex_unlock(&lock);
  struct cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    cudaGetLastError();
    snprintf(out, size, "device%d/?/%zu", device, cublasLtGetVersion());
    return;
  }
  snprintf(out, size, "%s/%d/%zu", prop.name, prop.multiProcessorCount, cublasLtGetVersion());
  if (!cached) return;
  pthread_mutex_lock(&lock);
  snprintf(cards[device], sizeof cards[device], "%s", out);
  pthread_mutex_unlock(&lock);
}

static bool cache_path(char *out, size_t size) {
  char folder[4096];
  if (!mn_cu_cache_folder(NULL, folder, sizeof folder)) return false;
  int n = snprintf(out, size, "%s/%s", folder, TUNE_FILE);
  return n > 0 && (size_t)n < size;
}

/* The algorithm's bytes as hex, and back. */
static void to_hex(const cublasLtMatmulAlgo_t *algo, char *out) {
  const unsigned char *b = (const unsigned char *)algo;
  for (size_t i = 0; i < sizeof *algo; i++)
    snprintf(out + 2 * i, 3, "%02x", b[i]);
}
static bool from_hex(const char *s, cublasLtMatmulAlgo_t *algo) {
  const size_t digits = 2 * sizeof *algo;
  if (strspn(s, "0123456789abcdef") != digits || (s[digits] != '\0' && s[digits] != '\n'))
    return false;
  unsigned char *b = (unsigned char *)algo;
  for (size_t i = 0; i < sizeof *algo; i++) {
    unsigned v;
    if (sscanf(s + 2 * i, "%2x", &v) != 1) return false;
    b[i] = (unsigned char)v;
  }
  return true;
}

/* Under the lock: key's entry, or NULL. */
static tune_entry *find(const char *key) {
  for (size_t i = 0; i < num_entries; i++)
    if (strcmp(entries[i].key, key) == 0) return &entries[i];
  return NULL;
}

/* Under the lock: sets key's algorithm. A full table keeps what it has: later products are
 * timed again. */
static void set(const char *key, const cublasLtMatmulAlgo_t *algo) {
  tune_entry *e = find(key);
  if (e) {
    e->algo = *algo;
    return;
  }
  if (num_entries == TUNE_ENTRIES) return;
  snprintf(entries[num_entries].key, TUNE_KEY, "%s", key);
  entries[num_entries++].algo = *algo;
}

/* Under the lock: the file's lines "key<TAB>hex", the last line of a key winning (a choice timed
 * again because the one before no longer applied is appended after it). */
static void read_file(void) {
  file_read = true;
  char path[4200];
  if (!cache_path(path, sizeof path)) return;
  FILE *f = fopen(path, "r");
  if (!f) return;
  char line[TUNE_KEY + 2 * sizeof(cublasLtMatmulAlgo_t) + 8];
  while (fgets(line, sizeof line, f)) {
    char *tab = strchr(line, '\t');
    cublasLtMatmulAlgo_t algo;
    if (!tab || (size_t)(tab - line) >= TUNE_KEY) continue;
    *tab = '\0';
    if (from_hex(tab + 1, &algo)) set(line, &algo);
  }
  fclose(f);
}

/* Best effort: a choice not written is timed again by the next process. */
static void append_file(const char *key, const cublasLtMatmulAlgo_t *algo) {
  char path[4200], hex[2 * sizeof *algo + 1];
  if (!cache_path(path, sizeof path)) return;
  to_hex(algo, hex);
  FILE *f = fopen(path, "a");
  if (!f) return;
  fprintf(f, "%s\t%s\n", key, hex);
  fclose(f);
}

static bool recall(const char *key, cublasLtMatmulAlgo_t *algo) {
  pthread_mutex_lock(&lock);
  if (!file_read) read_file();
  const tune_entry *e = find(key);
  if (e) *algo = e->algo;
  pthread_mutex_unlock(&lock);
  return e != NULL;
}

/* The timed choice for key. Another session of this process that timed the same product at the
 * same time and got there first wins, so that all of them run one algorithm (*algo becomes its
 * choice); a choice that replaces a stale one (`stale`) is kept and written. */
static void remember(const char *key, cublasLtMatmulAlgo_t *algo, bool stale) {
  pthread_mutex_lock(&lock);
  tune_entry *e = find(key);
  if (e && !stale) {
    *algo = e->algo;
  } else {
    set(key, algo);
    append_file(key, algo);
  }
  pthread_mutex_unlock(&lock);
}

size_t mn_cu_tune_timings(void) {
  pthread_mutex_lock(&lock);
  size_t n = timings;
  pthread_mutex_unlock(&lock);
  return n;
}

void mn_cu_tune_forget(void) {
  pthread_mutex_lock(&lock);
  num_entries = 0;
  file_read = false;
  pthread_mutex_unlock(&lock);
}

/* Mean milliseconds of `runs` runs after one untimed; negative when a run fails. */
static float time_candidate(cuda_state *st, mn_cu_tune_run run, void *ctx,
                            const cublasLtMatmulAlgo_t *algo, int runs, cudaEvent_t t0,
                            cudaEvent_t t1) {
  if (run(ctx, algo) != CUBLAS_STATUS_SUCCESS) return -1.0f;
  cudaEventRecord(t0, st->stream);
  for (int i = 0; i < runs; i++)
    if (run(ctx, algo) != CUBLAS_STATUS_SUCCESS) return -1.0f;
  cudaEventRecord(t1, st->stream);
  float ms = -1.0f;
  if (cudaEventSynchronize(t1) != cudaSuccess || cudaEventElapsedTime(&ms, t0, t1) != cudaSuccess)
    return -1.0f;
  return ms / (float)runs;
}

mn_status mn_cu_tune_pick(cuda_state *st, const char *key,
                          const cublasLtMatmulHeuristicResult_t *cand, int n, mn_cu_tune_run run,
                          mn_cu_tune_applies applies, void *ctx, cublasLtMatmulAlgo_t *algo,
                          bool *timed) {
  *timed = false;
  cublasLtMatmulAlgo_t known;
  bool stale = recall(key, &known);
  if (stale && applies(ctx, &known)) {
    *algo = known;
    return MN_OK;
  }
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
    float ms = time_candidate(st, run, ctx, &cand[i].algo, TUNE_RUNS, t0, t1);
    if (ms >= 0.0f && ms < TUNE_SMALL_MS)
      ms = time_candidate(st, run, ctx, &cand[i].algo, TUNE_RUNS_SMALL, t0, t1);
    if (ms >= 0.0f && (best < 0.0f || ms < best)) {
      best = ms;
      *algo = cand[i].algo;
    }
  }
  cudaEventDestroy(t0);
  cudaEventDestroy(t1);
  /* A candidate that failed to run may leave an error behind; the chosen one ran. */
  cudaGetLastError();
  *timed = true;
  pthread_mutex_lock(&lock);
  timings++;
  pthread_mutex_unlock(&lock);
  if (best >= 0.0f) remember(key, algo, stale);
  return MN_OK;
}
