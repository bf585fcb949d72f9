/* Reverse-mode differentiation of a forward graph: appends the backward nodes that
 * compute dLoss/dparameter for every parameter on a path to the loss. */
#ifndef MN_AUTODIFF_H
#define MN_AUTODIFF_H

#include "host/graph.h"

/* State shared by the VJP rules while one graph is differentiated. */
typedef struct mn_ad_ctx {
  mn_graph *g;               /* the forward graph being extended with backward nodes */
  size_t num_forward;        /* nodes [0, num_forward) are the forward graph */
  mn_node *grad;             /* per forward node: its accumulated gradient, or MN_NO_NODE */
  unsigned char *needs_grad; /* per forward node: a parameter reaches it */
} mn_ad_ctx;

/* A VJP rule: given forward node y and its upstream gradient dy, add the backward
 * nodes and hand each input's contribution to mn_ad_accumulate. Returns MN_OK, or the
 * graph's error status (set with mn_graph_fail) when a node could not be built. */
typedef mn_status (*mn_vjp_rule)(mn_ad_ctx *c, mn_node y, mn_node dy);

/* Adds dx to the gradient of forward node x (a sum when several users contribute);
 * contributions to nodes no parameter reaches are dropped. */
void mn_ad_accumulate(mn_ad_ctx *c, mn_node x, mn_node dx);

/* Appends a backward node of type `type` (NULL: the type of inputs[0]). */
mn_node mn_ad_node(mn_ad_ctx *c, mn_op op, const mn_node *inputs, int n, const mn_tensor_type *type,
                   const mn_op_attrs *attrs);
static inline const mn_node_rec *mn_ad_fwd(const mn_ad_ctx *c, mn_node id) {
  return &c->g->nodes[id];
}
static inline bool mn_ad_wants(const mn_ad_ctx *c, mn_node id) { return c->needs_grad[id] != 0; }

/* The rule of each differentiable op is mn_vjp_<ENUM>, in the autodiff/vjp_*.c file of its
 * area. Every op is declared here, but the table (vjp_table.c) names only those of the
 * ops flagged MN_OPF_DIFF, so a differentiable op without a rule fails to link. */
#define MN_VJP_DECLARE(e, name, arity, flags)                                                      \
  mn_status mn_vjp_##e(mn_ad_ctx *c, mn_node y, mn_node dy);
MN_OP_LIST(MN_VJP_DECLARE)
#undef MN_VJP_DECLARE

/* Indexed by mn_op: the rule of each MN_OPF_DIFF op, NULL for every other op. */
extern const mn_vjp_rule mn_vjp_rules[MN_OP_COUNT];

/* Differentiates `fwd` (toposorted; output 0 is the [1] loss). On success *out is a
 * new graph whose first fwd->num_nodes nodes are fwd's and whose outputs are fwd's
 * outputs followed by one gradient per parameter that the loss depends on; grads[i]
 * (for each node i of fwd) is the output index of parameter i's gradient, or -1. Each
 * gradient is a node of its own, never shared with another parameter or a leaf. */
mn_status mn_autodiff(const char *fn, const mn_graph *fwd, mn_graph **out, int32_t *grads);
/* mn_autodiff seeding the loss gradient with an F32 [1] input named scale_input (the loss
 * scale of an F16 session, which the backend writes every step) instead of the constant 1,
 * so every gradient comes out multiplied by it; NULL seeds 1 as mn_autodiff does. */
mn_status mn_autodiff_scaled(const char *fn, const mn_graph *fwd, const char *scale_input,
                             mn_graph **out, int32_t *grads);

#endif
