/* Matmuls through cuBLASLt. The plan describes row-major products; cuBLASLt is
 * column-major, so C[m,n] = A.B is computed as C^T[n,m] = B^T.A^T: the operands swap
 * and each row-major matrix is read as its column-major transpose. Algorithms are chosen
 * once, here, at session build: for large products the fastest of the heuristic's candidates,
 * measured (matmul_tune.h; MN_MATMUL_TUNE=0: the heuristic's first choice), for the others its
 * first choice; capture only enqueues.
 *
 * Epilogues (emit.h) are asked for first; when cuBLASLt has no algorithm for one, or its
 * documented restrictions rule it out, the product runs plain and the fallback commands
 * the lowering put after it compute the epilogue instead. */
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_state.h"
#include "cuda/matmul_tune.h"
#include "cuda/storage_layout.h"
#include "host/error.h"

static mn_status lt_check(cublasStatus_t s, const char *what) {
  if (s == CUBLAS_STATUS_SUCCESS) return MN_OK;
  return mn_fail(s == CUBLAS_STATUS_ALLOC_FAILED ? MN_ERR_OUT_OF_MEMORY : MN_ERR_DEVICE,
                 "cuda backend: cuBLASLt %s: %s", what, cublasLtGetStatusString(s));
}

/* The element type of an operand as stored, and its size. */
static cudaDataType_t data_type(const mn_session *s, mn_cu_arg a) {
  switch (mn_cu_arg_storage(s->plan, a)) {
  case MN_DEV_BF16: return CUDA_R_16BF;
  case MN_DEV_F16: return CUDA_R_16F;
  default: return CUDA_R_32F;
  }
}
static uintptr_t elem_size(const mn_session *s, mn_cu_arg a) {
  return mn_cu_arg_storage(s->plan, a) == MN_DEV_F32 ? 4 : 2;
}

/* Operands in bf16 / fp16 (a low-precision session) multiply on tensor cores and accumulate
 * in fp32; fp32 operands do so in TF32 only when allowed. */
static mn_status create_desc(const mn_session *s, const mn_cu_matmul_desc *d,
                             mn_cu_matmul_plan *mp) {
  cublasComputeType_t compute = s->options.allow_tf32 && data_type(s, d->a) == CUDA_R_32F
                                    ? CUBLAS_COMPUTE_32F_FAST_TF32
                                    : CUBLAS_COMPUTE_32F;
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
  return rc;
}

/* A row-major [rows, cols] matrix seen column-major: cols x rows with leading dim cols. */
static mn_status make_layout(cublasLtMatrixLayout_t *l, cudaDataType_t type, int64_t rows,
                             int64_t cols, int64_t batch, int64_t stride, int64_t pitch) {
  mn_status rc = lt_check(
      cublasLtMatrixLayoutCreate(l, type, (uint64_t)cols, (uint64_t)rows, pitch ? pitch : cols),
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

/* In cuBLASLt's terms. Its operand A is our B and its B our A, and its D is our C^T
 * [n x m]: so the column sums of our A (over k) are its bias gradient of B, one per column
 * of D, and those of our B its bias gradient of A, one per row of D. */
static cublasLtEpilogue_t lt_epilogue(mn_cu_epilogue e) {
  switch (e) {
  case MN_CU_EPI_BIAS: return CUBLASLT_EPILOGUE_BIAS;
  case MN_CU_EPI_BIAS_RELU: return CUBLASLT_EPILOGUE_RELU_BIAS;
  case MN_CU_EPI_BIAS_GELU: return CUBLASLT_EPILOGUE_GELU_BIAS;
  case MN_CU_EPI_DGELU: return CUBLASLT_EPILOGUE_DGELU;
  case MN_CU_EPI_BGRAD_A: return CUBLASLT_EPILOGUE_BGRADB;
  case MN_CU_EPI_BGRAD_B: return CUBLASLT_EPILOGUE_BGRADA;
  case MN_CU_EPI_NONE: break;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

/* MN_CUDA_EPILOGUES_OFF=NAME[,NAME...] (bias, bias_relu, bias_gelu, dgelu, bgrad, or all):
 * those epilogues run as their fallback commands, so that one can be timed against the other
 * in the same build (docs/performance.md). Read at each session build. */
static bool switched_off(mn_cu_epilogue e) {
  const char *list = getenv("MN_CUDA_EPILOGUES_OFF");
  if (!list || !*list) return false;
  const char *name = NULL;
  switch (e) {
  case MN_CU_EPI_BIAS: name = "bias"; break;
  case MN_CU_EPI_BIAS_RELU: name = "bias_relu"; break;
  case MN_CU_EPI_BIAS_GELU: name = "bias_gelu"; break;
  case MN_CU_EPI_DGELU: name = "dgelu"; break;
  case MN_CU_EPI_BGRAD_A:
  case MN_CU_EPI_BGRAD_B: name = "bgrad"; break;
  case MN_CU_EPI_NONE: return false;
  }
  for (const char *p = list; *p;) {
    size_t len = strcspn(p, ",");
    if ((len == 3 && strncmp(p, "all", 3) == 0) ||
        (len == strlen(name) && strncmp(p, name, len) == 0))
      return true;
    p += len + (p[len] == ',');
  }
  return false;
}

/* A bias-gradient product whose dy holds at least this many values, in rows of 8k, runs plain
 * and its column sums as a pass of their own (mn_red_sum_rows_vec, at the card's bandwidth):
 * with the epilogue GPT-2's [768, 2304], [768, 768] and [3072, 768] weight gradients ran at 441,
 * 349 and 579 TFLOP/s on an H200, the plain products around them at 674-699
 * (docs/performance.md). Smaller ones keep it, where the sums' two launches cost more than it
 * does. MN_CUDA_BGRAD_PLAIN_MIN=N moves the line, so that one can be timed against the other. */
#define BGRAD_PLAIN_MIN 4194304.0

static bool bgrad_runs_plain(const mn_cu_matmul_desc *d) {
  const char *env = getenv("MN_CUDA_BGRAD_PLAIN_MIN");
  char *end = NULL;
  double min = env && *env ? strtod(env, &end) : BGRAD_PLAIN_MIN;
  if (end && (end == env || *end)) min = BGRAD_PLAIN_MIN; /* not a number: the default */
  int64_t cols = d->epilogue == MN_CU_EPI_BGRAD_B ? d->n : d->m;
  return cols % 8 == 0 && (double)d->k * (double)cols >= min;
}

/* The restrictions cuBLASLt documents for these epilogues, checked here rather than left
 * to the heuristic: vectors 16-byte aligned; the gelu input's leading dimension (our row
 * pitch, since our rows are its columns) a multiple of 8 and at least its row count n;
 * BGRADA only with A not transposed, BGRADB only with B transposed (its A is our B, its B
 * our A). Epilogues here are never batched. Also those switched off; NULL when none applies. */
static const char *epilogue_ruled_out(const mn_cu_matmul_desc *d, uintptr_t bias, uintptr_t aux) {
  if (switched_off(d->epilogue)) return "switched off by MN_CUDA_EPILOGUES_OFF";
  if (d->batch > 1) return "a batched product";
  if (bias % 16) return "a bias vector not 16-byte aligned";
  switch (d->epilogue) {
  case MN_CU_EPI_DGELU:
    if (aux % 16) return "a gelu input not 16-byte aligned";
    if (d->aux_ld % 8 || d->aux_ld < d->n)
      return "a gelu input row pitch below n or not a multiple of 8";
    break;
  case MN_CU_EPI_BGRAD_A:
    if (!d->trans_a) return "bias gradient of an A that is not transposed";
    if (bgrad_runs_plain(d)) return "a bias gradient large enough for a pass of its own";
    break;
  case MN_CU_EPI_BGRAD_B:
    if (d->trans_b) return "bias gradient of a transposed B";
    if (bgrad_runs_plain(d)) return "a bias gradient large enough for a pass of its own";
    break;
  default: break;
  }
  return NULL;
}

/* Sets (or, with CUBLASLT_EPILOGUE_DEFAULT and NULL pointers, clears) the epilogue. The
 * heuristic reads the pointers' values for their alignment, so they are the real ones. */
static cublasStatus_t set_epilogue(cublasLtMatmulDesc_t desc, cublasLtEpilogue_t epi, void *bias,
                                   int32_t bias_type, void *aux, int64_t aux_ld) {
  uint32_t e = (uint32_t)epi;
  cublasStatus_t r =
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e);
  if (r == CUBLAS_STATUS_SUCCESS)
    r = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
  if (r == CUBLAS_STATUS_SUCCESS && bias)
    r = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                       sizeof bias_type);
  if (r == CUBLAS_STATUS_SUCCESS)
    r = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux,
                                       sizeof aux);
  if (r == CUBLAS_STATUS_SUCCESS && aux)
    r = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld,
                                       sizeof aux_ld);
  return r;
}

/* The heuristic's first choice into mp->algo; *found says whether there is one. */
static cublasStatus_t first_algo(cuda_state *st, mn_cu_matmul_plan *mp,
                                 cublasLtMatmulPreference_t pref, int *found) {
  cublasLtMatmulHeuristicResult_t result;
  *found = 0;
  cublasStatus_t r = cublasLtMatmulAlgoGetHeuristic(st->lt, mp->desc, mp->b, mp->a, mp->c, mp->c,
                                                    pref, 1, &result, found);
  if (r == CUBLAS_STATUS_SUCCESS && *found > 0) mp->algo = result.algo;
  return r;
}

/* Asks for the epilogue and sets mp->fused when cuBLASLt has an algorithm for it. When it
 * has none (some versions answer NOT_SUPPORTED rather than an empty list, so any refusal
 * but running out of memory counts), the descriptor is made plain again; that is an error
 * only when the lowering gave no fallback. */
/* One attempt at the epilogue with the given bias vector and its type; mp->fused says whether
 * cuBLASLt has an algorithm for it. */
static cublasStatus_t epilogue_attempt(cuda_state *st, const mn_cu_matmul_desc *d,
                                       mn_cu_matmul_plan *mp, cublasLtMatmulPreference_t pref,
                                       void *bias, int32_t bias_type, void *aux) {
  int found = 0;
  cublasStatus_t r =
      set_epilogue(mp->desc, lt_epilogue(d->epilogue), bias, bias_type, aux, d->aux_ld);
  if (r == CUBLAS_STATUS_SUCCESS) r = first_algo(st, mp, pref, &found);
  mp->fused = r == CUBLAS_STATUS_SUCCESS && found > 0;
  return r;
}

/* The bias vector has its argument's storage: a low-precision session reads matmul_bias_act's
 * bias in bf16 / fp16 (the parameter's low-precision copy), a bias gradient is fp32. A
 * refused attempt leaves attributes behind that later searches trip over, so the descriptor
 * is made anew for the plain product. */
static mn_status try_epilogue(cuda_state *st, const mn_session *s, const mn_cu_cmd *cmd,
                              mn_cu_matmul_plan *mp, cublasLtMatmulPreference_t pref) {
  const mn_cu_matmul_desc *d = &cmd->mm;
  void *bias = mn_cu_resolve(st, s, d->bias), *aux = mn_cu_resolve(st, s, d->aux);
  const char *why = epilogue_ruled_out(d, (uintptr_t)bias, (uintptr_t)aux);
  if (!why) {
    cublasStatus_t r = epilogue_attempt(st, d, mp, pref, bias, data_type(s, d->bias), aux);
    if (r == CUBLAS_STATUS_ALLOC_FAILED) return lt_check(r, "algorithm search");
    if (mp->fused) return MN_OK;
    why = r == CUBLAS_STATUS_SUCCESS ? "no algorithm for it" : cublasLtGetStatusString(r);
    cublasLtMatmulDescDestroy(mp->desc);
    mp->desc = NULL;
    mn_status rc = create_desc(s, d, mp);
    if (rc != MN_OK) return rc;
  }
  if (d->fallback_cmds > 0) return MN_OK;
  return mn_fail(MN_ERR_DEVICE,
                 "cuda backend: node %u (%s): cuBLASLt cannot apply the %s epilogue (%s: m %lld "
                 "n %lld k %lld) and the lowering gave no fallback",
                 cmd->node, mn_op_name(s->plan->graph->nodes[cmd->node].op),
                 mn_cu_epilogue_name(d->epilogue), why, (long long)d->m, (long long)d->n,
                 (long long)d->k);
}

/* What a timing run of one product needs. */
typedef struct tune_ctx {
  cuda_state *st;
  const mn_session *s;
  const mn_cu_matmul_desc *d;
  mn_cu_matmul_plan *mp;
} tune_ctx;

/* The product on the session stream with `algo`: what a step runs, and each timing run. */
static cublasStatus_t run_product(cuda_state *st, const mn_session *s, const mn_cu_matmul_desc *d,
                                  const mn_cu_matmul_plan *mp, const cublasLtMatmulAlgo_t *algo) {
  void *c = mn_cu_resolve(st, s, mp->plain_to_fallback ? d->c_fallback : d->c);
  return cublasLtMatmul(st->lt, mp->desc, &d->alpha, mn_cu_resolve(st, s, d->b), mp->b,
                        mn_cu_resolve(st, s, d->a), mp->a, &d->beta, c, mp->c, c, mp->c, algo,
                        st->workspace, st->workspace_bytes, st->stream);
}

static cublasStatus_t tune_run(void *ctx, const cublasLtMatmulAlgo_t *algo) {
  const tune_ctx *t = ctx;
  return run_product(t->st, t->s, t->d, t->mp, algo);
}

static bool tune_applies(void *ctx, const cublasLtMatmulAlgo_t *algo) {
  const tune_ctx *t = ctx;
  cublasLtMatmulHeuristicResult_t r;
  return cublasLtMatmulAlgoCheck(t->st->lt, t->mp->desc, t->mp->b, t->mp->a, t->mp->c, t->mp->c,
                                 algo, &r) == CUBLAS_STATUS_SUCCESS &&
         r.workspaceSize <= t->st->workspace_bytes;
}

/* Bytes of a stored row-major matrix of `rows` rows of `cols` (row pitch ld, 0: dense). */
static size_t stored_bytes(const mn_session *s, mn_cu_arg a, int64_t rows, int64_t cols,
                           int64_t ld) {
  return (size_t)rows * (size_t)(ld ? ld : cols) * (size_t)elem_size(s, a);
}

/* The measured choice for a large, unbatched product (matmul_tune.h). Timing runs write the
 * product's output (and a bias gradient) before any step: they are zeroed after, so that a
 * session reads as it would without them (gradients zero before the first step). */
static mn_status tune(cuda_state *st, const mn_session *s, const mn_cu_matmul_desc *d,
                      mn_cu_matmul_plan *mp, cublasLtMatmulPreference_t pref,
                      const uint32_t align[3]) {
  /* A product whose plain result goes to scratch is not timed: scratch is sized after the
   * algorithms are chosen (fit_scratch in cuda_backend.c). */
  if (d->batch > 1 || mp->plain_to_fallback || mn_cu_matmul_flops(d) < mn_cu_tune_min_flops())
    return MN_OK;
  cublasLtMatmulHeuristicResult_t cand[MN_TUNE_MAX_CANDIDATES];
  int found = 0;
  cublasStatus_t r = cublasLtMatmulAlgoGetHeuristic(st->lt, mp->desc, mp->b, mp->a, mp->c, mp->c,
                                                    pref, mn_cu_tune_candidates(), cand, &found);
  if (r != CUBLAS_STATUS_SUCCESS || found < 2) return MN_OK;
  mn_cu_arg c = d->c;
  char card[160], key[320];
  mn_cu_tune_card(st->device, card, sizeof card);
  snprintf(key, sizeof key, "%s|%lld %lld %lld|%d%d|%d %d %d|%d|%lld %lld %lld|%u %u %u|%g %g|%d",
           card, (long long)d->m, (long long)d->n, (long long)d->k, d->trans_a, d->trans_b,
           (int)data_type(s, d->a), (int)data_type(s, d->b), (int)data_type(s, c),
           mp->fused ? (int)d->epilogue : 0, (long long)d->lda, (long long)d->ldb,
           (long long)d->ldc, align[0], align[1], align[2], (double)d->alpha, (double)d->beta,
           (int)s->options.allow_tf32);
  tune_ctx ctx = {st, s, d, mp};
  bool timed = false;
  mn_status rc =
      mn_cu_tune_pick(st, key, cand, found, tune_run, tune_applies, &ctx, &mp->algo, &timed);
  if (rc != MN_OK || !timed) return rc;
  rc = mn_cu_check(cudaMemsetAsync(mn_cu_resolve(st, s, c), 0,
                                   stored_bytes(s, c, d->m, d->n, d->ldc), st->stream),
                   "clearing a timed product's output");
  bool bgrad = d->epilogue == MN_CU_EPI_BGRAD_A || d->epilogue == MN_CU_EPI_BGRAD_B;
  if (rc == MN_OK && mp->fused && bgrad)
    rc =
        mn_cu_check(cudaMemsetAsync(mn_cu_resolve(st, s, d->bias), 0,
                                    stored_bytes(s, d->bias, 1,
                                                 d->epilogue == MN_CU_EPI_BGRAD_A ? d->m : d->n, 0),
                                    st->stream),
                    "clearing a timed product's bias gradient");
  return rc;
}

static mn_status prepare_one(cuda_state *st, const mn_session *s, const mn_cu_cmd *cmd,
                             mn_cu_matmul_plan *mp) {
  const mn_cu_matmul_desc *d = &cmd->mm;
  cudaDataType_t ta = data_type(s, d->a), tb = data_type(s, d->b), tc = data_type(s, d->c);
  mn_status rc = create_desc(s, d, mp);
  /* Stored shapes, row-major: B is [k,n] or [n,k]; A is [m,k] or [k,m]; C is [m,n]. */
  if (rc == MN_OK)
    rc = make_layout(&mp->b, tb, d->trans_b ? d->n : d->k, d->trans_b ? d->k : d->n, d->batch,
                     d->stride_b, d->ldb);
  if (rc == MN_OK)
    rc = make_layout(&mp->a, ta, d->trans_a ? d->k : d->m, d->trans_a ? d->m : d->k, d->batch,
                     d->stride_a, d->lda);
  if (rc == MN_OK) rc = make_layout(&mp->c, tc, d->m, d->n, d->batch, d->stride_c, d->ldc);
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
                                  (batched * (uintptr_t)d->stride_b * elem_size(s, d->b))),
           align_a = alignment_of((uintptr_t)mn_cu_resolve(st, s, d->a) |
                                  (batched * (uintptr_t)d->stride_a * elem_size(s, d->a))),
           align_c = alignment_of((uintptr_t)mn_cu_resolve(st, s, d->c) |
                                  (batched * (uintptr_t)d->stride_c * elem_size(s, d->c)));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_b,
                                       sizeof align_b);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_a,
                                       sizeof align_a);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c,
                                       sizeof align_c);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c,
                                       sizeof align_c);
  /* Experiments only: which split-k reductions the heuristic may choose (a
   * cublasLtReductionScheme_t mask; 0: products in one kernel, 1: reduced in place). */
  const char *schemes = getenv("MN_CUDA_SPLITK_MASK");
  if (schemes && *schemes) {
    uint32_t mask = (uint32_t)strtoul(schemes, NULL, 0);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &mask,
                                         sizeof mask);
  }
  int found = 0;
  if (d->epilogue != MN_CU_EPI_NONE) rc = try_epilogue(st, s, cmd, mp, pref);
  if (rc == MN_OK && !mp->fused && d->c_fallback.kind != MN_CU_ARG_NONE) {
    cublasLtMatrixLayoutDestroy(mp->c);
    mp->c = NULL;
    mp->plain_to_fallback = true;
    rc =
        make_layout(&mp->c, data_type(s, d->c_fallback), d->m, d->n, d->batch, d->stride_c, d->ldc);
  }
  if (rc == MN_OK && !mp->fused)
    rc = lt_check(first_algo(st, mp, pref, &found), "algorithm search");
  if (rc == MN_OK && (mp->fused || found > 0))
    rc = tune(st, s, d, mp, pref, (const uint32_t[3]){align_a, align_b, align_c});
  cublasLtMatmulPreferenceDestroy(pref);
  if (rc != MN_OK || mp->fused) return rc;
  if (found < 1)
    return mn_fail(MN_ERR_UNSUPPORTED,
                   "cuda backend: cuBLASLt has no algorithm for node %u (%s): m %lld n %lld k "
                   "%lld batch %lld",
                   cmd->node, mn_op_name(s->plan->graph->nodes[cmd->node].op), (long long)d->m,
                   (long long)d->n, (long long)d->k, (long long)d->batch);
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
  st->skip = calloc(st->prog.num_cmds, sizeof *st->skip);
  if (!st->matmuls || !st->skip)
    return mn_fail(MN_ERR_OUT_OF_MEMORY, "cuda backend: out of host memory");
  for (size_t i = 0; i < st->prog.num_cmds && rc == MN_OK; i++) {
    const mn_cu_cmd *cmd = &st->prog.cmds[i];
    if (cmd->kind != MN_CU_CMD_MATMUL) continue;
    rc = prepare_one(st, s, cmd, &st->matmuls[i]);
    for (size_t j = 1; rc == MN_OK && st->matmuls[i].fused && j <= cmd->mm.fallback_cmds &&
                       i + j < st->prog.num_cmds;
         j++)
      st->skip[i + j] = true;
  }
  return rc;
}

size_t mn_cu_matmuls_scratch_bytes(const cuda_state *st) {
  bool *fused = calloc(st->prog.num_cmds ? st->prog.num_cmds : 1, sizeof *fused);
  /* Without host memory for the flags, as if nothing fused: more scratch, never too little. */
  for (size_t i = 0; fused && st->matmuls && i < st->prog.num_cmds; i++)
    fused[i] = st->matmuls[i].fused;
  size_t bytes = mn_cu_program_scratch_bytes(&st->prog, fused);
  free(fused);
  return bytes;
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
  free(st->skip);
  st->skip = NULL;
}

mn_status mn_cu_matmul_enqueue(cuda_state *st, const mn_session *s, size_t cmd) {
  const mn_cu_matmul_plan *mp = &st->matmuls[cmd];
  return lt_check(run_product(st, s, &st->prog.cmds[cmd].mm, mp, &mp->algo), "matmul");
}
