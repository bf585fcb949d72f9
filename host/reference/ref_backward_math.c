/* Reference kernels of the generic and element-wise backward ops. */
#include <math.h>
#include <string.h>

#include "host/reference/ref_shared.h"

mn_status mn_ref_RESHAPE(const mn_ref_ctx *c) {
  memcpy(c->out, c->in[0], mn_tensor_type_bytes(&c->node->type));
  return MN_OK;
}

mn_status mn_ref_ZEROS(const mn_ref_ctx *c) {
  memset(c->out, 0, mn_tensor_type_bytes(&c->node->type));
  return MN_OK;
}

/* dy [.., N] summed over every leading index into N values. */
mn_status mn_ref_SUM_ROWS(const mn_ref_ctx *c) {
  const mn_tensor_type *t = mn_ref_in_type(c, 0);
  size_t n = (size_t)t->shape[t->rank - 1], rows = (size_t)mn_tensor_type_numel(t) / n;
  mn_ref_column_sums(mn_ref_in_f32(c, 0), rows, n, mn_ref_out_f32(c));
  return MN_OK;
}

mn_status mn_ref_EXPAND_SCALAR(const mn_ref_ctx *c) {
  float v = (float)((double)mn_ref_in_f32(c, 0)[0] * c->node->attrs.scale);
  float *o = mn_ref_out_f32(c);
  for (size_t i = 0, n = mn_ref_numel(c); i < n; i++)
    o[i] = v;
  return MN_OK;
}

static double sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }

/* out = dy * f'(v), v being the forward input x or output y as the op names. */
#define MN_REF_GRAD(E, dfdv)                                                                       \
  mn_status mn_ref_##E(const mn_ref_ctx *c) {                                                      \
    const float *in = mn_ref_in_f32(c, 0), *dy = mn_ref_in_f32(c, 1);                              \
    float *o = mn_ref_out_f32(c);                                                                  \
    for (size_t i = 0, n = mn_ref_numel(c); i < n; i++) {                                          \
      double v = in[i];                                                                            \
      o[i] = (float)((double)dy[i] * (dfdv));                                                      \
    }                                                                                              \
    return MN_OK;                                                                                  \
  }
MN_REF_GRAD(RELU_GRAD, v > 0 ? 1.0 : 0.0)
MN_REF_GRAD(SIGMOID_GRAD, v *(1.0 - v))
MN_REF_GRAD(TANH_GRAD, 1.0 - v * v)
MN_REF_GRAD(ABS_GRAD, v > 0 ? 1.0 : (v < 0 ? -1.0 : 0.0))
MN_REF_GRAD(SILU_GRAD, sigmoid(v) * (1.0 + v * (1.0 - sigmoid(v))))
MN_REF_GRAD(GELU_GRAD, mn_ref_gelu_tanh_grad(v))
#undef MN_REF_GRAD
