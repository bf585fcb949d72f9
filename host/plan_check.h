/* Checks mn_plan_build makes on the ops the optimizer makes (plan_check.c says why). */
#ifndef MN_HOST_PLAN_CHECK_H
#define MN_HOST_PLAN_CHECK_H

#include "host/graph.h"

/* MN_ERR_STATE, naming the node, when an epilogue op's operands or result do not have the
 * types its kernels assume (a product's K and N, a bias of N values, an act in range). */
mn_status mn_plan_check_optimizer_ops(const mn_graph *g);

/* Whether extra_output node `extra` has the type of the value `producer` writes for it:
 * a fused node's values have its own shape; a bias gradient has one value per column of the
 * summed operand; an attention's statistics two per (batch, head, query); a loss's gradient
 * the shape of its logits. */
bool mn_plan_extra_type_ok(const mn_graph *g, const mn_node_rec *producer,
                           const mn_node_rec *extra);

/* Floats in the row statistics of an attention node (ops.h): 2 * batches * heads * queries. */
int64_t mn_attention_stats_numel(const mn_graph *g, const mn_node_rec *attention);

#endif
