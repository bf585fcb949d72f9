/* VJP rules of causal (plain and packed), full and cross attention. The gradients are backward ops
 * over (q, k, v, dy): the kernels recompute the softmax probabilities instead of the forward pass
 * storing a [T, S] matrix per head, so only the inputs that need a gradient cost one. dK and dV,
 * when both are needed, come from one attention_grad_kv pass. */
#include "autodiff/autodiff.h"

/* The packed attention's gradients take its positions as a fifth input and need no variant. */
static mn_status vjp_attention(mn_ad_ctx *c, mn_node y, mn_node dy, bool causal) {
  const mn_node_rec *n = mn_ad_fwd(c, y);
  bool segments = n->op == MN_OP_CAUSAL_ATTENTION_PACKED;
  mn_node ins[5] = {n->inputs[0], n->inputs[1], n->inputs[2], dy,
                    segments ? n->inputs[3] : MN_NO_NODE};
  int num_ins = segments ? 5 : 4;
  mn_op_attrs attrs = n->attrs;
  attrs.variant = causal && !segments ? 1 : 0;
  static const mn_op plain_op[4] = {MN_OP_ATTENTION_GRAD_Q, MN_OP_ATTENTION_GRAD_K,
                                    MN_OP_ATTENTION_GRAD_V, MN_OP_ATTENTION_GRAD_KV};
  static const mn_op packed_op[4] = {MN_OP_PACKED_ATTENTION_GRAD_Q, MN_OP_PACKED_ATTENTION_GRAD_K,
                                     MN_OP_PACKED_ATTENTION_GRAD_V, MN_OP_PACKED_ATTENTION_GRAD_KV};
  const mn_op *grad_op = segments ? packed_op : plain_op;
  bool packed = mn_ad_wants(c, ins[1]) && mn_ad_wants(c, ins[2]);
  if (packed) {
    /* One pass computes the probabilities once for both dK and dV; the slices copy the
     * two halves of each row out. */
    mn_tensor_type kt = c->g->nodes[ins[1]].type, vt = c->g->nodes[ins[2]].type;
    mn_tensor_type t = kt;
    int64_t width = kt.shape[kt.rank - 1];
    t.shape[t.rank - 1] = 2 * width;
    mn_node kv = mn_ad_node(c, grad_op[3], ins, num_ins, &t, &attrs);
    mn_op_attrs lo = {.pos_offset = 0}, hi = {.pos_offset = (int)width};
    mn_ad_accumulate(c, ins[1], mn_ad_node(c, MN_OP_SLICE_LAST, &kv, 1, &kt, &lo));
    mn_ad_accumulate(c, ins[2], mn_ad_node(c, MN_OP_SLICE_LAST, &kv, 1, &vt, &hi));
  }
  for (int i = 0; i < 3; i++) {
    mn_node x = ins[i];
    if (!mn_ad_wants(c, x) || (packed && i > 0)) continue;
    /* Self-attention passes one node as several of q, k, v: each role contributes its
     * own term, and mn_ad_accumulate sums them. */
    mn_ad_accumulate(c, x, mn_ad_node(c, grad_op[i], ins, num_ins, &c->g->nodes[x].type, &attrs));
  }
  return c->g->status;
}

mn_status mn_vjp_CAUSAL_ATTENTION(mn_ad_ctx *c, mn_node y, mn_node dy) {
  return vjp_attention(c, y, dy, true);
}
mn_status mn_vjp_FULL_ATTENTION(mn_ad_ctx *c, mn_node y, mn_node dy) {
  return vjp_attention(c, y, dy, false);
}
mn_status mn_vjp_CROSS_ATTENTION(mn_ad_ctx *c, mn_node y, mn_node dy) {
  return vjp_attention(c, y, dy, false);
}
mn_status mn_vjp_CAUSAL_ATTENTION_PACKED(mn_ad_ctx *c, mn_node y, mn_node dy) {
  return vjp_attention(c, y, dy, true);
}
