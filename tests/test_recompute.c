/* Recomputed activations (optimizer/recompute.h): in a low-precision training plan, an
 * activation that the backward reads long after the forward is computed again right before that
 * reader. On the CPU: where it fires (the SwiGLU outputs of a 4-block LM, which the down
 * projections' weight gradients read) and where not (fp32 sessions, a value that is a graph
 * output), that each copy runs right before its late reader, and that training is bit for bit
 * what it is without the copies. */
#include <stdlib.h>
#include <string.h>

#include "host/backend.h"
#include "host/plan.h"
#include "optimizer/recompute.h"
#include "optimizer/report.h"
#include "tests/support/mn_test.h"
#include "tests/support/models.h"
#include "tests/support/session_util.h"

enum { B = 2, T = 8, V = 11, LAYERS = 4 };

/* The LM with its loss as the only output, or (swiglu_outputs) with every SwiGLU value as an
 * output too, which the pass must leave alone. */
static mn_graph *lm(bool swiglu_outputs) {
  mn_graph *g = mn_test_lm(&mn_test_tiny_block, B, T, V, LAYERS);
  cr_assert_eq(mn_graph_status(g), MN_OK, "%s", mn_graph_error(g));
  if (!swiglu_outputs) return g;
  mn_node outs[1 + LAYERS];
  size_t n = 0;
  const mn_node *cur = NULL;
  mn_graph_outputs(g, &cur);
  outs[n++] = cur[0];
  for (size_t i = 0; i < g->num_nodes; i++)
    if (g->nodes[i].op == MN_OP_SWIGLU) outs[n++] = (mn_node)i;
  cr_assert_eq(n, 1 + LAYERS);
  mn_set_outputs(g, outs, n);
  return g;
}

static mn_session *build(const mn_graph *g, mn_precision prec, mn_optimize_report **r) {
  mn_session_options o = mn_session_options_default();
  o.backend = MN_BACKEND_CPU;
  o.precision = prec;
  mn_session *s = NULL;
  cr_assert_eq(mn_build_session_with_report(g, &o, &s, r), MN_OK, "%s", mn_last_error());
  return s;
}

static size_t recomputed(const mn_graph *g, mn_precision prec) {
  mn_optimize_report *r = NULL;
  mn_session *s = build(g, prec, &r);
  size_t n = r->stage[MN_OPTIMIZE_FULL].recomputed;
  mn_session_free(s);
  mn_optimize_report_free(r);
  return n;
}

Test(recompute, fires_in_low_precision_on_values_the_backward_reads_late) {
  mn_graph *g = lm(false), *kept = lm(true);
  size_t bf16 = recomputed(g, MN_PRECISION_BF16);
  cr_assert_geq(bf16, 2, "SwiGLU values recomputed: %zu", bf16);
  cr_assert_eq(recomputed(g, MN_PRECISION_F16), bf16);
  cr_assert_eq(recomputed(g, MN_PRECISION_F32), 0, "fp32 plans keep their values");
  size_t kept_n = recomputed(kept, MN_PRECISION_BF16);
  cr_assert_lt(kept_n, bf16, "graph outputs are never recomputed (%zu of %zu)", kept_n, bf16);
  mn_graph_free(g);
  mn_graph_free(kept);
}

/* Every recomputed SwiGLU (a second node of the same op over the same inputs) runs right
 * before the node that reads it, long after the first. */
Test(recompute, copies_run_right_before_their_late_reader) {
  mn_graph *g = lm(false);
  mn_session *s = build(g, MN_PRECISION_BF16, NULL);
  const mn_graph *pg = s->plan->graph;
  size_t copies = 0;
  for (size_t j = 0; j < pg->num_nodes; j++) {
    const mn_node_rec *c = &pg->nodes[j];
    if (c->op != MN_OP_SWIGLU) continue;
    for (size_t i = 0; i < j; i++) {
      const mn_node_rec *o = &pg->nodes[i];
      if (o->op != MN_OP_SWIGLU || memcmp(o->inputs, c->inputs, sizeof o->inputs)) continue;
      cr_assert_geq(j - i, MN_RECOMPUTE_MIN_GAP, "copy %zu of %zu", j, i);
      bool next_reads = false;
      for (int k = 0; k < pg->nodes[j + 1].num_inputs; k++)
        next_reads = next_reads || pg->nodes[j + 1].inputs[k] == (mn_node)j;
      cr_assert(next_reads, "copy %zu is not read by the node after it", j);
      copies++;
    }
  }
  cr_assert_geq(copies, 2);
  mn_session_free(s);
  mn_graph_free(g);
}

/* The copies store what the forward stored: three AdamW steps give the same losses and
 * parameters as the plan that keeps every SwiGLU value (an output), bit for bit. */
Test(recompute, training_is_unchanged) {
  mn_graph *g[2] = {lm(false), lm(true)};
  mn_session *s[2];
  for (int i = 0; i < 2; i++) {
    s[i] = build(g[i], MN_PRECISION_BF16, NULL);
    mn_rng r = mn_rng_new(5);
    mn_test_init_normal(g[i], &s[i], 1, &r, 0.2f, false);
    uint32_t tok[B * T], lab[B * T];
    mn_rng_fill_u32(&r, tok, B * T, V);
    mn_rng_fill_u32(&r, lab, B * T, V);
    cr_assert_eq(mn_session_set_input_u32(s[i], "tokens", tok, B * T), MN_OK);
    cr_assert_eq(mn_session_set_input_u32(s[i], "labels", lab, B * T), MN_OK);
    cr_assert_eq(mn_session_set_adamw(s[i], 1e-2f, 0.9f, 0.99f, 1e-8f, 0.01f), MN_OK);
  }
  for (int step = 0; step < 3; step++) {
    float a = mn_test_step_loss(s[0]), b = mn_test_step_loss(s[1]);
    cr_assert(a == b, "step %d: loss %.9g vs %.9g", step, (double)a, (double)b);
  }
  float *pa = mn_test_read_params(g[0], s[0]), *pb = mn_test_read_params(g[1], s[1]);
  size_t n = mn_test_param_count(g[0]);
  cr_assert(memcmp(pa, pb, n * sizeof *pa) == 0, "parameters differ after 3 steps");
  free(pa);
  free(pb);
  for (int i = 0; i < 2; i++) {
    mn_session_free(s[i]);
    mn_graph_free(g[i]);
  }
}

/* GPT-2 at a width where gelu_grad stays a kernel of its own, 128 tokens. */
static mn_graph *wide_gpt2(void) {
  mn_model_config c = mn_test_wide_mlp_gpt2();
  mn_graph *g = NULL;
  cr_assert_eq(mn_model_build(&c, 1, 128, NULL, &g), MN_OK, "%s", mn_last_error());
  return g;
}

/* Node ops of the bf16 training plan of g (CPU backend). */
static size_t count_in_plan(const mn_graph *g, mn_op op, int variant) {
  mn_session *s = build(g, MN_PRECISION_BF16, NULL);
  const mn_graph *pg = s->plan->graph;
  size_t n = 0;
  for (size_t i = 0; i < pg->num_nodes; i++)
    n += pg->nodes[i].op == op && (variant < 0 || pg->nodes[i].attrs.variant == variant);
  mn_session_free(s);
  return n;
}

/* The first layer's GELU, read late by c_proj's weight gradient, is recomputed by the kernel
 * that makes its gradient and its bias gradient (gelu_grad_bgrad variant 1, gelu(x) its value
 * 2), not by a GELU of its own; MN_OPTIMIZE_OFF=recompute_gelu_in_gradient
 * keeps that GELU apart. */
Test(recompute, gelu_is_recomputed_by_its_gradients_kernel) {
  mn_graph *g = wide_gpt2();
  cr_assert_eq(count_in_plan(g, MN_OP_GELU_GRAD_BGRAD, 1), 1, "layer 0 recomputes in it");
  cr_assert_eq(count_in_plan(g, MN_OP_GELU_GRAD_BGRAD, 0), 1, "layer 1's GELU is still live");
  cr_assert_eq(count_in_plan(g, MN_OP_GELU, -1), 2, "the forward's GELUs only");
  setenv("MN_OPTIMIZE_OFF", "recompute_gelu_in_gradient", 1);
  cr_assert_eq(count_in_plan(g, MN_OP_GELU_GRAD_BGRAD, 1), 0);
  cr_assert_eq(count_in_plan(g, MN_OP_GELU, -1), 3, "and one recomputed");
  unsetenv("MN_OPTIMIZE_OFF");
  mn_graph_free(g);
}

/* On the CPU too, the GELU that gelu_grad_bgrad recomputes (and the bias sums it adds as
 * stored) give a bf16 training step bit for bit that of the plan with the GELU apart and, with
 * every pass of the two off, that of plain gelu_grad and sum_rows. */
Test(recompute, gelu_recomputed_in_its_gradients_kernel_trains_bitwise) {
  mn_graph *g = wide_gpt2();
  static const char *const off[3] = {NULL, "recompute_gelu_in_gradient", "gelu_bgrad"};
  uint32_t ids[128], pos[128], labels[128];
  for (uint32_t t = 0; t < 128; t++) {
    ids[t] = (t * 7u + 3u) % 50u;
    labels[t] = (t * 11u + 5u) % 50u;
    pos[t] = t;
  }
  mn_session *s[3];
  for (int i = 0; i < 3; i++) {
    if (off[i]) setenv("MN_OPTIMIZE_OFF", off[i], 1);
    s[i] = build(g, MN_PRECISION_BF16, NULL);
    unsetenv("MN_OPTIMIZE_OFF");
  }
  mn_rng r = mn_rng_new(9);
  mn_test_init_normal(g, s, 3, &r, 0.02f, true);
  float loss[3];
  for (int i = 0; i < 3; i++) {
    cr_assert_eq(mn_session_set_input_u32(s[i], "input_ids", ids, 128), MN_OK);
    cr_assert_eq(mn_session_set_input_u32(s[i], "position_ids", pos, 128), MN_OK);
    cr_assert_eq(mn_session_set_input_u32(s[i], "labels", labels, 128), MN_OK);
    cr_assert_eq(mn_session_set_adamw(s[i], 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f), MN_OK);
    loss[i] = mn_test_step_loss(s[i]);
  }
  for (int i = 1; i < 3; i++) {
    cr_assert(loss[i] == loss[0], "MN_OPTIMIZE_OFF=%s: loss %.9g vs %.9g", off[i], (double)loss[i],
              (double)loss[0]);
    mn_test_assert_same_params(g, s[0], s[i], 0, off[i]);
  }
  for (int i = 0; i < 3; i++)
    mn_session_free(s[i]);
  mn_graph_free(g);
}
