/* Builders for attention (causal, packed causal, full, cross) and the KV cache used in inference.
 */
#include "host/build_util.h"
#include "host/error.h"

static int64_t last_dim(const mn_tensor_type *t) { return t->shape[t->rank - 1]; }

/* The three head counts are positive and query heads group evenly over kv heads. */
static bool check_heads(mn_graph *g, const char *fn, int num_heads, int num_kv_heads,
                        int head_dim) {
  if (!mn_require_positive(g, fn, "num_heads", num_heads) ||
      !mn_require_positive(g, fn, "num_kv_heads", num_kv_heads) ||
      !mn_require_positive(g, fn, "head_dim", head_dim))
    return false;
  if (num_heads % num_kv_heads != 0) {
    mn_graph_fail(g, MN_ERR_INVALID_ARGUMENT,
                  "%s: num_heads %d is not a multiple of num_kv_heads %d", fn, num_heads,
                  num_kv_heads);
    return false;
  }
  return true;
}

/* x's last dim must be heads * head_dim; `heads_name` says which count it is. */
static bool check_width(mn_graph *g, const char *fn, const char *what, mn_node x,
                        const char *heads_name, int heads, int head_dim) {
  int64_t want = (int64_t)heads * head_dim, have = last_dim(mn_type_of(g, x));
  if (have == want) return true;
  char d[128];
  mn_graph_fail(g, MN_ERR_SHAPE, "%s: %s is %s: last dim %lld, expected %s*head_dim = %d*%d = %lld",
                fn, what, MN_DESC(g, x, d), (long long)have, heads_name, heads, head_dim,
                (long long)want);
  return false;
}

static bool check_f32(mn_graph *g, const char *fn, mn_node q, mn_node k, mn_node v) {
  return mn_require_dtype(g, fn, "q", q, MN_F32) && mn_require_dtype(g, fn, "k", k, MN_F32) &&
         mn_require_dtype(g, fn, "v", v, MN_F32);
}

/* q [T, H*hd] or [B, T, H*hd]; k, v [S, KVH*hd] or [B, S, KVH*hd] with q's rank and B.
 * `same_len` (causal, full) additionally requires S == T. positions (MN_NO_NODE for all but
 * the packed attention) becomes a fourth input: U32 [T] or [B, T]. */
static mn_node attention(mn_graph *g, const char *fn, mn_op op, mn_node q, mn_node k, mn_node v,
                         mn_node positions, int num_heads, int num_kv_heads, int head_dim,
                         bool same_len) {
  mn_node ins[4] = {q, k, v, positions};
  int n = positions == MN_NO_NODE ? 3 : 4;
  if (!mn_graph_check_inputs(g, fn, ins, n)) return MN_NO_NODE;
  if (!check_heads(g, fn, num_heads, num_kv_heads, head_dim)) return MN_NO_NODE;
  if (!check_f32(g, fn, q, k, v)) return MN_NO_NODE;
  if (!mn_require_rank(g, fn, "q", q, 2, 3)) return MN_NO_NODE;
  const mn_tensor_type *tq = mn_type_of(g, q), *tk = mn_type_of(g, k);
  if (!mn_require_rank(g, fn, "k", k, tq->rank, tq->rank) ||
      !mn_require_rank(g, fn, "v", v, tq->rank, tq->rank))
    return MN_NO_NODE;
  if (!mn_require_same_shape(g, fn, k, v)) return MN_NO_NODE;
  if (!check_width(g, fn, "q", q, "num_heads", num_heads, head_dim) ||
      !check_width(g, fn, "k", k, "num_kv_heads", num_kv_heads, head_dim))
    return MN_NO_NODE;
  char dq[128], dk[128];
  if (tq->rank == 3 && tq->shape[0] != tk->shape[0])
    return mn_graph_fail(
        g, MN_ERR_SHAPE, "%s: q is %s and k is %s: batch sizes %lld and %lld differ", fn,
        MN_DESC(g, q, dq), MN_DESC(g, k, dk), (long long)tq->shape[0], (long long)tk->shape[0]);
  int64_t t_len = tq->shape[tq->rank - 2], s_len = tk->shape[tk->rank - 2];
  if (same_len && t_len != s_len)
    return mn_graph_fail(g, MN_ERR_SHAPE,
                         "%s: q is %s and k is %s: query length %lld and key length %lld differ "
                         "(mn_cross_attention allows that)",
                         fn, MN_DESC(g, q, dq), MN_DESC(g, k, dk), (long long)t_len,
                         (long long)s_len);
  if (n == 4 && !mn_require_positions(g, fn, positions, q)) return MN_NO_NODE;
  mn_op_attrs attrs = {.num_heads = num_heads, .num_kv_heads = num_kv_heads, .head_dim = head_dim};
  return mn_graph_append(g, op, ins, n, tq, &attrs, NULL);
}

mn_node mn_causal_attention(mn_graph *g, mn_node q, mn_node k, mn_node v, int num_heads,
                            int num_kv_heads, int head_dim) {
  return attention(g, "mn_causal_attention", MN_OP_CAUSAL_ATTENTION, q, k, v, MN_NO_NODE, num_heads,
                   num_kv_heads, head_dim, true);
}

mn_node mn_causal_attention_packed(mn_graph *g, mn_node q, mn_node k, mn_node v,
                                   mn_node positions_u32, int num_heads, int num_kv_heads,
                                   int head_dim) {
  return attention(g, "mn_causal_attention_packed", MN_OP_CAUSAL_ATTENTION_PACKED, q, k, v,
                   positions_u32, num_heads, num_kv_heads, head_dim, true);
}

mn_node mn_full_attention(mn_graph *g, mn_node q, mn_node k, mn_node v, int num_heads,
                          int num_kv_heads, int head_dim) {
  return attention(g, "mn_full_attention", MN_OP_FULL_ATTENTION, q, k, v, MN_NO_NODE, num_heads,
                   num_kv_heads, head_dim, true);
}

mn_node mn_cross_attention(mn_graph *g, mn_node q, mn_node k, mn_node v, int num_heads,
                           int num_kv_heads, int head_dim) {
  return attention(g, "mn_cross_attention", MN_OP_CROSS_ATTENTION, q, k, v, MN_NO_NODE, num_heads,
                   num_kv_heads, head_dim, false);
}

mn_node mn_multi_head_attn(mn_graph *g, mn_node q, mn_node k, mn_node v, int num_heads,
                           int num_kv_heads, int head_dim, bool is_cross) {
  return attention(g, "mn_multi_head_attn", is_cross ? MN_OP_CROSS_ATTENTION : MN_OP_FULL_ATTENTION,
                   q, k, v, MN_NO_NODE, num_heads, num_kv_heads, head_dim, !is_cross);
}

/* A U32 [1] scalar input such as kv_pos or kv_len. */
static bool check_u32_scalar(mn_graph *g, const char *fn, const char *what, mn_node x) {
  if (!mn_require_dtype(g, fn, what, x, MN_U32) || !mn_require_rank(g, fn, what, x, 1, 1))
    return false;
  if (mn_type_of(g, x)->shape[0] == 1) return true;
  char d[128];
  mn_graph_fail(g, MN_ERR_SHAPE, "%s: %s is %s, expected [1] u32", fn, what, MN_DESC(g, x, d));
  return false;
}

/* The sequences of a cache: [S, D] holds one, [B, S, D] holds B. */
static int64_t cache_batch(const mn_tensor_type *t) { return t->rank == 3 ? t->shape[0] : 1; }

/* Rows of each sequence of a cache of `batch` sequences: [B, W] (one) or [B, P, W] (P, at most
 * the cache's `max_rows`). */
static bool rows_each(const mn_tensor_type *t, int64_t batch, int64_t width, int64_t max_rows) {
  if (t->shape[t->rank - 1] != width || t->shape[0] != batch) return false;
  return t->rank == 2 || t->shape[1] <= max_rows;
}

mn_node mn_cache_write(mn_graph *g, mn_node new_kv, mn_node cache, mn_node kv_pos_u32) {
  const char *fn = "mn_cache_write";
  mn_node ins[3] = {new_kv, cache, kv_pos_u32};
  if (!mn_graph_check_inputs(g, fn, ins, 3)) return MN_NO_NODE;
  char dn[128], dc[128];
  /* The write is in place, so the cache must own a buffer that persists across steps
   * rather than an activation the planner may reuse. */
  mn_op cache_op = mn_graph_at(g, cache)->op;
  if (cache_op != MN_OP_INPUT && cache_op != MN_OP_CACHE_WRITE)
    return mn_graph_fail(g, MN_ERR_INVALID_ARGUMENT,
                         "%s: cache is %s (op %s); the cache must be an mn_input or the result "
                         "of mn_cache_write",
                         fn, MN_DESC(g, cache, dc), mn_op_name(cache_op));
  if (!mn_require_dtype(g, fn, "new_kv", new_kv, MN_F32) ||
      !mn_require_dtype(g, fn, "cache", cache, MN_F32) ||
      !mn_require_rank(g, fn, "new_kv", new_kv, 2, 3) ||
      !mn_require_rank(g, fn, "cache", cache, 2, 3) ||
      !check_u32_scalar(g, fn, "kv_pos", kv_pos_u32))
    return MN_NO_NODE;
  const mn_tensor_type *tn = mn_type_of(g, new_kv), *tc = mn_type_of(g, cache);
  int64_t b = cache_batch(tc), w = tc->shape[tc->rank - 1];
  if (!rows_each(tn, b, w, tc->shape[tc->rank - 2]))
    return mn_graph_fail(g, MN_ERR_SHAPE,
                         "%s: new_kv is %s, expected [%lld,%lld] (a row of cache %s per "
                         "sequence) or [%lld,P,%lld] (P rows, P at most the cache's)",
                         fn, MN_DESC(g, new_kv, dn), (long long)b, (long long)w,
                         MN_DESC(g, cache, dc), (long long)b, (long long)w);
  return mn_graph_append(g, MN_OP_CACHE_WRITE, ins, 3, tc, NULL, NULL);
}

mn_node mn_cached_attention(mn_graph *g, mn_node q, mn_node k_cache, mn_node v_cache,
                            mn_node kv_len_u32, int num_heads, int num_kv_heads, int head_dim) {
  const char *fn = "mn_cached_attention";
  mn_node ins[4] = {q, k_cache, v_cache, kv_len_u32};
  if (!mn_graph_check_inputs(g, fn, ins, 4)) return MN_NO_NODE;
  if (!check_heads(g, fn, num_heads, num_kv_heads, head_dim)) return MN_NO_NODE;
  if (!mn_require_dtype(g, fn, "q", q, MN_F32) ||
      !mn_require_dtype(g, fn, "k_cache", k_cache, MN_F32) ||
      !mn_require_dtype(g, fn, "v_cache", v_cache, MN_F32) ||
      !mn_require_rank(g, fn, "q", q, 2, 3) || !mn_require_rank(g, fn, "k_cache", k_cache, 2, 3) ||
      !mn_require_rank(g, fn, "v_cache", v_cache, 2, 3) ||
      !check_u32_scalar(g, fn, "kv_len", kv_len_u32))
    return MN_NO_NODE;
  if (!mn_require_same_shape(g, fn, k_cache, v_cache) ||
      !check_width(g, fn, "q", q, "num_heads", num_heads, head_dim) ||
      !check_width(g, fn, "k_cache", k_cache, "num_kv_heads", num_kv_heads, head_dim))
    return MN_NO_NODE;
  const mn_tensor_type *tk = mn_type_of(g, k_cache);
  int64_t b = cache_batch(tk), qw = (int64_t)num_heads * head_dim;
  char dq[128];
  if (!rows_each(mn_type_of(g, q), b, qw, tk->shape[tk->rank - 2]))
    return mn_graph_fail(g, MN_ERR_SHAPE,
                         "%s: q is %s, expected one row per sequence [%lld,%lld] or P rows "
                         "[%lld,P,%lld] (P at most the cache's)",
                         fn, MN_DESC(g, q, dq), (long long)b, (long long)qw, (long long)b,
                         (long long)qw);
  mn_op_attrs attrs = {.num_heads = num_heads, .num_kv_heads = num_kv_heads, .head_dim = head_dim};
  return mn_graph_append(g, MN_OP_CACHED_ATTENTION, ins, 4, mn_type_of(g, q), &attrs, NULL);
}

mn_node mn_sample(mn_graph *g, mn_node logits, mn_node params, mn_node key_u32) {
  const char *fn = "mn_sample";
  mn_node ins[3] = {logits, params, key_u32};
  if (!mn_graph_check_inputs(g, fn, ins, 3)) return MN_NO_NODE;
  if (!mn_require_dtype(g, fn, "logits", logits, MN_F32) ||
      !mn_require_dtype(g, fn, "params", params, MN_F32) ||
      !mn_require_dtype(g, fn, "key", key_u32, MN_U32) ||
      !mn_require_rank(g, fn, "logits", logits, 2, 3) ||
      !mn_require_rank(g, fn, "params", params, 1, 1) ||
      !mn_require_rank(g, fn, "key", key_u32, 1, 1))
    return MN_NO_NODE;
  const mn_tensor_type *tl = mn_type_of(g, logits);
  char d[128];
  if (tl->rank == 3 && tl->shape[1] != 1)
    return mn_graph_fail(g, MN_ERR_SHAPE, "%s: logits is %s, expected [B,V] or [B,1,V]", fn,
                         MN_DESC(g, logits, d));
  if (mn_type_of(g, params)->shape[0] != 3 || mn_type_of(g, key_u32)->shape[0] != 3)
    return mn_graph_fail(g, MN_ERR_SHAPE, "%s: params and key must have 3 elements each", fn);
  mn_tensor_type t = {.dtype = MN_U32, .rank = 1, .shape = {tl->shape[0]}};
  return mn_graph_append(g, MN_OP_SAMPLE, ins, 3, &t, NULL, NULL);
}
