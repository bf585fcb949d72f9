/* VJP rule of slice_last. */
#include "autodiff/autodiff.h"
#include "host/build_util.h"

/* dx is dy placed at the slice's columns of a zero tensor of x's type. Several slices of
 * one x (GPT-2's q, k and v) each contribute a full-size tensor, which mn_ad_accumulate
 * sums; the columns the slices do not cover stay zero. */
mn_status mn_vjp_SLICE_LAST(mn_ad_ctx *c, mn_node y, mn_node dy) {
  mn_node x = mn_ad_fwd(c, y)->inputs[0];
  if (!mn_ad_wants(c, x)) return c->g->status;
  /* Copied: appending nodes may move the array that the forward record lives in. */
  mn_op_attrs attrs = mn_ad_fwd(c, y)->attrs;
  mn_tensor_type t = *mn_type_of(c->g, x);
  mn_ad_accumulate(c, x, mn_ad_node(c, MN_OP_SLICE_LAST_GRAD, &dy, 1, &t, &attrs));
  return c->g->status;
}
