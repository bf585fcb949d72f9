/* llama_decode_layer (host/decode_layer.h) in five launches (kernels/decode_layer.cuh): the
 * normalized q/k/v products with RoPE and the cache writes, the split cached attention, the
 * merge with the o product and the residual, the normalized gate/up products with SwiGLU, and
 * the down product with the residual. q, the attention's partial results, the residual after
 * attention (x1) and the SwiGLU output (h) live in fp32 scratch. */
#include <string.h>

#include "cuda/emit.h"
#include "cuda/lower_attention.h"
#include "host/decode_layer.h"
#include "host/error.h"

/* Warps a block of the decode layer kernels (MN_DL_WARPS in kernels/decode_layer.cuh). */
#define MN_DL_WARPS_HOST 8
#define DL_BLOCK         (MN_DL_WARPS_HOST * 32)
/* Cache rows a block of the split attention kernel takes: 128 decoded faster than 64 and 32
 * (docs/performance.md, negative results). */
#define DL_SPLIT 128

static size_t align256(size_t bytes) { return (bytes + 255) / 256 * 256; }

static unsigned float_bits(float f) {
  unsigned u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static unsigned blocks_of(int64_t warps) {
  return (unsigned)((warps + MN_DL_WARPS_HOST - 1) / MN_DL_WARPS_HOST);
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
  /* Scratch: q, x1 and h, then the attention's partial results
   * (mn_cu_decode_attention_scratch). */
  size_t q_at = 0, x1_at = align256((size_t)(b * q_dim) * sizeof(float));
  size_t h_at = x1_at + align256((size_t)(b * dim) * sizeof(float));
  size_t parts_at = h_at + align256((size_t)(b * ff) * sizeof(float));
  mn_cu_arg parts[3];
  mn_cu_arg q = {.kind = MN_CU_ARG_SCRATCH, .offset = q_at};
  int split = DL_SPLIT;
  mn_status st = mn_cu_decode_attention_scratch(c, b, max_seq, split, parts_at, parts);
  if (st != MN_OK) return st;
  mn_cu_arg x1 = {.kind = MN_CU_ARG_SCRATCH, .offset = x1_at};
  mn_cu_arg h = {.kind = MN_CU_ARG_SCRATCH, .offset = h_at};
  unsigned eps = float_bits(at->eps), theta = float_bits(at->theta), node = (unsigned)c->id;

  int k = mn_cu_kernel(c, DL_BLOCK,
                       "mn_dl_qkv<%lld, %lld, %lld, %d, %lldLL, %lld, %uu, %uu, %uu, %d, %d>",
                       (long long)dim, (long long)q_dim, (long long)kv_dim, hd, (long long)max_seq,
                       (long long)b, node, eps, theta, fmt, group);
  if (k < 0) return mn_cu_oom(c);
  mn_cu_kernel_overlaps(c, k);
  mn_cu_arg qkv_args[10] = {w[MN_DL_X],  w[MN_DL_NORM1],   w[MN_DL_WQ],      w[MN_DL_WK],
                            w[MN_DL_WV], w[MN_DL_K_CACHE], w[MN_DL_V_CACHE], w[MN_DL_POS],
                            q,           mn_cu_error_arg()};
  st = mn_cu_launch(c, k, blocks_of((q_dim + 2 * kv_dim) / 2), 1, 1,
                    (size_t)(b * dim) * sizeof(float), 10, qkv_args);
  if (st != MN_OK) return st;
  st = mn_cu_decode_attention_parts(c, q, w[MN_DL_K_CACHE], w[MN_DL_V_CACHE], w[MN_DL_KV_LEN], b,
                                    max_seq, split, parts);
  if (st != MN_OK) return st;

  k = mn_cu_kernel(c, DL_BLOCK, "mn_dl_attn_out<%lld, %lld, %d, %d, %lldLL, %lld, %d, %uu, %d, %d>",
                   (long long)dim, (long long)q_dim, hd, heads, (long long)max_seq, (long long)b,
                   split, node, fmt, group);
  if (k < 0) return mn_cu_oom(c);
  mn_cu_kernel_overlaps(c, k);
  mn_cu_arg out_args[8] = {w[MN_DL_KV_LEN], parts[0],   parts[1], parts[2],
                           w[MN_DL_WO],     w[MN_DL_X], x1,       mn_cu_error_arg()};
  st = mn_cu_launch(c, k, blocks_of(dim), 1, 1, (size_t)(b * q_dim) * sizeof(float), 8, out_args);
  if (st != MN_OK) return st;

  k = mn_cu_kernel(c, DL_BLOCK, "mn_dl_mlp_up<%lld, %lld, %lld, %uu, %d, %d>", (long long)dim,
                   (long long)ff, (long long)b, eps, fmt, group);
  if (k < 0) return mn_cu_oom(c);
  mn_cu_kernel_overlaps(c, k);
  mn_cu_arg up_args[5] = {x1, w[MN_DL_NORM2], w[MN_DL_WGATE], w[MN_DL_WUP], h};
  st = mn_cu_launch(c, k, blocks_of(ff), 1, 1, (size_t)(b * dim) * sizeof(float), 5, up_args);
  if (st != MN_OK) return st;

  k = mn_cu_kernel(c, DL_BLOCK, "mn_dl_mlp_down<%lld, %lld, %lld, %d, %d>", (long long)dim,
                   (long long)ff, (long long)b, fmt, group);
  if (k < 0) return mn_cu_oom(c);
  mn_cu_kernel_overlaps(c, k);
  mn_cu_arg down_args[4] = {x1, h, w[MN_DL_WDOWN], mn_cu_out(c)};
  return mn_cu_launch(c, k, blocks_of(dim), 1, 1, (size_t)(b * ff) * sizeof(float), 4, down_args);
}
