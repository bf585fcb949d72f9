/* Reference kernels of the matrix products with an epilogue (optimizer/rules.c makes them
 * from a product and the pointwise op or reduction after it). Each computes exactly what
 * the ops it replaces compute, every intermediate rounded to float as those ops store it,
 * so an optimized graph gives bit for bit what the unoptimized one gives on the CPU. */
#include "host/pointwise.h"
#include "host/reference/ref_shared.h"
#include "host/storage.h"

/* The activation's row in host/pointwise.h; -1 for none. */
static int act_row(mn_act act) {
  switch (act) {
  case MN_ACT_RELU: return MN_PW_RELU;
  case MN_ACT_GELU: return MN_PW_GELU;
  case MN_ACT_SILU: return MN_PW_SILU;
  default: return -1;
  }
}

void mn_ref_apply_act(float *x, size_t n, mn_act act) {
  int row = act_row(act);
  if (row >= 0) mn_ref_pw_loop(row, x, NULL, NULL, 0.0, x, n);
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
  mn_ref_pw_loop(MN_PW_GELU_GRAD, pre, o, NULL, 0.0, o, m * n);
  return MN_OK;
}

mn_status mn_ref_MATMUL_DRELU(const mn_ref_ctx *c) {
  size_t m, n;
  product(c, &m, &n);
  float *o = mn_ref_out_f32(c);
  mn_ref_pw_loop(MN_PW_RELU_GRAD, mn_ref_in_f32(c, 2), o, NULL, 0.0, o, m * n);
  return MN_OK;
}

/* matmul_drelu; value 1 sums its rows as stored. */
mn_status mn_ref_MATMUL_DRELU_BGRAD(const mn_ref_ctx *c) {
  size_t m, n;
  product(c, &m, &n);
  float *o = mn_ref_out_f32(c);
  mn_ref_pw_loop(MN_PW_RELU_GRAD, mn_ref_in_f32(c, 2), o, NULL, 0.0, o, m * n);
  mn_storage_round_n(c->out_storage, o, m * n);
  mn_ref_column_sums(o, m, n, c->extra_out[0]);
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

/* gelu_grad(x, dy); value 1 sums its rows as stored (as sum_rows reading the stored value
 * would); variant 1: value 2 is gelu(x). */
mn_status mn_ref_GELU_GRAD_BGRAD(const mn_ref_ctx *c) {
  size_t n = mn_ref_numel(c), cols = mn_ref_last_dim(&c->node->type);
  float *o = mn_ref_out_f32(c);
  mn_ref_pw_loop(MN_PW_GELU_GRAD, mn_ref_in_f32(c, 0), mn_ref_in_f32(c, 1), NULL, 0.0, o, n);
  mn_storage_round_n(c->out_storage, o, n);
  mn_ref_column_sums(o, n / cols, cols, c->extra_out[0]);
  if (c->node->attrs.variant == 1)
    mn_ref_pw_loop(MN_PW_GELU, mn_ref_in_f32(c, 0), NULL, NULL, 0.0, c->extra_out[1], n);
  return MN_OK;
}

/* Written by the dispatch of its input; never dispatched itself (plan.h). */
mn_status mn_ref_EXTRA_OUTPUT(const mn_ref_ctx *c) {
  return mn_ref_fail(c, MN_ERR_STATE, "extra_output is written by its input's kernel");
}
