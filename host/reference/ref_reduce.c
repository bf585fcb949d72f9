/* Reference kernels: whole-tensor reductions, softmax over the last axis and the mean
 * losses. Every loss writes its scalar into out[0]. */
#include <math.h>

#include "host/pointwise.h"
#include "host/reference/ref_shared.h"

static size_t numel(const mn_tensor_type *t) { return (size_t)mn_tensor_type_numel(t); }

static double sum(const float *x, size_t n) {
  double acc = 0;
  for (size_t i = 0; i < n; i++)
    acc += x[i];
  return acc;
}

mn_status mn_ref_SUM_ALL(const mn_ref_ctx *c) {
  mn_ref_out_f32(c)[0] = (float)sum(mn_ref_in_f32(c, 0), numel(mn_ref_in_type(c, 0)));
  return MN_OK;
}

mn_status mn_ref_MEAN_ALL(const mn_ref_ctx *c) {
  size_t n = numel(mn_ref_in_type(c, 0));
  mn_ref_out_f32(c)[0] = (float)(sum(mn_ref_in_f32(c, 0), n) / (double)n);
  return MN_OK;
}

/* log_softmax is (x - max) - log_sum, subtracted in that order so that the largest
 * entry's value stays exact even when the row holds values of very different magnitude. */
static double log_softmax_at(const float *x, mn_ref_row_stats st, size_t i) {
  return ((double)x[i] - st.max) - st.log_sum;
}

mn_status mn_ref_SOFTMAX(const mn_ref_ctx *c) {
  const float *x = mn_ref_in_f32(c, 0);
  float *o = mn_ref_out_f32(c);
  size_t n = mn_ref_last_dim(&c->node->type), rows = mn_ref_numel(c) / n;
  for (size_t r = 0; r < rows; r++, x += n, o += n) {
    mn_ref_row_stats st = mn_ref_row_stats_of(x, n);
    for (size_t i = 0; i < n; i++)
      o[i] = (float)exp(log_softmax_at(x, st, i));
  }
  return MN_OK;
}

mn_status mn_ref_LOG_SOFTMAX(const mn_ref_ctx *c) {
  const float *x = mn_ref_in_f32(c, 0);
  float *o = mn_ref_out_f32(c);
  size_t n = mn_ref_last_dim(&c->node->type), rows = mn_ref_numel(c) / n;
  for (size_t r = 0; r < rows; r++, x += n, o += n) {
    mn_ref_row_stats st = mn_ref_row_stats_of(x, n);
    for (size_t i = 0; i < n; i++)
      o[i] = (float)log_softmax_at(x, st, i);
  }
  return MN_OK;
}

mn_status mn_ref_CROSS_ENTROPY_LOSS(const mn_ref_ctx *c) {
  const float *x = mn_ref_in_f32(c, 0), *t = mn_ref_in_f32(c, 1);
  const mn_tensor_type *tl = mn_ref_in_type(c, 0);
  size_t n = mn_ref_last_dim(tl), rows = numel(tl) / n;
  double acc = 0;
  for (size_t r = 0; r < rows; r++, x += n, t += n) {
    mn_ref_row_stats st = mn_ref_row_stats_of(x, n);
    for (size_t i = 0; i < n; i++)
      acc -= (double)t[i] * log_softmax_at(x, st, i);
  }
  mn_ref_out_f32(c)[0] = (float)(acc / (double)rows);
  return MN_OK;
}

/* Formats the multi-index of flat position `pos` within shape t, e.g. "[1,2]". */
static void index_str(const mn_tensor_type *t, size_t pos, char *buf, size_t size) {
  size_t idx[MN_MAX_RANK];
  for (int d = t->rank - 1; d >= 0; d--) {
    idx[d] = pos % (size_t)t->shape[d];
    pos /= (size_t)t->shape[d];
  }
  size_t used = 0;
  for (int d = 0; d < t->rank && used < size; d++) {
    int w = snprintf(buf + used, size - used, "%s%zu%s", d ? "," : "[", idx[d],
                     d == t->rank - 1 ? "]" : "");
    if (w < 0) break;
    used += (size_t)w;
  }
}

mn_status mn_ref_SPARSE_CROSS_ENTROPY_LOSS(const mn_ref_ctx *c) {
  const float *x = mn_ref_in_f32(c, 0);
  const uint32_t *labels = mn_ref_in_u32(c, 1);
  const mn_tensor_type *tl = mn_ref_in_type(c, 0), *ty = mn_ref_in_type(c, 1);
  size_t n = mn_ref_last_dim(tl), rows = numel(ty);
  float *o = mn_ref_out_f32(c);
  /* Validate every label before reading any logits row, so a bad label never indexes
   * past its row. */
  size_t counted = 0;
  for (size_t r = 0; r < rows; r++) {
    if (labels[r] == MN_IGNORE_LABEL) continue;
    counted++;
    if (labels[r] >= n) {
      o[0] = NAN;
      char idx[24 * MN_MAX_RANK], ls[96], ys[96];
      index_str(ty, r, idx, sizeof idx);
      return mn_ref_fail(c, MN_ERR_INVALID_ARGUMENT,
                         "label %u at %s (position %zu) of labels node %u %s is out of range: "
                         "logits node %u %s has C = %zu classes",
                         labels[r], idx, r, c->node->inputs[1], mn_shape_str(ty, ys, sizeof ys),
                         c->node->inputs[0], mn_shape_str(tl, ls, sizeof ls), n);
    }
  }
  if (counted == 0) {
    o[0] = NAN;
    return mn_ref_all_labels_ignored(c);
  }
  double acc = 0;
  for (size_t r = 0; r < rows; r++, x += n)
    if (labels[r] != MN_IGNORE_LABEL)
      acc -= log_softmax_at(x, mn_ref_row_stats_of(x, n), labels[r]);
  o[0] = (float)(acc / (double)counted);
  return MN_OK;
}

mn_status mn_ref_BCE_LOSS(const mn_ref_ctx *c) {
  const float *p = mn_ref_in_f32(c, 0), *t = mn_ref_in_f32(c, 1);
  size_t n = numel(mn_ref_in_type(c, 0));
  double acc = 0;
  for (size_t i = 0; i < n; i++) {
    double pi = p[i], ti = t[i];
    acc += ti * mn_pw_clamped_log(pi) + (1.0 - ti) * mn_pw_clamped_log(1.0 - pi);
  }
  mn_ref_out_f32(c)[0] = (float)(-acc / (double)n);
  return MN_OK;
}

mn_status mn_ref_MSE_LOSS(const mn_ref_ctx *c) {
  const float *p = mn_ref_in_f32(c, 0), *t = mn_ref_in_f32(c, 1);
  size_t n = numel(mn_ref_in_type(c, 0));
  double acc = 0;
  for (size_t i = 0; i < n; i++) {
    double d = (double)p[i] - t[i];
    acc += d * d;
  }
  mn_ref_out_f32(c)[0] = (float)(acc / (double)n);
  return MN_OK;
}

mn_status mn_ref_L1_LOSS(const mn_ref_ctx *c) {
  const float *p = mn_ref_in_f32(c, 0), *t = mn_ref_in_f32(c, 1);
  size_t n = numel(mn_ref_in_type(c, 0));
  double acc = 0;
  for (size_t i = 0; i < n; i++)
    acc += fabs((double)p[i] - t[i]);
  mn_ref_out_f32(c)[0] = (float)(acc / (double)n);
  return MN_OK;
}
