/* mn_matmul_quant. Decoding (a few rows): one warp per output feature
 * (cuda/kernels/quant_matmul.cuh), every weight read once and dequantized in registers. A
 * prefill (more than MN_QMM_GEMM_ROWS rows): the weight dequantized into the session's
 * precision (the low-precision staging, or fp32 scratch), then one cuBLASLt product; the warp
 * kernel re-read the weights for every 8 rows and took 420 ms for a batch-8 SmolLM2 prompt of
 * 128 tokens. In a low-precision session the GEMM reads the weights rounded to it, as it reads
 * every other weight. */
#include "cuda/emit.h"

#define MN_QMM_WARPS     8
#define MN_QMM_GEMM_ROWS 16
#define DEQUANT_BLOCK    256
#define DEQUANT_BLOCKS   4096

static mn_status dequant_product(const mn_cu_op_ctx *c, int64_t rows, int64_t in, int64_t out,
                                 int64_t rw) {
  bool low = mn_cu_low_storage(c->plan) != MN_DEV_F32;
  size_t cells = (size_t)out * (size_t)in;
  mn_cu_arg w = low ? mn_cu_stage(c, cells * 2) : mn_cu_scratch(c, cells * sizeof(float));
  int k = mn_cu_kernel(c, DEQUANT_BLOCK, "mn_quant_dequant<%d, %d, %lldLL, %lldLL, %lldLL>",
                       c->node->attrs.variant, c->node->attrs.groups, (long long)in, (long long)out,
                       (long long)rw);
  if (k < 0) return mn_cu_oom(c);
  mn_cu_arg args[2] = {mn_cu_in(c, 1), w};
  unsigned blocks = mn_cu_blocks(out * (in / 32), DEQUANT_BLOCK);
  mn_status st =
      mn_cu_launch(c, k, blocks < DEQUANT_BLOCKS ? blocks : DEQUANT_BLOCKS, 1, 1, 0, 2, args);
  if (st != MN_OK) return st;
  mn_cu_matmul_desc d = {.a = mn_cu_in(c, 0),
                         .b = w,
                         .c = mn_cu_out(c),
                         .trans_b = true,
                         .m = rows,
                         .n = out,
                         .k = in,
                         .batch = 1,
                         .alpha = 1.0f};
  return mn_cu_matmul(c, &d);
}

mn_status mn_cu_lower_MATMUL_QUANT(const mn_cu_op_ctx *c) {
  const mn_tensor_type *tx = mn_cu_in_type(c, 0), *tw = mn_cu_in_type(c, 1);
  int64_t in = tx->shape[tx->rank - 1], out = tw->shape[0], rw = tw->shape[1];
  int64_t rows = mn_tensor_type_numel(tx) / in;
  if (rows > MN_QMM_GEMM_ROWS) return dequant_product(c, rows, in, out, rw);
  int k = mn_cu_kernel(c, 32 * MN_QMM_WARPS,
                       "mn_quant_matmul<%d, %d, %lldLL, %lldLL, %lldLL, %lldLL, %d>",
                       c->node->attrs.variant, c->node->attrs.groups, (long long)rows,
                       (long long)in, (long long)out, (long long)rw, MN_QMM_WARPS);
  if (k < 0) return mn_cu_oom(c);
  mn_cu_arg args[3] = {mn_cu_in(c, 0), mn_cu_in(c, 1), mn_cu_out(c)};
  return mn_cu_launch(c, k, mn_cu_blocks(out, MN_QMM_WARPS), 1, 1, 0, 3, args);
}
