/* The rewrite engine: compiles the rule table's patterns once, then runs the rules on an
 * e-graph to saturation or until a limit stops it. */
#ifndef MN_OPTIMIZER_REWRITE_H
#define MN_OPTIMIZER_REWRITE_H

#include "optimizer/rules.h"

typedef struct mn_saturate_limits {
  size_t max_nodes; /* stop adding once the e-graph holds this many nodes */
  int max_iterations;
  double max_ms;   /* wall-clock time for the whole saturation */
  bool full_stage; /* the optimizer's full stage: rules flagged MN_RULE_FULL_ONLY run too */
} mn_saturate_limits;

typedef struct mn_saturate_result {
  int iterations;
  bool saturated; /* an iteration changed nothing: every rule's consequences are in */
  bool hit_node_limit, hit_iteration_limit, hit_time_limit;
  size_t fired[MN_MAX_RULES]; /* per rule: applications that merged two classes */
} mn_saturate_result;

/* Runs every rule of mn_rule_table on eg (rebuilt between iterations). Fails only when
 * out of memory or when a rule tried to merge values of different types (a bug in
 * that rule); the e-graph is consistent after any return. */
mn_status mn_saturate(mn_egraph *eg, const mn_saturate_limits *lim, mn_saturate_result *res);

/* NULL when every rule's patterns compile, else a message naming the rule (tests). */
const char *mn_rules_compile_error(void);

#endif
