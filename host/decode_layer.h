/* Whole decoder layers at decode time (MN_DECODE_OP_LIST in ops.h): one op for what the
 * family builders otherwise spell as a dozen (norm, three products, RoPE, two cache writes,
 * cached attention, product, residual, norm, two products, SwiGLU, product, residual), for
 * one new token per sequence, so that the CUDA backend runs the layer in five kernels
 * (cuda/lower_decode_layer.c) instead of fifteen. The reference backend computes the same
 * layer with every intermediate in fp32 (host/reference/ref_decode_layer.c). */
#ifndef MN_HOST_DECODE_LAYER_H
#define MN_HOST_DECODE_LAYER_H

#include "host/graph.h"
#include "host/quant.h"

/* The inputs of llama_decode_layer, in order. */
enum {
  MN_DL_X,       /* [B, C] or [B, 1, C]: the residual stream of the new token */
  MN_DL_NORM1,   /* [C] input_layernorm */
  MN_DL_WQ,      /* [H hd, C] */
  MN_DL_WK,      /* [KVH hd, C] */
  MN_DL_WV,      /* [KVH hd, C] */
  MN_DL_WO,      /* [C, H hd] */
  MN_DL_NORM2,   /* [C] post_attention_layernorm */
  MN_DL_WGATE,   /* [F, C] */
  MN_DL_WUP,     /* [F, C] */
  MN_DL_WDOWN,   /* [C, F] */
  MN_DL_K_CACHE, /* [B, S, KVH hd], row pos written in place */
  MN_DL_V_CACHE, /* [B, S, KVH hd], row pos written in place */
  MN_DL_POS,     /* U32 [1]: the row the new token's k and v go to, and its RoPE position */
  MN_DL_KV_LEN,  /* U32 [1]: rows attended, the new one included */
  MN_DL_NUM_INPUTS
};

/* The most sequences a decode layer serves: past it a batch is a prefill-sized product, which
 * the unfused layer's GEMMs do better. */
#define MN_DECODE_LAYER_MAX_BATCH 8
/* The most floats of batch x the widest of (hidden, q, intermediate) width: the CUDA kernels keep
 * the B rows they multiply in shared memory (96 KB, under the 99 KB that sm_86 and sm_89 allow a
 * block). */
#define MN_DECODE_LAYER_MAX_FLOATS (24 * 1024)

/* Whether a decode layer of `batch` sequences with these widths fits the bound above. */
static inline bool mn_decode_layer_fits(int64_t batch, int64_t dim, int64_t q_dim, int64_t ff) {
  int64_t widest = dim > ff ? dim : ff;
  if (q_dim > widest) widest = q_dim;
  return batch <= MN_DECODE_LAYER_MAX_BATCH && batch * widest <= MN_DECODE_LAYER_MAX_FLOATS;
}

/* Whether weights quantized as quant (with group_size for the affine formats) serve a decode
 * layer of these widths: MN_QUANT_NONE always; a format's block must divide the rows of every
 * Linear weight (hidden, q and intermediate widths). *block gets the block (1 for none), or 0
 * for a quant and group size that are no format. */
static inline bool mn_decode_layer_quant_fits(mn_quant quant, int group_size, int64_t dim,
                                              int64_t q_dim, int64_t ff, size_t *block) {
  size_t bytes = 0;
  *block = 1;
  if (quant == MN_QUANT_NONE) return true;
  if (!mn_quant_block(quant, group_size, block, &bytes)) {
    *block = 0;
    return false;
  }
  int64_t b = (int64_t)*block;
  return dim % b == 0 && q_dim % b == 0 && ff % b == 0;
}

/* w: input_layernorm, q, k, v, o, post_attention_layernorm, gate, up, down weights: the
 * Linear ones f32 [out, in], or with quant (not MN_QUANT_NONE) the U32 packed rows that
 * mn_matmul_quant reads (host/quant.h; group_size for the affine formats); attrs: num_heads,
 * num_kv_heads, head_dim, eps (both norms), theta (RoPE), variant (the format) and groups
 * (the group size). The value is x after the layer; the caches are written in place. */
mn_node mn_llama_decode_layer(mn_graph *g, mn_node x, const mn_node w[9], mn_node k_cache,
                              mn_node v_cache, mn_node pos_u32, mn_node kv_len_u32, int num_heads,
                              int num_kv_heads, int head_dim, float eps, float theta,
                              mn_quant quant, int group_size);

/* Whether input i of a decode layer is one of its seven Linear weights. */
static inline bool mn_dl_is_weight(int i) {
  return i == MN_DL_WQ || i == MN_DL_WK || i == MN_DL_WV || i == MN_DL_WO || i == MN_DL_WGATE ||
         i == MN_DL_WUP || i == MN_DL_WDOWN;
}

/* Whether input i of node n is a cache that n writes in place. */
static inline bool mn_decode_layer_writes(const mn_node_rec *n, int i) {
  return n->op == MN_OP_LLAMA_DECODE_LAYER && (i == MN_DL_K_CACHE || i == MN_DL_V_CACHE);
}

/* Whether input i of node n is a decode layer's Linear weight. */
static inline bool mn_decode_layer_weight(const mn_node_rec *n, int i) {
  return n->op == MN_OP_LLAMA_DECODE_LAYER && mn_dl_is_weight(i);
}

#endif
