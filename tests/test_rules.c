/* Every rewrite rule (optimizer/rules.c): a graph where it fires, with the optimized
 * graph computing what the unoptimized one does on the CPU backend, and graphs where it
 * must not (a graph output at its root, a shape or dtype that does not line up, a value
 * the rule does not apply to; a value with another user where the cost model decides).
 * Also the optimizer's promises: outputs, named leaves, own gradient buffers. */
#include <stdlib.h>

#include "host/plan.h"
#include "optimizer/optimize.h"
#include "optimizer/report.h"
#include "optimizer/rewrite.h"
#include "tests/support/graph_check.h"
#include "tests/support/mn_test.h"

enum { N = 8 };

/* The forward-stage optimization of a sorted copy of g. */
static mn_graph *optimized(const mn_graph *g, mn_optimize_report *r) {
  mn_graph *c = mn_graph_toposort(g);
  cr_assert_not_null(c, "%s", mn_last_error());
  mn_session_options o = mn_test_cpu_options(true);
  cr_assert_eq(mn_optimize_graph_report("test", &c, &o, MN_OPTIMIZE_FORWARD, r), MN_OK, "%s",
               mn_last_error());
  cr_assert(!r->stage[MN_OPTIMIZE_FORWARD].fell_back);
  return c;
}

/* Optimizes g and checks that `rule` fired `fired` times and `op` is left `left` times. */
static void expect(const mn_graph *g, const char *rule, size_t fired, mn_op op, size_t left) {
  mn_optimize_report *r = mn_optimize_report_new();
  mn_graph *o = optimized(g, r);
  size_t got = mn_optimize_report_fired(r, MN_OPTIMIZE_FORWARD, rule);
  cr_assert_eq(got, fired, "rule %s fired %zu times, expected %zu", rule, got, fired);
  cr_assert_eq(mn_test_count_op(o, op), left, "%zu %s nodes left, expected %zu",
               mn_test_count_op(o, op), mn_op_name(op), left);
  mn_graph_free(o);
  mn_optimize_report_free(r);
}

/* Inference sessions with the optimizer on and off agree on every output (F32 inputs
 * random in [-2, 2]) within tol (0: bitwise); the optimized one has no more dispatches. */
static void agree(const mn_graph *g, double tol) {
  mn_session *s[2];
  for (int on = 0; on < 2; on++) {
    mn_session_options o = mn_test_cpu_options(on);
    cr_assert_eq(mn_build_inference_session(g, &o, &s[on]), MN_OK, "%s", mn_last_error());
    mn_rng rng = mn_rng_new(7);
    for (size_t i = 0; i < g->num_nodes; i++) {
      const mn_node_rec *n = &g->nodes[i];
      if (n->op != MN_OP_INPUT || n->type.dtype != MN_F32) continue;
      size_t numel = (size_t)mn_tensor_type_numel(&n->type);
      float *x = malloc(numel * sizeof *x);
      mn_rng_fill(&rng, x, numel, -2, 2);
      cr_assert_eq(mn_session_set_input(s[on], n->name, x, numel), MN_OK, "%s", mn_last_error());
      free(x);
    }
    cr_assert_eq(mn_session_step(s[on]), MN_OK, "%s", mn_last_error());
    cr_assert_eq(mn_session_wait(s[on]), MN_OK, "%s", mn_last_error());
  }
  cr_assert_leq(mn_plan_num_dispatches(mn_session_plan(s[1])),
                mn_plan_num_dispatches(mn_session_plan(s[0])));
  for (size_t k = 0; k < g->num_outputs; k++) {
    size_t numel = (size_t)mn_tensor_type_numel(&g->nodes[g->outputs[k]].type);
    float *a = mn_test_read_output(s[0], k, numel), *b = mn_test_read_output(s[1], k, numel);
    if (tol == 0)
      cr_assert(memcmp(a, b, numel * sizeof *a) == 0, "output %zu differs", k);
    else
      mn_assert_close(b, a, numel, tol);
    free(a);
    free(b);
  }
  mn_session_free(s[0]);
  mn_session_free(s[1]);
}

/* A node built past the builders' checks, so that shapes or dtypes can disagree. */
static mn_node raw(mn_graph *g, mn_op op, const mn_node *ins, int n, mn_dtype dt,
                   const int64_t *shape, int rank, float scale) {
  mn_tensor_type t = mn_type_make(dt, shape, rank);
  mn_op_attrs a = {.scale = scale};
  mn_node id = mn_graph_append(g, op, ins, n, &t, &a, NULL);
  cr_assert_neq(id, MN_NO_NODE);
  return id;
}
#define F32_8  MN_F32, (int64_t[]){N}, 1
#define F32_24 MN_F32, (int64_t[]){2, 4}, 2

static mn_node filled(mn_graph *g, float v, int64_t n) {
  float *d = malloc((size_t)n * sizeof *d);
  for (int64_t i = 0; i < n; i++)
    d[i] = v;
  mn_node c = mn_constant(g, d, &n, 1);
  free(d);
  return c;
}

Test(rules, all_patterns_compile) { cr_assert_null(mn_rules_compile_error()); }

Test(rules, neg_neg) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(N));
  MN_TEST_OUTPUTS(g, mn_exp(g, mn_neg(g, mn_neg(g, x))));
  expect(g, "neg-neg", 1, MN_OP_NEG, 0);
  agree(g, 0);
  mn_graph_free(g);

  g = mn_graph_new(); /* the output itself is never rewritten */
  x = mn_input(g, "x", MN_SHAPE(N));
  MN_TEST_OUTPUTS(g, mn_neg(g, mn_neg(g, x)));
  expect(g, "neg-neg", 0, MN_OP_NEG, 2);
  mn_graph_free(g);

  g = mn_graph_new(); /* the inner neg has another user: both results stay right */
  x = mn_input(g, "x", MN_SHAPE(N));
  mn_node n1 = mn_neg(g, x);
  MN_TEST_OUTPUTS(g, mn_exp(g, mn_neg(g, n1)), mn_tanh(g, n1));
  expect(g, "neg-neg", 1, MN_OP_NEG, 1);
  agree(g, 0);
  mn_graph_free(g);

  g = mn_graph_new(); /* dtype and shape that do not line up */
  x = mn_input_u32(g, "x", MN_SHAPE(N));
  mn_node y = mn_input(g, "y", MN_SHAPE(N));
  mn_node a = raw(g, MN_OP_NEG, &x, 1, F32_8, 0);
  mn_node b = raw(g, MN_OP_NEG, &y, 1, F32_24, 0);
  MN_TEST_OUTPUTS(g, mn_exp(g, raw(g, MN_OP_NEG, &a, 1, F32_8, 0)),
                  mn_exp(g, raw(g, MN_OP_NEG, &b, 1, F32_24, 0)));
  expect(g, "neg-neg", 0, MN_OP_NEG, 4);
  mn_graph_free(g);
}

Test(rules, mul_one) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(N)), y = mn_input(g, "y", MN_SHAPE(N));
  mn_node one = filled(g, 1.0f, N);
  MN_TEST_OUTPUTS(g, mn_exp(g, mn_mul(g, x, one)), mn_exp(g, mn_mul(g, one, y)));
  expect(g, "mul-one", 2, MN_OP_MUL, 0);
  agree(g, 0);
  mn_graph_free(g);

  g = mn_graph_new(); /* not all ones; the output; dtype and shape mismatches */
  x = mn_input(g, "x", MN_SHAPE(N));
  mn_node u = mn_input_u32(g, "u", MN_SHAPE(N));
  float almost[N] = {1, 1, 1, 1, 1, 1, 1, 0.5f};
  mn_node c = mn_constant(g, almost, MN_SHAPE(N));
  one = filled(g, 1.0f, N);
  MN_TEST_OUTPUTS(g, mn_exp(g, mn_mul(g, x, c)), mn_mul(g, x, one),
                  mn_exp(g, raw(g, MN_OP_MUL, (mn_node[]){u, one}, 2, F32_8, 0)),
                  mn_exp(g, raw(g, MN_OP_MUL, (mn_node[]){x, one}, 2, F32_24, 0)));
  expect(g, "mul-one", 0, MN_OP_MUL, 4);
  mn_graph_free(g);
}

Test(rules, add_zero) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(N)), y = mn_input(g, "y", MN_SHAPE(N));
  mn_node z = mn_input(g, "z", MN_SHAPE(N));
  mn_node zeros = raw(g, MN_OP_ZEROS, NULL, 0, F32_8, 0);
  MN_TEST_OUTPUTS(g, mn_exp(g, mn_add(g, x, filled(g, 0.0f, N))),
                  mn_exp(g, mn_add(g, filled(g, -0.0f, N), y)), mn_exp(g, mn_add(g, z, zeros)));
  expect(g, "add-zero", 3, MN_OP_ADD, 0);
  agree(g, 0);
  mn_graph_free(g);

  g = mn_graph_new();
  x = mn_input(g, "x", MN_SHAPE(N));
  mn_node u = mn_input_u32(g, "u", MN_SHAPE(N));
  float almost[N] = {0, 0, 0, 0, 0, 0, 0, 1e-30f};
  mn_node zero = filled(g, 0.0f, N);
  MN_TEST_OUTPUTS(g, mn_exp(g, mn_add(g, x, mn_constant(g, almost, MN_SHAPE(N)))),
                  mn_add(g, x, zero),
                  mn_exp(g, raw(g, MN_OP_ADD, (mn_node[]){u, zero}, 2, F32_8, 0)),
                  mn_exp(g, raw(g, MN_OP_ADD, (mn_node[]){x, zero}, 2, F32_24, 0)));
  expect(g, "add-zero", 0, MN_OP_ADD, 4);
  mn_graph_free(g);
}

Test(rules, scale_one) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(N));
  MN_TEST_OUTPUTS(g, mn_exp(g, mn_scale(g, x, 1.0f)));
  expect(g, "scale-one", 1, MN_OP_SCALE, 0);
  agree(g, 0);
  mn_graph_free(g);

  g = mn_graph_new();
  x = mn_input(g, "x", MN_SHAPE(N));
  mn_node u = mn_input_u32(g, "u", MN_SHAPE(N));
  MN_TEST_OUTPUTS(g, mn_exp(g, mn_scale(g, x, 1.0000001f)), mn_scale(g, x, 1.0f),
                  mn_exp(g, raw(g, MN_OP_SCALE, &u, 1, F32_8, 1.0f)),
                  mn_exp(g, raw(g, MN_OP_SCALE, &x, 1, F32_24, 1.0f)));
  expect(g, "scale-one", 0, MN_OP_SCALE, 4);
  mn_graph_free(g);
}

Test(rules, scale_scale) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(N));
  MN_TEST_OUTPUTS(g, mn_exp(g, mn_scale(g, mn_scale(g, x, 1.1f), 1.3f)));
  expect(g, "scale-scale", 1, MN_OP_SCALE, 1);
  mn_optimize_report *r = mn_optimize_report_new();
  mn_graph *o = optimized(g, r);
  for (size_t i = 0; i < o->num_nodes; i++)
    if (o->nodes[i].op == MN_OP_SCALE)
      cr_assert_float_eq(o->nodes[i].attrs.scale, (float)(1.1 * 1.3), 0, "one scale 1.1 * 1.3");
  mn_graph_free(o);
  mn_optimize_report_free(r);
  agree(g, 1e-6);
  mn_graph_free(g);

  g = mn_graph_new(); /* products out of range; the output; a shape mismatch */
  x = mn_input(g, "x", MN_SHAPE(N));
  mn_node inner = mn_scale(g, x, 2.0f);
  MN_TEST_OUTPUTS(g, mn_exp(g, mn_scale(g, mn_scale(g, x, 1e30f), 1e30f)),
                  mn_exp(g, mn_scale(g, mn_scale(g, x, 1e-30f), 1e-30f)), mn_scale(g, inner, 3.0f),
                  mn_exp(g, raw(g, MN_OP_SCALE, &inner, 1, F32_24, 5.0f)));
  expect(g, "scale-scale", 0, MN_OP_SCALE, 7);
  mn_graph_free(g);

  g = mn_graph_new(); /* the inner scale has another user: the cost model decides */
  x = mn_input(g, "x", MN_SHAPE(N));
  inner = mn_scale(g, x, 2.0f);
  MN_TEST_OUTPUTS(g, mn_exp(g, mn_scale(g, inner, 3.0f)), mn_tanh(g, inner));
  agree(g, 0);
  mn_graph_free(g);
}

Test(rules, silu) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(N)), y = mn_input(g, "y", MN_SHAPE(N));
  MN_TEST_OUTPUTS(g, mn_exp(g, mn_mul(g, x, mn_sigmoid(g, x))),
                  mn_exp(g, mn_mul(g, mn_sigmoid(g, y), y)));
  expect(g, "silu", 2, MN_OP_SILU, 2);
  expect(g, "silu", 2, MN_OP_SIGMOID, 0);
  agree(g, 1e-6);
  mn_graph_free(g);

  g = mn_graph_new(); /* sigmoid of another value; the output; dtype and shape */
  x = mn_input(g, "x", MN_SHAPE(N));
  y = mn_input(g, "y", MN_SHAPE(N));
  mn_node u = mn_input_u32(g, "u", MN_SHAPE(N));
  mn_node su = raw(g, MN_OP_SIGMOID, &u, 1, F32_8, 0), sx = mn_sigmoid(g, x);
  MN_TEST_OUTPUTS(g, mn_exp(g, mn_mul(g, x, mn_sigmoid(g, y))), mn_mul(g, x, sx),
                  mn_exp(g, raw(g, MN_OP_MUL, (mn_node[]){u, su}, 2, F32_8, 0)),
                  mn_exp(g, raw(g, MN_OP_MUL, (mn_node[]){x, sx}, 2, F32_24, 0)));
  expect(g, "silu", 0, MN_OP_SILU, 0);
  mn_graph_free(g);

  g = mn_graph_new(); /* the sigmoid has another user: silu is still the cheaper pass */
  x = mn_input(g, "x", MN_SHAPE(N));
  sx = mn_sigmoid(g, x);
  MN_TEST_OUTPUTS(g, mn_exp(g, mn_mul(g, x, sx)), mn_tanh(g, sx));
  expect(g, "silu", 1, MN_OP_SILU, 1);
  agree(g, 1e-6);
  mn_graph_free(g);
}

Test(rules, swiglu) {
  mn_graph *g = mn_graph_new();
  mn_node a = mn_input(g, "a", MN_SHAPE(N)), b = mn_input(g, "b", MN_SHAPE(N));
  mn_node c = mn_input(g, "c", MN_SHAPE(N)), d = mn_input(g, "d", MN_SHAPE(N));
  MN_TEST_OUTPUTS(g, mn_exp(g, mn_mul(g, mn_silu(g, a), b)), mn_exp(g, mn_mul(g, b, mn_silu(g, c))),
                  /* silu written out: two rules in a row */
                  mn_exp(g, mn_mul(g, mn_mul(g, d, mn_sigmoid(g, d)), a)));
  expect(g, "swiglu", 3, MN_OP_SWIGLU, 3);
  expect(g, "swiglu", 3, MN_OP_MUL, 0);
  agree(g, 1e-6);
  mn_graph_free(g);

  g = mn_graph_new(); /* the output; shape and dtype of up */
  a = mn_input(g, "a", MN_SHAPE(N));
  b = mn_input(g, "b", MN_SHAPE(2, 4));
  mn_node u = mn_input_u32(g, "u", MN_SHAPE(N));
  mn_node sa = mn_silu(g, a);
  MN_TEST_OUTPUTS(g, mn_mul(g, sa, a),
                  mn_exp(g, raw(g, MN_OP_MUL, (mn_node[]){sa, b}, 2, F32_8, 0)),
                  mn_exp(g, raw(g, MN_OP_MUL, (mn_node[]){u, sa}, 2, F32_8, 0)));
  expect(g, "swiglu", 0, MN_OP_SWIGLU, 0);
  mn_graph_free(g);

  g = mn_graph_new(); /* silu(gate) has another user: the cost model decides */
  a = mn_input(g, "a", MN_SHAPE(N));
  b = mn_input(g, "b", MN_SHAPE(N));
  sa = mn_silu(g, a);
  MN_TEST_OUTPUTS(g, mn_exp(g, mn_mul(g, sa, b)), mn_tanh(g, sa));
  agree(g, 1e-6);
  mn_graph_free(g);
}

Test(rules, constant_fold) {
  float c1[N] = {1, 2, 3, 4, 5, 6, 7, 8}, c2[N] = {0.5f, -1, 2, 0, 3, -2, 1, 1};
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(N));
  mn_node a = mn_constant(g, c1, MN_SHAPE(N)), b = mn_constant(g, c2, MN_SHAPE(N));
  MN_TEST_OUTPUTS(g, mn_mul(g, x, mn_exp(g, mn_add(g, a, b))));
  expect(g, "constant-fold", 2, MN_OP_CONSTANT, 1);
  expect(g, "constant-fold", 2, MN_OP_EXP, 0);
  agree(g, 0);
  mn_optimize_report *r = mn_optimize_report_new();
  mn_graph *o = optimized(g, r);
  for (size_t i = 0; i < o->num_nodes; i++)
    if (o->nodes[i].op == MN_OP_CONSTANT)
      for (int k = 0; k < N; k++)
        cr_assert_float_eq(o->nodes[i].data[k], (float)exp((double)(c1[k] + c2[k])), 0);
  mn_graph_free(o);
  mn_optimize_report_free(r);
  mn_graph_free(g);

  g = mn_graph_new(); /* an input that is not constant; the output; too large to fold */
  x = mn_input(g, "x", MN_SHAPE(N));
  a = mn_constant(g, c1, MN_SHAPE(N));
  b = mn_constant(g, c2, MN_SHAPE(N));
  mn_node big = filled(g, 2.0f, MN_FOLD_MAX_ELEMS + 1);
  /* and a result that is not F32 (constants hold floats only) */
  mn_node u32 = raw(g, MN_OP_ADD, (mn_node[]){a, b}, 2, MN_U32, (int64_t[]){N}, 1, 0);
  MN_TEST_OUTPUTS(g, mn_exp(g, mn_add(g, a, x)), mn_add(g, a, b), mn_sum_all(g, mn_exp(g, big)),
                  raw(g, MN_OP_RESHAPE, &u32, 1, MN_U32, (int64_t[]){N}, 1, 0));
  expect(g, "constant-fold", 0, MN_OP_ADD, 3);
  mn_graph_free(g);
}

Test(rules, common_subexpressions) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(N));
  mn_node e1 = mn_exp(g, mn_scale(g, x, 2.0f)), e2 = mn_exp(g, mn_scale(g, x, 2.0f));
  MN_TEST_OUTPUTS(g, mn_mul(g, e1, e2), mn_mul(g, mn_scale(g, x, 3.0f), x));
  expect(g, "cse", 2, MN_OP_EXP, 1);
  expect(g, "cse", 2, MN_OP_SCALE, 2); /* scale 2 once, scale 3 stays apart */
  agree(g, 0);
  mn_graph_free(g);

  g = mn_graph_new(); /* the same op and input with other types: two values */
  x = mn_input(g, "x", MN_SHAPE(N));
  mn_node r1 = raw(g, MN_OP_RESHAPE, &x, 1, F32_24, 0);
  mn_node r2 = raw(g, MN_OP_RESHAPE, &x, 1, MN_F32, (int64_t[]){4, 2}, 2, 0);
  MN_TEST_OUTPUTS(g, mn_exp(g, r1), mn_exp(g, r2));
  expect(g, "cse", 0, MN_OP_RESHAPE, 2);
  agree(g, 0);
  mn_graph_free(g);
}

Test(rules, dead_code) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(N));
  mn_tanh(g, mn_exp(g, x)); /* nobody reads these */
  MN_TEST_OUTPUTS(g, mn_neg(g, x));
  mn_graph *c = mn_graph_clone(g); /* unsorted: the optimizer itself drops them */
  mn_optimize_report *r = mn_optimize_report_new();
  mn_session_options o = mn_test_cpu_options(true);
  cr_assert_eq(mn_optimize_graph_report("test", &c, &o, MN_OPTIMIZE_FORWARD, r), MN_OK);
  const mn_optimize_stage_report *s = &r->stage[MN_OPTIMIZE_FORWARD];
  cr_assert_eq(mn_optimize_report_fired(r, MN_OPTIMIZE_FORWARD, "dead-code"), 2);
  cr_assert_eq(s->nodes_before, 4);
  cr_assert_eq(s->nodes_after, 2);
  cr_assert_eq(s->dispatches_before, 3);
  cr_assert_eq(s->dispatches_after, 1);
  cr_assert_eq(c->num_nodes, 2);
  mn_optimize_report_free(r);
  mn_graph_free(c);
  mn_graph_free(g);
}

/* Outputs keep order and count; equal outputs that were different nodes stay different
 * nodes; unused named leaves stay, with their names. */
Test(rules, outputs_and_named_leaves_are_kept) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(N));
  mn_input(g, "unused_input", MN_SHAPE(3));
  mn_parameter(g, "unused.weight", MN_SHAPE(2, 2));
  mn_node e1 = mn_exp(g, x), e2 = mn_exp(g, x), one = filled(g, 1.0f, N);
  MN_TEST_OUTPUTS(g, e1, mn_mul(g, x, one), e2, e1, x);
  mn_optimize_report *r = mn_optimize_report_new();
  mn_graph *o = optimized(g, r);
  cr_assert_eq(o->num_outputs, 5);
  cr_assert_neq(o->outputs[0], o->outputs[2], "e1 and e2 were different nodes");
  cr_assert_eq(o->outputs[0], o->outputs[3], "e1 twice is one node");
  cr_assert_eq(o->nodes[o->outputs[1]].op, MN_OP_MUL, "an output is never rewritten");
  cr_assert_eq(o->nodes[o->outputs[4]].op, MN_OP_INPUT);
  cr_assert_neq(mn_graph_find_leaf(o, MN_OP_INPUT, "unused_input"), MN_NO_NODE);
  cr_assert_neq(mn_graph_find_leaf(o, MN_OP_PARAMETER, "unused.weight"), MN_NO_NODE);
  mn_graph_free(o);
  mn_optimize_report_free(r);
  agree(g, 0);
  mn_graph_free(g);
}

/* Two parameters whose gradients are equal expressions: hash-consing makes them one
 * class, but each gradient still gets a buffer of its own and the right values. */
Test(rules, equal_gradients_keep_own_buffers) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(N)), t = mn_input(g, "t", MN_SHAPE(N));
  mn_node p1 = mn_parameter(g, "p1", MN_SHAPE(N)), p2 = mn_parameter(g, "p2", MN_SHAPE(N));
  MN_TEST_OUTPUTS(g, mn_mse_loss(g, mn_add(g, mn_mul(g, x, p1), mn_mul(g, x, p2)), t));
  float xs[N], ts[N], w[N], got[2][4][N];
  mn_rng rng = mn_rng_new(3);
  mn_rng_fill(&rng, xs, N, -1, 1);
  mn_rng_fill(&rng, ts, N, -1, 1);
  mn_rng_fill(&rng, w, N, -1, 1);
  for (int on = 0; on < 2; on++) {
    mn_session_options o = mn_test_cpu_options(on);
    mn_session *s = NULL;
    cr_assert_eq(mn_build_session(g, &o, &s), MN_OK, "%s", mn_last_error());
    const mn_plan *p = mn_session_plan(s);
    cr_assert_eq(p->num_params, 2);
    cr_assert_neq(p->params[0].grad, p->params[1].grad, "each gradient is its own node");
    cr_assert_eq(mn_session_set_input(s, "x", xs, N), MN_OK);
    cr_assert_eq(mn_session_set_input(s, "t", ts, N), MN_OK);
    cr_assert_eq(mn_session_set_parameter(s, "p1", w, N), MN_OK);
    cr_assert_eq(mn_session_set_parameter(s, "p2", w, N), MN_OK);
    cr_assert_eq(mn_session_set_adamw(s, 0.01f, 0.9f, 0.999f, 1e-8f, 0.01f), MN_OK);
    for (int step = 0; step < 2; step++) {
      cr_assert_eq(mn_session_step(s), MN_OK, "%s", mn_last_error());
      cr_assert_eq(mn_session_wait(s), MN_OK, "%s", mn_last_error());
    }
    cr_assert_eq(mn_session_read_grad(s, "p1", got[on][0], N), MN_OK);
    cr_assert_eq(mn_session_read_grad(s, "p2", got[on][1], N), MN_OK);
    cr_assert_eq(mn_session_read_param(s, "p1", got[on][2], N), MN_OK);
    cr_assert_eq(mn_session_read_param(s, "p2", got[on][3], N), MN_OK);
    mn_session_free(s);
  }
  cr_assert(memcmp(got[0], got[1], sizeof got[0]) == 0, "gradients and updates agree");
  mn_graph_free(g);
}
