/* Builders for reductions (sum, mean, softmax over the last axis) and the mean losses. */
#include "host/build_util.h"

static const mn_tensor_type scalar_type = {.dtype = MN_F32, .rank = 1, .shape = {1}};

/* One F32 operand of rank >= 1; `what` names it in messages. */
static bool f32_operand(mn_graph *g, const char *fn, const char *what, mn_node x) {
  return mn_require_dtype(g, fn, what, x, MN_F32) &&
         mn_require_rank(g, fn, what, x, 1, MN_MAX_RANK);
}

static mn_node reduce_all(mn_graph *g, const char *fn, mn_op op, mn_node x) {
  if (!mn_graph_check_inputs(g, fn, &x, 1) || !f32_operand(g, fn, "x", x)) return MN_NO_NODE;
  return mn_graph_append(g, op, &x, 1, &scalar_type, NULL, NULL);
}

mn_node mn_sum_all(mn_graph *g, mn_node x) { return reduce_all(g, "mn_sum_all", MN_OP_SUM_ALL, x); }
mn_node mn_mean_all(mn_graph *g, mn_node x) {
  return reduce_all(g, "mn_mean_all", MN_OP_MEAN_ALL, x);
}

static mn_node last_axis(mn_graph *g, const char *fn, mn_op op, mn_node x) {
  if (!mn_graph_check_inputs(g, fn, &x, 1) || !f32_operand(g, fn, "x", x)) return MN_NO_NODE;
  return mn_graph_append(g, op, &x, 1, mn_type_of(g, x), NULL, NULL);
}

mn_node mn_softmax(mn_graph *g, mn_node x) { return last_axis(g, "mn_softmax", MN_OP_SOFTMAX, x); }
mn_node mn_log_softmax(mn_graph *g, mn_node x) {
  return last_axis(g, "mn_log_softmax", MN_OP_LOG_SOFTMAX, x);
}

/* Two F32 operands of identical shape; the message names both roles so the caller can
 * tell which argument is wrong. */
static mn_node loss_same_shape(mn_graph *g, const char *fn, mn_op op, const char *what_a, mn_node a,
                               const char *what_b, mn_node b) {
  mn_node ins[2] = {a, b};
  if (!mn_graph_check_inputs(g, fn, ins, 2) || !f32_operand(g, fn, what_a, a) ||
      !f32_operand(g, fn, what_b, b))
    return MN_NO_NODE;
  const mn_tensor_type *ta = mn_type_of(g, a), *tb = mn_type_of(g, b);
  if (!mn_type_same_shape(ta, tb)) {
    char da[128], db[128], want[96];
    return mn_graph_fail(g, MN_ERR_SHAPE, "%s: %s is %s, expected %s (the shape of %s %s)", fn,
                         what_b, MN_DESC(g, b, db), mn_shape_str(ta, want, sizeof want), what_a,
                         MN_DESC(g, a, da));
  }
  return mn_graph_append(g, op, ins, 2, &scalar_type, NULL, NULL);
}

mn_node mn_cross_entropy_loss(mn_graph *g, mn_node logits, mn_node target_probs) {
  return loss_same_shape(g, "mn_cross_entropy_loss", MN_OP_CROSS_ENTROPY_LOSS, "logits", logits,
                         "target_probs", target_probs);
}
mn_node mn_bce_loss(mn_graph *g, mn_node pred, mn_node target) {
  return loss_same_shape(g, "mn_bce_loss", MN_OP_BCE_LOSS, "pred", pred, "target", target);
}
mn_node mn_mse_loss(mn_graph *g, mn_node pred, mn_node target) {
  return loss_same_shape(g, "mn_mse_loss", MN_OP_MSE_LOSS, "pred", pred, "target", target);
}
mn_node mn_l1_loss(mn_graph *g, mn_node pred, mn_node target) {
  return loss_same_shape(g, "mn_l1_loss", MN_OP_L1_LOSS, "pred", pred, "target", target);
}

/* Labels have logits' shape without the last dim; rank-1 logits [C] take labels [1]
 * because there are no rank-0 tensors. */
mn_node mn_sparse_cross_entropy_loss(mn_graph *g, mn_node logits, mn_node labels) {
  const char *fn = "mn_sparse_cross_entropy_loss";
  mn_node ins[2] = {logits, labels};
  if (!mn_graph_check_inputs(g, fn, ins, 2) || !f32_operand(g, fn, "logits", logits) ||
      !mn_require_dtype(g, fn, "labels", labels, MN_U32))
    return MN_NO_NODE;
  const mn_tensor_type *tl = mn_type_of(g, logits), *ty = mn_type_of(g, labels);
  mn_tensor_type want = *tl;
  if (tl->rank == 1)
    want.shape[0] = 1;
  else
    want.rank = tl->rank - 1;
  want.dtype = MN_U32;
  for (int i = want.rank; i < MN_MAX_RANK; i++)
    want.shape[i] = 0;
  if (!mn_type_same_shape(&want, ty)) {
    char dl[128], dy[128], ws[96];
    return mn_graph_fail(g, MN_ERR_SHAPE,
                         "%s: labels is %s, expected %s (the shape of logits %s without its "
                         "last dim)",
                         fn, MN_DESC(g, labels, dy), mn_shape_str(&want, ws, sizeof ws),
                         MN_DESC(g, logits, dl));
  }
  return mn_graph_append(g, MN_OP_SPARSE_CROSS_ENTROPY_LOSS, ins, 2, &scalar_type, NULL, NULL);
}
