/* Reference kernel of llama_decode_layer (host/decode_layer.h): the layer of models/llama.c for
 * one token a sequence, each intermediate kept in fp32 (dot products, norms and softmax in
 * double), the new k and v rows written into the caches before the attention reads them. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "host/decode_layer.h"
#include "host/reference/ref_shared.h"

/* out[r] = w[r, :] . a for rows r of w [rows, n]: the products' threaded kernel (ref_math.c),
 * so a decode layer uses the cores as the unfused layer's products do. */
static void matvec(const float *w, const float *a, size_t rows, size_t n, float *out) {
  mn_ref_gemm(a, n, 1, w, 1, n, out, 1, rows, n);
}

static void rms_norm(const float *x, const float *w, size_t n, double eps, float *out) {
  double ss = 0;
  for (size_t i = 0; i < n; i++)
    ss += (double)x[i] * x[i];
  double inv = 1.0 / sqrt(ss / (double)n + eps);
  for (size_t i = 0; i < n; i++)
    out[i] = (float)(x[i] * inv * w[i]);
}

/* Rotate-half RoPE of the heads of x [width] at position pos, in place. */
static void rope(float *x, size_t width, size_t hd, double pos, double theta) {
  size_t half = hd / 2;
  for (size_t h = 0; h < width; h += hd)
    for (size_t i = 0; i < half; i++) {
      double angle = pos * pow(theta, -2.0 * (double)i / (double)hd);
      double cs = cos(angle), sn = sin(angle), a = x[h + i], b = x[h + i + half];
      x[h + i] = (float)(a * cs - b * sn);
      x[h + i + half] = (float)(b * cs + a * sn);
    }
}

mn_status mn_ref_LLAMA_DECODE_LAYER(const mn_ref_ctx *c) {
  const mn_op_attrs *at = &c->node->attrs;
  const mn_tensor_type *tk = mn_ref_in_type(c, MN_DL_K_CACHE), *tx = &c->node->type;
  size_t batch = (size_t)tk->shape[0], max_seq = (size_t)tk->shape[1];
  size_t dim = (size_t)tx->shape[tx->rank - 1], hd = (size_t)at->head_dim;
  size_t heads = (size_t)at->num_heads, kv_heads = (size_t)at->num_kv_heads;
  size_t q_dim = heads * hd, kv_dim = kv_heads * hd, group = heads / kv_heads;
  size_t ff = (size_t)mn_ref_in_type(c, MN_DL_WGATE)->shape[0];
  uint32_t pos = mn_ref_in_u32(c, MN_DL_POS)[0], kv_len = mn_ref_in_u32(c, MN_DL_KV_LEN)[0];
  if (pos >= max_seq)
    return mn_ref_fail(c, MN_ERR_INVALID_ARGUMENT,
                       "kv_pos %u is out of range for a cache of %zu rows (node %u)", pos, max_seq,
                       c->node->inputs[MN_DL_K_CACHE]);
  if (kv_len == 0 || kv_len > max_seq)
    return mn_ref_fail(c, MN_ERR_INVALID_ARGUMENT,
                       "kv_len %u is out of range 1..%zu (the rows of k_cache node %u)", kv_len,
                       max_seq, c->node->inputs[MN_DL_K_CACHE]);
  size_t scratch = 2 * dim + 2 * q_dim + 2 * kv_dim + 2 * ff;
  float *a = malloc(scratch * sizeof *a);
  double *p = malloc(((size_t)kv_len + hd) * sizeof *p);
  if (!a || !p) {
    free(a);
    free(p);
    return mn_ref_fail(c, MN_ERR_OUT_OF_MEMORY, "out of memory");
  }
  float *x1 = a + dim, *q = x1 + dim, *k = q + q_dim, *v = k + kv_dim, *g = v + kv_dim, *u = g + ff,
        *att = u + ff;
  float *kc = (float *)c->in[MN_DL_K_CACHE], *vc = (float *)c->in[MN_DL_V_CACHE];
  double scale = 1.0 / sqrt((double)hd), *acc = p + kv_len;
  for (size_t b = 0; b < batch; b++) {
    const float *x = mn_ref_in_f32(c, MN_DL_X) + b * dim;
    rms_norm(x, mn_ref_in_f32(c, MN_DL_NORM1), dim, at->eps, a);
    matvec(mn_ref_in_f32(c, MN_DL_WQ), a, q_dim, dim, q);
    matvec(mn_ref_in_f32(c, MN_DL_WK), a, kv_dim, dim, k);
    matvec(mn_ref_in_f32(c, MN_DL_WV), a, kv_dim, dim, v);
    rope(q, q_dim, hd, pos, at->theta);
    rope(k, kv_dim, hd, pos, at->theta);
    float *kb = kc + b * max_seq * kv_dim, *vb = vc + b * max_seq * kv_dim;
    memcpy(kb + pos * kv_dim, k, kv_dim * sizeof *k);
    memcpy(vb + pos * kv_dim, v, kv_dim * sizeof *v);
    for (size_t h = 0; h < heads; h++) {
      size_t off = (h / group) * hd;
      mn_ref_attention_probs(q + h * hd, kb + off, kv_dim, kv_len, hd, scale, p, NULL);
      for (size_t d = 0; d < hd; d++)
        acc[d] = 0;
      for (size_t s = 0; s < kv_len; s++)
        for (size_t d = 0; d < hd; d++)
          acc[d] += p[s] * vb[s * kv_dim + off + d];
      for (size_t d = 0; d < hd; d++)
        att[h * hd + d] = (float)acc[d];
    }
    matvec(mn_ref_in_f32(c, MN_DL_WO), att, dim, q_dim, x1);
    for (size_t i = 0; i < dim; i++)
      x1[i] += x[i];
    rms_norm(x1, mn_ref_in_f32(c, MN_DL_NORM2), dim, at->eps, a);
    matvec(mn_ref_in_f32(c, MN_DL_WGATE), a, ff, dim, g);
    matvec(mn_ref_in_f32(c, MN_DL_WUP), a, ff, dim, u);
    for (size_t i = 0; i < ff; i++)
      g[i] = (float)((double)g[i] / (1.0 + exp(-(double)g[i])) * u[i]);
    float *out = mn_ref_out_f32(c) + b * dim;
    matvec(mn_ref_in_f32(c, MN_DL_WDOWN), g, dim, ff, out);
    for (size_t i = 0; i < dim; i++)
      out[i] += x1[i];
  }
  free(a);
  free(p);
  return MN_OK;
}
