/* VJP rules: matrix products, element-wise ops, sum_all and mean_all. */
#include "autodiff/autodiff.h"
#include "host/build_util.h"

#define IN(c, y, k) (mn_ad_fwd((c), (y))->inputs[(k)])

/* Gives dx the exact type of forward node x (matmul_at's operands may have their
 * leading dims laid out differently from the product that carries the gradient). */
static mn_node as_type_of(mn_ad_ctx *c, mn_node dx, mn_node x) {
  if (dx == MN_NO_NODE) return dx;
  const mn_tensor_type *want = mn_type_of(c->g, x);
  if (mn_type_same_shape(mn_type_of(c->g, dx), want)) return dx;
  return mn_ad_node(c, MN_OP_RESHAPE, &dx, 1, want, NULL);
}

mn_status mn_vjp_MATMUL(mn_ad_ctx *c, mn_node y, mn_node dy) {
  mn_node a = IN(c, y, 0), b = IN(c, y, 1);
  if (mn_ad_wants(c, a)) mn_ad_accumulate(c, a, mn_matmul_bt(c->g, dy, b));
  if (mn_ad_wants(c, b)) mn_ad_accumulate(c, b, mn_matmul_at(c->g, a, dy));
  return c->g->status;
}

mn_status mn_vjp_MATMUL_BT(mn_ad_ctx *c, mn_node y, mn_node dy) {
  mn_node a = IN(c, y, 0), b = IN(c, y, 1);
  if (mn_ad_wants(c, a)) mn_ad_accumulate(c, a, mn_matmul(c->g, dy, b));
  if (mn_ad_wants(c, b)) mn_ad_accumulate(c, b, mn_matmul_at(c->g, dy, a));
  return c->g->status;
}

mn_status mn_vjp_MATMUL_AT(mn_ad_ctx *c, mn_node y, mn_node dy) {
  mn_node a = IN(c, y, 0), b = IN(c, y, 1);
  if (mn_ad_wants(c, a)) mn_ad_accumulate(c, a, as_type_of(c, mn_matmul_bt(c->g, b, dy), a));
  if (mn_ad_wants(c, b)) mn_ad_accumulate(c, b, as_type_of(c, mn_matmul(c->g, a, dy), b));
  return c->g->status;
}

mn_status mn_vjp_ADD(mn_ad_ctx *c, mn_node y, mn_node dy) {
  mn_ad_accumulate(c, IN(c, y, 0), dy);
  mn_ad_accumulate(c, IN(c, y, 1), dy);
  return c->g->status;
}

mn_status mn_vjp_MUL(mn_ad_ctx *c, mn_node y, mn_node dy) {
  mn_node a = IN(c, y, 0), b = IN(c, y, 1);
  if (mn_ad_wants(c, a)) mn_ad_accumulate(c, a, mn_mul(c->g, dy, b));
  if (mn_ad_wants(c, b)) mn_ad_accumulate(c, b, mn_mul(c->g, dy, a));
  return c->g->status;
}

/* y = a / b: da = dy / b, db = -(dy / b) * y. */
mn_status mn_vjp_DIV(mn_ad_ctx *c, mn_node y, mn_node dy) {
  mn_node a = IN(c, y, 0), b = IN(c, y, 1);
  mn_node dy_over_b = mn_div(c->g, dy, b);
  if (mn_ad_wants(c, a)) mn_ad_accumulate(c, a, dy_over_b);
  if (mn_ad_wants(c, b)) mn_ad_accumulate(c, b, mn_neg(c->g, mn_mul(c->g, dy_over_b, y)));
  return c->g->status;
}

/* x + a row repeated over leading dims: the row's gradient sums dy over them. */
static mn_status vjp_add_row(mn_ad_ctx *c, mn_node y, mn_node dy) {
  mn_node x = IN(c, y, 0), row = IN(c, y, 1);
  mn_ad_accumulate(c, x, dy);
  if (mn_ad_wants(c, row))
    mn_ad_accumulate(c, row, mn_ad_node(c, MN_OP_SUM_ROWS, &dy, 1, mn_type_of(c->g, row), NULL));
  return c->g->status;
}
mn_status mn_vjp_BIAS_ADD(mn_ad_ctx *c, mn_node y, mn_node dy) { return vjp_add_row(c, y, dy); }
mn_status mn_vjp_BROADCAST_ADD(mn_ad_ctx *c, mn_node y, mn_node dy) {
  return vjp_add_row(c, y, dy);
}

mn_status mn_vjp_SCALE(mn_ad_ctx *c, mn_node y, mn_node dy) {
  mn_ad_accumulate(c, IN(c, y, 0), mn_scale(c->g, dy, mn_ad_fwd(c, y)->attrs.scale));
  return c->g->status;
}

mn_status mn_vjp_NEG(mn_ad_ctx *c, mn_node y, mn_node dy) {
  mn_ad_accumulate(c, IN(c, y, 0), mn_neg(c->g, dy));
  return c->g->status;
}

mn_status mn_vjp_LOG(mn_ad_ctx *c, mn_node y, mn_node dy) {
  mn_ad_accumulate(c, IN(c, y, 0), mn_div(c->g, dy, IN(c, y, 0)));
  return c->g->status;
}

mn_status mn_vjp_EXP(mn_ad_ctx *c, mn_node y, mn_node dy) {
  mn_ad_accumulate(c, IN(c, y, 0), mn_mul(c->g, dy, y));
  return c->g->status;
}

/* y = 1/x: dx = -dy * y^2. */
mn_status mn_vjp_RECIP(mn_ad_ctx *c, mn_node y, mn_node dy) {
  mn_ad_accumulate(c, IN(c, y, 0), mn_neg(c->g, mn_mul(c->g, dy, mn_mul(c->g, y, y))));
  return c->g->status;
}

/* Element-wise ops whose gradient kernel takes (forward input, dy). */
static mn_status vjp_grad_of_input(mn_ad_ctx *c, mn_node y, mn_node dy, mn_op grad_op) {
  mn_node x = IN(c, y, 0), ins[2] = {x, dy};
  mn_ad_accumulate(c, x, mn_ad_node(c, grad_op, ins, 2, mn_type_of(c->g, x), NULL));
  return c->g->status;
}

/* Element-wise ops whose gradient is cheapest from the forward output y. */
static mn_status vjp_grad_of_output(mn_ad_ctx *c, mn_node y, mn_node dy, mn_op grad_op) {
  mn_node ins[2] = {y, dy};
  mn_ad_accumulate(c, IN(c, y, 0), mn_ad_node(c, grad_op, ins, 2, mn_type_of(c->g, y), NULL));
  return c->g->status;
}

mn_status mn_vjp_RELU(mn_ad_ctx *c, mn_node y, mn_node dy) {
  return vjp_grad_of_input(c, y, dy, MN_OP_RELU_GRAD);
}
mn_status mn_vjp_ABS(mn_ad_ctx *c, mn_node y, mn_node dy) {
  return vjp_grad_of_input(c, y, dy, MN_OP_ABS_GRAD);
}
mn_status mn_vjp_SILU(mn_ad_ctx *c, mn_node y, mn_node dy) {
  return vjp_grad_of_input(c, y, dy, MN_OP_SILU_GRAD);
}
mn_status mn_vjp_GELU(mn_ad_ctx *c, mn_node y, mn_node dy) {
  return vjp_grad_of_input(c, y, dy, MN_OP_GELU_GRAD);
}
mn_status mn_vjp_SIGMOID(mn_ad_ctx *c, mn_node y, mn_node dy) {
  return vjp_grad_of_output(c, y, dy, MN_OP_SIGMOID_GRAD);
}
mn_status mn_vjp_TANH(mn_ad_ctx *c, mn_node y, mn_node dy) {
  return vjp_grad_of_output(c, y, dy, MN_OP_TANH_GRAD);
}

/* sum_all / mean_all: every element receives dy[0] (divided by the count for mean). */
static mn_status vjp_reduce_all(mn_ad_ctx *c, mn_node y, mn_node dy, double scale) {
  mn_node x = IN(c, y, 0);
  mn_op_attrs attrs = {.scale = (float)scale};
  mn_ad_accumulate(c, x, mn_ad_node(c, MN_OP_EXPAND_SCALAR, &dy, 1, mn_type_of(c->g, x), &attrs));
  return c->g->status;
}
mn_status mn_vjp_SUM_ALL(mn_ad_ctx *c, mn_node y, mn_node dy) {
  return vjp_reduce_all(c, y, dy, 1.0);
}
mn_status mn_vjp_MEAN_ALL(mn_ad_ctx *c, mn_node y, mn_node dy) {
  return vjp_reduce_all(c, y, dy,
                        1.0 / (double)mn_tensor_type_numel(mn_type_of(c->g, IN(c, y, 0))));
}

/* The same mask on dy: the gradient node takes the forward's p and seed. */
mn_status mn_vjp_DROPOUT(mn_ad_ctx *c, mn_node y, mn_node dy) {
  mn_node x = IN(c, y, 0);
  mn_op_attrs attrs = mn_ad_fwd(c, y)->attrs;
  if (mn_ad_wants(c, x))
    mn_ad_accumulate(c, x, mn_ad_node(c, MN_OP_DROPOUT_GRAD, &dy, 1, mn_type_of(c->g, x), &attrs));
  return c->g->status;
}
