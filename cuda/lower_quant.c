/* mn_matmul_quant: one warp per output feature (cuda/kernels/quant_matmul.cuh), the same
 * kernel for decoding (1-8 rows: weights read once) and prefill (rows in chunks of 8). */
#include "cuda/emit.h"

#define MN_QMM_WARPS 8

mn_status mn_cu_lower_MATMUL_QUANT(const mn_cu_op_ctx *c) {
  const mn_tensor_type *tx = mn_cu_in_type(c, 0), *tw = mn_cu_in_type(c, 1);
  int64_t in = tx->shape[tx->rank - 1], out = tw->shape[0], rw = tw->shape[1];
  int64_t rows = mn_tensor_type_numel(tx) / in;
  int k = mn_cu_kernel(c, 32 * MN_QMM_WARPS,
                       "mn_quant_matmul<%d, %d, %lldLL, %lldLL, %lldLL, %lldLL, %d>",
                       c->node->attrs.variant, c->node->attrs.groups, (long long)rows,
                       (long long)in, (long long)out, (long long)rw, MN_QMM_WARPS);
  if (k < 0) return mn_cu_oom(c);
  mn_cu_arg args[3] = {mn_cu_in(c, 0), mn_cu_in(c, 1), mn_cu_out(c)};
  return mn_cu_launch(c, k, mn_cu_blocks(out, MN_QMM_WARPS), 1, 1, 0, 3, args);
}
