#include "optimizer/optimize.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "host/error.h"
#include "optimizer/attention_qkv.h"
#include "optimizer/attention_stats.h"
#include "optimizer/bgrad.h"
#include "optimizer/cost.h"
#include "optimizer/egraph.h"
#include "optimizer/extract.h"
#include "optimizer/fusion.h"
#include "optimizer/loss_grad.h"
#include "optimizer/pass_switch.h"
#include "optimizer/recompute.h"
#include "optimizer/report.h"
#include "optimizer/rewrite.h"
#include "optimizer/scale_fold.h"

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static size_t count_dispatches(const mn_graph *g) {
  size_t n = 0;
  for (size_t i = 0; i < g->num_nodes; i++)
    n += !(mn_op_flags(g->nodes[i].op) & (MN_OPF_LEAF | MN_OPF_EXTRA_OUTPUT));
  return n;
}

static bool is_topological(const mn_graph *g) {
  for (size_t i = 0; i < g->num_nodes; i++)
    for (int k = 0; k < g->nodes[i].num_inputs; k++)
      if (g->nodes[i].inputs[k] >= i) return false;
  return true;
}

/* Nodes no output depends on (named leaves excepted: they always stay). The graph is
 * topological, so one backward sweep marks everything live. */
static size_t count_dead(const mn_graph *g) {
  unsigned char *live = calloc(g->num_nodes ? g->num_nodes : 1, 1);
  if (!live) return 0;
  for (size_t i = 0; i < g->num_outputs; i++)
    live[g->outputs[i]] = 1;
  size_t dead = 0;
  for (size_t i = g->num_nodes; i-- > 0;) {
    const mn_node_rec *n = &g->nodes[i];
    if (!live[i]) {
      dead += n->op != MN_OP_INPUT && n->op != MN_OP_PARAMETER;
      continue;
    }
    for (int k = 0; k < n->num_inputs; k++)
      live[n->inputs[k]] = 1;
  }
  free(live);
  return dead;
}

/* Adds every node of g; equal nodes meet in one class as they arrive (common
 * subexpressions), counted in *cse. Named leaves, in-place ops and decode layers (which write
 * their caches) keep an identity of their own: two inputs are never the same value, and each
 * in-place write happens. */
static mn_status load(mn_egraph *eg, const mn_graph *g, eg_id *orig_node, size_t *cse) {
  for (size_t i = 0; i < g->num_nodes; i++) {
    const mn_node_rec *r = &g->nodes[i];
    eg_node_key k;
    memset(&k, 0, sizeof k);
    k.op = r->op;
    k.num_kids = r->num_inputs;
    for (int j = 0; j < r->num_inputs; j++)
      k.kids[j] = orig_node[r->inputs[j]];
    k.type = eg_intern_type(eg, &r->type);
    k.attrs = r->attrs;
    bool unique = r->op == MN_OP_INPUT || r->op == MN_OP_PARAMETER ||
                  (mn_op_flags(r->op) & MN_OPF_INPLACE) || r->op == MN_OP_LLAMA_DECODE_LAYER;
    k.identity = unique ? (uint32_t)i : EG_NONE;
    k.data = r->op == MN_OP_CONSTANT ? r->data : NULL;
    k.fused = r->op == MN_OP_FUSED ? r->fused : NULL;
    size_t before = eg->num_nodes;
    if (k.type == UINT32_MAX || (orig_node[i] = eg_add(eg, &k)) == EG_NONE)
      return mn_fail(MN_ERR_OUT_OF_MEMORY, "optimizer: out of memory (%zu nodes)", g->num_nodes);
    *cse += eg->num_nodes == before;
  }
  for (size_t i = 0; i < g->num_outputs; i++) {
    eg_id c = eg_find(eg, orig_node[g->outputs[i]]);
    if (eg->classes[c].pinned == EG_NONE) eg->classes[c].pinned = orig_node[g->outputs[i]];
  }
  return MN_OK;
}

static mn_saturate_limits resolve_limits(const mn_optimize_limits *l, size_t num_nodes,
                                         mn_optimize_stage stage) {
  mn_saturate_limits s = {.max_nodes = 20 * num_nodes,
                          .max_iterations = 8,
                          .max_ms = 100.0,
                          .full_stage = stage == MN_OPTIMIZE_FULL};
  if (s.max_nodes < 1024) s.max_nodes = 1024;
  if (l && l->max_nodes) s.max_nodes = l->max_nodes;
  if (l && l->max_iterations) s.max_iterations = l->max_iterations;
  if (l && l->max_ms > 0) s.max_ms = l->max_ms;
  return s;
}

static size_t count_classes(mn_egraph *eg) {
  size_t n = 0;
  for (size_t i = 0; i < eg->num_nodes; i++)
    n += eg_find(eg, (eg_id)i) == i;
  return n;
}

/* Saturates and extracts `in` into *out; fills the e-graph part of the report. */
static mn_status optimize(const mn_graph *in, const mn_saturate_limits *lim,
                          mn_optimize_stage_report *sr, mn_graph **out) {
  mn_egraph eg;
  if (!eg_init(&eg, 2 * in->num_nodes))
    return mn_fail(MN_ERR_OUT_OF_MEMORY, "optimizer: out of memory (%zu nodes)", in->num_nodes);
  eg_id *orig_node = malloc((in->num_nodes ? in->num_nodes : 1) * sizeof *orig_node);
  eg_id *best = NULL;
  size_t cse = 0;
  mn_saturate_result res;
  memset(&res, 0, sizeof res);
  double t0 = now_ms();
  mn_status st = orig_node ? load(&eg, in, orig_node, &cse)
                           : mn_fail(MN_ERR_OUT_OF_MEMORY, "optimizer: out of memory");
  if (st == MN_OK) st = mn_saturate(&eg, lim, &res);
  double t1 = now_ms();
  if (st == MN_OK && !(best = malloc((eg.num_nodes ? eg.num_nodes : 1) * sizeof *best)))
    st = mn_fail(MN_ERR_OUT_OF_MEMORY, "optimizer: out of memory");
  if (st == MN_OK) st = mn_extract(&eg, best);
  if (st == MN_OK) st = mn_emit_graph(&eg, best, in, orig_node, out);
  sr->saturation_ms = t1 - t0;
  sr->extraction_ms = now_ms() - t1;
  sr->eclasses = count_classes(&eg);
  sr->enodes = eg.live_nodes;
  sr->iterations = res.iterations;
  sr->saturated = res.saturated;
  sr->hit_node_limit = res.hit_node_limit;
  sr->hit_iteration_limit = res.hit_iteration_limit;
  sr->hit_time_limit = res.hit_time_limit;
  memcpy(sr->fired, res.fired, sizeof sr->fired);
  sr->cse = cse + eg.congruent;
  free(best);
  free(orig_node);
  eg_free(&eg);
  return st;
}

mn_status mn_optimize_graph_limits(const char *fn, mn_graph **g, const mn_session_options *opts,
                                   mn_optimize_stage stage, const mn_optimize_limits *limits,
                                   mn_optimize_report *report) {
  mn_optimize_stage_report local, *sr = report ? &report->stage[stage] : &local;
  memset(sr, 0, sizeof *sr);
  sr->ran = true;
  const mn_graph *in = *g;
  sr->nodes_before = sr->nodes_after = in->num_nodes;
  sr->dispatches_before = sr->dispatches_after = count_dispatches(in);
  if (!opts || !opts->optimize || in->num_outputs == 0) return MN_OK;
  /* The graph this stage made holds multi-output nodes, which the e-graph does not model:
   * it is kept as it is (an extra value nobody reads would be dropped). */
  for (size_t i = 0; i < in->num_nodes; i++)
    if (mn_op_flags(in->nodes[i].op) & (MN_OPF_MULTI_OUTPUT | MN_OPF_EXTRA_OUTPUT)) return MN_OK;
  sr->optimized = true;
  double t0 = now_ms();
  mn_graph *sorted = NULL, *out = NULL;
  mn_status st = MN_OK;
  if (!is_topological(in)) {
    if ((st = mn_graph_toposort_status(in, &sorted)) != MN_OK) return st;
    in = sorted;
  }
  mn_saturate_limits lim = resolve_limits(limits, in->num_nodes, stage);
  sr->dead = count_dead(in);
  sr->cost_before = mn_cost_graph(in);
  st = optimize(in, &lim, sr, &out);
  /* Fusion only in the full stage: a fused node has no VJP rule, so the forward graph
   * that autodiff differentiates must not hold one. Bias gradients are paired last, so that
   * no pass before them meets a multi-output node. */
  if (st == MN_OK && stage == MN_OPTIMIZE_FULL && opts->fusion != MN_FUSION_OFF)
    st = mn_fuse_pointwise(&out, &sr->fusions);
  if (st == MN_OK && stage == MN_OPTIMIZE_FULL)
    st = mn_fuse_bias_gradients(&out, &sr->multi_output_fusions);
  if (st == MN_OK && stage == MN_OPTIMIZE_FULL && opts->precision != MN_PRECISION_F32)
    st = mn_attention_save_stats(&out, &sr->saved_attention_stats);
  if (st == MN_OK && stage == MN_OPTIMIZE_FULL && opts->precision != MN_PRECISION_F32)
    st = mn_attention_read_qkv_in_place(&out, &sr->qkv_attentions);
  if (st == MN_OK && stage == MN_OPTIMIZE_FULL)
    st = mn_fuse_loss_gradients(&out, &sr->loss_gradients);
  if (st == MN_OK && stage == MN_OPTIMIZE_FULL && opts->precision != MN_PRECISION_F32 &&
      !mn_optimize_pass_off("recompute"))
    st = mn_recompute_activations(&out, &sr->recomputed);
  if (st == MN_OK && stage == MN_OPTIMIZE_FULL)
    st = mn_fold_scales_into_products(&out, &sr->scales_folded);
  if (st != MN_OK) {
    mn_graph_free(out);
    out = NULL;
  }
  if (st == MN_ERR_STATE) {
    /* A rule or the extraction broke an invariant: run the graph as it came rather
     * than a graph that may be wrong; the report says so. */
    sr->fell_back = true;
    sr->cost_after = sr->cost_before;
    st = MN_OK;
  } else if (st == MN_OK) {
    mn_graph_free(*g);
    *g = out;
    sr->nodes_after = out->num_nodes;
    sr->dispatches_after = count_dispatches(out);
    sr->cost_after = mn_cost_graph(out);
  } else {
    /* Name the public function that failed, as every message does. */
    char why[MN_ERROR_CAP];
    snprintf(why, sizeof why, "%s", mn_last_error());
    st = mn_fail(st, "%s: %s", fn, why);
  }
  mn_graph_free(sorted);
  sr->total_ms = now_ms() - t0;
  return st;
}

mn_status mn_optimize_graph_report(const char *fn, mn_graph **g, const mn_session_options *opts,
                                   mn_optimize_stage stage, mn_optimize_report *report) {
  return mn_optimize_graph_limits(fn, g, opts, stage, NULL, report);
}

mn_status mn_optimize_graph(const char *fn, mn_graph **g, const mn_session_options *opts,
                            mn_optimize_stage stage) {
  return mn_optimize_graph_limits(fn, g, opts, stage, NULL, NULL);
}
