/* Skinny products (lower_skinny.h): the launch shape and template instance of
 * mn_mm_narrow / mn_mm_short_k for one product. */
#include "cuda/lower_skinny.h"

#include <stdlib.h>
#include <string.h>

#include "host/error.h"
#include "host/pointwise.h"

#define NARROW_WARPS   8 /* rows of C a block */
#define SHORT_K_BLOCK  256
#define SHORT_K_BLOCKS 4096

static bool switched_off(void) {
  const char *env = getenv("MN_CUDA_SKINNY");
  return env && strcmp(env, "0") == 0;
}

static bool short_k(const mn_cu_matmul_desc *d) { return d->k <= MN_CU_SKINNY_MAX; }

/* A warp walks k alone, so a long k stays with cuBLASLt, which splits it. */
static bool narrow(const mn_cu_matmul_desc *d) {
  return d->n <= MN_CU_SKINNY_MAX && !d->trans_a && d->k <= MN_CU_SKINNY_NARROW_MAX_K;
}

bool mn_cu_skinny_applies(const mn_cu_op_ctx *c, const mn_cu_matmul_desc *d) {
  switch (d->epilogue) {
  case MN_CU_EPI_NONE:
  case MN_CU_EPI_BIAS:
  case MN_CU_EPI_BIAS_RELU:
  case MN_CU_EPI_BIAS_GELU: break;
  default: return false;
  }
  return !switched_off() && mn_cu_low_storage(c->plan) == MN_DEV_F32 && d->batch <= 1 &&
         d->beta == 0.0f && d->m > 0 && d->n > 0 && d->k > 0 &&
         mn_cu_matmul_flops(d) <= MN_CU_SKINNY_MAX_FLOPS && (short_k(d) || narrow(d));
}

/* The pointwise row of the epilogue's activation, -1 for none. */
static int act_code(mn_cu_epilogue e) {
  switch (e) {
  case MN_CU_EPI_BIAS_RELU: return mn_pw_code_of_op(MN_OP_RELU);
  case MN_CU_EPI_BIAS_GELU: return mn_pw_code_of_op(MN_OP_GELU);
  default: return -1;
  }
}

/* d's launch, its value gated by pointwise row `gate` (-1: none) of the element of g at the
 * same place. */
static mn_status skinny_launch(const mn_cu_op_ctx *c, const mn_cu_matmul_desc *d, int gate,
                               mn_cu_arg g) {
  /* Dense row pitches: A [m, k] or [k, m], B [k, n] or [n, k], C [m, n]. */
  long long lda = d->lda ? d->lda : (d->trans_a ? d->m : d->k);
  long long ldb = d->ldb ? d->ldb : (d->trans_b ? d->k : d->n);
  long long ldc = d->ldc ? d->ldc : d->n;
  bool bias = d->epilogue != MN_CU_EPI_NONE;
  int act = act_code(d->epilogue);
  unsigned alpha = mn_cu_float_bits(d->alpha);
  mn_cu_arg none = {.kind = MN_CU_ARG_NONE};
  mn_cu_arg args[5] = {d->c, d->a, d->b, bias ? d->bias : none, gate >= 0 ? g : none};
  if (!short_k(d)) {
    int k = mn_cu_kernel(c, 32 * NARROW_WARPS,
                         "mn_mm_narrow<%d, %lldLL, %d, %lldLL, %lldLL, %lldLL, %lldLL, %s, %d, %d, "
                         "%s, %uu>",
                         NARROW_WARPS, (long long)d->m, (int)d->n, (long long)d->k, lda, ldb, ldc,
                         d->trans_b ? "true" : "false", act, gate, bias ? "true" : "false", alpha);
    unsigned blocks = mn_cu_blocks(d->m, NARROW_WARPS);
    return mn_cu_launch(c, k, blocks, 1, 1, 0, 5, args);
  }
  int k = mn_cu_kernel(c, SHORT_K_BLOCK,
                       "mn_mm_short_k<%lldLL, %lldLL, %d, %lldLL, %lldLL, %lldLL, %s, %s, %d, %d, "
                       "%s, %uu>",
                       (long long)d->m, (long long)d->n, (int)d->k, lda, ldb, ldc,
                       d->trans_a ? "true" : "false", d->trans_b ? "true" : "false", act, gate,
                       bias ? "true" : "false", alpha);
  unsigned blocks = mn_cu_blocks(d->m * d->n, SHORT_K_BLOCK);
  return mn_cu_launch(c, k, blocks < SHORT_K_BLOCKS ? blocks : SHORT_K_BLOCKS, 1, 1, 0, 5, args);
}

mn_status mn_cu_skinny_matmul(const mn_cu_op_ctx *c, const mn_cu_matmul_desc *d) {
  return skinny_launch(c, d, -1, (mn_cu_arg){.kind = MN_CU_ARG_NONE});
}

mn_status mn_cu_skinny_matmul_gated(const mn_cu_op_ctx *c, const mn_cu_matmul_desc *d, mn_op gate,
                                    mn_cu_arg g) {
  return skinny_launch(c, d, mn_pw_code_of_op(gate), g);
}
