/* Sibling matmuls: products matmul_bt(x, W_i) of one x with nn.Linear weights W_i [out_i, in]
 * (Llama's q, k and v projections; its MLP gate and up) become one product with a derived
 * parameter P [sum of out_i, in], whose rows are the W_i stacked, and one slice_last of the
 * result per W_i. Only matmul_bt is grouped: it is the layout of every nn.Linear weight the
 * models load (GPT-2's Conv1D weights already come concatenated, as c_attn).
 *
 * A pass of its own, not an e-graph rule: it replaces parameters, which the e-graph keeps
 * with their identity. It runs on the forward graph after the optimization (of the forward
 * stage in training, before autodiff, so the backward of the concatenated form comes from
 * autodiff: slice_last_grad, add). Products the rules gave an epilogue are left alone.
 *
 * A source W_i joins a group only when nothing else reads it (tied weights stay apart), it is
 * no graph output, its product is no graph output, and (training) the unoptimized graph gives
 * it a gradient, so that the optimizer updates exactly the parameters it updated before. A
 * group is formed when the cost model (cost.h) prices the concatenated form, with the backward
 * it implies in training, below the separate products; docs/optimizer-siblings.md says where
 * that holds.
 *
 * P is a PARAMETER node marked with attrs.variant = MN_PARAM_DERIVED (host/param_layout.h),
 * named "#siblings(<source names>)" for reports. Which rows of P hold which source is not in
 * that name: the pass appends it to the table of derived parameters (mn_param_layout), which
 * the build pipeline carries through autodiff and the full-stage optimizer into the plan, and
 * from which sessions and the plan cache map the source names onto element ranges of P. */
#ifndef MN_OPTIMIZER_SIBLINGS_H
#define MN_OPTIMIZER_SIBLINGS_H

#include <stdbool.h>

#include "host/graph.h"
#include "host/param_layout.h"

/* Sources per group: a bound on the pass's per-group arrays. */
#define MN_SIBLINGS_MAX_GROUP 64

/* The cost model's two prices of one group, in cost.h bytes. */
typedef struct mn_siblings_price {
  double separate, concat;
} mn_siblings_price;

/* Prices products of x (type x, leading dims flattened into M) with n weights of rows[i] x
 * in (in: x's last dim). With backward, the gradient ops autodiff builds for each form are
 * added: the weights' always, x's when x_grad. */
mn_siblings_price mn_siblings_price_group(const mn_tensor_type *x, const int64_t *rows, size_t n,
                                          bool backward, bool x_grad);

/* Replaces *g (topological; freeing the old graph) with every group concatenated, appending
 * each group's sources to layout (empty on entry); *groups (may be NULL) counts them. training: the
 * graph is a forward graph that autodiff differentiates next (the backward is priced, and sources
 * need a gradient). o->siblings picks the groups (AUTO: those priced cheaper); with o->optimize
 * false or o->siblings NEVER it changes nothing. On failure *g is unchanged and layout empty. */
mn_status mn_siblings_concat(const char *fn, mn_graph **g, const mn_session_options *o,
                             bool training, mn_param_layout *layout, size_t *groups);

#endif
