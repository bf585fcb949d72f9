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

static mn_status vjp_matmul(mn_ad_ctx *c, mn_node y, mn_node dy) {
  mn_node a = IN(c, y, 0), b = IN(c, y, 1);
  if (mn_ad_wants(c, a)) mn_ad_accumulate(c, a, mn_matmul_bt(c->g, dy, b));
  if (mn_ad_wants(c, b)) mn_ad_accumulate(c, b, mn_matmul_at(c->g, a, dy));
  return c->g->status;
}

static mn_status vjp_matmul_bt(mn_ad_ctx *c, mn_node y, mn_node dy) {
  mn_node a = IN(c, y, 0), b = IN(c, y, 1);
  if (mn_ad_wants(c, a)) mn_ad_accumulate(c, a, mn_matmul(c->g, dy, b));
  if (mn_ad_wants(c, b)) mn_ad_accumulate(c, b, mn_matmul_at(c->g, dy, a));
  return c->g->status;
}

static mn_status vjp_matmul_at(mn_ad_ctx *c, mn_node y, mn_node dy) {
  mn_node a = IN(c, y, 0), b = IN(c, y, 1);
  if (mn_ad_wants(c, a)) mn_ad_accumulate(c, a, as_type_of(c, mn_matmul_bt(c->g, b, dy), a));
  if (mn_ad_wants(c, b)) mn_ad_accumulate(c, b, as_type_of(c, mn_matmul(c->g, a, dy), b));
  return c->g->status;
}

static mn_status vjp_add(mn_ad_ctx *c, mn_node y, mn_node dy) {
  mn_ad_accumulate(c, IN(c, y, 0), dy);
  mn_ad_accumulate(c, IN(c, y, 1), dy);
  return c->g->status;
}

static mn_status vjp_mul(mn_ad_ctx *c, mn_node y, mn_node dy) {
  mn_node a = IN(c, y, 0), b = IN(c, y, 1);
  if (mn_ad_wants(c, a)) mn_ad_accumulate(c, a, mn_mul(c->g, dy, b));
  if (mn_ad_wants(c, b)) mn_ad_accumulate(c, b, mn_mul(c->g, dy, a));
  return c->g->status;
}

/* y = a / b: da = dy / b, db = -(dy / b) * y. */
static mn_status vjp_div(mn_ad_ctx *c, mn_node y, mn_node dy) {
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

static mn_status vjp_scale(mn_ad_ctx *c, mn_node y, mn_node dy) {
  mn_ad_accumulate(c, IN(c, y, 0), mn_scale(c->g, dy, mn_ad_fwd(c, y)->attrs.scale));
  return c->g->status;
}

static mn_status vjp_neg(mn_ad_ctx *c, mn_node y, mn_node dy) {
  mn_ad_accumulate(c, IN(c, y, 0), mn_neg(c->g, dy));
  return c->g->status;
}

static mn_status vjp_log(mn_ad_ctx *c, mn_node y, mn_node dy) {
  mn_ad_accumulate(c, IN(c, y, 0), mn_div(c->g, dy, IN(c, y, 0)));
  return c->g->status;
}

static mn_status vjp_exp(mn_ad_ctx *c, mn_node y, mn_node dy) {
  mn_ad_accumulate(c, IN(c, y, 0), mn_mul(c->g, dy, y));
  return c->g->status;
}

/* y = 1/x: dx = -dy * y^2. */
static mn_status vjp_recip(mn_ad_ctx *c, mn_node y, mn_node dy) {
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

static mn_status vjp_relu(mn_ad_ctx *c, mn_node y, mn_node dy) {
  return vjp_grad_of_input(c, y, dy, MN_OP_RELU_GRAD);
}
static mn_status vjp_abs(mn_ad_ctx *c, mn_node y, mn_node dy) {
  return vjp_grad_of_input(c, y, dy, MN_OP_ABS_GRAD);
}
static mn_status vjp_silu(mn_ad_ctx *c, mn_node y, mn_node dy) {
  return vjp_grad_of_input(c, y, dy, MN_OP_SILU_GRAD);
}
static mn_status vjp_gelu(mn_ad_ctx *c, mn_node y, mn_node dy) {
  return vjp_grad_of_input(c, y, dy, MN_OP_GELU_GRAD);
}
static mn_status vjp_sigmoid(mn_ad_ctx *c, mn_node y, mn_node dy) {
  return vjp_grad_of_output(c, y, dy, MN_OP_SIGMOID_GRAD);
}
static mn_status vjp_tanh(mn_ad_ctx *c, mn_node y, mn_node dy) {
  return vjp_grad_of_output(c, y, dy, MN_OP_TANH_GRAD);
}

/* sum_all / mean_all: every element receives dy[0] (divided by the count for mean). */
static mn_status vjp_reduce_all(mn_ad_ctx *c, mn_node y, mn_node dy, double scale) {
  mn_node x = IN(c, y, 0);
  mn_op_attrs attrs = {.scale = (float)scale};
  mn_ad_accumulate(c, x, mn_ad_node(c, MN_OP_EXPAND_SCALAR, &dy, 1, mn_type_of(c->g, x), &attrs));
  return c->g->status;
}
static mn_status vjp_sum_all(mn_ad_ctx *c, mn_node y, mn_node dy) {
  return vjp_reduce_all(c, y, dy, 1.0);
}
static mn_status vjp_mean_all(mn_ad_ctx *c, mn_node y, mn_node dy) {
  return vjp_reduce_all(c, y, dy,
                        1.0 / (double)mn_tensor_type_numel(mn_type_of(c->g, IN(c, y, 0))));
}

void mn_vjp_register_math(mn_vjp_rule *rules) {
  rules[MN_OP_MATMUL] = vjp_matmul;
  rules[MN_OP_MATMUL_AT] = vjp_matmul_at;
  rules[MN_OP_MATMUL_BT] = vjp_matmul_bt;
  rules[MN_OP_ADD] = vjp_add;
  rules[MN_OP_MUL] = vjp_mul;
  rules[MN_OP_DIV] = vjp_div;
  rules[MN_OP_BIAS_ADD] = vjp_add_row;
  rules[MN_OP_BROADCAST_ADD] = vjp_add_row;
  rules[MN_OP_SCALE] = vjp_scale;
  rules[MN_OP_RELU] = vjp_relu;
  rules[MN_OP_SIGMOID] = vjp_sigmoid;
  rules[MN_OP_TANH] = vjp_tanh;
  rules[MN_OP_NEG] = vjp_neg;
  rules[MN_OP_ABS] = vjp_abs;
  rules[MN_OP_LOG] = vjp_log;
  rules[MN_OP_EXP] = vjp_exp;
  rules[MN_OP_RECIP] = vjp_recip;
  rules[MN_OP_SILU] = vjp_silu;
  rules[MN_OP_GELU] = vjp_gelu;
  rules[MN_OP_SUM_ALL] = vjp_sum_all;
  rules[MN_OP_MEAN_ALL] = vjp_mean_all;
}
