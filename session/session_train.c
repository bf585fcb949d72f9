/* Training sessions: the build pipeline (optimize, differentiate, optimize, plan,
 * backend), gradients, and optimizer configuration. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "autodiff/autodiff.h"
#include "host/error.h"
#include "optimizer/optimize.h"
#include "optimizer/report.h"
#include "optimizer/siblings.h"
#include "session/session.h"

/* grad_output indexed by node of `before` (the graph autodiff differentiated) rewritten
 * for `after`, matching parameters by their unique names: the optimizer and the sort in
 * between renumber nodes but keep names, and outputs by index. */
static int32_t *remap_grads(const mn_graph *before, const int32_t *grads, const mn_graph *after) {
  int32_t *out = malloc((after->num_nodes ? after->num_nodes : 1) * sizeof *out);
  if (!out) return NULL;
  for (size_t i = 0; i < after->num_nodes; i++) {
    out[i] = -1;
    const mn_node_rec *n = &after->nodes[i];
    if (n->op != MN_OP_PARAMETER) continue;
    mn_node old = mn_graph_find_leaf(before, MN_OP_PARAMETER, n->name);
    if (old != MN_NO_NODE) out[i] = grads[old];
  }
  return out;
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

mn_status mn_lower_training_report(const char *fn, const mn_graph *g, const mn_session_options *o,
                                   mn_plan **out, mn_optimize_report *report) {
  *out = NULL;
  double t0 = now_ms();
  mn_graph *fwd = NULL, *full = NULL, *sorted = NULL;
  int32_t *grads = NULL, *sorted_grads = NULL;
  /* Where the user's parameters lie in derived ones: the derived parameters keep their names
   * through autodiff, the optimizer and the sort, and the plan binds the table to its graph. */
  mn_param_layout layout = {0};
  mn_status st = mn_graph_toposort_status(g, &fwd);
  if (st == MN_OK) st = mn_optimize_graph_report(fn, &fwd, o, MN_OPTIMIZE_FORWARD, report);
  /* Before autodiff, which then differentiates the concatenated form. */
  if (st == MN_OK)
    st = mn_siblings_concat(fn, &fwd, o, true, &layout,
                            report ? &report->stage[MN_OPTIMIZE_FORWARD].sibling_groups : NULL);
  if (st == MN_OK && !(grads = malloc((fwd->num_nodes ? fwd->num_nodes : 1) * sizeof *grads)))
    st = mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
  /* F16 seeds the loss gradient with the loss scale, an input the backend writes each step. */
  const char *scale = o && o->precision == MN_PRECISION_F16 ? MN_LOSS_SCALE_INPUT : NULL;
  if (st == MN_OK) st = mn_autodiff_scaled(fn, fwd, scale, &full, grads);
  /* The optimizer keeps names and the outputs' order, so gradients stay matched. */
  if (st == MN_OK) st = mn_optimize_graph_report(fn, &full, o, MN_OPTIMIZE_FULL, report);
  if (st == MN_OK) st = mn_graph_toposort_status(full, &sorted);
  if (st == MN_OK && !(sorted_grads = remap_grads(fwd, grads, sorted)))
    st = mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
  if (st == MN_OK) {
    st = mn_plan_build(sorted, g->num_outputs, sorted_grads, &layout, out);
    sorted = NULL; /* owned by the plan now, even on failure */
  }
  mn_graph_free(fwd);
  mn_graph_free(full);
  mn_graph_free(sorted);
  free(grads);
  free(sorted_grads);
  mn_param_layout_clear(&layout);
  if (report && st == MN_OK) {
    report->lower_ms = now_ms() - t0;
    report->plan_dispatches = (*out)->num_dispatches;
    report->plan_buffers = (*out)->num_buffers;
  }
  return st;
}

mn_status mn_lower_training(const char *fn, const mn_graph *g, const mn_session_options *o,
                            mn_plan **out) {
  return mn_lower_training_report(fn, g, o, out, NULL);
}

mn_status mn_build_session(const mn_graph *g, const mn_session_options *opts, mn_session **out) {
  const char *fn = "mn_build_session";
  mn_status st = mn_session_check_buildable(fn, g, opts, out);
  if (st != MN_OK) return st;
  mn_session_options o = opts ? *opts : mn_session_options_default();
  mn_plan *plan = NULL;
  if ((st = mn_lower_training(fn, g, &o, &plan)) != MN_OK) return st;
  return mn_session_create(fn, plan, &o, true, out);
}

mn_status mn_build_session_with_report(const mn_graph *g, const mn_session_options *opts,
                                       mn_session **out, mn_optimize_report **report) {
  const char *fn = "mn_build_session_with_report";
  if (report) *report = NULL;
  mn_status st = mn_session_check_buildable(fn, g, opts, out);
  if (st != MN_OK) return st;
  mn_optimize_report *r = NULL;
  if (report && !(r = mn_optimize_report_new()))
    return mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
  double t0 = now_ms();
  mn_session_options o = opts ? *opts : mn_session_options_default();
  mn_plan *plan = NULL;
  st = mn_lower_training_report(fn, g, &o, &plan, r);
  if (st == MN_OK) st = mn_session_create(fn, plan, &o, true, out);
  if (st != MN_OK) {
    mn_optimize_report_free(r);
    return st;
  }
  if (r) r->build_ms = now_ms() - t0;
  if (report) *report = r;
  return MN_OK;
}

mn_status mn_session_read_grad(mn_session *s, const char *name, float *out, size_t n) {
  const char *fn = "mn_session_read_grad";
  mn_param_view v;
  mn_status st = mn_session_find_param(fn, s, name, out, n, &v);
  if (st != MN_OK) return st;
  if (!s->training)
    return mn_fail(MN_ERR_STATE, "%s: \"%s\": an inference session has no gradients", fn, name);
  const mn_plan *p = s->plan;
  for (size_t i = 0; i < p->num_params; i++) {
    if (p->params[i].param != v.node) continue;
    if (p->params[i].grad == MN_NO_NODE) {
      memset(out, 0, n * sizeof *out); /* the loss does not depend on this parameter */
      return MN_OK;
    }
    /* A source's gradient is its rows of the derived parameter's gradient. */
    size_t all = (size_t)mn_tensor_type_numel(&p->graph->nodes[v.node].type);
    return mn_session_read_range(s, p->node_buffer[p->params[i].grad], all, v.offset, out, n);
  }
  return mn_fail(MN_ERR_NOT_FOUND, "%s: no parameter named \"%s\"", fn, name);
}

static mn_status check_training(const char *fn, mn_session *s) {
  if (!s) return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: session is NULL", fn);
  if (!s->training)
    return mn_fail(MN_ERR_STATE,
                   "%s: an inference session has no optimizer (build it with "
                   "mn_build_session)",
                   fn);
  return MN_OK;
}

static mn_status check_hyper(const char *fn, const char *what, float v, float lo, bool lo_open,
                             float hi, bool hi_open) {
  bool ok = isfinite(v) && (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi);
  if (ok) return MN_OK;
  return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: %s = %g, expected %s%g, %g%s", fn, what, (double)v,
                 lo_open ? "(" : "[", (double)lo, (double)hi, hi_open ? ")" : "]");
}

mn_status mn_session_set_learning_rate(mn_session *s, float lr) {
  const char *fn = "mn_session_set_learning_rate";
  mn_status st = check_training(fn, s);
  if (st == MN_OK) st = check_hyper(fn, "lr", lr, 0, false, INFINITY, true);
  if (st != MN_OK) return st;
  s->optim.kind = MN_OPTIM_SGD;
  s->optim.lr = lr;
  return MN_OK;
}

static mn_status set_adam_family(const char *fn, mn_session *s, mn_optimizer_kind kind, float lr,
                                 float beta1, float beta2, float eps, float wd) {
  mn_status st = check_training(fn, s);
  if (st == MN_OK) st = check_hyper(fn, "lr", lr, 0, false, INFINITY, true);
  if (st == MN_OK) st = check_hyper(fn, "beta1", beta1, 0, false, 1, true);
  if (st == MN_OK) st = check_hyper(fn, "beta2", beta2, 0, false, 1, true);
  if (st == MN_OK) st = check_hyper(fn, "eps", eps, 0, false, INFINITY, true);
  if (st == MN_OK) st = check_hyper(fn, "weight_decay", wd, 0, false, INFINITY, true);
  if (st != MN_OK) return st;
  s->optim.kind = kind;
  s->optim.lr = lr;
  s->optim.beta1 = beta1;
  s->optim.beta2 = beta2;
  s->optim.eps = eps;
  s->optim.weight_decay = wd;
  return MN_OK;
}

mn_status mn_session_set_adam(mn_session *s, float lr, float beta1, float beta2, float eps) {
  return set_adam_family("mn_session_set_adam", s, MN_OPTIM_ADAM, lr, beta1, beta2, eps, 0);
}

mn_status mn_session_set_adamw(mn_session *s, float lr, float beta1, float beta2, float eps,
                               float weight_decay) {
  return set_adam_family("mn_session_set_adamw", s, MN_OPTIM_ADAMW, lr, beta1, beta2, eps,
                         weight_decay);
}

mn_status mn_session_set_grad_accumulation(mn_session *s, int k) {
  const char *fn = "mn_session_set_grad_accumulation";
  mn_status st = check_training(fn, s);
  if (st == MN_OK && k < 1)
    st = mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: k = %d, expected at least 1", fn, k);
  if (st != MN_OK) return st;
  s->grad_accum = (unsigned)k;
  s->accum_index = 0;
  return MN_OK;
}

mn_status mn_session_set_grad_clip(mn_session *s, float max_global_norm) {
  const char *fn = "mn_session_set_grad_clip";
  mn_status st = check_training(fn, s);
  if (st == MN_OK)
    st = check_hyper(fn, "max_global_norm", max_global_norm, 0, false, INFINITY, true);
  if (st != MN_OK) return st;
  s->optim.max_grad_norm = max_global_norm;
  return MN_OK;
}
