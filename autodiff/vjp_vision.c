/* VJP rules: conv2d, group_norm, concat, split_a, split_b, upsample_2x, add_per_channel. */
#include "autodiff/autodiff.h"
#include "host/build_util.h"

#define IN(c, y, k) (mn_ad_fwd((c), (y))->inputs[(k)])

/* Sums dy over batch and space into the [C] type of the vector it is the gradient of. */
static mn_node sum_per_channel(mn_ad_ctx *c, mn_node dy, mn_node vec) {
  mn_tensor_type t = *mn_type_of(c->g, vec);
  return mn_ad_node(c, MN_OP_SUM_PER_CHANNEL, &dy, 1, &t, NULL);
}

mn_status mn_vjp_CONV2D(mn_ad_ctx *c, mn_node y, mn_node dy) {
  mn_node x = IN(c, y, 0), k = IN(c, y, 1);
  /* Copied: appending nodes may move the array that the forward record lives in. */
  mn_op_attrs attrs = mn_ad_fwd(c, y)->attrs;
  if (mn_ad_wants(c, x)) {
    mn_tensor_type t = *mn_type_of(c->g, x);
    mn_node ins[2] = {dy, k};
    mn_ad_accumulate(c, x, mn_ad_node(c, MN_OP_CONV2D_GRAD_INPUT, ins, 2, &t, &attrs));
  }
  if (mn_ad_wants(c, k)) {
    mn_tensor_type t = *mn_type_of(c->g, k);
    mn_node ins[2] = {x, dy};
    mn_ad_accumulate(c, k, mn_ad_node(c, MN_OP_CONV2D_GRAD_KERNEL, ins, 2, &t, &attrs));
  }
  return c->g->status;
}

/* The normalized x is recomputed from x rather than recovered from y as (y - b) / w,
 * which would divide by weights that may be zero. */
mn_status mn_vjp_GROUP_NORM(mn_ad_ctx *c, mn_node y, mn_node dy) {
  mn_node x = IN(c, y, 0), w = IN(c, y, 1), b = IN(c, y, 2);
  mn_op_attrs attrs = mn_ad_fwd(c, y)->attrs;
  if (mn_ad_wants(c, x)) {
    mn_tensor_type t = *mn_type_of(c->g, x);
    mn_node ins[3] = {x, w, dy};
    mn_ad_accumulate(c, x, mn_ad_node(c, MN_OP_GROUP_NORM_GRAD_X, ins, 3, &t, &attrs));
  }
  if (mn_ad_wants(c, w)) {
    mn_tensor_type t = *mn_type_of(c->g, w);
    mn_node ins[2] = {x, dy};
    mn_ad_accumulate(c, w, mn_ad_node(c, MN_OP_GROUP_NORM_GRAD_W, ins, 2, &t, &attrs));
  }
  if (mn_ad_wants(c, b)) mn_ad_accumulate(c, b, sum_per_channel(c, dy, b));
  return c->g->status;
}

mn_status mn_vjp_CONCAT(mn_ad_ctx *c, mn_node y, mn_node dy) {
  mn_node a = IN(c, y, 0), b = IN(c, y, 1);
  int ca = (int)mn_type_of(c->g, a)->shape[1];
  if (mn_ad_wants(c, a)) mn_ad_accumulate(c, a, mn_split_a(c->g, dy, ca));
  if (mn_ad_wants(c, b)) mn_ad_accumulate(c, b, mn_split_b(c->g, dy, ca));
  return c->g->status;
}

/* The channels a split drops receive no gradient: dy is padded with zeros back to x's
 * channel count, on the side the split kept. */
static mn_status vjp_split(mn_ad_ctx *c, mn_node y, mn_node dy, bool kept_first) {
  mn_node x = IN(c, y, 0);
  if (!mn_ad_wants(c, x)) return c->g->status;
  mn_tensor_type rest = *mn_type_of(c->g, x);
  rest.shape[1] -= mn_type_of(c->g, y)->shape[1];
  mn_node zeros = mn_ad_node(c, MN_OP_ZEROS, NULL, 0, &rest, NULL);
  if (zeros == MN_NO_NODE) return c->g->status;
  mn_ad_accumulate(c, x, kept_first ? mn_concat(c->g, dy, zeros) : mn_concat(c->g, zeros, dy));
  return c->g->status;
}
mn_status mn_vjp_SPLIT_A(mn_ad_ctx *c, mn_node y, mn_node dy) { return vjp_split(c, y, dy, true); }
mn_status mn_vjp_SPLIT_B(mn_ad_ctx *c, mn_node y, mn_node dy) { return vjp_split(c, y, dy, false); }

mn_status mn_vjp_UPSAMPLE_2X(mn_ad_ctx *c, mn_node y, mn_node dy) {
  mn_node x = IN(c, y, 0);
  if (!mn_ad_wants(c, x)) return c->g->status;
  mn_tensor_type t = *mn_type_of(c->g, x);
  mn_ad_accumulate(c, x, mn_ad_node(c, MN_OP_DOWNSAMPLE_SUM_2X, &dy, 1, &t, NULL));
  return c->g->status;
}

mn_status mn_vjp_ADD_PER_CHANNEL(mn_ad_ctx *c, mn_node y, mn_node dy) {
  mn_node x = IN(c, y, 0), bias = IN(c, y, 1);
  mn_ad_accumulate(c, x, dy);
  if (mn_ad_wants(c, bias)) mn_ad_accumulate(c, bias, sum_per_channel(c, dy, bias));
  return c->g->status;
}
