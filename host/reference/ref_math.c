/* Reference kernels: matrix products and element-wise ops. */
#include <math.h>
#include <stdlib.h>

#include "host/pointwise.h"
#include "host/reference/ref_shared.h"

void mn_ref_gemm(const float *a, size_t a_row, size_t a_col, const float *b, size_t b_row,
                 size_t b_col, float *c, size_t m, size_t n, size_t k) {
  for (size_t i = 0; i < m; i++)
    for (size_t j = 0; j < n; j++) {
      double acc = 0;
      for (size_t p = 0; p < k; p++)
        acc += (double)a[i * a_row + p * a_col] * b[p * b_row + j * b_col];
      c[i * n + j] = (float)acc;
    }
}

/* A product the optimizer gave a scale (scale_fold.h) multiplies its rounded result, as the
 * scale op it replaced did. */
static void apply_alpha(const mn_ref_ctx *c) {
  float s = c->node->attrs.scale;
  if (s == 0.0f) return;
  float *o = mn_ref_out_f32(c);
  for (size_t i = 0, total = mn_ref_numel(c); i < total; i++)
    o[i] *= s;
}

mn_status mn_ref_MATMUL(const mn_ref_ctx *c) {
  const mn_tensor_type *ta = mn_ref_in_type(c, 0), *tb = mn_ref_in_type(c, 1);
  size_t k = (size_t)mn_ref_last_dim(ta), n = (size_t)tb->shape[1],
         m = (size_t)mn_tensor_type_numel(ta) / k;
  mn_ref_gemm(mn_ref_in_f32(c, 0), k, 1, mn_ref_in_f32(c, 1), n, 1, mn_ref_out_f32(c), m, n, k);
  apply_alpha(c);
  return MN_OK;
}

mn_status mn_ref_MATMUL_BT(const mn_ref_ctx *c) {
  const mn_tensor_type *ta = mn_ref_in_type(c, 0), *tb = mn_ref_in_type(c, 1);
  size_t k = (size_t)mn_ref_last_dim(ta), n = (size_t)tb->shape[0],
         m = (size_t)mn_tensor_type_numel(ta) / k;
  mn_ref_gemm(mn_ref_in_f32(c, 0), k, 1, mn_ref_in_f32(c, 1), 1, k, mn_ref_out_f32(c), m, n, k);
  apply_alpha(c);
  return MN_OK;
}

mn_status mn_ref_MATMUL_AT(const mn_ref_ctx *c) {
  const mn_tensor_type *ta = mn_ref_in_type(c, 0), *tb = mn_ref_in_type(c, 1);
  size_t m = (size_t)mn_ref_last_dim(ta), n = (size_t)mn_ref_last_dim(tb),
         k = (size_t)mn_tensor_type_numel(ta) / m;
  mn_ref_gemm(mn_ref_in_f32(c, 0), 1, m, mn_ref_in_f32(c, 1), n, 1, mn_ref_out_f32(c), m, n, k);
  apply_alpha(c);
  return MN_OK;
}

/* x [.., N] + row [N] or [1, N]: the row repeats over every leading index. */
static mn_status add_row(const mn_ref_ctx *c) {
  const float *x = mn_ref_in_f32(c, 0), *row = mn_ref_in_f32(c, 1);
  float *o = mn_ref_out_f32(c);
  size_t n = (size_t)mn_ref_last_dim(&c->node->type), total = mn_ref_numel(c);
  for (size_t i = 0; i < total; i++)
    o[i] = x[i] + row[i % n];
  return MN_OK;
}
mn_status mn_ref_BIAS_ADD(const mn_ref_ctx *c) { return add_row(c); }
mn_status mn_ref_BROADCAST_ADD(const mn_ref_ctx *c) { return add_row(c); }

/* Dropout and its gradient apply one mask, drawn from the node's seed and the step
 * (host/pointwise.h): the gradient node carries its forward's seed and p. */
static mn_status dropout(const mn_ref_ctx *c) {
  const float *x = mn_ref_in_f32(c, 0);
  float *o = mn_ref_out_f32(c);
  float p = c->node->attrs.scale;
  unsigned threshold = mn_pw_dropout_threshold(p);
  unsigned long long key =
      mn_pw_dropout_key((unsigned long long)c->node->attrs.seed, c->micro_step);
  for (size_t i = 0, n = mn_ref_numel(c); i < n; i++)
    o[i] = mn_pw_dropout(x[i], key, i, threshold, p);
  return MN_OK;
}
mn_status mn_ref_DROPOUT(const mn_ref_ctx *c) { return dropout(c); }
mn_status mn_ref_DROPOUT_GRAD(const mn_ref_ctx *c) { return dropout(c); }
