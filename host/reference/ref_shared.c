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

void mn_ref_rope_rotate(const mn_ref_ctx *c, double offset, const uint32_t *positions,
                        int direction) {
  const mn_tensor_type *t = &c->node->type;
  const float *x = mn_ref_in_f32(c, 0);
  float *o = mn_ref_out_f32(c);
  size_t d = (size_t)t->shape[t->rank - 1], seq = (size_t)t->shape[t->rank - 2];
  size_t rows = mn_ref_numel(c) / d;
  size_t hd = (size_t)c->node->attrs.head_dim, half = hd / 2;
  double theta = c->node->attrs.theta;
  for (size_t r = 0; r < rows; r++) {
    double pos = positions ? (double)positions[r] : (double)(r % seq) + offset;
    for (size_t h = 0; h < d; h += hd) {
      const float *xh = x + r * d + h;
      float *oh = o + r * d + h;
      for (size_t i = 0; i < half; i++) {
        double angle = pos * pow(theta, -2.0 * (double)i / (double)hd);
        double cs = cos(angle), sn = direction * sin(angle), a = xh[i], b = xh[i + half];
        oh[i] = (float)(a * cs - b * sn);
        oh[i + half] = (float)(b * cs + a * sn);
      }
    }
  }
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
