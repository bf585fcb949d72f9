#include "host/reference/ref_shared.h"

#include <math.h>
#include <string.h>

mn_ref_row_stats mn_ref_row_stats_of(const float *x, size_t n) {
  double m = x[0];
  for (size_t i = 1; i < n; i++)
    if (x[i] > m) m = x[i];
  double s = 0;
  for (size_t i = 0; i < n; i++)
    s += exp((double)x[i] - m);
  return (mn_ref_row_stats){m, log(s)};
}

void mn_ref_rope_row(const float *x, float *out, size_t width, size_t hd, double pos, double theta,
                     int direction) {
  size_t half = hd / 2;
  for (size_t h = 0; h < width; h += hd)
    for (size_t i = 0; i < half; i++) {
      double angle = pos * pow(theta, -2.0 * (double)i / (double)hd);
      double cs = cos(angle), sn = direction * sin(angle), a = x[h + i], b = x[h + i + half];
      out[h + i] = (float)(a * cs - b * sn);
      out[h + i + half] = (float)(b * cs + a * sn);
    }
}

void mn_ref_rope_rotate(const mn_ref_ctx *c, double offset, const uint32_t *positions,
                        int direction) {
  const mn_tensor_type *t = &c->node->type;
  const float *x = mn_ref_in_f32(c, 0);
  float *o = mn_ref_out_f32(c);
  size_t d = (size_t)t->shape[t->rank - 1], seq = (size_t)t->shape[t->rank - 2];
  size_t rows = mn_ref_numel(c) / d;
  for (size_t r = 0; r < rows; r++) {
    double pos = positions ? (double)positions[r] : (double)(r % seq) + offset;
    mn_ref_rope_row(x + r * d, o + r * d, d, (size_t)c->node->attrs.head_dim, pos,
                    c->node->attrs.theta, direction);
  }
}

void mn_ref_rms_norm_row(const float *x, const float *w, size_t n, double eps, float *out) {
  double ss = 0;
  for (size_t i = 0; i < n; i++)
    ss += (double)x[i] * x[i];
  double inv = 1.0 / sqrt(ss / (double)n + eps);
  for (size_t i = 0; i < n; i++)
    out[i] = (float)(x[i] * inv * w[i]);
}

void mn_ref_attention_probs(const float *qh, const float *k, size_t kv_stride, size_t n_keys,
                            size_t head_dim, double scale, double *p, float stats[2]) {
  double max = -INFINITY;
  for (size_t s = 0; s < n_keys; s++) {
    const float *ks = k + s * kv_stride;
    double dot = 0;
    for (size_t d = 0; d < head_dim; d++)
      dot += (double)qh[d] * ks[d];
    p[s] = dot * scale;
    if (p[s] > max) max = p[s];
  }
  double sum = 0;
  for (size_t s = 0; s < n_keys; s++) {
    p[s] = exp(p[s] - max);
    sum += p[s];
  }
  for (size_t s = 0; s < n_keys; s++)
    p[s] /= sum;
  if (stats) {
    stats[0] = (float)(max * 1.4426950408889634); /* log2(e): exp(x) = exp2(x log2(e)) */
    stats[1] = (float)(1.0 / sum);
  }
}

void mn_ref_column_sums(const float *x, size_t rows, size_t cols, float *out) {
  for (size_t j = 0; j < cols; j++) {
    double acc = 0;
    for (size_t r = 0; r < rows; r++)
      acc += x[r * cols + j];
    out[j] = (float)acc;
  }
}

mn_status mn_ref_all_labels_ignored(const mn_ref_ctx *c) {
  const mn_tensor_type *ty = mn_ref_in_type(c, 1);
  char ys[96];
  return mn_ref_fail(c, MN_ERR_INVALID_ARGUMENT,
                     "every label of labels node %u %s is the ignore label MN_IGNORE_LABEL (%u): "
                     "the mean cross-entropy over no counted rows is undefined",
                     c->node->inputs[1], mn_shape_str(ty, ys, sizeof ys), MN_IGNORE_LABEL);
}

void mn_ref_split_qkv(const float *x, size_t rows, size_t q_width, size_t kv_width, float *q,
                      float *k, float *v) {
  size_t pitch = q_width + 2 * kv_width;
  for (size_t r = 0; r < rows; r++) {
    memcpy(q + r * q_width, x + r * pitch, q_width * sizeof *q);
    memcpy(k + r * kv_width, x + r * pitch + q_width, kv_width * sizeof *k);
    memcpy(v + r * kv_width, x + r * pitch + q_width + kv_width, kv_width * sizeof *v);
  }
}

void mn_ref_attend_head(const float *qh, const float *k, const float *v, size_t kv_stride,
                        size_t n_keys, size_t head_dim, double scale, double *p, double *acc,
                        float *out, float stats[2]) {
  mn_ref_attention_probs(qh, k, kv_stride, n_keys, head_dim, scale, p, stats);
  for (size_t d = 0; d < head_dim; d++)
    acc[d] = 0;
  for (size_t s = 0; s < n_keys; s++)
    for (size_t d = 0; d < head_dim; d++)
      acc[d] += p[s] * v[s * kv_stride + d];
  for (size_t d = 0; d < head_dim; d++)
    out[d] = (float)acc[d];
}
