/* The full stage's epilogue rules (optimizer/rules.c) and the bias-gradient pass
 * (optimizer/bgrad.c): for every rule a graph where it fires and graphs where it must not (a
 * graph output at its root, types that do not line up, an inner value with another user,
 * where the cost model decides whether the product is computed twice); optimized and
 * unoptimized CPU sessions agree bit for bit, inference and training (SGD and AdamW) of an
 * MLP in the Linear and Conv1D layouts, a GPT-2 MLP with GELU, and a conv block with
 * group_norm and SiLU; and the plan's dispatch count goes down where a rule pays.
 *
 * The cost model at these tiny shapes: a launch is priced at 15 MB moved (cost.h) while the
 * tensors here are a few hundred bytes, so every fused node that saves a kernel wins by about
 * one launch, and where it would compute a product or a norm a second time for a value
 * another user still reads, the launches are even and the bytes decide: recomputing reads the
 * operands again, keeping the separate op reads the value once. Extraction then keeps the
 * separate ops, except where reading the value costs more than recomputing it (a product over
 * K = 1, below). */
#include <stdlib.h>

#include "host/plan.h"
#include "optimizer/cost.h"
#include "optimizer/optimize.h"
#include "optimizer/report.h"
#include "optimizer/rewrite.h"
#include "session/session.h"
#include "tests/support/graph_check.h"
#include "tests/support/mn_test.h"
#include "tests/support/session_util.h"

/* A stage's optimization of a sorted copy of g, without pointwise fusion so that the ops the
 * rules leave can be counted (the sessions below fuse). */
static mn_graph *optimized(const mn_graph *g, mn_optimize_stage stage, mn_optimize_report *r) {
  mn_graph *c = mn_graph_toposort(g);
  cr_assert_not_null(c, "%s", mn_last_error());
  mn_session_options o = mn_test_cpu_options(true);
  o.fusion = MN_FUSION_OFF;
  mn_status st = mn_optimize_graph_report("test", &c, &o, stage, r);
  cr_assert_eq(st, MN_OK, "%s", mn_last_error());
  cr_assert(!r->stage[stage].fell_back);
  return c;
}

static size_t count_act(const mn_graph *g, mn_op op, mn_act act) {
  size_t n = 0;
  for (size_t i = 0; i < g->num_nodes; i++)
    n += g->nodes[i].op == op && g->nodes[i].attrs.act == (int)act;
  return n;
}

static size_t count_variant(const mn_graph *g, mn_op op, int variant) {
  size_t n = 0;
  for (size_t i = 0; i < g->num_nodes; i++)
    n += g->nodes[i].op == op && g->nodes[i].attrs.variant == variant;
  return n;
}

/* Nodes that multiply matrices in the forward direction: each is one product computed. */
static size_t products(const mn_graph *g) {
  return mn_test_count_op(g, MN_OP_MATMUL) + mn_test_count_op(g, MN_OP_MATMUL_BT) +
         mn_test_count_op(g, MN_OP_MATMUL_BIAS_ACT) + mn_test_count_op(g, MN_OP_MATMUL_DGELU) +
         mn_test_count_op(g, MN_OP_MATMUL_DRELU) + mn_test_count_op(g, MN_OP_MATMUL_DRELU_BGRAD);
}

/* Full-stage optimization of g: `rule` fired `fired` times and `op` is left `left` times.
 * Returns the optimized graph for further checks (mn_graph_free it). */
static mn_graph *expect_full(const mn_graph *g, const char *rule, size_t fired, mn_op op,
                             size_t left) {
  mn_optimize_report *r = mn_optimize_report_new();
  mn_graph *o = optimized(g, MN_OPTIMIZE_FULL, r);
  size_t got = mn_optimize_report_fired(r, MN_OPTIMIZE_FULL, rule);
  cr_assert_eq(got, fired, "rule %s fired %zu times, expected %zu", rule, got, fired);
  cr_assert_eq(mn_test_count_op(o, op), left, "%zu %s nodes left, expected %zu",
               mn_test_count_op(o, op), mn_op_name(op), left);
  mn_optimize_report_free(r);
  return o;
}

static void expect(const mn_graph *g, const char *rule, size_t fired, mn_op op, size_t left) {
  mn_graph_free(expect_full(g, rule, fired, op, left));
}

/* The plan the optimized session runs (inference or training); mn_plan_free it. */
static mn_plan *lowered(const mn_graph *g, bool training) {
  mn_session_options o = mn_test_cpu_options(true);
  mn_plan *p = NULL;
  mn_status st =
      training ? mn_lower_training("test", g, &o, &p) : mn_lower_inference("test", g, &o, &p);
  cr_assert_eq(st, MN_OK, "%s", mn_last_error());
  return p;
}

typedef struct dispatches {
  size_t off, on; /* the plan's dispatches with the optimizer off and on */
} dispatches;

static void assert_bitwise(const float *on, const float *off, size_t n, const char *what,
                           int step) {
  for (size_t i = 0; i < n; i++)
    cr_assert(memcmp(&on[i], &off[i], sizeof *on) == 0 || (isnan(on[i]) && isnan(off[i])),
              "step %d, %s [%zu of %zu]: optimized %.9g, unoptimized %.9g", step, what, i, n,
              (double)on[i], (double)off[i]);
}

static float *read_output(mn_session *s, const mn_graph *g, size_t k, size_t *n) {
  *n = (size_t)mn_tensor_type_numel(&g->nodes[g->outputs[k]].type);
  float *v = malloc(*n * sizeof *v);
  cr_assert_eq(mn_session_read_output_by_index(s, k, v, *n), MN_OK, "%s", mn_last_error());
  return v;
}

/* Inference sessions with the optimizer off and on, fed the same values uniform in [-2, 2):
 * every output agrees bit for bit. */
static dispatches infer_agree(const mn_graph *g) {
  mn_session *s[2];
  for (int on = 0; on < 2; on++) {
    mn_session_options o = mn_test_cpu_options(on);
    cr_assert_eq(mn_build_inference_session(g, &o, &s[on]), MN_OK, "%s", mn_last_error());
    mn_rng r = mn_rng_new(11);
    mn_test_init_uniform(g, s[on], &r, -2, 2, true);
    cr_assert_eq(mn_session_step(s[on]), MN_OK, "%s", mn_last_error());
    cr_assert_eq(mn_session_wait(s[on]), MN_OK, "%s", mn_last_error());
  }
  for (size_t k = 0; k < g->num_outputs; k++) {
    size_t n;
    float *a = read_output(s[0], g, k, &n), *b = read_output(s[1], g, k, &n);
    assert_bitwise(b, a, n, "output", 0);
    free(a);
    free(b);
  }
  dispatches d = {mn_plan_num_dispatches(mn_session_plan(s[0])),
                  mn_plan_num_dispatches(mn_session_plan(s[1]))};
  mn_session_free(s[0]);
  mn_session_free(s[1]);
  return d;
}

typedef enum { SGD, ADAMW } optimizer;

/* Training sessions with the optimizer off and on, fed the same values uniform in [-1, 1),
 * `steps` steps of SGD or AdamW: after each, the loss, every output, gradient and parameter
 * agree bit for bit. */
static dispatches train_agree(const mn_graph *g, optimizer opt, int steps) {
  mn_session *s[2];
  for (int on = 0; on < 2; on++) {
    mn_session_options o = mn_test_cpu_options(on);
    cr_assert_eq(mn_build_session(g, &o, &s[on]), MN_OK, "%s", mn_last_error());
    mn_rng r = mn_rng_new(5);
    mn_test_init_uniform(g, s[on], &r, -1, 1, true);
    mn_status st = opt == SGD ? mn_session_set_learning_rate(s[on], 0.05f)
                              : mn_session_set_adamw(s[on], 0.01f, 0.9f, 0.999f, 1e-8f, 0.1f);
    cr_assert_eq(st, MN_OK, "%s", mn_last_error());
  }
  size_t np = mn_test_param_count(g);
  for (int step = 1; step <= steps; step++) {
    for (int on = 0; on < 2; on++) {
      cr_assert_eq(mn_session_step(s[on]), MN_OK, "%s", mn_last_error());
      cr_assert_eq(mn_session_wait(s[on]), MN_OK, "%s", mn_last_error());
    }
    float l0 = mn_session_read_loss(s[0]), l1 = mn_session_read_loss(s[1]);
    assert_bitwise(&l1, &l0, 1, "loss", step);
    for (size_t k = 0; k < g->num_outputs; k++) {
      size_t n;
      float *a = read_output(s[0], g, k, &n), *b = read_output(s[1], g, k, &n);
      assert_bitwise(b, a, n, "output", step);
      free(a);
      free(b);
    }
    for (size_t i = 0; i < g->num_nodes; i++) {
      const mn_node_rec *p = &g->nodes[i];
      if (p->op != MN_OP_PARAMETER) continue;
      size_t n = (size_t)mn_tensor_type_numel(&p->type);
      float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
      cr_assert_eq(mn_session_read_grad(s[0], p->name, a, n), MN_OK, "%s", mn_last_error());
      cr_assert_eq(mn_session_read_grad(s[1], p->name, b, n), MN_OK, "%s", mn_last_error());
      assert_bitwise(b, a, n, p->name, step);
      free(a);
      free(b);
    }
    float *a = mn_test_read_params(g, s[0]), *b = mn_test_read_params(g, s[1]);
    assert_bitwise(b, a, np, "parameters", step);
    free(a);
    free(b);
  }
  dispatches d = {mn_plan_num_dispatches(mn_session_plan(s[0])),
                  mn_plan_num_dispatches(mn_session_plan(s[1]))};
  mn_session_free(s[0]);
  mn_session_free(s[1]);
  return d;
}

/* A node built past the builders' checks, so that shapes or dtypes can disagree. */
static mn_node raw(mn_graph *g, mn_op op, const mn_node *ins, int n, mn_dtype dt,
                   const int64_t *shape, int rank) {
  mn_tensor_type t = mn_type_make(dt, shape, rank);
  mn_node id = mn_graph_append(g, op, ins, n, &t, NULL, NULL);
  cr_assert_neq(id, MN_NO_NODE);
  return id;
}
static mn_node raw1(mn_graph *g, mn_op op, mn_node in, mn_dtype dt, const int64_t *shape,
                    int rank) {
  return raw(g, op, &in, 1, dt, shape, rank);
}
static mn_node raw2(mn_graph *g, mn_op op, mn_node a, mn_node b, const int64_t *shape, int rank) {
  mn_node ins[2] = {a, b};
  return raw(g, op, ins, 2, MN_F32, shape, rank);
}

static void outputs(mn_graph *g, const mn_node *outs, size_t n) {
  mn_set_outputs(g, outs, n);
  cr_assert_eq(mn_graph_status(g), MN_OK, "%s", mn_graph_error(g));
}

/* ---------------------------------------------------------------- the stage restriction */

Test(rules_epilogue, ops_without_vjp_are_made_in_the_full_stage_only) {
  static const char *const full_only[] = {
      "matmul-bias",     "matmul-bt-bias",     "matmul-bias-relu", "matmul-bias-gelu",
      "matmul-dgelu",    "matmul-bt-dgelu",    "matmul-drelu",     "matmul-bt-drelu",
      "group-norm-silu", "relu-grad-of-output"};
  cr_assert_null(mn_rules_compile_error());
  size_t n;
  const mn_rule *rules = mn_rule_table(&n);
  for (size_t k = 0; k < sizeof full_only / sizeof full_only[0]; k++) {
    size_t i = 0;
    while (i < n && strcmp(rules[i].name, full_only[k]) != 0)
      i++;
    cr_assert_lt(i, n, "no rule %s", full_only[k]);
    cr_assert(rules[i].flags & MN_RULE_FULL_ONLY, "%s runs in the forward stage", full_only[k]);
  }

  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(4, 6));
  mn_node w = mn_parameter(g, "w", MN_SHAPE(6, 5)), b = mn_parameter(g, "b", MN_SHAPE(5));
  mn_node y = mn_exp(g, mn_relu(g, mn_bias_add(g, mn_matmul(g, x, w), b)));
  outputs(g, &y, 1);
  mn_optimize_report *r = mn_optimize_report_new();
  mn_graph *o = optimized(g, MN_OPTIMIZE_FORWARD, r);
  cr_assert_eq(mn_optimize_report_fired(r, MN_OPTIMIZE_FORWARD, "matmul-bias"), 0);
  cr_assert_eq(mn_test_count_op(o, MN_OP_MATMUL_BIAS_ACT), 0);
  cr_assert_eq(mn_test_count_op(o, MN_OP_BIAS_ADD), 1);
  mn_graph_free(o);
  mn_optimize_report_free(r);
  expect(g, "matmul-bias", 1, MN_OP_MATMUL_BIAS_ACT, 1);
  mn_graph_free(g);
}

/* ---------------------------------------------------------------- matmul + bias */

Test(rules_epilogue, matmul_bias) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(2, 3, 6)); /* leading dims flattened into M */
  mn_node w = mn_parameter(g, "w", MN_SHAPE(6, 5)), wt = mn_parameter(g, "wt", MN_SHAPE(5, 6));
  mn_node b = mn_parameter(g, "b", MN_SHAPE(5)), row = mn_parameter(g, "row", MN_SHAPE(1, 5));
  mn_node p = mn_matmul(g, x, w);
  mn_node outs[] = {mn_exp(g, mn_bias_add(g, p, b)),
                    mn_exp(g, mn_bias_add(g, mn_matmul_bt(g, x, wt), b)),
                    /* a bias of [1, N] */
                    mn_exp(g, raw2(g, MN_OP_BIAS_ADD, p, row, MN_SHAPE(2, 3, 5)))};
  outputs(g, outs, 3);
  mn_graph *o = expect_full(g, "matmul-bias", 2, MN_OP_MATMUL_BIAS_ACT, 3);
  cr_assert_eq(count_variant(o, MN_OP_MATMUL_BIAS_ACT, 1), 1, "one from matmul_bt");
  cr_assert_eq(count_act(o, MN_OP_MATMUL_BIAS_ACT, MN_ACT_NONE), 3);
  cr_assert_eq(products(o), 3, "the shared product is computed once per bias");
  cr_assert_eq(mn_test_count_op(o, MN_OP_BIAS_ADD), 0);
  mn_graph_free(o);
  expect(g, "matmul-bt-bias", 1, MN_OP_MATMUL_BT, 0);
  dispatches d = infer_agree(g);
  cr_assert_eq(d.on, d.off - 2, "%zu -> %zu dispatches", d.off, d.on);
  mn_graph_free(g);

  /* The output's own node is never rewritten; biases whose numel or dtype is not N's; a
   * [2, 3] row (not [1, N]); a bias_add typed apart from its product. */
  g = mn_graph_new();
  x = mn_input(g, "x", MN_SHAPE(4, 6));
  w = mn_parameter(g, "w", MN_SHAPE(6, 6));
  b = mn_parameter(g, "b", MN_SHAPE(6));
  p = mn_matmul(g, x, w);
  mn_node b4 = mn_parameter(g, "b4", MN_SHAPE(4)), bu = mn_input_u32(g, "bu", MN_SHAPE(6));
  mn_node b23 = mn_parameter(g, "b23", MN_SHAPE(2, 3));
  mn_node bad[] = {mn_bias_add(g, p, b), mn_exp(g, raw2(g, MN_OP_BIAS_ADD, p, b4, MN_SHAPE(4, 6))),
                   mn_exp(g, raw2(g, MN_OP_BIAS_ADD, p, bu, MN_SHAPE(4, 6))),
                   mn_exp(g, raw2(g, MN_OP_BIAS_ADD, p, b23, MN_SHAPE(4, 6))),
                   mn_exp(g, raw2(g, MN_OP_BIAS_ADD, p, b, MN_SHAPE(24)))};
  outputs(g, bad, 5);
  expect(g, "matmul-bias", 0, MN_OP_MATMUL_BIAS_ACT, 0);
  mn_graph_free(g);

  /* Products of unexpected types: a U32 operand, a weight whose dims do not line up. */
  g = mn_graph_new();
  x = mn_input(g, "x", MN_SHAPE(4, 6));
  mn_node xu = mn_input_u32(g, "xu", MN_SHAPE(4, 6));
  w = mn_parameter(g, "w", MN_SHAPE(6, 6));
  b = mn_parameter(g, "b", MN_SHAPE(6));
  mn_node w5 = mn_parameter(g, "w5", MN_SHAPE(5, 6));
  mn_node pu = raw2(g, MN_OP_MATMUL, xu, w, MN_SHAPE(4, 6));
  mn_node pw = raw2(g, MN_OP_MATMUL, x, w5, MN_SHAPE(4, 6));
  mn_node odd[] = {mn_exp(g, mn_bias_add(g, pu, b)), mn_exp(g, mn_bias_add(g, pw, b))};
  outputs(g, odd, 2);
  expect(g, "matmul-bias", 0, MN_OP_MATMUL_BIAS_ACT, 0);
  mn_graph_free(g);
}

/* The product has another user. At [8, 8] x [8, 8] computing it again inside the fused node
 * reads x and w again and adds its flops, more than bias_add reading the product once: the
 * rule fires but extraction keeps the product and bias_add. Over K = 1 the product [64, 64]
 * is cheaper to recompute from two 64-vectors than to read back, and the cost model says so:
 * then it is computed twice, still bit for bit. */
Test(rules_epilogue, matmul_bias_with_a_shared_product) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(8, 8));
  mn_node p = mn_matmul(g, x, mn_parameter(g, "w", MN_SHAPE(8, 8)));
  mn_node outs[] = {mn_exp(g, mn_bias_add(g, p, mn_parameter(g, "b", MN_SHAPE(8)))), mn_tanh(g, p)};
  outputs(g, outs, 2);
  mn_graph *o = expect_full(g, "matmul-bias", 1, MN_OP_MATMUL_BIAS_ACT, 0);
  cr_assert_eq(products(o), 1);
  cr_assert_eq(mn_test_count_op(o, MN_OP_BIAS_ADD), 1);
  mn_graph_free(o);
  infer_agree(g);
  mn_graph_free(g);

  g = mn_graph_new();
  x = mn_input(g, "x", MN_SHAPE(64, 1));
  p = mn_matmul(g, x, mn_parameter(g, "w", MN_SHAPE(1, 64)));
  mn_node outs1[] = {mn_exp(g, mn_bias_add(g, p, mn_parameter(g, "b", MN_SHAPE(64)))),
                     mn_tanh(g, p)};
  outputs(g, outs1, 2);
  o = expect_full(g, "matmul-bias", 1, MN_OP_MATMUL_BIAS_ACT, 1);
  cr_assert_eq(products(o), 2, "recomputed: cheaper than reading [64, 64] back");
  mn_graph_free(o);
  infer_agree(g);
  mn_graph_free(g);
}

/* ---------------------------------------------------------------- activations */

Test(rules_epilogue, matmul_bias_relu_and_gelu) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(4, 6));
  mn_node w = mn_parameter(g, "w", MN_SHAPE(6, 5)), wt = mn_parameter(g, "wt", MN_SHAPE(5, 6));
  mn_node b = mn_parameter(g, "b", MN_SHAPE(5));
  mn_node outs[] = {mn_exp(g, mn_relu(g, mn_bias_add(g, mn_matmul(g, x, w), b))),
                    mn_exp(g, mn_gelu(g, mn_bias_add(g, mn_matmul_bt(g, x, wt), b)))};
  outputs(g, outs, 2);
  mn_graph *o = expect_full(g, "matmul-bias-relu", 1, MN_OP_RELU, 0);
  cr_assert_eq(count_act(o, MN_OP_MATMUL_BIAS_ACT, MN_ACT_RELU), 1);
  cr_assert_eq(count_act(o, MN_OP_MATMUL_BIAS_ACT, MN_ACT_GELU), 1);
  cr_assert_eq(count_variant(o, MN_OP_MATMUL_BIAS_ACT, 1), 1);
  cr_assert_eq(products(o), 2);
  mn_graph_free(o);
  expect(g, "matmul-bias-gelu", 1, MN_OP_GELU, 0);
  dispatches d = infer_agree(g);
  cr_assert_eq(d.on, d.off - 4, "%zu -> %zu dispatches", d.off, d.on);
  mn_graph_free(g);

  /* The activation is an output: the product takes the bias only. */
  g = mn_graph_new();
  x = mn_input(g, "x", MN_SHAPE(4, 6));
  w = mn_parameter(g, "w", MN_SHAPE(6, 5));
  b = mn_parameter(g, "b", MN_SHAPE(5));
  mn_node y = mn_relu(g, mn_bias_add(g, mn_matmul(g, x, w), b));
  outputs(g, &y, 1);
  o = expect_full(g, "matmul-bias-relu", 0, MN_OP_RELU, 1);
  cr_assert_eq(count_act(o, MN_OP_MATMUL_BIAS_ACT, MN_ACT_NONE), 1);
  mn_graph_free(o);
  infer_agree(g);
  mn_graph_free(g);

  /* Activations typed apart from the sum they read. */
  g = mn_graph_new();
  x = mn_input(g, "x", MN_SHAPE(4, 6));
  w = mn_parameter(g, "w", MN_SHAPE(6, 5));
  b = mn_parameter(g, "b", MN_SHAPE(5));
  mn_node z = mn_bias_add(g, mn_matmul(g, x, w), b);
  mn_node odd[] = {mn_exp(g, raw1(g, MN_OP_RELU, z, MN_F32, MN_SHAPE(20))),
                   mn_exp(g, raw1(g, MN_OP_GELU, z, MN_F32, MN_SHAPE(5, 4)))};
  outputs(g, odd, 2);
  o = expect_full(g, "matmul-bias-relu", 0, MN_OP_MATMUL_BIAS_ACT, 1);
  cr_assert_eq(count_act(o, MN_OP_MATMUL_BIAS_ACT, MN_ACT_NONE), 1);
  mn_graph_free(o);
  expect(g, "matmul-bias-gelu", 0, MN_OP_GELU, 1);
  mn_graph_free(g);
}

/* The pre-activation has another user: recomputing the product inside the relu or gelu
 * epilogue would read x, w and b again and redo the flops, more than the activation reading
 * the sum once. The rules fire, but the product is computed once. */
Test(rules_epilogue, pre_activation_with_another_user_is_not_recomputed) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(8, 8));
  mn_node z = mn_bias_add(g, mn_matmul(g, x, mn_parameter(g, "w", MN_SHAPE(8, 8))),
                          mn_parameter(g, "b", MN_SHAPE(8)));
  mn_node outs[] = {mn_exp(g, mn_relu(g, z)), mn_tanh(g, z), mn_exp(g, mn_gelu(g, z))};
  outputs(g, outs, 3);
  mn_graph *o = expect_full(g, "matmul-bias-relu", 1, MN_OP_MATMUL_BIAS_ACT, 1);
  cr_assert_eq(count_act(o, MN_OP_MATMUL_BIAS_ACT, MN_ACT_NONE), 1);
  cr_assert_eq(products(o), 1);
  mn_graph_free(o);
  expect(g, "matmul-bias-gelu", 1, MN_OP_GELU, 1);
  infer_agree(g);
  mn_graph_free(g);
}

/* ---------------------------------------------------------------- GELU gradient */

/* grad_op(x, a op(b)) in both layouts becomes `fused` by `rule` and `bt_rule` (variants 0 and
 * 1), and gives on the CPU the bits of the two ops (infer_agree). */
static void expect_gated_product(mn_op grad_op, mn_op fused, const char *rule,
                                 const char *bt_rule) {
  mn_graph *g = mn_graph_new();
  mn_node a = mn_input(g, "a", MN_SHAPE(2, 4, 6)), x = mn_input(g, "x", MN_SHAPE(2, 4, 5));
  mn_node w = mn_parameter(g, "w", MN_SHAPE(6, 5)), wt = mn_parameter(g, "wt", MN_SHAPE(5, 6));
  mn_node outs[] = {mn_exp(g, raw2(g, grad_op, x, mn_matmul(g, a, w), MN_SHAPE(2, 4, 5))),
                    mn_exp(g, raw2(g, grad_op, x, mn_matmul_bt(g, a, wt), MN_SHAPE(2, 4, 5)))};
  outputs(g, outs, 2);
  mn_graph *o = expect_full(g, rule, 1, fused, 2);
  cr_assert_eq(count_variant(o, fused, 0), 1);
  cr_assert_eq(count_variant(o, fused, 1), 1);
  cr_assert_eq(products(o), 2);
  mn_graph_free(o);
  expect(g, bt_rule, 1, grad_op, 0);
  dispatches d = infer_agree(g);
  cr_assert_eq(d.on, d.off - 2, "%zu -> %zu dispatches", d.off, d.on);
  mn_graph_free(g);
}

Test(rules_epilogue, matmul_dgelu) {
  expect_gated_product(MN_OP_GELU_GRAD, MN_OP_MATMUL_DGELU, "matmul-dgelu", "matmul-bt-dgelu");

  /* The gradient is an output; pre of another shape; a gradient typed apart from its
   * product. */
  mn_graph *g = mn_graph_new();
  mn_node a = mn_input(g, "a", MN_SHAPE(8, 8));
  mn_node pre = mn_input(g, "pre", MN_SHAPE(8, 8));
  mn_node pre64 = mn_input(g, "pre64", MN_SHAPE(64));
  mn_node w = mn_parameter(g, "w", MN_SHAPE(8, 8));
  mn_node p = mn_matmul(g, a, w), q = mn_matmul_bt(g, a, w);
  mn_node bad[] = {raw2(g, MN_OP_GELU_GRAD, pre, p, MN_SHAPE(8, 8)),
                   mn_exp(g, raw2(g, MN_OP_GELU_GRAD, pre64, q, MN_SHAPE(8, 8))),
                   mn_exp(g, raw2(g, MN_OP_GELU_GRAD, pre, q, MN_SHAPE(64)))};
  outputs(g, bad, 3);
  expect(g, "matmul-dgelu", 0, MN_OP_MATMUL_DGELU, 0);
  expect(g, "matmul-bt-dgelu", 0, MN_OP_MATMUL_DGELU, 0);
  mn_graph_free(g);

  /* The product has another user: at these shapes reading it back is cheaper than computing
   * it again, so the rule fires and extraction keeps gelu_grad. */
  g = mn_graph_new();
  a = mn_input(g, "a", MN_SHAPE(8, 8));
  pre = mn_input(g, "pre", MN_SHAPE(8, 8));
  p = mn_matmul(g, a, mn_parameter(g, "w", MN_SHAPE(8, 8)));
  mn_node shared[] = {mn_exp(g, raw2(g, MN_OP_GELU_GRAD, pre, p, MN_SHAPE(8, 8))), mn_tanh(g, p)};
  outputs(g, shared, 2);
  mn_graph *o = expect_full(g, "matmul-dgelu", 1, MN_OP_MATMUL_DGELU, 0);
  cr_assert_eq(products(o), 1);
  mn_graph_free(o);
  infer_agree(g);
  mn_graph_free(g);
}

/* ---------------------------------------------------------------- ReLU gradient */

/* relu_grad(x, a op(b)) becomes matmul_drelu in both layouts, and gives on the CPU the bits of
 * the two ops (infer_agree). */
Test(rules_epilogue, matmul_drelu) {
  expect_gated_product(MN_OP_RELU_GRAD, MN_OP_MATMUL_DRELU, "matmul-drelu", "matmul-bt-drelu");

  /* x of another shape, or a gradient typed apart from its product: left alone. */
  mn_graph *g = mn_graph_new();
  mn_node a = mn_input(g, "a", MN_SHAPE(8, 8));
  mn_node x = mn_input(g, "x", MN_SHAPE(8, 8));
  mn_node x64 = mn_input(g, "x64", MN_SHAPE(64));
  mn_node w = mn_parameter(g, "w", MN_SHAPE(8, 8));
  mn_node q = mn_matmul_bt(g, a, w);
  mn_node bad[] = {mn_exp(g, raw2(g, MN_OP_RELU_GRAD, x64, q, MN_SHAPE(8, 8))),
                   mn_exp(g, raw2(g, MN_OP_RELU_GRAD, x, q, MN_SHAPE(64)))};
  outputs(g, bad, 2);
  expect(g, "matmul-bt-drelu", 0, MN_OP_MATMUL_DRELU, 0);
  mn_graph_free(g);
}

/* ---------------------------------------------------------------- group_norm + silu */

static mn_node norm(mn_graph *g, mn_node x, int64_t channels) {
  return mn_group_norm(g, x, mn_parameter(g, "norm.weight", MN_SHAPE(channels)),
                       mn_parameter(g, "norm.bias", MN_SHAPE(channels)), 2, 1e-5f);
}

Test(rules_epilogue, group_norm_silu) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(2, 4, 3, 3));
  mn_node y = mn_exp(g, mn_silu(g, norm(g, x, 4)));
  outputs(g, &y, 1);
  mn_graph *o = expect_full(g, "group-norm-silu", 1, MN_OP_SILU, 0);
  cr_assert_eq(count_act(o, MN_OP_GROUP_NORM, MN_ACT_SILU), 1);
  cr_assert_eq(mn_test_count_op(o, MN_OP_GROUP_NORM), 1);
  mn_graph_free(o);
  dispatches d = infer_agree(g);
  cr_assert_eq(d.on, d.off - 1, "%zu -> %zu dispatches", d.off, d.on);
  mn_graph_free(g);

  /* silu is the output; silu typed apart from the norm. */
  g = mn_graph_new();
  x = mn_input(g, "x", MN_SHAPE(2, 4, 3, 3));
  mn_node n = norm(g, x, 4);
  mn_node bad[] = {mn_silu(g, n), mn_exp(g, raw1(g, MN_OP_SILU, n, MN_F32, MN_SHAPE(72)))};
  outputs(g, bad, 2);
  o = expect_full(g, "group-norm-silu", 0, MN_OP_SILU, 2);
  cr_assert_eq(count_act(o, MN_OP_GROUP_NORM, MN_ACT_NONE), 1);
  mn_graph_free(o);
  mn_graph_free(g);

  /* The norm has another user: normalizing twice would read x, weight and bias again, more
   * than silu reading the norm once. It is normalized once. */
  g = mn_graph_new();
  x = mn_input(g, "x", MN_SHAPE(2, 4, 3, 3));
  n = norm(g, x, 4);
  mn_node shared[] = {mn_exp(g, mn_silu(g, n)), mn_tanh(g, n)};
  outputs(g, shared, 2);
  o = expect_full(g, "group-norm-silu", 1, MN_OP_GROUP_NORM, 1);
  cr_assert_eq(count_act(o, MN_OP_GROUP_NORM, MN_ACT_NONE), 1);
  mn_graph_free(o);
  infer_agree(g);
  mn_graph_free(g);
}

/* In training silu_grad reads the norm too: the rule fires in the full stage, and extraction
 * keeps one group_norm without the activation (the epilogue cannot pay there). */
Test(rules_epilogue, group_norm_silu_in_training_normalizes_once) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(2, 3, 6, 6)), t = mn_input(g, "t", MN_SHAPE(2, 4, 6, 6));
  mn_node h = mn_conv2d(g, x, mn_parameter(g, "conv1.weight", MN_SHAPE(4, 3, 3, 3)), 1, 1);
  h = mn_silu(g, norm(g, h, 4));
  h = mn_conv2d(g, h, mn_parameter(g, "conv2.weight", MN_SHAPE(4, 4, 3, 3)), 1, 1);
  mn_node loss = mn_mse_loss(g, h, t);
  outputs(g, &loss, 1);
  mn_session_options o = mn_test_cpu_options(true);
  mn_session *s = NULL;
  mn_optimize_report *r = NULL;
  cr_assert_eq(mn_build_session_with_report(g, &o, &s, &r), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_optimize_report_fired(r, MN_OPTIMIZE_FORWARD, "group-norm-silu"), 0);
  cr_assert_eq(mn_optimize_report_fired(r, MN_OPTIMIZE_FULL, "group-norm-silu"), 1);
  const mn_graph *pg = mn_session_plan(s)->graph;
  cr_assert_eq(mn_test_count_op(pg, MN_OP_GROUP_NORM), 1);
  cr_assert_eq(count_act(pg, MN_OP_GROUP_NORM, MN_ACT_NONE), 1);
  mn_optimize_report_free(r);
  mn_session_free(s);
  train_agree(g, ADAMW, 3);
  mn_graph_free(g);
}

Test(rules_epilogue, conv_block_inference) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(2, 3, 8, 8));
  mn_node h = mn_conv2d(g, x, mn_parameter(g, "conv1.weight", MN_SHAPE(4, 3, 3, 3)), 1, 1);
  h = mn_add_per_channel(g, h, mn_parameter(g, "conv1.bias", MN_SHAPE(4)));
  h = mn_silu(g, norm(g, h, 4));
  h = mn_conv2d(g, h, mn_parameter(g, "conv2.weight", MN_SHAPE(4, 4, 3, 3)), 1, 1);
  outputs(g, &h, 1);
  mn_plan *p = lowered(g, false);
  cr_assert_eq(count_act(p->graph, MN_OP_GROUP_NORM, MN_ACT_SILU), 1);
  cr_assert_eq(mn_test_count_op(p->graph, MN_OP_SILU), 0);
  mn_plan_free(p);
  dispatches d = infer_agree(g);
  cr_assert_eq(d.on, d.off - 1, "%zu -> %zu dispatches", d.off, d.on);
  mn_graph_free(g);
}

/* ---------------------------------------------------------------- relu_grad of the output */

/* relu_grad(x, dy) reads relu(x) instead, so that x loses its second user and the product
 * that makes x can take the relu as its epilogue. Where x is an input there is nothing to
 * gain (reading x or relu(x) costs the same) and extraction keeps the graph's own node. */
Test(rules_epilogue, relu_grad_of_output) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_bias_add(
      g, mn_matmul(g, mn_input(g, "a", MN_SHAPE(4, 6)), mn_parameter(g, "w", MN_SHAPE(6, 16))),
      mn_parameter(g, "b", MN_SHAPE(16)));
  mn_node dy = mn_input(g, "dy", MN_SHAPE(4, 16));
  mn_node outs[] = {mn_exp(g, raw2(g, MN_OP_RELU_GRAD, x, dy, MN_SHAPE(4, 16))),
                    mn_exp(g, mn_relu(g, x))};
  outputs(g, outs, 2);
  mn_graph *o = expect_full(g, "relu-grad-of-output", 1, MN_OP_RELU_GRAD, 1);
  cr_assert_eq(count_act(o, MN_OP_MATMUL_BIAS_ACT, MN_ACT_RELU), 1);
  cr_assert_eq(products(o), 1, "the pre-activation is not kept");
  mn_graph_free(o);
  dispatches d = infer_agree(g);
  cr_assert_leq(d.on, d.off - 2, "%zu -> %zu dispatches", d.off, d.on);
  mn_graph_free(g);

  g = mn_graph_new();
  x = mn_input(g, "x", MN_SHAPE(16));
  dy = mn_input(g, "dy", MN_SHAPE(16));
  mn_node leaf[] = {mn_exp(g, raw2(g, MN_OP_RELU_GRAD, x, dy, MN_SHAPE(16))),
                    mn_exp(g, mn_relu(g, x))};
  outputs(g, leaf, 2);
  expect(g, "relu-grad-of-output", 1, MN_OP_RELU_GRAD, 1);
  infer_agree(g);
  mn_graph_free(g);

  /* No relu of y; relu_grad is the output; a U32 x; dy of another shape. */
  g = mn_graph_new();
  x = mn_input(g, "x", MN_SHAPE(16));
  dy = mn_input(g, "dy", MN_SHAPE(16));
  mn_node y = mn_input(g, "y", MN_SHAPE(16)), u = mn_input_u32(g, "u", MN_SHAPE(16));
  mn_node x44 = mn_input(g, "x44", MN_SHAPE(4, 4));
  mn_node bad[] = {mn_exp(g, raw2(g, MN_OP_RELU_GRAD, y, dy, MN_SHAPE(16))),
                   raw2(g, MN_OP_RELU_GRAD, x, dy, MN_SHAPE(16)),
                   mn_exp(g, mn_relu(g, x)),
                   mn_exp(g, raw2(g, MN_OP_RELU_GRAD, u, dy, MN_SHAPE(16))),
                   mn_exp(g, raw1(g, MN_OP_RELU, u, MN_F32, MN_SHAPE(16))),
                   mn_exp(g, raw2(g, MN_OP_RELU_GRAD, x44, dy, MN_SHAPE(4, 4))),
                   mn_exp(g, mn_relu(g, x44))};
  outputs(g, bad, 7);
  expect(g, "relu-grad-of-output", 0, MN_OP_RELU_GRAD, 4);
  mn_graph_free(g);
}

/* x > 0 exactly when relu(x) > 0, for the values where that could fail: signed zeros, NaN,
 * infinities, denormals. */
Test(rules_epilogue, relu_grad_of_output_special_values) {
  enum { N = 8 };
  mn_graph *g = mn_graph_new();
  mn_node x = mn_scale(g, mn_input(g, "x", MN_SHAPE(N)), 1.0f);
  mn_node dy = mn_input(g, "dy", MN_SHAPE(N));
  mn_node outs[] = {mn_scale(g, raw2(g, MN_OP_RELU_GRAD, x, dy, MN_SHAPE(N)), 2.0f),
                    mn_scale(g, mn_relu(g, x), 2.0f)};
  outputs(g, outs, 2);
  float xs[N] = {-0.0f, 0.0f, NAN, -NAN, INFINITY, -INFINITY, 1e-40f, -1e-40f};
  float dys[N] = {1, 2, 3, 4, 5, 6, 7, 8};
  float got[2][2][N];
  for (int on = 0; on < 2; on++) {
    mn_session_options o = mn_test_cpu_options(on);
    mn_session *s = NULL;
    cr_assert_eq(mn_build_inference_session(g, &o, &s), MN_OK, "%s", mn_last_error());
    cr_assert_eq(mn_session_set_input(s, "x", xs, N), MN_OK);
    cr_assert_eq(mn_session_set_input(s, "dy", dys, N), MN_OK);
    cr_assert_eq(mn_session_step(s), MN_OK, "%s", mn_last_error());
    cr_assert_eq(mn_session_wait(s), MN_OK, "%s", mn_last_error());
    for (size_t k = 0; k < 2; k++)
      cr_assert_eq(mn_session_read_output_by_index(s, k, got[on][k], N), MN_OK);
    mn_session_free(s);
  }
  assert_bitwise(got[1][0], got[0][0], N, "relu_grad", 0);
  assert_bitwise(got[1][1], got[0][1], N, "relu", 0);
  mn_graph_free(g);
}

/* ---------------------------------------------------------------- reshapes */

Test(rules_epilogue, reshape_chains) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(2, 4)), y = mn_input(g, "y", MN_SHAPE(2, 4));
  mn_node r1 = raw1(g, MN_OP_RESHAPE, x, MN_F32, MN_SHAPE(8));
  mn_node back = raw1(g, MN_OP_RESHAPE, y, MN_F32, MN_SHAPE(8));
  mn_node outs[] = {mn_exp(g, raw1(g, MN_OP_RESHAPE, r1, MN_F32, MN_SHAPE(4, 2))),
                    /* there and back: both rules, no copy left */
                    mn_exp(g, raw1(g, MN_OP_RESHAPE, back, MN_F32, MN_SHAPE(2, 4))),
                    mn_exp(g, raw1(g, MN_OP_RESHAPE, x, MN_F32, MN_SHAPE(2, 4)))};
  outputs(g, outs, 3);
  /* There and back leaves y's class holding reshape(reshape(y)), so the rules also find
   * reshapes of their own results (an e-graph is cyclic there): they fire at least once per
   * chain and copy, and one reshape is left. */
  mn_optimize_report *r = mn_optimize_report_new();
  mn_graph *o = optimized(g, MN_OPTIMIZE_FULL, r);
  cr_assert_geq(mn_optimize_report_fired(r, MN_OPTIMIZE_FULL, "reshape-reshape"), 2);
  cr_assert_geq(mn_optimize_report_fired(r, MN_OPTIMIZE_FULL, "reshape-same"), 2);
  cr_assert_eq(mn_test_count_op(o, MN_OP_RESHAPE), 1);
  mn_graph_free(o);
  mn_optimize_report_free(r);
  /* They remove copies, which needs no VJP: the forward stage runs them too. */
  r = mn_optimize_report_new();
  o = optimized(g, MN_OPTIMIZE_FORWARD, r);
  cr_assert_geq(mn_optimize_report_fired(r, MN_OPTIMIZE_FORWARD, "reshape-reshape"), 2);
  cr_assert_eq(mn_test_count_op(o, MN_OP_RESHAPE), 1);
  mn_graph_free(o);
  mn_optimize_report_free(r);
  dispatches d = infer_agree(g);
  cr_assert_eq(d.on, d.off - 4, "%zu -> %zu dispatches", d.off, d.on);
  mn_graph_free(g);

  /* The output itself; reshapes around one that changes the dtype (not a copy). */
  g = mn_graph_new();
  x = mn_input(g, "x", MN_SHAPE(2, 4));
  mn_node u = mn_input_u32(g, "u", MN_SHAPE(8));
  mn_node ur = raw1(g, MN_OP_RESHAPE, u, MN_F32, MN_SHAPE(8));
  mn_node bad[] = {raw1(g, MN_OP_RESHAPE, x, MN_F32, MN_SHAPE(2, 4)),
                   mn_exp(g, raw1(g, MN_OP_RESHAPE, ur, MN_F32, MN_SHAPE(2, 4)))};
  outputs(g, bad, 2);
  expect(g, "reshape-reshape", 0, MN_OP_RESHAPE, 3);
  expect(g, "reshape-same", 0, MN_OP_RESHAPE, 3);
  mn_graph_free(g);
}

/* ---------------------------------------------------------------- bias gradients */

/* The full stage of g pairs `made` sums with products, and the graph stays topological. */
static mn_graph *expect_bgrad(const mn_graph *g, size_t made) {
  mn_optimize_report *r = mn_optimize_report_new();
  mn_graph *o = optimized(g, MN_OPTIMIZE_FULL, r);
  size_t got = r->stage[MN_OPTIMIZE_FULL].multi_output_fusions;
  cr_assert_eq(got, made, "%zu multi-output fusions, expected %zu", got, made);
  cr_assert_eq(mn_test_count_op(o, MN_OP_MATMUL_AT_BGRAD), made);
  cr_assert_eq(mn_test_count_op(o, MN_OP_EXTRA_OUTPUT), made);
  for (size_t i = 0; i < o->num_nodes; i++)
    for (int k = 0; k < o->nodes[i].num_inputs; k++)
      cr_assert_lt(o->nodes[i].inputs[k], i, "node %zu reads a later node", i);
  mn_optimize_report_free(r);
  return o;
}

Test(rules_epilogue, bias_gradient_pairs) {
  for (int of_b = 0; of_b < 2; of_b++) {
    mn_graph *g = mn_graph_new();
    mn_node d = mn_tanh(g, mn_input(g, "d", MN_SHAPE(2, 3, 5)));
    mn_node x = mn_input(g, "x", MN_SHAPE(6, 4));
    /* the sum first, so that the pair's product moves up to it; a [1, N] sum for b */
    mn_node sum = of_b ? raw1(g, MN_OP_SUM_ROWS, d, MN_F32, MN_SHAPE(1, 5))
                       : raw1(g, MN_OP_SUM_ROWS, d, MN_F32, MN_SHAPE(5));
    mn_node prod = of_b ? mn_matmul_at(g, x, d) : mn_matmul_at(g, d, x);
    mn_node outs[] = {sum, prod, mn_exp(g, sum)};
    outputs(g, outs, 3);
    mn_graph *o = expect_bgrad(g, 1);
    cr_assert_eq(count_variant(o, MN_OP_MATMUL_AT_BGRAD, of_b), 1);
    cr_assert_eq(o->nodes[o->outputs[0]].op, MN_OP_EXTRA_OUTPUT, "the sum's output");
    cr_assert_eq(o->nodes[o->outputs[1]].op, MN_OP_MATMUL_AT_BGRAD, "the product's output");
    cr_assert_eq(mn_test_count_op(o, MN_OP_SUM_ROWS), 0);
    mn_graph_free(o);
    dispatches dd = infer_agree(g);
    cr_assert_eq(dd.on, dd.off - 1, "%zu -> %zu dispatches", dd.off, dd.on);
    mn_graph_free(g);
  }
}

Test(rules_epilogue, bias_gradient_pairs_that_must_not_form) {
  /* A sum whose length is not d's last dim; a sum of a value no product reads. */
  mn_graph *g = mn_graph_new();
  mn_node d = mn_tanh(g, mn_input(g, "d", MN_SHAPE(6, 5)));
  mn_node e = mn_tanh(g, mn_input(g, "e", MN_SHAPE(6, 5)));
  mn_node x = mn_input(g, "x", MN_SHAPE(6, 4));
  mn_node bad[] = {mn_matmul_at(g, d, x), raw1(g, MN_OP_SUM_ROWS, d, MN_F32, MN_SHAPE(4)),
                   raw1(g, MN_OP_SUM_ROWS, e, MN_F32, MN_SHAPE(5))};
  outputs(g, bad, 3);
  mn_graph_free(expect_bgrad(g, 0));
  mn_graph_free(g);

  /* The product depends on the sum: one node would read itself. */
  g = mn_graph_new();
  d = mn_tanh(g, mn_input(g, "d", MN_SHAPE(6, 5)));
  mn_node s = raw1(g, MN_OP_SUM_ROWS, d, MN_F32, MN_SHAPE(5));
  mn_node xs = mn_bias_add(g, mn_input(g, "x", MN_SHAPE(6, 5)), s);
  mn_node self[] = {mn_matmul_at(g, d, xs), s};
  outputs(g, self, 2);
  mn_graph_free(expect_bgrad(g, 0));
  infer_agree(g);
  mn_graph_free(g);

  /* Two pairs, each fine alone, that would close a cycle together (each product reads what
   * the other's sum feeds): the first forms, the second does not. */
  g = mn_graph_new();
  mn_node d1 = mn_tanh(g, mn_input(g, "d1", MN_SHAPE(6, 5)));
  mn_node d2 = mn_sigmoid(g, mn_input(g, "d2", MN_SHAPE(6, 5)));
  mn_node s1 = raw1(g, MN_OP_SUM_ROWS, d1, MN_F32, MN_SHAPE(5));
  mn_node s2 = raw1(g, MN_OP_SUM_ROWS, d2, MN_F32, MN_SHAPE(5));
  mn_node x1 = mn_bias_add(g, mn_input(g, "e1", MN_SHAPE(6, 5)), s2);
  mn_node x2 = mn_bias_add(g, mn_input(g, "e2", MN_SHAPE(6, 5)), s1);
  mn_node crossed[] = {mn_matmul_at(g, d1, x1), mn_matmul_at(g, d2, x2), s1, s2};
  outputs(g, crossed, 4);
  mn_graph_free(expect_bgrad(g, 1));
  infer_agree(g);
  mn_graph_free(g);

  /* Two products read d, one sum: one pair, the other product stays. */
  g = mn_graph_new();
  d = mn_tanh(g, mn_input(g, "d", MN_SHAPE(6, 5)));
  mn_node two[] = {mn_matmul_at(g, d, mn_input(g, "x", MN_SHAPE(6, 4))),
                   mn_matmul_at(g, mn_input(g, "y", MN_SHAPE(6, 3)), d),
                   raw1(g, MN_OP_SUM_ROWS, d, MN_F32, MN_SHAPE(5))};
  outputs(g, two, 3);
  mn_graph *o = expect_bgrad(g, 1);
  cr_assert_eq(mn_test_count_op(o, MN_OP_MATMUL_AT), 1);
  mn_graph_free(o);
  infer_agree(g);
  mn_graph_free(g);
}

/* A sum of gelu_grad's value rides on the gelu_grad (gelu_grad_bgrad) rather than on the
 * weight gradient's product, which then stays a plain matmul_at; with MN_OPTIMIZE_OFF=gelu_bgrad
 * the product takes it as before. Either way the CPU values are those of the unfused graph. */
Test(rules_epilogue, bias_gradient_of_gelu_grad_rides_on_it) {
  for (int off = 0; off < 2; off++) {
    if (off) setenv("MN_OPTIMIZE_OFF", "gelu_bgrad", 1);
    mn_graph *g = mn_graph_new();
    mn_node pre = mn_input(g, "pre", MN_SHAPE(2, 3, 8));
    mn_node d = raw2(g, MN_OP_GELU_GRAD, pre, mn_tanh(g, mn_input(g, "dy", MN_SHAPE(2, 3, 8))),
                     MN_SHAPE(2, 3, 8));
    mn_node outs[] = {mn_matmul_at(g, mn_input(g, "x", MN_SHAPE(6, 4)), d),
                      raw1(g, MN_OP_SUM_ROWS, d, MN_F32, MN_SHAPE(8)), d};
    outputs(g, outs, 3);
    mn_optimize_report *r = mn_optimize_report_new();
    mn_graph *o = optimized(g, MN_OPTIMIZE_FULL, r);
    cr_assert_eq(r->stage[MN_OPTIMIZE_FULL].multi_output_fusions, 1);
    cr_assert_eq(mn_test_count_op(o, MN_OP_GELU_GRAD_BGRAD), off ? 0 : 1);
    cr_assert_eq(mn_test_count_op(o, MN_OP_MATMUL_AT_BGRAD), off ? 1 : 0);
    cr_assert_eq(mn_test_count_op(o, MN_OP_MATMUL_AT), off ? 0 : 1);
    cr_assert_eq(mn_test_count_op(o, MN_OP_SUM_ROWS), 0);
    cr_assert_eq(o->nodes[o->outputs[1]].op, MN_OP_EXTRA_OUTPUT, "the sum's output");
    mn_optimize_report_free(r);
    mn_graph_free(o);
    dispatches dd = infer_agree(g);
    cr_assert_leq(dd.on, dd.off - 1, "%zu -> %zu dispatches", dd.off, dd.on);
    mn_graph_free(g);
    unsetenv("MN_OPTIMIZE_OFF");
  }
}

/* ---------------------------------------------------------------- whole models, trained */

/* x -> linear -> relu -> linear -> mse, nn.Linear weights [out, in] (matmul_bt) or Conv1D
 * weights [in, out] (matmul). */
static mn_graph *mlp(bool conv1d) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(6, 5)), t = mn_input(g, "t", MN_SHAPE(6, 3));
  mn_node w1 = conv1d ? mn_parameter(g, "fc1.weight", MN_SHAPE(5, 7))
                      : mn_parameter(g, "fc1.weight", MN_SHAPE(7, 5));
  mn_node w2 = conv1d ? mn_parameter(g, "fc2.weight", MN_SHAPE(7, 3))
                      : mn_parameter(g, "fc2.weight", MN_SHAPE(3, 7));
  mn_node h = conv1d ? mn_matmul(g, x, w1) : mn_matmul_bt(g, x, w1);
  h = mn_relu(g, mn_bias_add(g, h, mn_parameter(g, "fc1.bias", MN_SHAPE(7))));
  mn_node y = conv1d ? mn_matmul(g, h, w2) : mn_matmul_bt(g, h, w2);
  y = mn_bias_add(g, y, mn_parameter(g, "fc2.bias", MN_SHAPE(3)));
  mn_node loss = mn_mse_loss(g, y, t);
  outputs(g, &loss, 1);
  return g;
}

static void check_mlp_plan(const mn_graph *g, bool conv1d) {
  mn_plan *p = lowered(g, true);
  const mn_graph *pg = p->graph;
  cr_assert_eq(count_act(pg, MN_OP_MATMUL_BIAS_ACT, MN_ACT_RELU), 1, "layer 1: bias and relu");
  cr_assert_eq(count_act(pg, MN_OP_MATMUL_BIAS_ACT, MN_ACT_NONE), 1, "layer 2: bias");
  cr_assert_eq(count_variant(pg, MN_OP_MATMUL_BIAS_ACT, conv1d ? 0 : 1), 2);
  cr_assert_eq(mn_test_count_op(pg, MN_OP_BIAS_ADD) + mn_test_count_op(pg, MN_OP_RELU), 0);
  /* dW = matmul_at(dz, x) for nn.Linear (dz is a), matmul_at(x, dz) for Conv1D (dz is b);
   * layer 1's bias gradient is summed by the kernel that gates its gradient (below), so its
   * weight gradient is a plain product */
  cr_assert_eq(count_variant(pg, MN_OP_MATMUL_AT_BGRAD, conv1d ? 1 : 0), 1);
  cr_assert_eq(mn_test_count_op(pg, MN_OP_MATMUL_AT_BGRAD), 1);
  cr_assert_eq(mn_test_count_op(pg, MN_OP_MATMUL_AT), 1);
  cr_assert_eq(mn_test_count_op(pg, MN_OP_SUM_ROWS), 0);
  for (size_t i = 0; i < p->num_params; i++) {
    const char *name = pg->nodes[p->params[i].param].name;
    if (strstr(name, "bias"))
      cr_assert_eq(pg->nodes[p->params[i].grad].op, MN_OP_EXTRA_OUTPUT, "%s", name);
  }
  /* relu_grad reads the layer's output, so no pre-activation is kept, and it gates the
   * product that makes its gradient, whose column sums are layer 1's bias gradient
   * (matmul_drelu_bgrad). */
  cr_assert_eq(mn_test_count_op(pg, MN_OP_RELU_GRAD), 0);
  cr_assert_eq(mn_test_count_op(pg, MN_OP_MATMUL_DRELU), 0);
  cr_assert_eq(count_variant(pg, MN_OP_MATMUL_DRELU_BGRAD, conv1d ? 1 : 0), 1);
  for (size_t i = 0; i < pg->num_nodes; i++)
    if (pg->nodes[i].op == MN_OP_MATMUL_DRELU_BGRAD)
      cr_assert_eq(pg->nodes[pg->nodes[i].inputs[2]].attrs.act, MN_ACT_RELU);
  cr_assert_eq(products(pg), 3, "two forward products and dx of layer 2");
  mn_plan_free(p);
}

Test(rules_epilogue, mlp_linear_layout_trains_bitwise) {
  mn_graph *g = mlp(false);
  check_mlp_plan(g, false);
  dispatches sgd = train_agree(g, SGD, 3), adamw = train_agree(g, ADAMW, 3);
  /* matmul+bias+relu and matmul+bias: 5 -> 2; two sum_rows gone */
  cr_assert_leq(sgd.on, sgd.off - 5, "%zu -> %zu dispatches", sgd.off, sgd.on);
  cr_assert_eq(adamw.on, sgd.on);
  mn_graph_free(g);
}

Test(rules_epilogue, mlp_conv1d_layout_trains_bitwise) {
  mn_graph *g = mlp(true);
  check_mlp_plan(g, true);
  dispatches sgd = train_agree(g, SGD, 3);
  cr_assert_leq(sgd.on, sgd.off - 5, "%zu -> %zu dispatches", sgd.off, sgd.on);
  train_agree(g, ADAMW, 3);
  mn_graph_free(g);
}

/* GPT-2's MLP: Conv1D weights, GELU, a residual, on [B, T, D] activations. */
static mn_graph *gpt2_mlp(void) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(2, 4, 8)), t = mn_input(g, "t", MN_SHAPE(2, 4, 8));
  mn_node h = mn_bias_add(g, mn_matmul(g, x, mn_parameter(g, "c_fc.weight", MN_SHAPE(8, 16))),
                          mn_parameter(g, "c_fc.bias", MN_SHAPE(16)));
  h = mn_gelu(g, h);
  mn_node y = mn_bias_add(g, mn_matmul(g, h, mn_parameter(g, "c_proj.weight", MN_SHAPE(16, 8))),
                          mn_parameter(g, "c_proj.bias", MN_SHAPE(8)));
  mn_node loss = mn_mse_loss(g, mn_add(g, x, y), t);
  outputs(g, &loss, 1);
  return g;
}

Test(rules_epilogue, gpt2_mlp_trains_bitwise) {
  mn_graph *g = gpt2_mlp();
  mn_optimize_report *r = NULL;
  mn_session *s = NULL;
  mn_session_options o = mn_test_cpu_options(true);
  cr_assert_eq(mn_build_session_with_report(g, &o, &s, &r), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_optimize_report_fired(r, MN_OPTIMIZE_FULL, "matmul-bt-dgelu"), 1,
               "dh = matmul_bt(dy, c_proj.weight) into gelu_grad");
  cr_assert_eq(r->stage[MN_OPTIMIZE_FULL].multi_output_fusions, 2);
  const mn_graph *pg = mn_session_plan(s)->graph;
  cr_assert_eq(count_variant(pg, MN_OP_MATMUL_DGELU, 1), 1);
  cr_assert_eq(mn_test_count_op(pg, MN_OP_GELU_GRAD), 0);
  /* gelu_grad's epilogue reads the pre-activation, so GELU stays apart from the product
   * rather than computing the product twice. */
  cr_assert_eq(count_act(pg, MN_OP_MATMUL_BIAS_ACT, MN_ACT_GELU), 0);
  cr_assert_eq(mn_test_count_op(pg, MN_OP_MATMUL_BIAS_ACT), 2);
  cr_assert_eq(products(pg), 3);
  cr_assert_eq(count_variant(pg, MN_OP_MATMUL_AT_BGRAD, 1), 2);
  mn_optimize_report_free(r);
  mn_session_free(s);
  dispatches d = train_agree(g, ADAMW, 3);
  cr_assert_leq(d.on, d.off - 5, "%zu -> %zu dispatches", d.off, d.on);
  train_agree(g, SGD, 2);

  /* Inference: nothing else reads the pre-activation, and GELU joins the product. */
  mn_plan *p = lowered(g, false);
  cr_assert_eq(count_act(p->graph, MN_OP_MATMUL_BIAS_ACT, MN_ACT_GELU), 1);
  cr_assert_eq(mn_test_count_op(p->graph, MN_OP_GELU), 0);
  mn_plan_free(p);
  d = infer_agree(g);
  cr_assert_eq(d.on, d.off - 3, "%zu -> %zu dispatches", d.off, d.on);
  mn_graph_free(g);
}

/* ---------------------------------------------------------------- report and cost model */

Test(rules_epilogue, report_counts_multi_output_fusions) {
  mn_graph *g = mlp(false);
  mn_session_options o = mn_test_cpu_options(true);
  mn_session *s = NULL;
  mn_optimize_report *r = NULL;
  cr_assert_eq(mn_build_session_with_report(g, &o, &s, &r), MN_OK, "%s", mn_last_error());
  cr_assert_eq(r->stage[MN_OPTIMIZE_FORWARD].multi_output_fusions, 0);
  cr_assert_eq(r->stage[MN_OPTIMIZE_FULL].multi_output_fusions, 2);
  cr_assert_eq(mn_optimize_report_fired(r, MN_OPTIMIZE_FORWARD, "matmul-bt-bias"), 0);
  cr_assert_eq(mn_optimize_report_fired(r, MN_OPTIMIZE_FULL, "matmul-bt-bias"), 2);
  cr_assert_eq(mn_optimize_report_fired(r, MN_OPTIMIZE_FULL, "matmul-bias-relu"), 1);
  cr_assert_eq(mn_optimize_report_fired(r, MN_OPTIMIZE_FULL, "relu-grad-of-output"), 1);
  cr_assert_eq(r->plan_dispatches, mn_plan_num_dispatches(mn_session_plan(s)));
  char text[4096];
  mn_optimize_report_format(r, text, sizeof text);
  cr_assert(strstr(text, "multi-output fusions: 2"), "%s", text);
  cr_assert(strstr(text, "matmul-bt-bias 2"), "%s", text);
  mn_optimize_report_free(r);
  mn_session_free(s);
  mn_graph_free(g);
}

/* What the notes at the top say, in the cost model's numbers: at [8, 8] x [8, 8] each op is
 * priced at one launch plus a few hundred bytes, so fusing product, bias and relu saves two
 * launches; a second product for a value also read elsewhere costs its operands' bytes and
 * flops, more than one relu pass reading the value. */
Test(rules_epilogue, cost_model_at_tiny_shapes) {
  mn_tensor_type m = mn_type_make(MN_F32, (int64_t[]){8, 8}, 2);
  mn_tensor_type v = mn_type_make(MN_F32, (int64_t[]){8}, 1);
  const mn_tensor_type *mm[2] = {&m, &m}, *row[2] = {&m, &v}, *one[1] = {&m},
                       *fused[3] = {&m, &m, &v};
  double product = mn_cost_op(MN_OP_MATMUL, &m, mm, 2);
  double separate =
      product + mn_cost_op(MN_OP_BIAS_ADD, &m, row, 2) + mn_cost_op(MN_OP_RELU, &m, one, 1);
  double epilogue = mn_cost_op(MN_OP_MATMUL_BIAS_ACT, &m, fused, 3);
  cr_assert_gt(separate - epilogue, 1.99 * MN_COST_LAUNCH_BYTES);
  cr_assert_lt(separate - epilogue, 2.01 * MN_COST_LAUNCH_BYTES);
  cr_assert_lt(epilogue - MN_COST_LAUNCH_BYTES, 1e-3 * MN_COST_LAUNCH_BYTES, "launch-dominated");
  cr_assert_gt(epilogue, mn_cost_op(MN_OP_RELU, &m, one, 1),
               "a second product costs more than a relu pass");
}
