/* Reference kernels of the softmax and loss gradients. The loss gradients read the
 * upstream gradient of the [1] loss as dy[0]; the mean's 1/count is applied here. */
#include <math.h>
#include <string.h>

#include "host/reference/ref_shared.h"

static size_t numel(const mn_tensor_type *t) { return (size_t)mn_tensor_type_numel(t); }

/* dx = y * (dy - sum_row(dy * y)). */
mn_status mn_ref_SOFTMAX_GRAD(const mn_ref_ctx *c) {
  const float *y = mn_ref_in_f32(c, 0), *dy = mn_ref_in_f32(c, 1);
  float *o = mn_ref_out_f32(c);
  size_t n = mn_ref_last_dim(&c->node->type), rows = mn_ref_numel(c) / n;
  for (size_t r = 0; r < rows; r++, y += n, dy += n, o += n) {
    double s = 0;
    for (size_t i = 0; i < n; i++)
      s += (double)dy[i] * y[i];
    for (size_t i = 0; i < n; i++)
      o[i] = (float)((double)y[i] * ((double)dy[i] - s));
  }
  return MN_OK;
}

/* dx = dy - softmax * sum_row(dy), the softmax being exp of the forward output. */
mn_status mn_ref_LOG_SOFTMAX_GRAD(const mn_ref_ctx *c) {
  const float *y = mn_ref_in_f32(c, 0), *dy = mn_ref_in_f32(c, 1);
  float *o = mn_ref_out_f32(c);
  size_t n = mn_ref_last_dim(&c->node->type), rows = mn_ref_numel(c) / n;
  for (size_t r = 0; r < rows; r++, y += n, dy += n, o += n) {
    double s = 0;
    for (size_t i = 0; i < n; i++)
      s += dy[i];
    for (size_t i = 0; i < n; i++)
      o[i] = (float)((double)dy[i] - exp((double)y[i]) * s);
  }
  return MN_OK;
}

/* A row's max and log(sum(exp(x - max))), as the forward kernels compute them, so that
 * the gradient is the derivative of exactly the loss that was reported. */
static double softmax_at(const float *x, mn_ref_row_stats st, size_t i) {
  return exp(((double)x[i] - st.max) - st.log_sum);
}

/* d logits = dy[0]/R * (softmax * sum_c t - t): the sum of t is kept because targets
 * need not be distributions (label smoothing, masked rows). */
mn_status mn_ref_CROSS_ENTROPY_GRAD(const mn_ref_ctx *c) {
  const float *x = mn_ref_in_f32(c, 0), *t = mn_ref_in_f32(c, 1);
  float *o = mn_ref_out_f32(c);
  size_t n = mn_ref_last_dim(&c->node->type), rows = mn_ref_numel(c) / n;
  double k = (double)mn_ref_in_f32(c, 2)[0] / (double)rows;
  for (size_t r = 0; r < rows; r++, x += n, t += n, o += n) {
    mn_ref_row_stats st = mn_ref_row_stats_of(x, n);
    double tsum = 0;
    for (size_t i = 0; i < n; i++)
      tsum += t[i];
    for (size_t i = 0; i < n; i++)
      o[i] = (float)(k * (softmax_at(x, st, i) * tsum - (double)t[i]));
  }
  return MN_OK;
}

/* d logits = dy[0]/count * (softmax - onehot(label)) on the rows that count, zero on those
 * whose label is MN_IGNORE_LABEL. The forward pass of the same step validated the labels, but
 * this kernel checks them again before reading any row, so that it is safe on its own (e.g.
 * run from another plan). */
mn_status mn_ref_SPARSE_CROSS_ENTROPY_GRAD(const mn_ref_ctx *c) {
  const float *x = mn_ref_in_f32(c, 0);
  const uint32_t *labels = mn_ref_in_u32(c, 1);
  const mn_tensor_type *ty = mn_ref_in_type(c, 1);
  float *o = mn_ref_out_f32(c);
  size_t n = mn_ref_last_dim(&c->node->type), rows = numel(ty), total = mn_ref_numel(c);
  size_t counted = 0;
  for (size_t r = 0; r < rows; r++) {
    if (labels[r] == MN_IGNORE_LABEL) continue;
    counted++;
    if (labels[r] < n) continue;
    for (size_t i = 0; i < total; i++)
      o[i] = NAN;
    char ys[96], ls[96];
    return mn_ref_fail(c, MN_ERR_INVALID_ARGUMENT,
                       "label %u at position %zu of labels node %u %s is out of range: logits "
                       "node %u %s has C = %zu classes",
                       labels[r], r, c->node->inputs[1], mn_shape_str(ty, ys, sizeof ys),
                       c->node->inputs[0], mn_shape_str(&c->node->type, ls, sizeof ls), n);
  }
  if (counted == 0) {
    for (size_t i = 0; i < total; i++)
      o[i] = NAN;
    return mn_ref_all_labels_ignored(c);
  }
  double k = (double)mn_ref_in_f32(c, 2)[0] / (double)counted;
  for (size_t r = 0; r < rows; r++, x += n, o += n) {
    if (labels[r] == MN_IGNORE_LABEL) {
      memset(o, 0, n * sizeof *o);
      continue;
    }
    mn_ref_row_stats st = mn_ref_row_stats_of(x, n);
    for (size_t i = 0; i < n; i++)
      o[i] = (float)(k * (softmax_at(x, st, i) - (i == labels[r] ? 1.0 : 0.0)));
  }
  return MN_OK;
}

/* The loss and, as extra value 1, its gradient (optimizer/loss_grad.h): the loss kernel, then
 * the gradient kernel into the extra value, in that order because the gradient may be written
 * over the logits (host/memplan.c). */
mn_status mn_ref_SPARSE_CROSS_ENTROPY_LOSS_GRAD(const mn_ref_ctx *c) {
  mn_status st = mn_ref_SPARSE_CROSS_ENTROPY_LOSS(c);
  if (st != MN_OK) return st;
  mn_node_rec grad = *c->node;
  grad.op = MN_OP_SPARSE_CROSS_ENTROPY_GRAD;
  grad.type = *mn_ref_in_type(c, 0);
  mn_ref_ctx gc = *c;
  gc.node = &grad;
  gc.out = c->extra_out[0];
  return mn_ref_SPARSE_CROSS_ENTROPY_GRAD(&gc);
}
