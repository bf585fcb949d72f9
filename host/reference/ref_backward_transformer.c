/* Reference kernels of the transformer backward ops: SwiGLU's gate gradient, the norms'
 * x and weight gradients, and the inverse RoPE rotations. */
#include <math.h>
#include <stdlib.h>

#include "host/reference/ref_shared.h"

/* dy * up * silu'(gate), silu'(g) = s(g) (1 + g (1 - s(g))). */
/* Per-row statistics of a norm: x_hat = (x - mean) * inv, with mean 0 for rms_norm. */
static void row_stats(const float *xr, size_t n, double eps, bool center, double *mean,
                      double *inv) {
  double m = 0;
  if (center) {
    for (size_t i = 0; i < n; i++)
      m += xr[i];
    m /= (double)n;
  }
  double ss = 0;
  for (size_t i = 0; i < n; i++)
    ss += (xr[i] - m) * (xr[i] - m);
  *mean = m;
  *inv = 1.0 / sqrt(ss / (double)n + eps);
}

/* With g = dy * w: dx = inv * (g - mean(g) - x_hat * mean(g * x_hat)); rms_norm has no
 * mean(g) term because its x_hat is not centered. */
static mn_status norm_grad_x(const mn_ref_ctx *c, bool center) {
  const float *x = mn_ref_in_f32(c, 0), *w = mn_ref_in_f32(c, 1), *dy = mn_ref_in_f32(c, 2);
  float *o = mn_ref_out_f32(c);
  size_t n = mn_ref_last_dim(&c->node->type), rows = mn_ref_numel(c) / n;
  for (size_t r = 0; r < rows; r++) {
    const float *xr = x + r * n, *dr = dy + r * n;
    double mean, inv;
    row_stats(xr, n, c->node->attrs.eps, center, &mean, &inv);
    double sg = 0, sgx = 0;
    for (size_t i = 0; i < n; i++) {
      double g = (double)dr[i] * w[i];
      sg += g;
      sgx += g * (xr[i] - mean) * inv;
    }
    double mg = center ? sg / (double)n : 0.0, mgx = sgx / (double)n;
    for (size_t i = 0; i < n; i++) {
      double g = (double)dr[i] * w[i], xh = (xr[i] - mean) * inv;
      o[r * n + i] = (float)(inv * (g - mg - xh * mgx));
    }
  }
  return MN_OK;
}

/* dw[i] = sum over rows of dy * x_hat. */
static mn_status norm_grad_w(const mn_ref_ctx *c, bool center) {
  const float *x = mn_ref_in_f32(c, 0), *dy = mn_ref_in_f32(c, 1);
  const mn_tensor_type *tx = mn_ref_in_type(c, 0);
  size_t n = mn_ref_last_dim(tx), rows = (size_t)mn_tensor_type_numel(tx) / n;
  double *acc = calloc(n ? n : 1, sizeof *acc);
  if (!acc) return mn_ref_fail(c, MN_ERR_OUT_OF_MEMORY, "cannot allocate scratch for %zu", n);
  for (size_t r = 0; r < rows; r++) {
    const float *xr = x + r * n, *dr = dy + r * n;
    double mean, inv;
    row_stats(xr, n, c->node->attrs.eps, center, &mean, &inv);
    for (size_t i = 0; i < n; i++)
      acc[i] += (double)dr[i] * (xr[i] - mean) * inv;
  }
  float *o = mn_ref_out_f32(c);
  for (size_t i = 0; i < n; i++)
    o[i] = (float)acc[i];
  free(acc);
  return MN_OK;
}

mn_status mn_ref_RMS_NORM_GRAD_X(const mn_ref_ctx *c) { return norm_grad_x(c, false); }
mn_status mn_ref_RMS_NORM_GRAD_W(const mn_ref_ctx *c) { return norm_grad_w(c, false); }
mn_status mn_ref_LAYER_NORM_GRAD_X(const mn_ref_ctx *c) { return norm_grad_x(c, true); }
mn_status mn_ref_LAYER_NORM_GRAD_W(const mn_ref_ctx *c) { return norm_grad_w(c, true); }

mn_status mn_ref_ROPE_GRAD(const mn_ref_ctx *c) {
  mn_ref_rope_rotate(c, (double)c->node->attrs.pos_offset, NULL, -1);
  return MN_OK;
}

mn_status mn_ref_ROPE_DYNAMIC_GRAD(const mn_ref_ctx *c) {
  mn_ref_rope_rotate(c, (double)mn_ref_in_u32(c, 1)[0], NULL, -1);
  return MN_OK;
}

mn_status mn_ref_ROPE_POSITIONS_GRAD(const mn_ref_ctx *c) {
  mn_ref_rope_rotate(c, 0, mn_ref_in_u32(c, 1), -1);
  return MN_OK;
}
