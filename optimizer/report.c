#include "optimizer/report.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

mn_optimize_report *mn_optimize_report_new(void) { return calloc(1, sizeof(mn_optimize_report)); }

void mn_optimize_report_free(mn_optimize_report *r) { free(r); }

size_t mn_optimize_report_fired(const mn_optimize_report *r, mn_optimize_stage stage,
                                const char *name) {
  if (!r || !name || (stage != MN_OPTIMIZE_FORWARD && stage != MN_OPTIMIZE_FULL)) return 0;
  const mn_optimize_stage_report *s = &r->stage[stage];
  if (strcmp(name, "cse") == 0) return s->cse;
  if (strcmp(name, "dead-code") == 0) return s->dead;
  size_t n;
  const mn_rule *rules = mn_rule_table(&n);
  for (size_t i = 0; i < n && i < MN_MAX_RULES; i++)
    if (strcmp(rules[i].name, name) == 0) return s->fired[i];
  return 0;
}

/* snprintf into a growing position that keeps counting once the buffer is full. */
typedef struct writer {
  char *buf;
  size_t size, len;
} writer;

__attribute__((format(printf, 2, 3))) static void put(writer *w, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char *at = w->len < w->size ? w->buf + w->len : NULL;
  int n = vsnprintf(at, at ? w->size - w->len : 0, fmt, ap);
  va_end(ap);
  if (n > 0) w->len += (size_t)n;
}

static void put_stage(writer *w, const char *what, const mn_optimize_stage_report *s) {
  put(w, "%s graph: ", what);
  if (!s->ran) {
    put(w, "not optimized (the build did not reach this stage)\n");
    return;
  }
  if (!s->optimized) {
    put(w, "optimizer off, %zu nodes, %zu dispatches\n", s->nodes_before, s->dispatches_before);
    return;
  }
  put(w, "%zu -> %zu nodes, %zu -> %zu dispatches, cost estimate %.4g -> %.4g GB moved\n",
      s->nodes_before, s->nodes_after, s->dispatches_before, s->dispatches_after,
      s->cost_before / 1e9, s->cost_after / 1e9);
  put(w, "  e-graph: %zu e-classes, %zu e-nodes, %d iteration%s, %s\n", s->eclasses, s->enodes,
      s->iterations, s->iterations == 1 ? "" : "s",
      s->saturated             ? "saturated"
      : s->hit_node_limit      ? "stopped at the node limit"
      : s->hit_time_limit      ? "stopped at the time limit"
      : s->hit_iteration_limit ? "stopped at the iteration limit"
                               : "stopped");
  if (s->fell_back) put(w, "  fell back to the unoptimized graph (internal inconsistency)\n");
  put(w, "  rules fired:");
  size_t n, any = 0;
  const mn_rule *rules = mn_rule_table(&n);
  for (size_t i = 0; i < n && i < MN_MAX_RULES; i++)
    if (s->fired[i]) put(w, "%s %s %zu", any++ ? "," : "", rules[i].name, s->fired[i]);
  put(w, "%s cse %zu, dead-code %zu\n", any ? "," : "", s->cse, s->dead);
  put(w, "  fusions applied: %zu\n", s->fusions);
  put(w, "  multi-output fusions: %zu\n", s->multi_output_fusions);
  if (s->saved_attention_stats)
    put(w, "  attention gradients reading saved statistics: %zu\n", s->saved_attention_stats);
  if (s->qkv_attentions)
    put(w, "  attentions reading q, k and v in place: %zu\n", s->qkv_attentions);
  if (s->loss_gradients)
    put(w, "  losses computed with their gradient in one pass: %zu\n", s->loss_gradients);
  if (s->recomputed) put(w, "  activations recomputed for the backward: %zu\n", s->recomputed);
  if (s->scales_folded)
    put(w, "  scales folded into their product's alpha: %zu\n", s->scales_folded);
  put(w, "  sibling groups: %zu\n", s->sibling_groups);
  put(w, "  time: saturation %.3f ms, extraction %.3f ms, stage %.3f ms\n", s->saturation_ms,
      s->extraction_ms, s->total_ms);
}

size_t mn_optimize_report_format(const mn_optimize_report *r, char *buf, size_t size) {
  writer w = {.buf = buf, .size = buf ? size : 0};
  if (w.size) buf[0] = '\0';
  if (!r) {
    put(&w, "(no optimizer report)");
    return w.len;
  }
  put(&w, "optimizer report\n");
  put_stage(&w, "forward", &r->stage[MN_OPTIMIZE_FORWARD]);
  put_stage(&w, "full", &r->stage[MN_OPTIMIZE_FULL]);
  put(&w, "plan: %zu dispatches, %zu buffers; lower/plan %.3f ms", r->plan_dispatches,
      r->plan_buffers, r->lower_ms);
  if (r->build_ms > 0) put(&w, ", whole build (with the backend) %.3f ms", r->build_ms);
  put(&w, "\n");
  return w.len;
}
