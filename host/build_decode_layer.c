/* The builder of llama_decode_layer (host/decode_layer.h): every shape is checked against
 * x's width C, the heads and the caches, so a mismatched weight fails here and not in a
 * kernel. */
#include <stdio.h>

#include "host/build_util.h"
#include "host/decode_layer.h"
#include "host/quant.h"

/* Node id is of type dt with exactly the shape dims[0..rank-1]. */
static bool require_typed(mn_graph *g, const char *fn, const char *what, mn_node id, mn_dtype dt,
                          int rank, const int64_t *dims) {
  const mn_tensor_type *t = mn_type_of(g, id);
  bool ok = t->dtype == dt && t->rank == rank;
  for (int i = 0; ok && i < rank; i++)
    ok = t->shape[i] == dims[i];
  if (ok) return true;
  char d[128], want[96];
  int w = 0;
  for (int i = 0; i < rank; i++)
    w += snprintf(want + w, sizeof want - (size_t)w, i ? ",%lld" : "%lld", (long long)dims[i]);
  mn_graph_fail(g, MN_ERR_SHAPE, "%s: %s is %s, expected %s [%s]", fn, what, MN_DESC(g, id, d),
                dt == MN_U32 ? "u32" : "f32", want);
  return false;
}

static bool require_shape(mn_graph *g, const char *fn, const char *what, mn_node id, int rank,
                          const int64_t *dims) {
  return require_typed(g, fn, what, id, MN_F32, rank, dims);
}

static bool require_u32_scalar(mn_graph *g, const char *fn, const char *what, mn_node id) {
  const mn_tensor_type *t = mn_type_of(g, id);
  if (t->dtype == MN_U32 && t->rank == 1 && t->shape[0] == 1) return true;
  char d[128];
  mn_graph_fail(g, MN_ERR_SHAPE, "%s: %s is %s, expected u32 [1]", fn, what, MN_DESC(g, id, d));
  return false;
}

mn_node mn_llama_decode_layer(mn_graph *g, mn_node x, const mn_node w[9], mn_node k_cache,
                              mn_node v_cache, mn_node pos_u32, mn_node kv_len_u32, int num_heads,
                              int num_kv_heads, int head_dim, float eps, float theta,
                              mn_quant quant, int group_size) {
  const char *fn = "mn_llama_decode_layer";
  mn_node ins[MN_DL_NUM_INPUTS] = {x,    w[0], w[1], w[2],    w[3],    w[4],    w[5],
                                   w[6], w[7], w[8], k_cache, v_cache, pos_u32, kv_len_u32};
  if (!mn_graph_check_inputs(g, fn, ins, MN_DL_NUM_INPUTS)) return MN_NO_NODE;
  if (!mn_require_positive(g, fn, "num_heads", num_heads) ||
      !mn_require_positive(g, fn, "num_kv_heads", num_kv_heads) ||
      !mn_require_positive(g, fn, "head_dim", head_dim))
    return MN_NO_NODE;
  if (num_heads % num_kv_heads != 0 || head_dim % 2 != 0)
    return mn_graph_fail(g, MN_ERR_INVALID_ARGUMENT,
                         "%s: num_heads %d must be a multiple of num_kv_heads %d and head_dim %d "
                         "even",
                         fn, num_heads, num_kv_heads, head_dim);
  if (!(eps > 0) || !(theta > 0))
    return mn_graph_fail(g, MN_ERR_INVALID_ARGUMENT, "%s: eps %g and theta %g must be positive", fn,
                         (double)eps, (double)theta);
  if (!mn_require_dtype(g, fn, "x", x, MN_F32) || !mn_require_rank(g, fn, "x", x, 2, 3))
    return MN_NO_NODE;
  /* The caches are written in place: they must be inputs (which the memory planner never
   * reuses), and two of them. */
  if (g->nodes[k_cache].op != MN_OP_INPUT || g->nodes[v_cache].op != MN_OP_INPUT ||
      k_cache == v_cache)
    return mn_graph_fail(g, MN_ERR_INVALID_ARGUMENT,
                         "%s: k_cache (node %u) and v_cache (node %u) must be two graph inputs", fn,
                         k_cache, v_cache);
  const mn_tensor_type *tx = mn_type_of(g, x);
  char d[128];
  if (tx->rank == 3 && tx->shape[1] != 1)
    return mn_graph_fail(g, MN_ERR_SHAPE, "%s: x is %s, expected one row per sequence", fn,
                         MN_DESC(g, x, d));
  int64_t b = tx->shape[0], c = tx->shape[tx->rank - 1];
  if (b > MN_DECODE_LAYER_MAX_BATCH)
    return mn_graph_fail(g, MN_ERR_INVALID_ARGUMENT, "%s: batch %lld is above %d", fn, (long long)b,
                         MN_DECODE_LAYER_MAX_BATCH);
  if (!require_shape(g, fn, "k_cache", k_cache, 3, mn_type_of(g, k_cache)->shape))
    return MN_NO_NODE;
  const mn_tensor_type *tk = mn_type_of(g, k_cache);
  int64_t q_dim = (int64_t)num_heads * head_dim, kv_dim = (int64_t)num_kv_heads * head_dim;
  int64_t ff = mn_type_of(g, w[6])->shape[0];
  int64_t cache[3] = {b, tk->shape[1], kv_dim};
  int64_t vec[1] = {c}, wq[2] = {q_dim, c}, wkv[2] = {kv_dim, c}, wo[2] = {c, q_dim},
          wup[2] = {ff, c}, wdown[2] = {c, ff};
  bool quantized = quant != MN_QUANT_NONE;
  size_t block = 0;
  if (!mn_decode_layer_quant_fits(quant, group_size, c, q_dim, ff, &block))
    return block == 0
               ? mn_graph_fail(g, MN_ERR_INVALID_ARGUMENT,
                               "%s: quant %d with group_size %d is not a quantized format", fn,
                               (int)quant, group_size)
               : mn_graph_fail(g, MN_ERR_INVALID_ARGUMENT,
                               "%s: widths %lld, %lld and %lld must be multiples of the %s block "
                               "of %zu",
                               fn, (long long)c, (long long)q_dim, (long long)ff,
                               mn_quant_name(quant), block);
  static const char *const names[9] = {"input_layernorm", "q_proj",  "k_proj",
                                       "v_proj",          "o_proj",  "post_attention_layernorm",
                                       "gate_proj",       "up_proj", "down_proj"};
  const int64_t *dims[9] = {vec, wq, wkv, wkv, wo, vec, wup, wup, wdown};
  for (int i = 0; i < 9; i++) {
    bool linear = i != 0 && i != 5;
    if (!linear || !quantized) {
      if (!require_shape(g, fn, names[i], w[i], linear ? 2 : 1, dims[i])) return MN_NO_NODE;
      continue;
    }
    int64_t words = (int64_t)mn_quant_row_words(quant, group_size, dims[i][1]);
    int64_t packed[2] = {dims[i][0], words};
    if (!require_typed(g, fn, names[i], w[i], MN_U32, 2, packed)) return MN_NO_NODE;
  }
  if (!require_shape(g, fn, "k_cache", k_cache, 3, cache) ||
      !require_shape(g, fn, "v_cache", v_cache, 3, cache) ||
      !require_u32_scalar(g, fn, "pos", pos_u32) ||
      !require_u32_scalar(g, fn, "kv_len", kv_len_u32))
    return MN_NO_NODE;
  if (!mn_decode_layer_fits(b, c, q_dim, ff))
    return mn_graph_fail(
        g, MN_ERR_INVALID_ARGUMENT,
        "%s: batch %lld x the widest of widths %lld, %lld, %lld is above %d floats", fn,
        (long long)b, (long long)c, (long long)q_dim, (long long)ff, MN_DECODE_LAYER_MAX_FLOATS);
  mn_op_attrs attrs = {.num_heads = num_heads,
                       .num_kv_heads = num_kv_heads,
                       .head_dim = head_dim,
                       .eps = eps,
                       .theta = theta,
                       .variant = (int)quant,
                       .groups = quantized ? group_size : 0};
  return mn_graph_append(g, MN_OP_LLAMA_DECODE_LAYER, ins, MN_DL_NUM_INPUTS, tx, &attrs, NULL);
}
