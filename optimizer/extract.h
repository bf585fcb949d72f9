/* Extraction: one node per e-class, chosen by the cost model (cost.h), and the graph
 * those choices make, which is what the session runs. */
#ifndef MN_OPTIMIZER_EXTRACT_H
#define MN_OPTIMIZER_EXTRACT_H

#include "optimizer/egraph.h"

/* Chooses best[c] for every class root c that can be computed (EG_NONE otherwise).
 *
 * Classes are finalized in order of cost, a node becoming a candidate only once all its
 * input classes are final (Knuth's generalization of Dijkstra), so the choices never
 * form a cycle however the e-graph's classes refer to each other. A node costs its own
 * price plus each input's cost divided by the number of classes that use that input:
 * a shared value is paid for once, not once per user, so a rewrite that would compute a
 * shared value a second time is priced for the work it adds. A class holding a graph
 * output takes its pinned node (unless that node cannot be computed).
 *
 * That division is an estimate (it counts every class that could use a value, chosen or
 * not), so the choices are then refined against the exact cost of the graph they make:
 * one class at a time moves to another of its nodes while that lowers the summed cost of
 * every class the outputs need, each priced once, and never closes a cycle. A value is
 * thus computed twice (by a fused node and by the node its other users read) only where
 * the cost model says that is cheaper than computing it once. */
mn_status mn_extract(mn_egraph *eg, eg_id *best);

/* The graph of the choices: every named leaf of `orig` (orig_node[i] is the e-node of
 * orig's node i) in its original order and with its name, then what the outputs need,
 * inputs before users, in the original order where a node stands for one of orig's.
 * Outputs keep their order and count; two outputs that were different nodes stay
 * different nodes, and an output that was computed is never a leaf, so every gradient
 * keeps a buffer of its own. */
mn_status mn_emit_graph(mn_egraph *eg, const eg_id *best, const mn_graph *orig,
                        const eg_id *orig_node, mn_graph **out);

#endif
