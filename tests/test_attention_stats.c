/* The attention backward of a low-precision training plan reads what the forward saved
 * (optimizer/attention_stats.h): the forward writes its row statistics as an fp32 extra value,
 * and dQ and dK | dV become their _saved forms, which take delta = dy . y from the stored
 * output. On the CPU: where the pass fires and where it must not, what the plan stores, that
 * the gradients agree with the recomputing ops of a plan built without the optimizer, and that
 * a cached plan keeps the rewrite. The CUDA kernels are checked against this CPU emulation by
 * test_cuda_attention (bf16 backward of every shape). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "host/backend.h"
#include "host/plan.h"
#include "optimizer/report.h"
#include "session/session.h"
#include "tests/support/cuda_check.h"
#include "tests/support/mn_test.h"
#include "tests/support/models.h"
#include "tests/support/session_util.h"
#include "tests/support/tmp_dir.h"

enum { B = 2, T = 9, D = 16, HEADS = 4, KV_HEADS = 2, HD = 4 };

/* x -> q, k, v projections (k and v narrower: grouped-query heads) -> causal attention -> an
 * output projection, trained to t; outputs the loss and the attention's output. */
static mn_graph *attention_block(void) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(B, T, D)), t = mn_input(g, "t", MN_SHAPE(B, T, D));
  mn_node q = mn_matmul(g, x, mn_parameter(g, "wq", MN_SHAPE(D, HEADS * HD)));
  mn_node k = mn_matmul(g, x, mn_parameter(g, "wk", MN_SHAPE(D, KV_HEADS * HD)));
  mn_node v = mn_matmul(g, x, mn_parameter(g, "wv", MN_SHAPE(D, KV_HEADS * HD)));
  mn_node a = mn_causal_attention(g, q, k, v, HEADS, KV_HEADS, HD);
  mn_node y = mn_matmul(g, a, mn_parameter(g, "wo", MN_SHAPE(HEADS * HD, D)));
  mn_set_outputs(g, (mn_node[]){mn_mse_loss(g, y, t), a}, 2);
  cr_assert_eq(mn_graph_status(g), MN_OK, "%s", mn_graph_error(g));
  return g;
}

static mn_session *build(const mn_graph *g, mn_precision prec, bool optimize,
                         mn_optimize_report **report) {
  mn_session_options o = mn_session_options_default();
  o.backend = MN_BACKEND_CPU;
  o.precision = prec;
  o.optimize = optimize;
  mn_session *s = NULL;
  mn_status st =
      report ? mn_build_session_with_report(g, &o, &s, report) : mn_build_session(g, &o, &s);
  cr_assert_eq(st, MN_OK, "%s", mn_last_error());
  return s;
}

/* The same inputs and parameters into every session (values of a few tenths keep the softmax
 * rows away from one-hot, so the gradients are not tiny differences). */
static void feed(const mn_graph *g, mn_session *const *s, size_t n) {
  mn_rng r = mn_rng_new(17);
  mn_test_init_normal(g, s, n, &r, 0.4f, false);
  float x[B * T * D], t[B * T * D];
  mn_rng_fill(&r, x, B * T * D, -1.0f, 1.0f);
  mn_rng_fill(&r, t, B * T * D, -1.0f, 1.0f);
  for (size_t i = 0; i < n; i++) {
    cr_assert_eq(mn_session_set_input(s[i], "x", x, B * T * D), MN_OK, "%s", mn_last_error());
    cr_assert_eq(mn_session_set_input(s[i], "t", t, B * T * D), MN_OK, "%s", mn_last_error());
  }
}

/* A session of the plan lowered for bf16 (which holds the _saved attention gradients and the
 * one-pass loss gradient) that computes in fp32: the ops themselves, without roundings. */
static mn_session *saved_ops_in_fp32(const mn_graph *g, mn_backend backend) {
  mn_session_options o = mn_session_options_default();
  o.backend = backend;
  o.precision = MN_PRECISION_BF16;
  mn_plan *plan = NULL;
  cr_assert_eq(mn_lower_training("test", g, &o, &plan), MN_OK, "%s", mn_last_error());
  o.precision = MN_PRECISION_F32;
  mn_session *s = NULL;
  cr_assert_eq(mn_session_create("test", plan, &o, true, &s), MN_OK, "%s", mn_last_error());
  return s;
}

static size_t count_op(const mn_plan *p, mn_op op) {
  size_t n = 0;
  for (size_t i = 0; i < p->graph->num_nodes; i++)
    n += p->graph->nodes[i].op == op;
  return n;
}

Test(attention_stats, low_precision_training_plans_save_the_statistics) {
  mn_graph *g = attention_block();
  const mn_precision low[] = {MN_PRECISION_BF16, MN_PRECISION_F16};
  for (size_t i = 0; i < 2; i++) {
    mn_optimize_report *r = NULL;
    mn_session *s = build(g, low[i], true, &r);
    cr_assert_eq(r->stage[MN_OPTIMIZE_FULL].saved_attention_stats, 2, "dQ and dK | dV: %zu",
                 r->stage[MN_OPTIMIZE_FULL].saved_attention_stats);
    const mn_plan *p = s->plan;
    cr_assert_eq(count_op(p, MN_OP_ATTENTION_GRAD_Q_SAVED), 1);
    cr_assert_eq(count_op(p, MN_OP_ATTENTION_GRAD_KV_SAVED), 1);
    cr_assert_eq(count_op(p, MN_OP_ATTENTION_GRAD_Q) + count_op(p, MN_OP_ATTENTION_GRAD_KV), 0);
    /* The forward writes the statistics, F32 [2 * B * H * T], stored in fp32 however low
     * the session's precision is. */
    size_t found = 0;
    for (size_t n = 0; n < p->graph->num_nodes; n++) {
      const mn_node_rec *rec = &p->graph->nodes[n];
      if (rec->op != MN_OP_CAUSAL_ATTENTION) continue;
      cr_assert_eq(rec->attrs.variant, 1);
      mn_node stats = mn_plan_extra_output(p, (mn_node)n, 1);
      cr_assert_neq(stats, MN_NO_NODE);
      cr_assert_eq(mn_tensor_type_numel(&p->graph->nodes[stats].type), 2 * B * HEADS * T);
      cr_assert_eq(mn_plan_buffer_of(p, stats)->storage, MN_F32);
      cr_assert_neq(mn_plan_buffer_of(p, (mn_node)n)->storage, MN_F32, "the output is stored low");
      found++;
    }
    cr_assert_eq(found, 1);
    mn_session_free(s);
    mn_optimize_report_free(r);
  }
  mn_graph_free(g);
}

/* fp32 keeps delta = sum P dP (exact zeros where a query sees one key), and a plan built
 * without the optimizer recomputes the statistics in every precision. */
Test(attention_stats, fp32_and_unoptimized_plans_recompute) {
  mn_graph *g = attention_block();
  struct {
    mn_precision prec;
    bool optimize;
  } cases[] = {{MN_PRECISION_F32, true}, {MN_PRECISION_BF16, false}, {MN_PRECISION_F16, false}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    mn_session *s = build(g, cases[i].prec, cases[i].optimize, NULL);
    cr_assert_eq(count_op(s->plan, MN_OP_ATTENTION_GRAD_Q_SAVED) +
                     count_op(s->plan, MN_OP_ATTENTION_GRAD_KV_SAVED),
                 0, "case %zu", i);
    cr_assert_eq(count_op(s->plan, MN_OP_ATTENTION_GRAD_Q), 1, "case %zu", i);
    mn_session_free(s);
  }
  mn_graph_free(g);
}

static float *grad_of(mn_session *s, const char *name, size_t n) {
  float *x = malloc(n * sizeof *x);
  cr_assert_eq(mn_session_read_grad(s, name, x, n), MN_OK, "%s", mn_last_error());
  return x;
}

/* Every weight gradient of the bf16 plan with saved statistics against the bf16 plan without
 * the optimizer (both round what they store; the second recomputes the statistics and takes
 * delta = sum P dP): delta = dy . round(y) differs from the exact sum by about u |dy| |y|, which
 * dS = P (dP - delta) turns into a relative error of u times the cancellation factor of that
 * difference (rho <= 2 for these rows, docs/precision.md), plus a rounding that one plan makes
 * and the other does not in each of the four products the gradients pass: 8 u bounds it. The
 * two plans must still differ (the delta really changed). */
Test(attention_stats, saved_gradients_agree_with_recomputed_ones) {
  mn_graph *g = attention_block();
  mn_session *s[2] = {build(g, MN_PRECISION_BF16, true, NULL),
                      build(g, MN_PRECISION_BF16, false, NULL)};
  feed(g, s, 2);
  for (int i = 0; i < 2; i++)
    mn_test_step_loss(s[i]);
  const char *names[] = {"wq", "wk", "wv", "wo"};
  const size_t sizes[] = {D * HEADS * HD, D * KV_HEADS * HD, D * KV_HEADS * HD, HEADS * HD * D};
  double worst = 0;
  for (int i = 0; i < 4; i++) {
    float *a = grad_of(s[0], names[i], sizes[i]), *b = grad_of(s[1], names[i], sizes[i]);
    double e = mn_test_rel_err(a, b, sizes[i]);
    cr_assert_leq(e, 8 * 0x1p-8, "gradient of %s: relative error %.3g", names[i], e);
    worst = e > worst ? e : worst;
    free(a);
    free(b);
  }
  cr_assert_gt(worst, 0.0, "the saved and the recomputing plans gave identical gradients");
  cr_log_info("largest relative difference: %.3g (%.2f u)", worst, worst / 0x1p-8);
  mn_session_free(s[0]);
  mn_session_free(s[1]);
  mn_graph_free(g);
}

/* A cached bf16 plan (written cold, read warm) keeps the statistics and gives the same step bit
 * for bit as the plan built directly. */
Test(attention_stats, cached_plans_keep_the_saved_statistics) {
  mn_graph *g = attention_block();
  mn_tmp_dir dir = mn_tmp_dir_make("mn_attention_stats");
  const char *path = mn_tmp_path(&dir, "plan.json");
  mn_session_options o = mn_session_options_default();
  o.backend = MN_BACKEND_CPU;
  o.precision = MN_PRECISION_BF16;
  mn_session *s[3] = {build(g, MN_PRECISION_BF16, true, NULL), NULL, NULL};
  for (int i = 1; i < 3; i++)
    cr_assert_eq(mn_build_session_cached(g, path, &o, &s[i]), MN_OK, "%s", mn_last_error());
  cr_assert_eq(count_op(s[2]->plan, MN_OP_ATTENTION_GRAD_KV_SAVED), 1);
  feed(g, s, 3);
  float loss[3];
  for (int i = 0; i < 3; i++)
    loss[i] = mn_test_step_loss(s[i]);
  for (int i = 1; i < 3; i++) {
    cr_assert_eq(loss[i], loss[0], "loss %d: %g vs %g", i, (double)loss[i], (double)loss[0]);
    float *a = grad_of(s[i], "wk", D * KV_HEADS * HD), *b = grad_of(s[0], "wk", D * KV_HEADS * HD);
    cr_assert_arr_eq(a, b, D * KV_HEADS * HD * sizeof *a, "the gradient of wk differs (%d)", i);
    free(a);
    free(b);
  }
  for (int i = 0; i < 3; i++)
    mn_session_free(s[i]);
  mn_tmp_dir_remove(&dir);
  mn_graph_free(g);
}

/* q a single pointwise op (silu) whose input the backward reads long after the attention's
 * gradient: recompute.c must leave it to the forward's value, which the saved gradients name as
 * their q (host/plan_check.c refuses a plan where they differ). The plan builds, saves the
 * statistics and trains. */
Test(attention_stats, a_pointwise_q_is_not_recomputed_under_a_saved_gradient) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(B, T, D)), t = mn_input(g, "t", MN_SHAPE(B, T, D));
  mn_node q = mn_silu(g, mn_matmul(g, x, mn_parameter(g, "wq", MN_SHAPE(D, HEADS * HD))));
  mn_node k = mn_matmul(g, x, mn_parameter(g, "wk", MN_SHAPE(D, KV_HEADS * HD)));
  mn_node v = mn_matmul(g, x, mn_parameter(g, "wv", MN_SHAPE(D, KV_HEADS * HD)));
  mn_node y = mn_matmul(g, mn_causal_attention(g, q, k, v, HEADS, KV_HEADS, HD),
                        mn_parameter(g, "wo", MN_SHAPE(HEADS * HD, D)));
  for (int l = 0; l < 12; l++) {
    char name[16];
    snprintf(name, sizeof name, "w%d", l);
    y = mn_tanh(g, mn_matmul(g, y, mn_parameter(g, name, MN_SHAPE(D, D))));
  }
  mn_set_outputs(g, (mn_node[]){mn_mse_loss(g, y, t)}, 1);
  cr_assert_eq(mn_graph_status(g), MN_OK, "%s", mn_graph_error(g));
  mn_optimize_report *r = NULL;
  mn_session *s = build(g, MN_PRECISION_BF16, true, &r);
  cr_assert_eq(r->stage[MN_OPTIMIZE_FULL].saved_attention_stats, 2);
  feed(g, &s, 1);
  float loss = mn_test_step_loss(s);
  cr_assert(isfinite(loss), "loss %g", (double)loss);
  mn_session_free(s);
  mn_optimize_report_free(r);
  mn_graph_free(g);
}

/* The _saved gradients (delta = dy . y, the forward's statistics) and the one-pass loss gradient
 * compute the same function as the ops they replace: in fp32, every weight gradient and the loss
 * of a plan that holds them equal the plain fp32 session's within 1e-6 (the sums only run in
 * another order). On a device the CUDA kernels of those ops match the CPU at 1e-5. */
static void check_saved_ops_fp32(mn_backend backend) {
  mn_graph *g = attention_block();
  const mn_node *outs = NULL;
  mn_graph_outputs(g, &outs);
  mn_node loss = outs[0];
  mn_set_outputs(g, &loss, 1);
  mn_session *s[2] = {saved_ops_in_fp32(g, backend), build(g, MN_PRECISION_F32, true, NULL)};
  cr_assert_eq(count_op(s[0]->plan, MN_OP_ATTENTION_GRAD_KV_SAVED), 1);
  feed(g, s, 2);
  float l0 = mn_test_step_loss(s[0]), l1 = mn_test_step_loss(s[1]);
  double tol = backend == MN_BACKEND_CPU ? 1e-6 : 1e-5;
  cr_assert_leq(fabs((double)l0 - l1), tol * fabs((double)l1), "loss %.9g vs %.9g", (double)l0,
                (double)l1);
  const char *names[] = {"wq", "wk", "wv", "wo"};
  const size_t sizes[] = {D * HEADS * HD, D * KV_HEADS * HD, D * KV_HEADS * HD, HEADS * HD * D};
  for (int i = 0; i < 4; i++) {
    float *a = grad_of(s[0], names[i], sizes[i]), *b = grad_of(s[1], names[i], sizes[i]);
    double e = mn_test_rel_err(a, b, sizes[i]);
    cr_assert_leq(e, tol, "gradient of %s: relative error %.3g", names[i], e);
    free(a);
    free(b);
  }
  mn_session_free(s[0]);
  mn_session_free(s[1]);
  mn_graph_free(g);
}

Test(attention_stats, saved_ops_compute_the_same_function_in_fp32) {
  check_saved_ops_fp32(MN_BACKEND_CPU);
}

Test(attention_stats, saved_ops_in_fp32_on_cuda_match_the_cpu) {
  mn_test_require_cuda_device();
  check_saved_ops_fp32(MN_BACKEND_CUDA);
}

/* The same for a two-block language model, whose loss is a sparse cross-entropy: the one-pass
 * loss gradient (and the gradient written over the logits) and the _saved attention gradients
 * against the plain fp32 session, every parameter's gradient. */
Test(attention_stats, a_language_model_with_saved_ops_matches_in_fp32) {
  mn_graph *g = mn_test_lm(&mn_test_tiny_block, 2, 8, 11, 2);
  cr_assert_eq(mn_graph_status(g), MN_OK, "%s", mn_graph_error(g));
  mn_session *s[2] = {saved_ops_in_fp32(g, MN_BACKEND_CPU), build(g, MN_PRECISION_F32, true, NULL)};
  cr_assert_eq(count_op(s[0]->plan, MN_OP_SPARSE_CROSS_ENTROPY_LOSS_GRAD), 1);
  cr_assert_eq(count_op(s[0]->plan, MN_OP_ATTENTION_GRAD_Q_SAVED), 2);
  mn_rng r = mn_rng_new(4);
  mn_test_init_normal(g, s, 2, &r, 0.3f, false);
  uint32_t tok[16], lab[16];
  mn_rng_fill_u32(&r, tok, 16, 11);
  mn_rng_fill_u32(&r, lab, 16, 11);
  for (int i = 0; i < 2; i++) {
    cr_assert_eq(mn_session_set_input_u32(s[i], "tokens", tok, 16), MN_OK);
    cr_assert_eq(mn_session_set_input_u32(s[i], "labels", lab, 16), MN_OK);
  }
  float l0 = mn_test_step_loss(s[0]), l1 = mn_test_step_loss(s[1]);
  cr_assert_leq(fabs((double)l0 - l1), 1e-6 * fabs((double)l1), "loss %.9g vs %.9g", (double)l0,
                (double)l1);
  size_t checked = 0;
  for (size_t i = 0; i < g->num_nodes; i++) {
    const mn_node_rec *n = &g->nodes[i];
    if (n->op != MN_OP_PARAMETER) continue;
    size_t count = (size_t)mn_tensor_type_numel(&n->type);
    float *a = grad_of(s[0], n->name, count), *b = grad_of(s[1], n->name, count);
    double e = mn_test_rel_err(a, b, count);
    cr_assert_leq(e, 1e-6, "gradient of %s: relative error %.3g", n->name, e);
    free(a);
    free(b);
    checked++;
  }
  cr_assert_gt(checked, 10);
  mn_session_free(s[0]);
  mn_session_free(s[1]);
  mn_graph_free(g);
}
