/* Reference kernels: attention and the KV cache. Scores, softmax and the weighted sum of
 * values are accumulated in double. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "host/reference/ref_shared.h"

typedef struct attn_shape {
  size_t t_len, s_len, heads, kv_heads, head_dim;
  bool causal;
  size_t offset;             /* causal: query row t sees keys up to t + offset */
  const uint32_t *positions; /* packed: U32 [B, T], else NULL */
} attn_shape;

/* One batch of attention. q is [T, H*hd], k and v are [S, KVH*hd]; query row t attends
 * to keys 0..t when causal, to keys mn_ref_segment_start(t, positions[t])..t when packed
 * (`positions`: this batch's row), else to all S keys. scores (S doubles) and acc (hd doubles)
 * are scratch. stats, when not NULL, is this batch's part of the row statistics a training
 * plan's attention also writes (ops.h): the base-2 maxima of the heads' rows [H, T], then, n
 * floats on (n = B * H * T), their 1 / sums. */

static void attend(const attn_shape *sh, const uint32_t *positions, const float *q, const float *k,
                   const float *v, float *out, double *scores, double *acc, float *stats,
                   size_t n) {
  size_t hd = sh->head_dim, q_stride = sh->heads * hd, kv_stride = sh->kv_heads * hd;
  size_t group = sh->heads / sh->kv_heads;
  double scale = 1.0 / sqrt((double)hd);
  for (size_t t = 0; t < sh->t_len; t++) {
    size_t first = positions ? mn_ref_segment_start(t, positions[t]) : 0;
    size_t n_keys = sh->causal ? t + sh->offset + 1 - first : sh->s_len;
    for (size_t h = 0; h < sh->heads; h++) {
      const float *qh = q + t * q_stride + h * hd;
      size_t kv_off = first * kv_stride + (h / group) * hd;
      float st[2];
      mn_ref_attend_head(qh, k + kv_off, v + kv_off, kv_stride, n_keys, hd, scale, scores, acc,
                         out + t * q_stride + h * hd, st);
      if (stats) {
        stats[h * sh->t_len + t] = st[0];
        stats[n + h * sh->t_len + t] = st[1];
      }
    }
  }
}

/* Runs attend over every batch with scratch sized for s_len keys. */
static mn_status attend_batches(const mn_ref_ctx *c, const attn_shape *sh, size_t batches,
                                const float *q, const float *k, const float *v, float *out,
                                float *stats) {
  double *scores = malloc((sh->s_len + sh->head_dim) * sizeof *scores);
  if (!scores)
    return mn_ref_fail(c, MN_ERR_OUT_OF_MEMORY, "no memory for %zu attention scores", sh->s_len);
  size_t q_batch = sh->t_len * sh->heads * sh->head_dim;
  size_t kv_batch = sh->s_len * sh->kv_heads * sh->head_dim;
  size_t n = batches * sh->heads * sh->t_len, stats_batch = sh->heads * sh->t_len;
  for (size_t b = 0; b < batches; b++)
    attend(sh, sh->positions ? sh->positions + b * sh->t_len : NULL, q + b * q_batch,
           k + b * kv_batch, v + b * kv_batch, out + b * q_batch, scores, scores + sh->s_len,
           stats ? stats + b * stats_batch : NULL, n);
  free(scores);
  return MN_OK;
}

static mn_status attention(const mn_ref_ctx *c, bool causal, const uint32_t *positions) {
  const mn_tensor_type *tq = mn_ref_in_type(c, 0), *tk = mn_ref_in_type(c, 1);
  const mn_op_attrs *a = &c->node->attrs;
  attn_shape sh = {.t_len = (size_t)tq->shape[tq->rank - 2],
                   .s_len = (size_t)tk->shape[tk->rank - 2],
                   .heads = (size_t)a->num_heads,
                   .kv_heads = (size_t)a->num_kv_heads,
                   .head_dim = (size_t)a->head_dim,
                   .causal = causal,
                   .positions = positions};
  size_t batches = tq->rank == 3 ? (size_t)tq->shape[0] : 1;
  return attend_batches(c, &sh, batches, mn_ref_in_f32(c, 0), mn_ref_in_f32(c, 1),
                        mn_ref_in_f32(c, 2), mn_ref_out_f32(c),
                        a->variant == 1 ? c->extra_out[0] : NULL);
}

mn_status mn_ref_CAUSAL_ATTENTION(const mn_ref_ctx *c) { return attention(c, true, NULL); }
mn_status mn_ref_FULL_ATTENTION(const mn_ref_ctx *c) { return attention(c, false, NULL); }
mn_status mn_ref_CROSS_ATTENTION(const mn_ref_ctx *c) { return attention(c, false, NULL); }
mn_status mn_ref_CAUSAL_ATTENTION_PACKED(const mn_ref_ctx *c) {
  return attention(c, true, mn_ref_in_u32(c, 3));
}

/* qkv [.., T, (H + 2 KVH) hd]: the blocks q | k | v of each row, copied apart, then the causal
 * attention of causal_attention. */
mn_status mn_ref_QKV_CAUSAL_ATTENTION(const mn_ref_ctx *c) {
  const mn_tensor_type *tx = mn_ref_in_type(c, 0);
  const mn_op_attrs *a = &c->node->attrs;
  attn_shape sh = {.t_len = (size_t)tx->shape[tx->rank - 2],
                   .heads = (size_t)a->num_heads,
                   .kv_heads = (size_t)a->num_kv_heads,
                   .head_dim = (size_t)a->head_dim,
                   .causal = true};
  sh.s_len = sh.t_len;
  size_t batches = tx->rank == 3 ? (size_t)tx->shape[0] : 1, rows = batches * sh.t_len;
  size_t qw = sh.heads * sh.head_dim, kw = sh.kv_heads * sh.head_dim, pitch = qw + 2 * kw;
  size_t n = rows * pitch;
  float *q = malloc((n ? n : 1) * sizeof *q);
  if (!q) return mn_ref_fail(c, MN_ERR_OUT_OF_MEMORY, "no memory for q, k and v (%zu rows)", rows);
  float *k = q + rows * qw, *v = k + rows * kw;
  mn_ref_split_qkv(mn_ref_in_f32(c, 0), rows, qw, kw, q, k, v);
  mn_status st = attend_batches(c, &sh, batches, q, k, v, mn_ref_out_f32(c),
                                a->variant == 1 ? c->extra_out[0] : NULL);
  free(q);
  return st;
}

/* The sequences of a cache ([S, D]: one; [B, S, D]: B) and the rows of each. */
static size_t cache_batch(const mn_tensor_type *t) {
  return t->rank == 3 ? (size_t)t->shape[0] : 1;
}
static size_t cache_rows(const mn_tensor_type *t) { return (size_t)t->shape[t->rank - 2]; }

/* The rows per sequence of new_kv or q: [B, W] holds one, [B, P, W] P. */
static size_t rows_each(const mn_tensor_type *t) { return t->rank == 3 ? (size_t)t->shape[1] : 1; }

/* out is the cache's own buffer (the plan makes the op in place), so only rows kv_pos ..
 * kv_pos+P-1 of each sequence change and every other row keeps what earlier steps wrote. */
mn_status mn_ref_CACHE_WRITE(const mn_ref_ctx *c) {
  const mn_tensor_type *tc = mn_ref_in_type(c, 1);
  size_t batch = cache_batch(tc), max_seq = cache_rows(tc),
         kv_dim = (size_t)tc->shape[tc->rank - 1], p = rows_each(mn_ref_in_type(c, 0));
  uint32_t pos = mn_ref_in_u32(c, 2)[0];
  if (pos >= max_seq || p > max_seq - pos)
    return mn_ref_fail(c, MN_ERR_INVALID_ARGUMENT,
                       "mn_cache_write: kv_pos %u is out of range for a cache of %zu rows "
                       "(node %u) and %zu new rows",
                       pos, max_seq, c->node->inputs[1], p);
  for (size_t b = 0; b < batch; b++)
    memmove(mn_ref_out_f32(c) + (b * max_seq + pos) * kv_dim, mn_ref_in_f32(c, 0) + b * p * kv_dim,
            p * kv_dim * sizeof(float));
  return MN_OK;
}

mn_status mn_ref_CACHED_ATTENTION(const mn_ref_ctx *c) {
  const mn_tensor_type *tk = mn_ref_in_type(c, 1);
  const mn_op_attrs *a = &c->node->attrs;
  size_t batch = cache_batch(tk), max_seq = cache_rows(tk), p = rows_each(mn_ref_in_type(c, 0));
  uint32_t kv_len = mn_ref_in_u32(c, 3)[0];
  if (kv_len < p || kv_len == 0 || kv_len > max_seq)
    return mn_ref_fail(c, MN_ERR_INVALID_ARGUMENT,
                       "mn_cached_attention: kv_len %u is out of range %zu..%zu (the query rows "
                       "to the rows of k_cache node %u)",
                       kv_len, p, max_seq, c->node->inputs[1]);
  /* Query row r is the token at row kv_len - p + r of the cache: causal with that offset. */
  attn_shape sh = {.t_len = p,
                   .s_len = kv_len,
                   .heads = (size_t)a->num_heads,
                   .kv_heads = (size_t)a->num_kv_heads,
                   .head_dim = (size_t)a->head_dim,
                   .causal = true,
                   .offset = kv_len - p};
  size_t q_row = p * sh.heads * sh.head_dim, kv_seq = max_seq * sh.kv_heads * sh.head_dim;
  for (size_t b = 0; b < batch; b++) {
    mn_status st =
        attend_batches(c, &sh, 1, mn_ref_in_f32(c, 0) + b * q_row, mn_ref_in_f32(c, 1) + b * kv_seq,
                       mn_ref_in_f32(c, 2) + b * kv_seq, mn_ref_out_f32(c) + b * q_row, NULL);
    if (st != MN_OK) return st;
  }
  return MN_OK;
}
