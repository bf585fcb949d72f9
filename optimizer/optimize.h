/* The graph optimizer's entry point, called twice by the build pipeline: on the
 * forward graph and on the forward+backward graph.
 *
 * The graph goes into an e-graph (optimizer/egraph.h), the rewrite rules
 * (optimizer/rules.c) run to saturation or to a limit, and extraction by the cost model
 * (optimizer/extract.h, optimizer/cost.h) builds the graph that replaces the input. The
 * full stage also runs the rules flagged MN_RULE_FULL_ONLY (they make ops without a VJP
 * rule), then fuses pointwise groups (fusion.h) and pairs bias gradients with weight
 * gradients (bgrad.h). docs/optimizer.md describes the rules. */
#ifndef MN_OPTIMIZER_OPTIMIZE_H
#define MN_OPTIMIZER_OPTIMIZE_H

#include "host/graph.h"

typedef enum mn_optimize_stage { MN_OPTIMIZE_FORWARD, MN_OPTIMIZE_FULL } mn_optimize_stage;

typedef struct mn_optimize_limits {
  size_t max_nodes;   /* e-nodes; 0: 20 per graph node (and at least 1024) */
  int max_iterations; /* 0: 8 */
  double max_ms;      /* saturation time; 0: 100 ms */
} mn_optimize_limits;

/* Replaces *g (freeing the old graph) with the optimized graph: same outputs in the same
 * order and count (an output may become another node id; outputs that were different
 * nodes stay different, and a computed output stays computed), every named leaf kept
 * with its name, inputs before users. An output's own node is never rewritten; what
 * feeds it is, except that the full stage then fuses pointwise groups (fusion.h), and an
 * output at a group's root becomes that group's fused node, and an output that was a
 * paired sum_rows or matmul_at becomes its extra_output or matmul_at_bgrad (bgrad.h). With
 * opts->optimize false it changes nothing. */
mn_status mn_optimize_graph(const char *fn, mn_graph **g, const mn_session_options *opts,
                            mn_optimize_stage stage);

/* The same, filling report->stage[stage] when report is not NULL. */
mn_status mn_optimize_graph_report(const char *fn, mn_graph **g, const mn_session_options *opts,
                                   mn_optimize_stage stage, mn_optimize_report *report);

/* The same with explicit limits (NULL: the defaults above). */
mn_status mn_optimize_graph_limits(const char *fn, mn_graph **g, const mn_session_options *opts,
                                   mn_optimize_stage stage, const mn_optimize_limits *limits,
                                   mn_optimize_report *report);

#endif
