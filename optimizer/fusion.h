/* Pointwise fusion: the last pass of the optimizer's full stage (training graphs after
 * autodiff, inference graphs), run on the extracted graph.
 *
 * A group is a connected set of pointwise F32 nodes of one shape with a single value
 * leaving it: every member but the root is used only inside the group and is no graph
 * output. Such a group is convex by construction (any path out of it leaves through the
 * root), so replacing it by one MN_OP_FUSED node at the root's place keeps the graph
 * acyclic and topological. A value with a user outside the group stays materialized and
 * ends the group there (no recomputation yet: docs/fusion.md says when it would pay). A
 * group reads at most MN_MAX_INPUTS distinct values and runs at most MN_FUSED_MAX_INSTRS
 * ops, and is formed only when the cost model (cost.h) prices the fused node below the ops
 * it replaces.
 *
 * See docs/fusion.md for the design and what is not fused yet. */
#ifndef MN_OPTIMIZER_FUSION_H
#define MN_OPTIMIZER_FUSION_H

#include <stdbool.h>

#include "graph.h"

/* Replaces *g (topological) by the graph with every group fused, freeing the old graph;
 * *fusions counts the fused nodes made. Outputs, named leaves and their order are kept;
 * an output that was a group's root is now its fused node. On failure (out of memory)
 * *g is left as it was. */
mn_status mn_fuse_pointwise(mn_graph **g, size_t *fusions);

/* Process-wide switch, on by default: tests and benchmarks turn fusion off to compare an
 * optimized graph with and without it (the rewrite rules change rounding, so the optimizer
 * off is not always a bitwise baseline). Not for concurrent use with session builds. */
void mn_fusion_set_enabled(bool on);
bool mn_fusion_enabled(void);

#endif
