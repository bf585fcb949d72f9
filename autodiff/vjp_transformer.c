/* VJP rules: SwiGLU, rms_norm, layer_norm, RoPE, embedding and scatter_add. Index and
 * offset inputs are U32 and never reached by a parameter, so they get no gradient. */
#include "autodiff/autodiff.h"
#include "host/build_util.h"

#define IN(c, y, k) (mn_ad_fwd((c), (y))->inputs[(k)])

/* y = silu(gate) * up. d up recomputes silu(gate): y / up would divide by zero where
 * up is 0. */
mn_status mn_vjp_SWIGLU(mn_ad_ctx *c, mn_node y, mn_node dy) {
  mn_node gate = IN(c, y, 0), up = IN(c, y, 1);
  if (mn_ad_wants(c, gate)) {
    mn_node ins[3] = {gate, up, dy};
    mn_ad_accumulate(c, gate,
                     mn_ad_node(c, MN_OP_SWIGLU_GRAD_GATE, ins, 3, mn_type_of(c->g, gate), NULL));
  }
  if (mn_ad_wants(c, up)) mn_ad_accumulate(c, up, mn_mul(c->g, dy, mn_silu(c->g, gate)));
  return c->g->status;
}

/* The norms' x and w gradients recompute the row statistics from x rather than reading
 * y: x_hat = (y - b) / w is undefined where a weight is 0. */
static mn_status vjp_norm(mn_ad_ctx *c, mn_node y, mn_node dy, mn_op grad_x, mn_op grad_w) {
  mn_node x = IN(c, y, 0), w = IN(c, y, 1);
  mn_op_attrs attrs = {.eps = mn_ad_fwd(c, y)->attrs.eps};
  if (mn_ad_wants(c, x)) {
    mn_node ins[3] = {x, w, dy};
    mn_ad_accumulate(c, x, mn_ad_node(c, grad_x, ins, 3, mn_type_of(c->g, x), &attrs));
  }
  if (mn_ad_wants(c, w)) {
    mn_node ins[2] = {x, dy};
    mn_ad_accumulate(c, w, mn_ad_node(c, grad_w, ins, 2, mn_type_of(c->g, w), &attrs));
  }
  return c->g->status;
}

mn_status mn_vjp_RMS_NORM(mn_ad_ctx *c, mn_node y, mn_node dy) {
  return vjp_norm(c, y, dy, MN_OP_RMS_NORM_GRAD_X, MN_OP_RMS_NORM_GRAD_W);
}

mn_status mn_vjp_LAYER_NORM(mn_ad_ctx *c, mn_node y, mn_node dy) {
  mn_node b = IN(c, y, 2);
  if (vjp_norm(c, y, dy, MN_OP_LAYER_NORM_GRAD_X, MN_OP_LAYER_NORM_GRAD_W) != MN_OK)
    return c->g->status;
  if (mn_ad_wants(c, b))
    mn_ad_accumulate(c, b, mn_ad_node(c, MN_OP_SUM_ROWS, &dy, 1, mn_type_of(c->g, b), NULL));
  return c->g->status;
}

/* RoPE is a rotation per position, so its transpose is the rotation by the negated
 * angle; the backward node carries the forward attrs (theta, head_dim, pos_offset). */
mn_status mn_vjp_ROPE(mn_ad_ctx *c, mn_node y, mn_node dy) {
  mn_node x = IN(c, y, 0);
  mn_op_attrs attrs = mn_ad_fwd(c, y)->attrs;
  if (mn_ad_wants(c, x))
    mn_ad_accumulate(c, x, mn_ad_node(c, MN_OP_ROPE_GRAD, &dy, 1, mn_type_of(c->g, x), &attrs));
  return c->g->status;
}

mn_status mn_vjp_ROPE_DYNAMIC(mn_ad_ctx *c, mn_node y, mn_node dy) {
  mn_node x = IN(c, y, 0), ins[2] = {dy, IN(c, y, 1)};
  mn_op_attrs attrs = mn_ad_fwd(c, y)->attrs;
  if (mn_ad_wants(c, x))
    mn_ad_accumulate(c, x,
                     mn_ad_node(c, MN_OP_ROPE_DYNAMIC_GRAD, ins, 2, mn_type_of(c->g, x), &attrs));
  return c->g->status;
}

mn_status mn_vjp_ROPE_POSITIONS(mn_ad_ctx *c, mn_node y, mn_node dy) {
  mn_node x = IN(c, y, 0), ins[2] = {dy, IN(c, y, 1)};
  mn_op_attrs attrs = mn_ad_fwd(c, y)->attrs;
  if (mn_ad_wants(c, x))
    mn_ad_accumulate(c, x,
                     mn_ad_node(c, MN_OP_ROPE_POSITIONS_GRAD, ins, 2, mn_type_of(c->g, x), &attrs));
  return c->g->status;
}

/* Embedding and scatter_add are transposes of each other: a row gather's gradient
 * scatters dy back to the table rows (summing repeated indices), and a scatter's
 * gradient gathers dy's rows. */
mn_status mn_vjp_EMBEDDING(mn_ad_ctx *c, mn_node y, mn_node dy) {
  mn_node idx = IN(c, y, 0), table = IN(c, y, 1);
  if (mn_ad_wants(c, table))
    mn_ad_accumulate(c, table, mn_scatter_add(c->g, idx, dy, mn_type_of(c->g, table)->shape[0]));
  return c->g->status;
}

mn_status mn_vjp_SCATTER_ADD(mn_ad_ctx *c, mn_node y, mn_node dy) {
  mn_node idx = IN(c, y, 0), src = IN(c, y, 1);
  if (mn_ad_wants(c, src)) mn_ad_accumulate(c, src, mn_embedding(c->g, idx, dy));
  return c->g->status;
}
