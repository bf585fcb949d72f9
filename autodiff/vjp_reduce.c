/* VJP rules: softmax, log_softmax and the mean losses. Every loss is a [1] output, so
 * its upstream gradient dy is [1] and the kernels read dy[0]. */
#include "autodiff/autodiff.h"
#include "host/build_util.h"

#define IN(c, y, k) (mn_ad_fwd((c), (y))->inputs[(k)])

/* Softmax-type gradients are cheapest from the forward output y: the softmax itself
 * (or its log) need not be recomputed. */
static mn_status vjp_softmax_of_output(mn_ad_ctx *c, mn_node y, mn_node dy, mn_op grad_op) {
  mn_node ins[2] = {y, dy};
  mn_ad_accumulate(c, IN(c, y, 0), mn_ad_node(c, grad_op, ins, 2, mn_type_of(c->g, y), NULL));
  return c->g->status;
}
mn_status mn_vjp_SOFTMAX(mn_ad_ctx *c, mn_node y, mn_node dy) {
  return vjp_softmax_of_output(c, y, dy, MN_OP_SOFTMAX_GRAD);
}
mn_status mn_vjp_LOG_SOFTMAX(mn_ad_ctx *c, mn_node y, mn_node dy) {
  return vjp_softmax_of_output(c, y, dy, MN_OP_LOG_SOFTMAX_GRAD);
}

/* loss = -1/R sum t * log_softmax(logits). The target's gradient is a product of
 * forward ops; the logits' gradient has its own kernel, which does not assume that
 * each target row sums to 1. */
mn_status mn_vjp_CROSS_ENTROPY_LOSS(mn_ad_ctx *c, mn_node y, mn_node dy) {
  mn_node logits = IN(c, y, 0), t = IN(c, y, 1);
  if (mn_ad_wants(c, logits)) {
    mn_node ins[3] = {logits, t, dy};
    mn_ad_accumulate(
        c, logits, mn_ad_node(c, MN_OP_CROSS_ENTROPY_GRAD, ins, 3, mn_type_of(c->g, logits), NULL));
  }
  if (mn_ad_wants(c, t)) {
    const mn_tensor_type *lt = mn_type_of(c->g, logits);
    double rows = (double)(mn_tensor_type_numel(lt) / lt->shape[lt->rank - 1]);
    mn_op_attrs attrs = {.scale = (float)(-1.0 / rows)};
    mn_node coef = mn_ad_node(c, MN_OP_EXPAND_SCALAR, &dy, 1, mn_type_of(c->g, t), &attrs);
    mn_ad_accumulate(c, t, mn_mul(c->g, mn_log_softmax(c->g, logits), coef));
  }
  return c->g->status;
}

/* Labels are U32 and never get a gradient; only the logits do. */
mn_status mn_vjp_SPARSE_CROSS_ENTROPY_LOSS(mn_ad_ctx *c, mn_node y, mn_node dy) {
  mn_node logits = IN(c, y, 0);
  if (!mn_ad_wants(c, logits)) return c->g->status;
  mn_node ins[3] = {logits, IN(c, y, 1), dy};
  mn_ad_accumulate(
      c, logits,
      mn_ad_node(c, MN_OP_SPARSE_CROSS_ENTROPY_GRAD, ins, 3, mn_type_of(c->g, logits), NULL));
  return c->g->status;
}

/* BCE's two partial derivatives differ in form (a ratio and a log difference), so the
 * kernel computes either, chosen by attrs.variant. */
mn_status mn_vjp_BCE_LOSS(mn_ad_ctx *c, mn_node y, mn_node dy) {
  mn_node p = IN(c, y, 0), t = IN(c, y, 1), ins[3] = {p, t, dy};
  if (mn_ad_wants(c, p)) {
    mn_op_attrs attrs = {.variant = 0};
    mn_ad_accumulate(c, p, mn_ad_node(c, MN_OP_BCE_GRAD, ins, 3, mn_type_of(c->g, p), &attrs));
  }
  if (mn_ad_wants(c, t)) {
    mn_op_attrs attrs = {.variant = 1};
    mn_ad_accumulate(c, t, mn_ad_node(c, MN_OP_BCE_GRAD, ins, 3, mn_type_of(c->g, t), &attrs));
  }
  return c->g->status;
}

/* Losses of p - t: the target's gradient is the negated prediction gradient, so one
 * kernel serves both and the negation is only built when the target needs it. */
static mn_status vjp_of_difference(mn_ad_ctx *c, mn_node y, mn_node dy, mn_op grad_op) {
  mn_node p = IN(c, y, 0), t = IN(c, y, 1), ins[3] = {p, t, dy};
  bool want_p = mn_ad_wants(c, p), want_t = mn_ad_wants(c, t);
  if (!want_p && !want_t) return c->g->status;
  mn_node dp = mn_ad_node(c, grad_op, ins, 3, mn_type_of(c->g, p), NULL);
  if (want_p) mn_ad_accumulate(c, p, dp);
  if (want_t) mn_ad_accumulate(c, t, mn_neg(c->g, dp));
  return c->g->status;
}
mn_status mn_vjp_MSE_LOSS(mn_ad_ctx *c, mn_node y, mn_node dy) {
  return vjp_of_difference(c, y, dy, MN_OP_MSE_GRAD);
}
mn_status mn_vjp_L1_LOSS(mn_ad_ctx *c, mn_node y, mn_node dy) {
  return vjp_of_difference(c, y, dy, MN_OP_L1_GRAD);
}
