/* Reference kernels of the matrix products with an epilogue (optimizer/rules.c makes them
 * from a product and the pointwise op or reduction after it). Each computes exactly what
 * the ops it replaces compute, every intermediate rounded to float as those ops store it,
 * so an optimized graph gives bit for bit what the unoptimized one gives on the CPU. */
#include <math.h>

#include "host/reference/ref_shared.h"

static double sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }

void mn_ref_apply_act(float *x, size_t n, mn_act act) {
  for (size_t i = 0; i < n; i++) {
    double v = x[i];
    switch (act) {
    case MN_ACT_RELU: x[i] = (float)(v > 0 ? v : 0.0); break;
    case MN_ACT_GELU: x[i] = (float)mn_ref_gelu_tanh(v); break;
    case MN_ACT_SILU: x[i] = (float)(v * sigmoid(v)); break;
    default: break;
    }
  }
}

/* out[M,N] = a [.., K] times b ([K,N], or [N,K] when variant is 1), as matmul and
 * matmul_bt compute it. */
static void product(const mn_ref_ctx *c, size_t *m_out, size_t *n_out) {
  const mn_tensor_type *ta = mn_ref_in_type(c, 0), *tb = mn_ref_in_type(c, 1);
  size_t k = mn_ref_last_dim(ta), m = (size_t)mn_tensor_type_numel(ta) / k;
  bool bt = c->node->attrs.variant == 1;
  size_t n = (size_t)(bt ? tb->shape[0] : tb->shape[1]);
  mn_ref_gemm(mn_ref_in_f32(c, 0), k, 1, mn_ref_in_f32(c, 1), bt ? 1 : n, bt ? k : 1,
              mn_ref_out_f32(c), m, n, k);
  *m_out = m;
  *n_out = n;
}

mn_status mn_ref_MATMUL_BIAS_ACT(const mn_ref_ctx *c) {
  size_t m, n;
  product(c, &m, &n);
  float *o = mn_ref_out_f32(c);
  const float *bias = mn_ref_in_f32(c, 2);
  for (size_t i = 0; i < m * n; i++)
    o[i] = o[i] + bias[i % n];
  mn_ref_apply_act(o, m * n, (mn_act)c->node->attrs.act);
  return MN_OK;
}

mn_status mn_ref_MATMUL_DGELU(const mn_ref_ctx *c) {
  size_t m, n;
  product(c, &m, &n);
  float *o = mn_ref_out_f32(c);
  const float *pre = mn_ref_in_f32(c, 2);
  for (size_t i = 0; i < m * n; i++)
    o[i] = (float)((double)o[i] * mn_ref_gelu_tanh_grad(pre[i]));
  return MN_OK;
}

/* a [K, M] transposed times b [K, N]; value 1 sums the K rows of a or b as sum_rows does. */
mn_status mn_ref_MATMUL_AT_BGRAD(const mn_ref_ctx *c) {
  const mn_tensor_type *ta = mn_ref_in_type(c, 0), *tb = mn_ref_in_type(c, 1);
  size_t m = mn_ref_last_dim(ta), n = mn_ref_last_dim(tb), k = (size_t)mn_tensor_type_numel(ta) / m;
  mn_ref_gemm(mn_ref_in_f32(c, 0), 1, m, mn_ref_in_f32(c, 1), n, 1, mn_ref_out_f32(c), m, n, k);
  bool of_b = c->node->attrs.variant == 1;
  mn_ref_column_sums(mn_ref_in_f32(c, of_b ? 1 : 0), k, of_b ? n : m, c->extra_out[0]);
  return MN_OK;
}

/* Written by the dispatch of its input; never dispatched itself (plan.h). */
mn_status mn_ref_EXTRA_OUTPUT(const mn_ref_ctx *c) {
  return mn_ref_fail(c, MN_ERR_STATE, "extra_output is written by its input's kernel");
}
