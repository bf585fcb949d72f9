/* The optimizer end to end: optimized and unoptimized training sessions agree (an MLP,
 * the transformer block of tests/support/models.c, a conv block) over three AdamW steps;
 * random pointwise graphs compute the same with and without it; the limits stop a
 * graph that blows up and still give a correct graph; and mn_build_session_with_report
 * reports numbers that match the graph. */
#include <stdio.h>
#include <stdlib.h>

#include "host/plan.h"
#include "optimizer/report.h"
#include "tests/support/graph_check.h"
#include "tests/support/mn_test.h"
#include "tests/support/models.h"

static size_t numel_of(const mn_graph *g, mn_node id) {
  mn_node_info info;
  cr_assert_eq(mn_graph_node(g, id, &info), MN_OK);
  return (size_t)mn_tensor_type_numel(&info.type);
}

static void assert_agree(const float *opt, const float *ref, size_t n, double tol, const char *what,
                         int step) {
  if (tol == 0) {
    cr_assert(memcmp(opt, ref, n * sizeof *opt) == 0, "%s differs bitwise at step %d", what, step);
    return;
  }
  double e = mn_test_rel_err(opt, ref, n);
  cr_assert_leq(e, tol, "%s at step %d: relative error %g > %g", what, step, e, tol);
}

/* Feeds both sessions the same data: parameters small and random (norm weights, rank 1,
 * near 1), inputs in [-1, 1]. */
static void feed(const mn_graph *g, mn_session *s) {
  mn_rng r = mn_rng_new(5);
  for (size_t i = 0; i < mn_graph_num_nodes(g); i++) {
    mn_node_info info;
    mn_graph_node(g, (mn_node)i, &info);
    bool param = strcmp(info.op, "parameter") == 0;
    if (!param && strcmp(info.op, "input") != 0) continue;
    size_t n = (size_t)mn_tensor_type_numel(&info.type);
    float *v = malloc(n * sizeof *v);
    if (param && info.type.rank == 1)
      mn_rng_fill(&r, v, n, 0.8f, 1.2f);
    else
      mn_rng_fill(&r, v, n, param ? -0.3f : -1.0f, param ? 0.3f : 1.0f);
    mn_status st = param ? mn_session_set_parameter(s, info.name, v, n)
                         : mn_session_set_input(s, info.name, v, n);
    cr_assert_eq(st, MN_OK, "%s: %s", info.name, mn_last_error());
    free(v);
  }
}

/* Three AdamW steps on sessions with the optimizer off and on: losses, outputs,
 * gradients and the updated parameters agree within tol (0: bitwise). */
static void sessions_agree(const mn_graph *g, double tol) {
  mn_session *s[2];
  for (int on = 0; on < 2; on++) {
    mn_session_options o = mn_test_cpu_options(on);
    cr_assert_eq(mn_build_session(g, &o, &s[on]), MN_OK, "%s", mn_last_error());
    feed(g, s[on]);
    cr_assert_eq(mn_session_set_adamw(s[on], 1e-2f, 0.9f, 0.999f, 1e-8f, 0.01f), MN_OK);
  }
  const mn_node *outs;
  size_t nout = mn_graph_outputs(g, &outs);
  for (int step = 0; step < 3; step++) {
    for (int on = 0; on < 2; on++) {
      cr_assert_eq(mn_session_step(s[on]), MN_OK, "%s", mn_last_error());
      cr_assert_eq(mn_session_wait(s[on]), MN_OK, "%s", mn_last_error());
    }
    float l0 = mn_session_read_loss(s[0]), l1 = mn_session_read_loss(s[1]);
    assert_agree(&l1, &l0, 1, tol, "loss", step);
    for (size_t k = 0; k < nout; k++) {
      size_t n = numel_of(g, outs[k]);
      float *a = mn_test_read_output(s[0], k, n), *b = mn_test_read_output(s[1], k, n);
      assert_agree(b, a, n, tol, "output", step);
      free(a);
      free(b);
    }
    for (size_t i = 0; i < mn_graph_num_nodes(g); i++) {
      mn_node_info info;
      mn_graph_node(g, (mn_node)i, &info);
      if (strcmp(info.op, "parameter") != 0) continue;
      size_t n = (size_t)mn_tensor_type_numel(&info.type);
      float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
      cr_assert_eq(mn_session_read_grad(s[0], info.name, a, n), MN_OK);
      cr_assert_eq(mn_session_read_grad(s[1], info.name, b, n), MN_OK);
      assert_agree(b, a, n, tol, info.name, step);
      cr_assert_eq(mn_session_read_param(s[0], info.name, a, n), MN_OK);
      cr_assert_eq(mn_session_read_param(s[1], info.name, b, n), MN_OK);
      assert_agree(b, a, n, tol, info.name, step);
      free(a);
      free(b);
    }
  }
  mn_session_free(s[0]);
  mn_session_free(s[1]);
}

Test(optimize, mlp_sessions_agree) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(16, 12)), t = mn_input(g, "targets", MN_SHAPE(16, 4));
  mn_node h = mn_bias_add(g, mn_matmul_bt(g, x, mn_parameter(g, "fc1.weight", MN_SHAPE(32, 12))),
                          mn_parameter(g, "fc1.bias", MN_SHAPE(32)));
  mn_node logits =
      mn_bias_add(g, mn_matmul_bt(g, mn_relu(g, h), mn_parameter(g, "fc2.weight", MN_SHAPE(4, 32))),
                  mn_parameter(g, "fc2.bias", MN_SHAPE(4)));
  mn_set_outputs(g, (mn_node[]){mn_cross_entropy_loss(g, logits, t), logits}, 2);
  sessions_agree(g, 0); /* no rewrite changes arithmetic here */
  mn_graph_free(g);

  /* The same MLP written the long way: SiLU by hand, a scale of a scale, a double
   * negation and a repeated subexpression, so that rules fire in both stages. */
  g = mn_graph_new();
  x = mn_input(g, "x", MN_SHAPE(16, 12));
  t = mn_input(g, "targets", MN_SHAPE(16, 4));
  h = mn_bias_add(g, mn_matmul_bt(g, x, mn_parameter(g, "fc1.weight", MN_SHAPE(32, 12))),
                  mn_parameter(g, "fc1.bias", MN_SHAPE(32)));
  h = mn_mul(g, mn_neg(g, mn_neg(g, h)), mn_sigmoid(g, h));
  mn_node w2 = mn_parameter(g, "fc2.weight", MN_SHAPE(4, 32));
  logits = mn_bias_add(g, mn_scale(g, mn_scale(g, mn_matmul_bt(g, h, w2), 0.5f), 3.0f),
                       mn_parameter(g, "fc2.bias", MN_SHAPE(4)));
  mn_node again = mn_matmul_bt(g, h, w2);
  mn_set_outputs(g, (mn_node[]){mn_mse_loss(g, mn_add(g, logits, again), t), logits}, 2);
  sessions_agree(g, 1e-6);
  mn_graph_free(g);
}

Test(optimize, transformer_block_sessions_agree) {
  mn_test_block_config c = {.d_model = 16,
                            .num_heads = 2,
                            .num_kv_heads = 1,
                            .head_dim = 8,
                            .d_ff = 24,
                            .rope_theta = 10000.0f,
                            .eps = 1e-5f};
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(2, 5, 16)), t = mn_input(g, "t", MN_SHAPE(2, 5, 16));
  mn_test_block_weights w = mn_test_block_params(g, &c, 0);
  mn_node y = mn_test_block(g, &c, &w, x);
  mn_set_outputs(g, (mn_node[]){mn_mse_loss(g, y, t), y}, 2);
  sessions_agree(g, 1e-6);
  mn_graph_free(g);
}

Test(optimize, conv_block_sessions_agree) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(2, 3, 8, 8)), t = mn_input(g, "t", MN_SHAPE(2, 4, 8, 8));
  mn_node h = mn_conv2d(g, x, mn_parameter(g, "conv1.weight", MN_SHAPE(4, 3, 3, 3)), 1, 1);
  h = mn_add_per_channel(g, h, mn_parameter(g, "conv1.bias", MN_SHAPE(4)));
  h = mn_group_norm(g, h, mn_parameter(g, "norm.weight", MN_SHAPE(4)),
                    mn_parameter(g, "norm.bias", MN_SHAPE(4)), 2, 1e-5f);
  h = mn_mul(g, h, mn_sigmoid(g, h)); /* SiLU by hand: the silu rule fires */
  mn_node y = mn_conv2d(g, h, mn_parameter(g, "conv2.weight", MN_SHAPE(4, 4, 3, 3)), 1, 1);
  mn_set_outputs(g, (mn_node[]){mn_mse_loss(g, y, t), y}, 2);
  sessions_agree(g, 1e-6);
  mn_graph_free(g);
}

/* ---- random pointwise graphs */

enum { PN = 16, GRAPHS = 200 };

typedef struct rnode {
  mn_node id;
  double bound; /* |value| never exceeds it, so exp and mul stay finite */
} rnode;

static rnode pick(mn_rng *r, const rnode *v, int n) {
  /* Prefer recent nodes so that graphs grow deep as well as wide. */
  int i = n - 1 - (int)(mn_rng_uniform(r) * mn_rng_uniform(r) * n);
  return v[i < 0 ? 0 : i];
}

static mn_graph *random_graph(mn_rng *r, int *num_inputs) {
  static const float scales[] = {1, -1, 0.5f, 2, 4, -0.25f};
  mn_graph *g = mn_graph_new();
  rnode v[64];
  int n = 0;
  *num_inputs = 2 + (mn_rng_uniform(r) < 0.5);
  for (int i = 0; i < *num_inputs; i++) {
    char name[16];
    snprintf(name, sizeof name, "in%d", i);
    v[n++] = (rnode){mn_input(g, name, MN_SHAPE(PN)), 1};
  }
  int ops = 3 + (int)(mn_rng_uniform(r) * 14);
  for (int k = 0; k < ops; k++) {
    rnode a = pick(r, v, n), b = pick(r, v, n);
    int kind = (int)(mn_rng_uniform(r) * 12);
    rnode out = a;
    switch (kind) {
    case 0: out = (rnode){mn_add(g, a.id, b.id), a.bound + b.bound}; break;
    case 1:
      out = a.bound * b.bound < 1e4 ? (rnode){mn_mul(g, a.id, b.id), a.bound * b.bound}
                                    : (rnode){mn_tanh(g, a.id), 1};
      break;
    case 2: out = (rnode){mn_neg(g, a.id), a.bound}; break;
    case 3: {
      float s = scales[(int)(mn_rng_uniform(r) * 6)];
      out = (rnode){mn_scale(g, a.id, s), a.bound * fabsf(s)};
      break;
    }
    case 4: out = (rnode){mn_sigmoid(g, a.id), 1}; break;
    case 5:
      out = a.bound < 6 ? (rnode){mn_exp(g, a.id), exp(a.bound)} : (rnode){mn_tanh(g, a.id), 1};
      break;
    case 6: out = (rnode){mn_tanh(g, a.id), 1}; break;
    case 7: out = (rnode){mn_relu(g, a.id), a.bound}; break;
    /* the shapes the rules look for, so that they fire often */
    case 8: out = (rnode){mn_mul(g, a.id, mn_sigmoid(g, a.id)), a.bound}; break;
    case 9: {
      float ones[PN];
      for (int i = 0; i < PN; i++)
        ones[i] = 1;
      out = (rnode){mn_mul(g, mn_constant(g, ones, MN_SHAPE(PN)), a.id), a.bound};
      break;
    }
    case 10: {
      float zeros[PN] = {0};
      out = (rnode){mn_add(g, a.id, mn_constant(g, zeros, MN_SHAPE(PN))), a.bound};
      break;
    }
    default: out = (rnode){mn_neg(g, mn_neg(g, a.id)), a.bound}; break;
    }
    if (n < 64) v[n++] = out;
  }
  rnode extra = pick(r, v, n);
  if (extra.id != v[n - 1].id && mn_rng_uniform(r) < 0.5)
    mn_set_outputs(g, (mn_node[]){v[n - 1].id, extra.id}, 2);
  else
    mn_set_outputs(g, &v[n - 1].id, 1);
  cr_assert_eq(mn_graph_status(g), MN_OK, "%s", mn_graph_error(g));
  return g;
}

static float **run_outputs(const mn_graph *g, bool optimize, int num_inputs, uint64_t seed,
                           size_t *dispatches) {
  mn_session_options o = mn_test_cpu_options(optimize);
  mn_session *s = NULL;
  cr_assert_eq(mn_build_inference_session(g, &o, &s), MN_OK, "%s", mn_last_error());
  mn_rng r = mn_rng_new(seed);
  for (int i = 0; i < num_inputs; i++) {
    char name[16];
    float x[PN];
    snprintf(name, sizeof name, "in%d", i);
    mn_rng_fill(&r, x, PN, -1, 1);
    cr_assert_eq(mn_session_set_input(s, name, x, PN), MN_OK);
  }
  cr_assert_eq(mn_session_step(s), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_wait(s), MN_OK, "%s", mn_last_error());
  float **outs = calloc(2, sizeof *outs);
  for (size_t k = 0; k < mn_session_num_outputs(s); k++)
    outs[k] = mn_test_read_output(s, k, PN);
  *dispatches = mn_plan_num_dispatches(mn_session_plan(s));
  mn_session_free(s);
  return outs;
}

Test(optimize, random_pointwise_graphs) {
  mn_rng r = mn_rng_new(2024);
  size_t before = 0, after = 0;
  for (int i = 0; i < GRAPHS; i++) {
    int inputs;
    mn_graph *g = random_graph(&r, &inputs);
    size_t d0, d1;
    float **ref = run_outputs(g, false, inputs, (uint64_t)i + 1, &d0);
    float **opt = run_outputs(g, true, inputs, (uint64_t)i + 1, &d1);
    before += d0;
    after += d1;
    cr_assert_leq(d1, d0, "graph %d: %zu dispatches optimized, %zu not", i, d1, d0);
    for (int k = 0; k < 2 && ref[k]; k++) {
      double rel = mn_test_rel_err(opt[k], ref[k], PN);
      double diff = mn_test_max_abs_diff(opt[k], ref[k], PN);
      cr_assert(rel <= 1e-6 || diff <= 1e-6, "graph %d output %d: relative error %g", i, k, rel);
    }
    for (int k = 0; k < 2; k++) {
      free(ref[k]);
      free(opt[k]);
    }
    free(ref);
    free(opt);
    mn_graph_free(g);
  }
  cr_assert_lt(after, before, "the rules removed work: %zu -> %zu dispatches", before, after);
}

/* ---- limits */

/* x scaled 400 times by distinct factors, under a tanh: scale-scale derives a node for
 * every pair of chain positions, quadratically many, until the node limit. */
static mn_graph *scale_chain(void) {
  mn_graph *g = mn_graph_new();
  mn_node h = mn_input(g, "x", MN_SHAPE(PN));
  for (int i = 0; i < 400; i++)
    h = mn_scale(g, h, 1.0f + (float)(i % 13 + 1) / 4096.0f);
  mn_set_outputs(g, (mn_node[]){mn_tanh(g, h)}, 1);
  return g;
}

static void limited(const mn_optimize_limits *lim, mn_optimize_stage_report *out) {
  mn_graph *g = scale_chain();
  mn_graph *c = mn_graph_clone(g);
  mn_optimize_report *r = mn_optimize_report_new();
  mn_session_options o = mn_test_cpu_options(true);
  cr_assert_eq(mn_optimize_graph_limits("test", &c, &o, MN_OPTIMIZE_FORWARD, lim, r), MN_OK);
  *out = r->stage[MN_OPTIMIZE_FORWARD];
  cr_assert(!out->fell_back);
  /* The extracted graph, run as is, computes what the chain computes. */
  float x[PN];
  mn_rng rng = mn_rng_new(9);
  mn_rng_fill(&rng, x, PN, -1, 1);
  mn_test_feed f = {.name = "x", .data = x, .n = PN};
  mn_session *s0 = mn_test_run(g, &f, 1), *s1 = NULL;
  mn_session_options off = mn_test_cpu_options(false);
  cr_assert_eq(mn_build_inference_session(c, &off, &s1), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_set_input(s1, "x", x, PN), MN_OK);
  cr_assert_eq(mn_session_step(s1), MN_OK);
  cr_assert_eq(mn_session_wait(s1), MN_OK);
  float *a = mn_test_read_output(s0, 0, PN), *b = mn_test_read_output(s1, 0, PN);
  /* Products of the factors are rounded in another order: a few ulps over 400 steps. */
  mn_assert_close(b, a, PN, 1e-5);
  cr_assert_leq(mn_plan_num_dispatches(mn_session_plan(s1)), 401);
  free(a);
  free(b);
  mn_session_free(s0);
  mn_session_free(s1);
  mn_optimize_report_free(r);
  mn_graph_free(c);
  mn_graph_free(g);
}

Test(optimize, node_limit_stops_blowup) {
  mn_optimize_stage_report s;
  limited(&(mn_optimize_limits){.max_nodes = 3000}, &s);
  cr_assert(s.hit_node_limit);
  cr_assert(!s.saturated);
  cr_assert_leq(s.enodes, 3000 + 8, "%zu e-nodes", s.enodes);
  cr_assert_lt(s.dispatches_after, s.dispatches_before);
  limited(NULL, &s); /* the default limit (20 per node) holds as well */
  cr_assert(s.hit_node_limit || s.hit_time_limit);
  cr_assert_leq(s.enodes, 20 * 402 + 8);
}

Test(optimize, time_and_iteration_limits) {
  mn_optimize_stage_report s;
  limited(&(mn_optimize_limits){.max_ms = 1e-6}, &s);
  cr_assert(s.hit_time_limit);
  cr_assert_eq(s.iterations, 1);
  limited(&(mn_optimize_limits){.max_iterations = 2}, &s);
  cr_assert(s.hit_iteration_limit);
  cr_assert_eq(s.iterations, 2);
}

/* ---- the report */

/* neg-neg once, silu twice (one through a repeated subexpression), one repeat merged. */
static mn_graph *report_graph(void) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(4, 8)), t = mn_input(g, "t", MN_SHAPE(4, 8));
  mn_node a = mn_neg(g, mn_neg(g, mn_bias_add(g, x, mn_parameter(g, "b", MN_SHAPE(8)))));
  mn_node e1 = mn_exp(g, mn_mul(g, a, mn_sigmoid(g, a))),
          e2 = mn_exp(g, mn_mul(g, a, mn_sigmoid(g, a)));
  mn_node y = mn_mul(g, mn_sigmoid(g, e1), e2);
  mn_set_outputs(g, (mn_node[]){mn_mse_loss(g, y, t)}, 1);
  return g;
}

Test(optimize, report_counts_what_fired) {
  mn_graph *g = report_graph();
  mn_session_options o = mn_test_cpu_options(true);
  mn_session *s = NULL;
  mn_optimize_report *r = NULL;
  cr_assert_eq(mn_build_session_with_report(g, &o, &s, &r), MN_OK, "%s", mn_last_error());
  cr_assert_not_null(r);
  const mn_optimize_stage_report *f = &r->stage[MN_OPTIMIZE_FORWARD],
                                 *u = &r->stage[MN_OPTIMIZE_FULL];
  cr_assert(f->ran && f->optimized && u->ran && u->optimized);
  cr_assert_eq(mn_optimize_report_fired(r, MN_OPTIMIZE_FORWARD, "neg-neg"), 1);
  cr_assert_eq(mn_optimize_report_fired(r, MN_OPTIMIZE_FORWARD, "silu"), 2);
  cr_assert_eq(mn_optimize_report_fired(r, MN_OPTIMIZE_FORWARD, "cse"), 3, "sigmoid, mul, exp");
  cr_assert_eq(mn_optimize_report_fired(r, MN_OPTIMIZE_FORWARD, "swiglu"), 0);
  cr_assert_eq(mn_optimize_report_fired(r, MN_OPTIMIZE_FORWARD, "no-such-rule"), 0);
  cr_assert_eq(f->fusions, 0);
  /* x, t, b, bias_add, neg, neg, 2 x (sigmoid, mul, exp), sigmoid, mul, mse: 15 nodes
   * become x, t, b, bias_add, silu, exp, silu, mse. */
  cr_assert_eq(f->nodes_before, 15);
  cr_assert_eq(f->nodes_after, 8);
  cr_assert_eq(f->dispatches_before, 12);
  cr_assert_eq(f->dispatches_after, 5);
  cr_assert_geq(f->eclasses, f->nodes_after);
  cr_assert_geq(f->enodes, f->eclasses);
  cr_assert(f->saturated);
  cr_assert_gt(f->cost_before, f->cost_after);
  cr_assert_geq(u->nodes_before, u->nodes_after);
  cr_assert_eq(r->plan_dispatches, mn_plan_num_dispatches(mn_session_plan(s)));
  cr_assert_eq(r->plan_buffers, mn_plan_num_buffers(mn_session_plan(s)));
  cr_assert(f->saturation_ms >= 0 && f->extraction_ms >= 0 && f->total_ms >= f->saturation_ms);
  cr_assert_leq(r->lower_ms, r->build_ms);

  size_t need = mn_optimize_report_format(r, NULL, 0);
  char *text = malloc(need + 1);
  cr_assert_eq(mn_optimize_report_format(r, text, need + 1), need);
  cr_assert_eq(strlen(text), need);
  static const char *const parts[] = {"forward graph: 15 -> 8 nodes",
                                      "12 -> 5 dispatches",
                                      "neg-neg 1",
                                      "silu 2",
                                      "cse 3",
                                      "dead-code 0",
                                      "fusions applied: 0",
                                      "multi-output fusions: 0",
                                      "sibling groups: 0",
                                      "full graph:",
                                      "saturation",
                                      "extraction",
                                      "lower/plan",
                                      "whole build"};
  for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
    cr_assert(strstr(text, parts[i]), "report lacks \"%s\":\n%s", parts[i], text);
  char small[10];
  cr_assert_eq(mn_optimize_report_format(r, small, sizeof small), need, "snprintf semantics");
  cr_assert_eq(strlen(small), sizeof small - 1);
  cr_assert(strncmp(small, text, sizeof small - 1) == 0);
  free(text);
  mn_optimize_report_free(r);
  mn_session_free(s);
  mn_graph_free(g);
}

Test(optimize, report_with_optimizer_off_and_errors) {
  mn_graph *g = report_graph();
  mn_session_options o = mn_test_cpu_options(false);
  mn_session *s = NULL;
  mn_optimize_report *r = NULL;
  cr_assert_eq(mn_build_session_with_report(g, &o, &s, &r), MN_OK, "%s", mn_last_error());
  cr_assert(r->stage[MN_OPTIMIZE_FORWARD].ran && !r->stage[MN_OPTIMIZE_FORWARD].optimized);
  cr_assert_eq(r->stage[MN_OPTIMIZE_FORWARD].nodes_after, 15);
  char text[2048];
  mn_optimize_report_format(r, text, sizeof text);
  cr_assert(strstr(text, "optimizer off"), "%s", text);
  mn_optimize_report_free(r);
  mn_session_free(s);

  /* No report wanted: a plain build. */
  cr_assert_eq(mn_build_session_with_report(g, &o, &s, NULL), MN_OK);
  mn_session_free(s);

  r = (mn_optimize_report *)1;
  mn_assert_error(mn_build_session_with_report(NULL, &o, &s, &r), MN_ERR_INVALID_ARGUMENT,
                  "mn_build_session_with_report: graph is NULL");
  cr_assert_null(r);
  cr_assert_null(s);
  mn_graph *empty = mn_graph_new();
  mn_assert_error(mn_build_session_with_report(empty, &o, &s, &r), MN_ERR_INVALID_ARGUMENT,
                  "no outputs");
  cr_assert_null(r);
  mn_graph_free(empty);

  mn_optimize_report_free(NULL);
  cr_assert_eq(mn_optimize_report_format(NULL, text, sizeof text), strlen(text));
  cr_assert_str_eq(text, "(no optimizer report)");
  mn_graph_free(g);
}
