/* Pointwise fusion: the last pass of the optimizer's full stage (training graphs after
 * autodiff, inference graphs), run on the extracted graph.
 *
 * A group is a connected set of F32 nodes of one shape: pointwise ops and at most one row op
 * (a norm or a norm's x gradient, whose weight and bias rows it reads as inputs), which then
 * runs with the group's other ops as its prologue and epilogue in one kernel. Its last member
 * (the root) gives the fused node's value; every other member whose value is a graph output
 * or read outside the group is written as an extra value of the fused node (at most
 * MN_MAX_EXTRA_OUTPUTS), read through an extra_output node. A group reads at most
 * MN_FUSED_MAX_INPUTS distinct values and runs at most MN_FUSED_MAX_INSTRS ops, takes each member
 * only when the cost model (cost.h) prices the group with it below the group without it plus
 * the member on its own, and must leave the graph acyclic: the pass keeps every node and group
 * at a place between what it reads and what reads it, and a group for which no such place
 * exists (a path leaves it and comes back) does not take the member.
 *
 * It runs unless the session options turn it off (mn_session_options.fusion).
 * See docs/fusion.md for the design and what is not fused yet. */
#ifndef MN_OPTIMIZER_FUSION_H
#define MN_OPTIMIZER_FUSION_H

#include <stdbool.h>

#include "host/graph.h"

/* Replaces *g (topological) by the graph with every group fused, freeing the old graph;
 * *fusions counts the fused nodes made. Outputs and named leaves are kept; an output that was
 * a group's root is now its fused node, one that was another member its extra_output node.
 * On failure (out of memory) *g is left as it was. */
mn_status mn_fuse_pointwise(mn_graph **g, size_t *fusions);

#endif
