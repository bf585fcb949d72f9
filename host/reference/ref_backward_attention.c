/* Reference kernels of the attention gradients. Inputs are (q, k, v, dy) with the forward
 * attrs; variant 1 is causal. The packed gradients are causal within the segments of their
 * positions, their last input (ops.h). Per (batch, query, head) the softmax probabilities P are
 * recomputed in double, then
 *   dV[s] += P[s] dy,  dS[s] = P[s] (dy.v[s] - delta),  delta = sum_s' P[s'] dy.v[s'],
 *   dQ = scale sum_s dS[s] k[s],  dK[s] += scale dS[s] q,
 * with dK and dV summing over the query heads that share a kv head. attention_grad_kv
 * writes dK and dV side by side in each row. The _saved forms also read the forward's output
 * y (input 4) and statistics (input 5): their delta is dy . y, the same sum written through
 * the stored output, as the CUDA kernels take it; the probabilities are recomputed here as
 * for the others (the statistics only spare the CUDA kernels a pass). */
#include <math.h>
#include <stdlib.h>

#include "host/reference/ref_shared.h"

typedef enum grad_of { GRAD_Q, GRAD_K, GRAD_V } grad_of;

typedef struct attn_dims {
  size_t batches, t_len, s_len, heads, kv_heads, head_dim;
  bool causal;
  const uint32_t *positions; /* packed gradients: U32 [B, T] (their last input), else NULL */
} attn_dims;

static attn_dims dims_of(const mn_ref_ctx *c) {
  const mn_tensor_type *tq = mn_ref_in_type(c, 0), *tk = mn_ref_in_type(c, 1);
  const mn_op_attrs *a = &c->node->attrs;
  bool packed = mn_op_is_packed_attention_grad(c->node->op);
  return (attn_dims){.batches = tq->rank == 3 ? (size_t)tq->shape[0] : 1,
                     .t_len = (size_t)tq->shape[tq->rank - 2],
                     .s_len = (size_t)tk->shape[tk->rank - 2],
                     .heads = (size_t)a->num_heads,
                     .kv_heads = (size_t)a->num_kv_heads,
                     .head_dim = (size_t)a->head_dim,
                     .causal = packed || a->variant == 1,
                     .positions = packed ? mn_ref_in_u32(c, c->node->num_inputs - 1) : NULL};
}

/* Turns p into dS in place: dS[s] = p[s] (dy.v[s] - delta), delta = sum_s' p[s'] dy.v[s'],
 * or dy.y when the output row yh is given. */
static void score_grad(const float *dyh, const float *yh, const float *v, size_t kv_stride,
                       size_t n_keys, size_t hd, double *p, double *dp) {
  double mean = 0;
  for (size_t s = 0; s < n_keys; s++) {
    const float *vs = v + s * kv_stride;
    double dot = 0;
    for (size_t d = 0; d < hd; d++)
      dot += (double)dyh[d] * vs[d];
    dp[s] = dot;
    mean += p[s] * dot;
  }
  if (yh) {
    mean = 0;
    for (size_t d = 0; d < hd; d++)
      mean += (double)dyh[d] * yh[d];
  }
  for (size_t s = 0; s < n_keys; s++)
    p[s] *= dp[s] - mean;
}

/* One batch: adds this batch's gradient of `which` into acc (laid out like that input). */
static void backward_batch(const attn_dims *sh, grad_of which, const uint32_t *positions,
                           const float *q, const float *k, const float *v, const float *dy,
                           const float *y, double *acc, double *p, double *dp) {
  size_t hd = sh->head_dim, q_stride = sh->heads * hd, kv_stride = sh->kv_heads * hd;
  size_t group = sh->heads / sh->kv_heads;
  double scale = 1.0 / sqrt((double)hd);
  for (size_t t = 0; t < sh->t_len; t++) {
    size_t first = positions ? mn_ref_segment_start(t, positions[t]) : 0;
    size_t n_keys = sh->causal ? t + 1 - first : sh->s_len;
    for (size_t h = 0; h < sh->heads; h++) {
      size_t q_off = t * q_stride + h * hd, kv_off = first * kv_stride + (h / group) * hd;
      const float *qh = q + q_off, *dyh = dy + q_off;
      mn_ref_attention_probs(qh, k + kv_off, kv_stride, n_keys, hd, scale, p, NULL);
      if (which == GRAD_V) {
        for (size_t s = 0; s < n_keys; s++) {
          double *dv = acc + s * kv_stride + kv_off;
          for (size_t d = 0; d < hd; d++)
            dv[d] += p[s] * dyh[d];
        }
        continue;
      }
      score_grad(dyh, y ? y + q_off : NULL, v + kv_off, kv_stride, n_keys, hd, p, dp);
      if (which == GRAD_Q) {
        double *dq = acc + q_off;
        for (size_t s = 0; s < n_keys; s++) {
          const float *ks = k + s * kv_stride + kv_off;
          for (size_t d = 0; d < hd; d++)
            dq[d] += scale * p[s] * ks[d];
        }
      } else {
        for (size_t s = 0; s < n_keys; s++) {
          double *dk = acc + s * kv_stride + kv_off;
          for (size_t d = 0; d < hd; d++)
            dk[d] += scale * p[s] * qh[d];
        }
      }
    }
  }
}

/* What a gradient reads: q [B, T, H hd], k and v [B, S, KVH hd], dy and (saved forms, else
 * NULL) the forward's output y like q. */
typedef struct attn_operands {
  const float *q, *k, *v, *dy, *y;
} attn_operands;

static attn_operands operands_of(const mn_ref_ctx *c) {
  return (attn_operands){mn_ref_in_f32(c, 0), mn_ref_in_f32(c, 1), mn_ref_in_f32(c, 2),
                         mn_ref_in_f32(c, 3),
                         mn_op_is_saved_attention_grad(c->node->op) ? mn_ref_in_f32(c, 4) : NULL};
}

/* One gradient into acc (laid out like its input), summed in double. */
static void gradient_of(const attn_operands *o, const attn_dims *sh, grad_of which, double *acc,
                        double *p, double *dp) {
  size_t q_batch = sh->t_len * sh->heads * sh->head_dim;
  size_t kv_batch = sh->s_len * sh->kv_heads * sh->head_dim;
  size_t out_batch = which == GRAD_Q ? q_batch : kv_batch;
  for (size_t b = 0; b < sh->batches; b++)
    backward_batch(sh, which, sh->positions ? sh->positions + b * sh->t_len : NULL,
                   o->q + b * q_batch, o->k + b * kv_batch, o->v + b * kv_batch,
                   o->dy + b * q_batch, o->y ? o->y + b * q_batch : NULL, acc + b * out_batch, p,
                   dp);
}

static mn_status attention_backward(const mn_ref_ctx *c, grad_of which) {
  attn_dims sh = dims_of(c);
  size_t n_out = mn_ref_numel(c);
  /* GQA sums several heads' terms into one kv element: accumulate all of them in double
   * before rounding once. */
  double *acc = calloc(n_out + 2 * sh.s_len, sizeof *acc);
  if (!acc)
    return mn_ref_fail(c, MN_ERR_OUT_OF_MEMORY, "no memory for %zu attention gradients", n_out);
  double *p = acc + n_out, *dp = p + sh.s_len;
  attn_operands ops = operands_of(c);
  gradient_of(&ops, &sh, which, acc, p, dp);
  float *o = mn_ref_out_f32(c);
  for (size_t i = 0; i < n_out; i++)
    o[i] = (float)acc[i];
  free(acc);
  return MN_OK;
}

mn_status mn_ref_ATTENTION_GRAD_Q(const mn_ref_ctx *c) { return attention_backward(c, GRAD_Q); }
mn_status mn_ref_ATTENTION_GRAD_K(const mn_ref_ctx *c) { return attention_backward(c, GRAD_K); }
mn_status mn_ref_ATTENTION_GRAD_V(const mn_ref_ctx *c) { return attention_backward(c, GRAD_V); }

mn_status mn_ref_ATTENTION_GRAD_Q_SAVED(const mn_ref_ctx *c) {
  return attention_backward(c, GRAD_Q);
}

/* dK and dV side by side in each row of the output. */
static mn_status attention_backward_kv(const mn_ref_ctx *c) {
  attn_dims sh = dims_of(c);
  size_t n_out = mn_ref_numel(c), half = n_out / 2, width = sh.kv_heads * sh.head_dim;
  double *acc = calloc(n_out + 2 * sh.s_len, sizeof *acc);
  if (!acc)
    return mn_ref_fail(c, MN_ERR_OUT_OF_MEMORY, "no memory for %zu attention gradients", n_out);
  double *dk = acc, *dv = acc + half, *p = acc + n_out, *dp = p + sh.s_len;
  attn_operands ops = operands_of(c);
  gradient_of(&ops, &sh, GRAD_K, dk, p, dp);
  gradient_of(&ops, &sh, GRAD_V, dv, p, dp);
  float *o = mn_ref_out_f32(c);
  for (size_t r = 0; r < half / width; r++)
    for (size_t j = 0; j < width; j++) {
      o[2 * r * width + j] = (float)dk[r * width + j];
      o[(2 * r + 1) * width + j] = (float)dv[r * width + j];
    }
  free(acc);
  return MN_OK;
}

mn_status mn_ref_ATTENTION_GRAD_KV(const mn_ref_ctx *c) { return attention_backward_kv(c); }
mn_status mn_ref_ATTENTION_GRAD_KV_SAVED(const mn_ref_ctx *c) { return attention_backward_kv(c); }

mn_status mn_ref_PACKED_ATTENTION_GRAD_Q(const mn_ref_ctx *c) {
  return attention_backward(c, GRAD_Q);
}
mn_status mn_ref_PACKED_ATTENTION_GRAD_K(const mn_ref_ctx *c) {
  return attention_backward(c, GRAD_K);
}
mn_status mn_ref_PACKED_ATTENTION_GRAD_V(const mn_ref_ctx *c) {
  return attention_backward(c, GRAD_V);
}
mn_status mn_ref_PACKED_ATTENTION_GRAD_KV(const mn_ref_ctx *c) { return attention_backward_kv(c); }
mn_status mn_ref_PACKED_ATTENTION_GRAD_Q_SAVED(const mn_ref_ctx *c) {
  return attention_backward(c, GRAD_Q);
}
mn_status mn_ref_PACKED_ATTENTION_GRAD_KV_SAVED(const mn_ref_ctx *c) {
  return attention_backward_kv(c);
}

/* qkv_attention_grad_saved (qkv, dy, y, stats): the blocks q | k | v of qkv's rows copied apart,
 * then dQ, dK and dV as for the saved forms, written into the same blocks of the output. */
mn_status mn_ref_QKV_ATTENTION_GRAD_SAVED(const mn_ref_ctx *c) {
  const mn_tensor_type *tx = mn_ref_in_type(c, 0);
  const mn_op_attrs *a = &c->node->attrs;
  attn_dims sh = {.batches = tx->rank == 3 ? (size_t)tx->shape[0] : 1,
                  .t_len = (size_t)tx->shape[tx->rank - 2],
                  .heads = (size_t)a->num_heads,
                  .kv_heads = (size_t)a->num_kv_heads,
                  .head_dim = (size_t)a->head_dim,
                  .causal = true};
  sh.s_len = sh.t_len;
  size_t rows = sh.batches * sh.t_len, qw = sh.heads * sh.head_dim;
  size_t kw = sh.kv_heads * sh.head_dim, pitch = qw + 2 * kw, n = rows * pitch;
  float *qkv = malloc((n ? n : 1) * sizeof *qkv);
  double *acc = calloc(n + 2 * sh.s_len, sizeof *acc);
  if (!qkv || !acc) {
    free(qkv);
    free(acc);
    return mn_ref_fail(c, MN_ERR_OUT_OF_MEMORY, "no memory for %zu attention gradients", n);
  }
  float *q = qkv, *k = q + rows * qw, *v = k + rows * kw;
  mn_ref_split_qkv(mn_ref_in_f32(c, 0), rows, qw, kw, q, k, v);
  attn_operands o = {q, k, v, mn_ref_in_f32(c, 1), mn_ref_in_f32(c, 2)};
  double *dq = acc, *dk = dq + rows * qw, *dv = dk + rows * kw, *p = acc + n, *dp = p + sh.s_len;
  gradient_of(&o, &sh, GRAD_Q, dq, p, dp);
  gradient_of(&o, &sh, GRAD_K, dk, p, dp);
  gradient_of(&o, &sh, GRAD_V, dv, p, dp);
  float *out = mn_ref_out_f32(c);
  for (size_t r = 0; r < rows; r++) {
    for (size_t j = 0; j < qw; j++)
      out[r * pitch + j] = (float)dq[r * qw + j];
    for (size_t j = 0; j < kw; j++) {
      out[r * pitch + qw + j] = (float)dk[r * kw + j];
      out[r * pitch + qw + kw + j] = (float)dv[r * kw + j];
    }
  }
  free(qkv);
  free(acc);
  return MN_OK;
}
