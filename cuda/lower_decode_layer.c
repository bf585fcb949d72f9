/* llama_decode_layer (host/decode_layer.h) in five launches (kernels/decode_layer.cuh): the
 * normalized q/k/v products with RoPE and the cache writes, the split cached attention that
 * merges its own splits, the o product with the residual, the normalized gate/up products with
 * SwiGLU, and the down product with the residual. q, the attention's partial results and output,
 * the residual after attention (x1) and the SwiGLU output (h) live in fp32 scratch. */
#include "cuda/emit.h"
#include "cuda/lower_attention.h"
#include "host/decode_layer.h"
#include "host/error.h"
#include "host/quant.h"

/* Warps a block of the decode layer kernels (MN_DL_WARPS in kernels/decode_layer.cuh). */
#define MN_DL_WARPS_HOST 8
#define DL_BLOCK         (MN_DL_WARPS_HOST * 32)
/* Cache rows a block of the split attention kernel takes: 128 decoded faster than 64 and 32
 * (docs/performance.md, negative results). */
#define DL_SPLIT 128

static size_t align256(size_t bytes) { return (bytes + 255) / 256 * 256; }

static unsigned blocks_of(int64_t warps) {
  return (unsigned)((warps + MN_DL_WARPS_HOST - 1) / MN_DL_WARPS_HOST);
}

/* Bytes of one weight row of k values that a lane of the residual products holds: its 16-bit or
 * fp32 values, or for quantized rows the floats it dequantizes them into (mn_dl_qrow). */
static int64_t lane_row_bytes(const mn_cu_op_ctx *c, int64_t k, int fmt) {
  int64_t bytes = fmt == MN_QUANT_NONE && mn_cu_low_storage(c->plan) != MN_DEV_F32 ? 2 * k : 4 * k;
  return bytes / 32;
}

/* Rows of the weight a warp of a residual product takes: two from batch 4, where each row of
 * the shared input serves two weight rows, while a lane's share of both rows stays in 48
 * registers. */
static int rows_per_warp(const mn_cu_op_ctx *c, int64_t b, int64_t k, int fmt) {
  return b >= 4 && 2 * lane_row_bytes(c, k, fmt) <= 48 * 4 ? 2 : 1;
}

/* The shared memory a block may have on every card the kernels serve (99 KB on sm_86 and sm_89),
 * and the static shared memory of the tensor-core kernels: the warps' sums of two 16 x 8 tiles
 * (q/k/v, gate/up) or one (the residual products). */
#define DL_SMEM_LIMIT    (99 * 1024)
#define DL_MMA_RED_BYTES (2 * MN_DL_WARPS_HOST * 128 * 4)

/* Whether the products run on tensor cores (kernels/decode_layer_mma.cuh): a bf16 session (its
 * weights bf16, or quantized and dequantized to bf16 for the products), 2 to 8 sequences, every
 * width a multiple of 32 and half a head a multiple of 16, and each kernel's input rows in shared
 * memory beside its sums within DL_SMEM_LIMIT. */
static bool use_mma(const mn_cu_op_ctx *c, int64_t b, int64_t dim, int64_t q_dim, int64_t ff,
                    int hd) {
  int64_t widest = q_dim > ff ? q_dim : ff;
  return mn_cu_low_storage(c->plan) == MN_DEV_BF16 && b >= 2 && dim % 32 == 0 && q_dim % 32 == 0 &&
         ff % 32 == 0 && hd % 32 == 0 && b * dim * 4 + DL_MMA_RED_BYTES <= DL_SMEM_LIMIT &&
         b * widest * 4 + DL_MMA_RED_BYTES / 2 <= DL_SMEM_LIMIT;
}

static mn_status residual_product(const mn_cu_op_ctx *c, bool mma, mn_cu_arg res, mn_cu_arg in,
                                  mn_cu_arg w, mn_cu_arg out, int64_t b, int64_t dim, int64_t k,
                                  int fmt, int group) {
  int r = rows_per_warp(c, b, k, fmt);
  int kid = mma ? mn_cu_kernel(c, DL_BLOCK, "mn_dl_residual_product_mma<%lld, %lld, %lld, %d, %d>",
                               (long long)dim, (long long)k, (long long)b, fmt, group)
                : mn_cu_kernel(c, DL_BLOCK, "mn_dl_residual_product<%lld, %lld, %lld, %d, %d, %d>",
                               (long long)dim, (long long)k, (long long)b, r, fmt, group);
  if (kid < 0) return mn_cu_oom(c);
  mn_cu_kernel_overlaps(c, kid);
  mn_cu_arg args[4] = {res, in, w, out};
  unsigned blocks = mma ? (unsigned)(dim / 16) : blocks_of((dim + r - 1) / r);
  return mn_cu_launch(c, kid, blocks, 1, 1, (size_t)(b * k) * sizeof(float), 4, args);
}

mn_status mn_cu_lower_LLAMA_DECODE_LAYER(const mn_cu_op_ctx *c) {
  const mn_op_attrs *at = &c->node->attrs;
  const mn_tensor_type *tk = mn_cu_in_type(c, MN_DL_K_CACHE), *tx = &c->node->type;
  int64_t b = tk->shape[0], max_seq = tk->shape[1], dim = tx->shape[tx->rank - 1];
  int hd = at->head_dim, heads = at->num_heads;
  int64_t q_dim = (int64_t)heads * hd, kv_dim = (int64_t)at->num_kv_heads * hd;
  int64_t ff = mn_cu_in_type(c, MN_DL_WGATE)->shape[0];
  if (!mn_decode_layer_fits(b, dim, q_dim, ff))
    return mn_fail(MN_ERR_UNSUPPORTED,
                   "cuda backend: node %u (llama_decode_layer): batch %lld is more than the "
                   "kernels hold in shared memory",
                   c->id, (long long)b);
  mn_cu_arg w[MN_DL_NUM_INPUTS];
  for (int i = 0; i < MN_DL_NUM_INPUTS; i++)
    w[i] = mn_cu_in(c, i);
  int fmt = at->variant, group = at->groups;
  /* In a low-precision session plain products read the weights' low-precision copies. */
  if (fmt == MN_QUANT_NONE && mn_cu_low_storage(c->plan) != MN_DEV_F32)
    for (int i = 0; i < MN_DL_NUM_INPUTS; i++) {
      if (!mn_dl_is_weight(i)) continue;
      const mn_tensor_type *t = mn_cu_in_type(c, i);
      mn_status st = mn_cu_low_operand(c, &w[i], t->shape[0], t->shape[1], 0, 1, 0);
      if (st != MN_OK) return st;
    }
  /* Scratch: q, the attention's output, x1, h and the merge's counters, then the attention's
   * partial results (mn_cu_decode_attention_scratch). */
  int64_t ncnt = b * heads;
  size_t q_at = 0, att_at = align256((size_t)(b * q_dim) * sizeof(float));
  size_t x1_at = att_at + align256((size_t)(b * q_dim) * sizeof(float));
  size_t h_at = x1_at + align256((size_t)(b * dim) * sizeof(float));
  size_t cnt_at = h_at + align256((size_t)(b * ff) * sizeof(float));
  size_t parts_at = cnt_at + align256((size_t)ncnt * sizeof(unsigned));
  mn_cu_arg parts[3];
  int split = DL_SPLIT;
  mn_status st = mn_cu_decode_attention_scratch(c, b, max_seq, split, parts_at, parts);
  if (st != MN_OK) return st;
  mn_cu_arg q = {.kind = MN_CU_ARG_SCRATCH, .offset = q_at};
  mn_cu_arg merge[2] = {{.kind = MN_CU_ARG_SCRATCH, .offset = att_at},
                        {.kind = MN_CU_ARG_SCRATCH, .offset = cnt_at}};
  mn_cu_arg x1 = {.kind = MN_CU_ARG_SCRATCH, .offset = x1_at};
  mn_cu_arg h = {.kind = MN_CU_ARG_SCRATCH, .offset = h_at};
  unsigned eps = mn_cu_float_bits(at->eps), theta = mn_cu_float_bits(at->theta);
  /* The norms' weights join the input rows in shared memory where they fit. */
  bool mma = use_mma(c, b, dim, q_dim, ff, hd);
  bool nws = (b + 1) * dim * 4 + (mma ? DL_MMA_RED_BYTES : 0) <= DL_SMEM_LIMIT;
  size_t norm_smem = (size_t)((b + (nws ? 1 : 0)) * dim) * sizeof(float);

  const char *nws_s = nws ? "true" : "false", *mma_s = mma ? "_mma" : "";
  int k = mn_cu_kernel(
      c, DL_BLOCK, "mn_dl_qkv%s<%lld, %lld, %lld, %d, %lldLL, %lld, %uu, %uu, %d, %d, %s, %lld>",
      mma_s, (long long)dim, (long long)q_dim, (long long)kv_dim, hd, (long long)max_seq,
      (long long)b, eps, theta, fmt, group, nws_s, (long long)ncnt);
  if (k < 0) return mn_cu_oom(c);
  mn_cu_kernel_overlaps(c, k);
  mn_cu_arg qkv_args[12] = {w[MN_DL_X],  w[MN_DL_NORM1],    w[MN_DL_WQ],      w[MN_DL_WK],
                            w[MN_DL_WV], w[MN_DL_K_CACHE],  w[MN_DL_V_CACHE], w[MN_DL_POS],
                            q,           mn_cu_error_arg(), merge[1],         mn_cu_node_id_arg(c)};
  unsigned qkv_blocks =
      mma ? (unsigned)((q_dim + 2 * kv_dim) / 32) : blocks_of((q_dim + 2 * kv_dim) / 2);
  st = mn_cu_launch(c, k, qkv_blocks, 1, 1, norm_smem, 12, qkv_args);
  if (st != MN_OK) return st;
  st = mn_cu_decode_attention_parts(c, q, w[MN_DL_K_CACHE], w[MN_DL_V_CACHE], w[MN_DL_KV_LEN], b,
                                    max_seq, split, parts, merge);
  if (st != MN_OK) return st;
  st = residual_product(c, mma, w[MN_DL_X], merge[0], w[MN_DL_WO], x1, b, dim, q_dim, fmt, group);
  if (st != MN_OK) return st;

  k = mn_cu_kernel(c, DL_BLOCK, "mn_dl_mlp_up%s<%lld, %lld, %lld, %uu, %d, %d, %s>", mma_s,
                   (long long)dim, (long long)ff, (long long)b, eps, fmt, group, nws_s);
  if (k < 0) return mn_cu_oom(c);
  mn_cu_kernel_overlaps(c, k);
  mn_cu_arg up_args[5] = {x1, w[MN_DL_NORM2], w[MN_DL_WGATE], w[MN_DL_WUP], h};
  st = mn_cu_launch(c, k, mma ? (unsigned)(ff / 16) : blocks_of(ff), 1, 1, norm_smem, 5, up_args);
  if (st != MN_OK) return st;
  return residual_product(c, mma, x1, h, w[MN_DL_WDOWN], mn_cu_out(c), b, dim, ff, fmt, group);
}
