/* Matmuls through cuBLASLt. The plan describes row-major products; cuBLASLt is
 * column-major, so C[m,n] = A.B is computed as C^T[n,m] = B^T.A^T: the operands swap
 * and each row-major matrix is read as its column-major transpose. Algorithms are chosen
 * once, here, at session build (the heuristic's first choice: timing its candidates was
 * tried and bought about 1%, docs/performance.md); capture only enqueues. */
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

static mn_status prepare_one(cuda_state *st, const mn_session *s, const mn_cu_cmd *cmd,
                             mn_cu_matmul_plan *mp) {
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
  cublasLtMatmulHeuristicResult_t result;
  int found = 0;
  rc = lt_check(cublasLtMatmulAlgoGetHeuristic(st->lt, mp->desc, mp->b, mp->a, mp->c, mp->c, pref,
                                               1, &result, &found),
                "algorithm search");
  cublasLtMatmulPreferenceDestroy(pref);
  if (rc != MN_OK) return rc;
  if (found < 1)
    return mn_fail(MN_ERR_UNSUPPORTED,
                   "cuda backend: cuBLASLt has no algorithm for node %u (%s): m %lld n %lld k "
                   "%lld batch %lld",
                   cmd->node, mn_op_name(s->plan->graph->nodes[cmd->node].op), (long long)d->m,
                   (long long)d->n, (long long)d->k, (long long)d->batch);
  mp->algo = result.algo;
  return MN_OK;
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
  for (size_t i = 0; i < st->prog.num_cmds && rc == MN_OK; i++)
    if (st->prog.cmds[i].kind == MN_CU_CMD_MATMUL)
      rc = prepare_one(st, s, &st->prog.cmds[i], &st->matmuls[i]);
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
  const mn_cu_matmul_desc *d = &st->prog.cmds[cmd].mm;
  mn_cu_matmul_plan *mp = &st->matmuls[cmd];
  void *c = mn_cu_resolve(st, s, d->c);
  return lt_check(cublasLtMatmul(st->lt, mp->desc, &d->alpha, mn_cu_resolve(st, s, d->b), mp->b,
                                 mn_cu_resolve(st, s, d->a), mp->a, &d->beta, c, mp->c, c, mp->c,
                                 &mp->algo, st->workspace, st->workspace_bytes, st->stream),
                  "matmul");
}
