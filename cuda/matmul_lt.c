/* Matmuls through cuBLASLt. The plan describes row-major products; cuBLASLt is
 * column-major, so C[m,n] = A.B is computed as C^T[n,m] = B^T.A^T: the operands swap
 * and each row-major matrix is read as its column-major transpose. Algorithms are chosen
 * once, here, at session build (large matmuls by timing the heuristic's candidates);
 * capture only enqueues. */
#include <stdlib.h>
#include <string.h>

#include "../host/error.h"
#include "cuda_state.h"

#define MN_LT_WORKSPACE_BYTES (32u << 20)

static mn_status lt_check(cublasStatus_t s, const char *what) {
  if (s == CUBLAS_STATUS_SUCCESS) return MN_OK;
  return mn_fail(s == CUBLAS_STATUS_ALLOC_FAILED ? MN_ERR_OUT_OF_MEMORY : MN_ERR_DEVICE,
                 "cuda backend: cuBLASLt %s: %s", what, cublasLtGetStatusString(s));
}

/* A row-major [rows, cols] matrix seen column-major: cols x rows with leading dim cols. */
static mn_status make_layout(cublasLtMatrixLayout_t *l, int64_t rows, int64_t cols, int64_t batch,
                             int64_t stride, int64_t pitch) {
  mn_status rc = lt_check(cublasLtMatrixLayoutCreate(l, CUDA_R_32F, (uint64_t)cols, (uint64_t)rows,
                                                     pitch ? pitch : cols),
                          "layout");
  if (rc != MN_OK || batch <= 1) return rc;
  int32_t count = (int32_t)batch;
  rc = lt_check(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                                 sizeof count),
                "batch count");
  if (rc == MN_OK)
    rc = lt_check(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                   &stride, sizeof stride),
                  "batch stride");
  return rc;
}

static uint32_t alignment_of(uintptr_t addr) {
  uint32_t a = 256;
  while (a > 4 && addr % a)
    a /= 2;
  return a;
}

/* Candidates asked of the heuristic; matmuls of at least MN_LT_TUNE_MIN_FLOPS time each
 * candidate on the session's own buffers (at build, before any value is set) and keep the
 * fastest: for shapes such as GPT-2's 50257-wide head the heuristic's first choice can be
 * far from the best. MN_MATMUL_AUTOTUNE=0 keeps the heuristic's first choice. */
#define MN_LT_CANDIDATES     8
#define MN_LT_TUNE_MIN_FLOPS 4e9
#define MN_LT_TUNE_REPS      3

/* Algorithms already timed in this build, by everything that decides the choice. */
typedef struct tuned_key {
  int64_t m, n, k, batch, stride_a, stride_b, stride_c, lda, ldb, ldc;
  uint32_t align_a, align_b, align_c;
  bool trans_a, trans_b, accumulate;
} tuned_key;

typedef struct tuned {
  tuned_key key;
  cublasLtMatmulAlgo_t algo;
} tuned;

typedef struct tuned_cache {
  tuned *items;
  size_t count, cap;
} tuned_cache;

static const tuned *tuned_find(const tuned_cache *tc, const tuned_key *k) {
  for (size_t i = 0; i < tc->count; i++)
    if (memcmp(&tc->items[i].key, k, sizeof *k) == 0) return &tc->items[i];
  return NULL;
}

/* Remembering is an optimization: without memory the next matmul is timed again. */
static void tuned_add(tuned_cache *tc, const tuned_key *k, const cublasLtMatmulAlgo_t *algo) {
  if (tc->count == tc->cap) {
    size_t cap = tc->cap ? 2 * tc->cap : 16;
    tuned *items = realloc(tc->items, cap * sizeof *items);
    if (!items) return;
    tc->items = items;
    tc->cap = cap;
  }
  tc->items[tc->count++] = (tuned){*k, *algo};
}

static bool tuning_enabled(void) {
  const char *e = getenv("MN_MATMUL_AUTOTUNE");
  return !e || strcmp(e, "0") != 0;
}

static mn_status enqueue_with(cuda_state *st, const mn_session *s, const mn_cu_cmd *cmd,
                              const mn_cu_matmul_plan *mp, const cublasLtMatmulAlgo_t *algo) {
  const mn_cu_matmul_desc *d = &cmd->mm;
  void *c = mn_cu_resolve(st, s, d->c);
  return lt_check(cublasLtMatmul(st->lt, mp->desc, &d->alpha, mn_cu_resolve(st, s, d->b), mp->b,
                                 mn_cu_resolve(st, s, d->a), mp->a, &d->beta, c, mp->c, c, mp->c,
                                 algo, st->workspace, st->workspace_bytes, st->stream),
                  "matmul");
}

/* Times every usable candidate (one warm-up, then the best of MN_LT_TUNE_REPS runs) and
 * keeps the fastest in mp->algo. A candidate that fails to run is skipped. */
static mn_status fastest(cuda_state *st, const mn_session *s, const mn_cu_cmd *cmd,
                         mn_cu_matmul_plan *mp, const cublasLtMatmulHeuristicResult_t *results,
                         int found) {
  cudaEvent_t start, stop;
  mn_status rc = mn_cu_check(cudaEventCreate(&start), "creating an event");
  if (rc != MN_OK) return rc;
  rc = mn_cu_check(cudaEventCreate(&stop), "creating an event");
  if (rc != MN_OK) {
    cudaEventDestroy(start);
    return rc;
  }
  float best = -1.0f;
  for (int i = 0; i < found && rc == MN_OK; i++) {
    if (results[i].state != CUBLAS_STATUS_SUCCESS ||
        results[i].workspaceSize > st->workspace_bytes ||
        enqueue_with(st, s, cmd, mp, &results[i].algo) != MN_OK)
      continue;
    float ms = -1.0f;
    for (int r = 0; r < MN_LT_TUNE_REPS && rc == MN_OK; r++) {
      float t = 0;
      rc = mn_cu_check(cudaEventRecord(start, st->stream), "recording an event");
      if (rc == MN_OK) rc = enqueue_with(st, s, cmd, mp, &results[i].algo);
      if (rc == MN_OK) rc = mn_cu_check(cudaEventRecord(stop, st->stream), "recording an event");
      if (rc == MN_OK) rc = mn_cu_check(cudaEventSynchronize(stop), "timing a matmul");
      if (rc == MN_OK) rc = mn_cu_check(cudaEventElapsedTime(&t, start, stop), "timing a matmul");
      if (rc == MN_OK && (ms < 0 || t < ms)) ms = t;
    }
    if (rc == MN_OK && ms >= 0 && (best < 0 || ms < best)) {
      best = ms;
      mp->algo = results[i].algo;
    }
  }
  cudaGetLastError();
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return rc;
}

static mn_status prepare_one(cuda_state *st, const mn_session *s, const mn_cu_cmd *cmd,
                             mn_cu_matmul_plan *mp, tuned_cache *tc) {
  const mn_cu_matmul_desc *d = &cmd->mm;
  cublasComputeType_t compute =
      s->options.allow_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  mn_status rc = lt_check(cublasLtMatmulDescCreate(&mp->desc, compute, CUDA_R_32F), "descriptor");
  /* Operand 1 of cuBLASLt is our B, operand 2 our A. */
  cublasOperation_t op_b = d->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t op_a = d->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  if (rc == MN_OK)
    rc = lt_check(
        cublasLtMatmulDescSetAttribute(mp->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_b, sizeof op_b),
        "transpose");
  if (rc == MN_OK)
    rc = lt_check(
        cublasLtMatmulDescSetAttribute(mp->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_a, sizeof op_a),
        "transpose");
  /* Stored shapes, row-major: B is [k,n] or [n,k]; A is [m,k] or [k,m]; C is [m,n]. */
  if (rc == MN_OK)
    rc = make_layout(&mp->b, d->trans_b ? d->n : d->k, d->trans_b ? d->k : d->n, d->batch,
                     d->stride_b, d->ldb);
  if (rc == MN_OK)
    rc = make_layout(&mp->a, d->trans_a ? d->k : d->m, d->trans_a ? d->m : d->k, d->batch,
                     d->stride_a, d->lda);
  if (rc == MN_OK) rc = make_layout(&mp->c, d->m, d->n, d->batch, d->stride_c, d->ldc);
  if (rc != MN_OK) return rc;

  cublasLtMatmulPreference_t pref;
  rc = lt_check(cublasLtMatmulPreferenceCreate(&pref), "preference");
  if (rc != MN_OK) return rc;
  uint64_t ws = st->workspace_bytes;
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                       sizeof ws);
  /* Every batch's matrix must be as aligned as promised, not only the first. */
  uintptr_t batched = d->batch > 1;
  uint32_t align_b = alignment_of((uintptr_t)mn_cu_resolve(st, s, d->b) |
                                  (batched * (uintptr_t)d->stride_b * sizeof(float))),
           align_a = alignment_of((uintptr_t)mn_cu_resolve(st, s, d->a) |
                                  (batched * (uintptr_t)d->stride_a * sizeof(float))),
           align_c = alignment_of((uintptr_t)mn_cu_resolve(st, s, d->c) |
                                  (batched * (uintptr_t)d->stride_c * sizeof(float)));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_b,
                                       sizeof align_b);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_a,
                                       sizeof align_a);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c,
                                       sizeof align_c);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c,
                                       sizeof align_c);
  cublasLtMatmulHeuristicResult_t results[MN_LT_CANDIDATES];
  int found = 0;
  rc = lt_check(cublasLtMatmulAlgoGetHeuristic(st->lt, mp->desc, mp->b, mp->a, mp->c, mp->c, pref,
                                               MN_LT_CANDIDATES, results, &found),
                "algorithm search");
  cublasLtMatmulPreferenceDestroy(pref);
  if (rc != MN_OK) return rc;
  if (found < 1)
    return mn_fail(MN_ERR_UNSUPPORTED,
                   "cuda backend: cuBLASLt has no algorithm for node %u (%s): m %lld n %lld k "
                   "%lld batch %lld",
                   cmd->node, mn_op_name(s->plan->graph->nodes[cmd->node].op), (long long)d->m,
                   (long long)d->n, (long long)d->k, (long long)d->batch);
  mp->algo = results[0].algo;
  double flops = 2.0 * (double)d->m * (double)d->n * (double)d->k * (double)d->batch;
  if (found < 2 || flops < MN_LT_TUNE_MIN_FLOPS || !tuning_enabled()) return MN_OK;
  tuned_key key;
  memset(&key, 0, sizeof key); /* padding bytes take part in memcmp */
  key.m = d->m;
  key.n = d->n;
  key.k = d->k;
  key.batch = d->batch;
  key.stride_a = d->stride_a;
  key.stride_b = d->stride_b;
  key.stride_c = d->stride_c;
  key.lda = d->lda;
  key.ldb = d->ldb;
  key.ldc = d->ldc;
  key.align_a = align_a;
  key.align_b = align_b;
  key.align_c = align_c;
  key.trans_a = d->trans_a;
  key.trans_b = d->trans_b;
  key.accumulate = d->beta != 0.0f;
  const tuned *known = tuned_find(tc, &key);
  if (known) {
    mp->algo = known->algo;
    return MN_OK;
  }
  rc = fastest(st, s, cmd, mp, results, found);
  if (rc == MN_OK) tuned_add(tc, &key, &mp->algo);
  return rc;
}

mn_status mn_cu_matmuls_prepare(cuda_state *st, const mn_session *s) {
  bool any = false;
  for (size_t i = 0; i < st->prog.num_cmds; i++)
    any = any || st->prog.cmds[i].kind == MN_CU_CMD_MATMUL;
  if (!any) return MN_OK;
  mn_status rc = lt_check(cublasLtCreate(&st->lt), "handle");
  if (rc != MN_OK) return rc;
  st->workspace_bytes = MN_LT_WORKSPACE_BYTES;
  rc = mn_cu_check(cudaMalloc(&st->workspace, st->workspace_bytes), "the cuBLASLt workspace");
  if (rc != MN_OK) return rc;
  st->matmuls = calloc(st->prog.num_cmds, sizeof *st->matmuls);
  if (!st->matmuls) return mn_fail(MN_ERR_OUT_OF_MEMORY, "cuda backend: out of host memory");
  tuned_cache tc = {0};
  for (size_t i = 0; i < st->prog.num_cmds && rc == MN_OK; i++)
    if (st->prog.cmds[i].kind == MN_CU_CMD_MATMUL)
      rc = prepare_one(st, s, &st->prog.cmds[i], &st->matmuls[i], &tc);
  free(tc.items);
  return rc;
}

void mn_cu_matmuls_destroy(cuda_state *st) {
  for (size_t i = 0; st->matmuls && i < st->prog.num_cmds; i++) {
    mn_cu_matmul_plan *mp = &st->matmuls[i];
    if (mp->desc) cublasLtMatmulDescDestroy(mp->desc);
    if (mp->a) cublasLtMatrixLayoutDestroy(mp->a);
    if (mp->b) cublasLtMatrixLayoutDestroy(mp->b);
    if (mp->c) cublasLtMatrixLayoutDestroy(mp->c);
  }
  free(st->matmuls);
  st->matmuls = NULL;
}

mn_status mn_cu_matmul_enqueue(cuda_state *st, const mn_session *s, size_t cmd) {
  const mn_cu_matmul_plan *mp = &st->matmuls[cmd];
  return enqueue_with(st, s, &st->prog.cmds[cmd], mp, &mp->algo);
}
