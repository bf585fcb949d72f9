/* What the optimizer did during one build (mn_build_session_with_report): per stage
 * (the forward graph before autodiff, the full graph after), and for the whole build. */
#ifndef MN_OPTIMIZER_REPORT_H
#define MN_OPTIMIZER_REPORT_H

#include "optimizer/optimize.h"
#include "optimizer/rules.h"

typedef struct mn_optimize_stage_report {
  bool ran;                         /* the pipeline reached this stage */
  bool optimized;                   /* the optimizer ran (mn_session_options.optimize) */
  bool fell_back;                   /* an internal inconsistency: the stage kept its input graph */
  size_t nodes_before, nodes_after; /* graph nodes */
  size_t dispatches_before, dispatches_after; /* nodes that are not leaves */
  size_t eclasses, enodes;                    /* the e-graph when saturation stopped */
  int iterations;
  bool saturated, hit_node_limit, hit_iteration_limit, hit_time_limit;
  size_t fired[MN_MAX_RULES];   /* per row of mn_rule_table */
  size_t cse;                   /* nodes merged into an equal node (hash-consing, congruence) */
  size_t dead;                  /* nodes that no output needs */
  size_t fusions;               /* fused nodes made (optimizer/fusion.h; full stage only) */
  size_t multi_output_fusions;  /* matmul_at + sum_rows pairs made one (bgrad.h; full stage) */
  size_t saved_attention_stats; /* attention gradients reading the forward's statistics
                                   (attention_stats.h; full stage, low precision) */
  size_t qkv_attentions;        /* attentions reading their fused projection in place
                                   (attention_qkv.h; full stage, low precision) */
  size_t loss_gradients;        /* losses computed with their gradient in one pass (loss_grad.h;
                                   full stage, low precision) */
  size_t recomputed;     /* activations computed again for the backward (recompute.h; full stage,
                            low precision) */
  size_t sibling_groups; /* products over one derived parameter (siblings.h; forward stage) */
  size_t scales_folded;  /* scales made the alpha of their product (scale_fold.h; full stage) */
  double cost_before, cost_after; /* cost model estimate (cost.h), bytes */
  double saturation_ms, extraction_ms, total_ms;
} mn_optimize_stage_report;

struct mn_optimize_report {
  mn_optimize_stage_report stage[2]; /* indexed by mn_optimize_stage */
  double lower_ms; /* the whole lowering: sort, optimize, differentiate, optimize, plan */
  double build_ms; /* lowering plus creating the session on its backend */
  size_t plan_dispatches, plan_buffers;
};

mn_optimize_report *mn_optimize_report_new(void);

/* Times rule `name` fired in a stage ("cse" and "dead-code" name the built-in passes);
 * 0 for an unknown name. */
size_t mn_optimize_report_fired(const mn_optimize_report *r, mn_optimize_stage stage,
                                const char *name);

#endif
