/* Reference kernel of llama_decode_layer (host/decode_layer.h): the layer of models/llama.c for
 * one token a sequence, each intermediate kept in fp32 (dot products, norms and softmax in
 * double), the new k and v rows written into the caches before the attention reads them. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "host/decode_layer.h"
#include "host/reference/ref_shared.h"

/* out[r] = w[r, :] . a for rows r of Linear weight `input` [rows, n]: the products' threaded
 * kernels (ref_math.c, ref_quant.c), so a decode layer uses the cores and does the arithmetic of
 * the unfused layer's products; false when out of memory. */
static bool product(const mn_ref_ctx *c, int input, const float *a, size_t rows, size_t n,
                    float *out) {
  mn_quant q = (mn_quant)c->node->attrs.variant;
  if (q != MN_QUANT_NONE)
    return mn_ref_quant_product(a, 1, c->in[input], q, c->node->attrs.groups, n, rows, out);
  mn_ref_gemm(a, n, 1, mn_ref_in_f32(c, input), 1, n, out, 1, rows, n);
  return true;
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
  bool ok = true;
  for (size_t b = 0; ok && b < batch; b++) {
    const float *x = mn_ref_in_f32(c, MN_DL_X) + b * dim;
    mn_ref_rms_norm_row(x, mn_ref_in_f32(c, MN_DL_NORM1), dim, at->eps, a);
    ok = product(c, MN_DL_WQ, a, q_dim, dim, q) && product(c, MN_DL_WK, a, kv_dim, dim, k) &&
         product(c, MN_DL_WV, a, kv_dim, dim, v);
    mn_ref_rope_row(q, q, q_dim, hd, pos, at->theta, 1);
    mn_ref_rope_row(k, k, kv_dim, hd, pos, at->theta, 1);
    float *kb = kc + b * max_seq * kv_dim, *vb = vc + b * max_seq * kv_dim;
    memcpy(kb + pos * kv_dim, k, kv_dim * sizeof *k);
    memcpy(vb + pos * kv_dim, v, kv_dim * sizeof *v);
    for (size_t h = 0; h < heads; h++) {
      size_t off = (h / group) * hd;
      mn_ref_attend_head(q + h * hd, kb + off, vb + off, kv_dim, kv_len, hd, scale, p, acc,
                         att + h * hd, NULL);
    }
    ok = ok && product(c, MN_DL_WO, att, dim, q_dim, x1);
    for (size_t i = 0; i < dim; i++)
      x1[i] += x[i];
    mn_ref_rms_norm_row(x1, mn_ref_in_f32(c, MN_DL_NORM2), dim, at->eps, a);
    ok = ok && product(c, MN_DL_WGATE, a, ff, dim, g) && product(c, MN_DL_WUP, a, ff, dim, u);
    for (size_t i = 0; i < ff; i++)
      g[i] = (float)((double)g[i] / (1.0 + exp(-(double)g[i])) * u[i]);
    float *out = mn_ref_out_f32(c) + b * dim;
    ok = ok && product(c, MN_DL_WDOWN, g, dim, ff, out);
    for (size_t i = 0; i < dim; i++)
      out[i] += x1[i];
  }
  free(a);
  free(p);
  return ok ? MN_OK : mn_ref_fail(c, MN_ERR_OUT_OF_MEMORY, "out of memory for a weight row");
}
