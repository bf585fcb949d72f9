/* Multi-output nodes: a node that writes values besides its own, each read through an
 * extra_output node that owns the buffer (host/plan.h). The plan refuses a graph where
 * an extra value has no reader or two, the memory planner keeps an extra value alive from
 * the producer's dispatch on, and the CPU backend computes what the separate ops compute. */
#include <stdlib.h>

#include "host/plan.h"
#include "session/session.h"
#include "tests/support/mn_test.h"

enum { K = 6, M = 5, N = 7 };

static mn_node raw(mn_graph *g, mn_op op, const mn_node *ins, int n, const int64_t *shape, int rank,
                   int variant) {
  mn_tensor_type t = mn_type_make(MN_F32, shape, rank);
  mn_op_attrs a = {.variant = variant};
  mn_node id = mn_graph_append(g, op, ins, n, &t, &a, NULL);
  cr_assert_neq(id, MN_NO_NODE);
  return id;
}

static mn_session *run(const mn_graph *g, const float *a, const float *b) {
  mn_session_options o = mn_session_options_default();
  o.backend = MN_BACKEND_CPU;
  o.optimize = false;
  mn_session *s = NULL;
  cr_assert_eq(mn_build_inference_session(g, &o, &s), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_set_input(s, "a", a, K * M), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_set_input(s, "b", b, K * N), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_step(s), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_wait(s), MN_OK, "%s", mn_last_error());
  return s;
}

/* The product through relu'd operands, so that every buffer is a planned activation. */
static void operands(mn_graph *g, mn_node *a, mn_node *b) {
  *a = mn_relu(g, mn_input(g, "a", MN_SHAPE(K, M)));
  *b = mn_tanh(g, mn_input(g, "b", MN_SHAPE(K, N)));
}

static void expect_same(mn_session *x, mn_session *y, size_t index, size_t n) {
  float *p = mn_test_read_output(x, index, n), *q = mn_test_read_output(y, index, n);
  cr_assert(memcmp(p, q, n * sizeof *p) == 0, "output %zu differs", index);
  free(p);
  free(q);
}

Test(multi_output, bias_gradient_matches_matmul_at_and_sum_rows) {
  mn_rng rng = mn_rng_new(3);
  float a[K * M], b[K * N];
  mn_rng_fill(&rng, a, K * M, -2, 2);
  mn_rng_fill(&rng, b, K * N, -2, 2);
  for (int of_b = 0; of_b < 2; of_b++) {
    int64_t cols = of_b ? N : M;
    mn_graph *sep = mn_graph_new();
    mn_node x, y;
    operands(sep, &x, &y);
    mn_node summed = of_b ? y : x;
    mn_node outs[2] = {mn_matmul_at(sep, x, y), raw(sep, MN_OP_SUM_ROWS, &summed, 1, &cols, 1, 0)};
    mn_set_outputs(sep, outs, 2);
    cr_assert_eq(mn_graph_status(sep), MN_OK, "%s", mn_graph_error(sep));

    mn_graph *fused = mn_graph_new();
    operands(fused, &x, &y);
    mn_node ins[2] = {x, y};
    mn_node p = raw(fused, MN_OP_MATMUL_AT_BGRAD, ins, 2, (int64_t[]){M, N}, 2, of_b);
    /* An op between producer and reader, so the extra value must outlive it. */
    mn_node later = mn_exp(fused, p);
    mn_node sums = raw(fused, MN_OP_EXTRA_OUTPUT, &p, 1, &cols, 1, 1);
    mn_node fouts[3] = {p, sums, later};
    mn_set_outputs(fused, fouts, 3);
    cr_assert_eq(mn_graph_status(fused), MN_OK, "%s", mn_graph_error(fused));

    mn_session *s0 = run(sep, a, b), *s1 = run(fused, a, b);
    const mn_plan *plan = mn_session_plan(s1);
    cr_assert_eq(mn_plan_num_dispatches(plan), 4, "relu, tanh, the product and exp");
    expect_same(s0, s1, 0, M * N);
    expect_same(s0, s1, 1, (size_t)cols);
    mn_session_free(s0);
    mn_session_free(s1);
    mn_graph_free(sep);
    mn_graph_free(fused);
  }
}

/* The extra value is written by the producer's dispatch: its memory may not be shared with
 * anything live from that dispatch to its last reader, the producer's inputs included. */
Test(multi_output, extra_value_lives_from_its_producer) {
  mn_graph *g = mn_graph_new();
  mn_node x, y;
  operands(g, &x, &y);
  mn_node ins[2] = {x, y};
  mn_node p = raw(g, MN_OP_MATMUL_AT_BGRAD, ins, 2, (int64_t[]){M, N}, 2, 0);
  mn_node after = mn_exp(g, mn_exp(g, p));
  mn_node sums = raw(g, MN_OP_EXTRA_OUTPUT, &p, 1, (int64_t[]){M}, 1, 1);
  mn_node used = mn_scale(g, sums, 2.0f);
  mn_node outs[2] = {after, used};
  mn_set_outputs(g, outs, 2);
  mn_session *s = NULL;
  mn_session_options o = mn_session_options_default();
  o.backend = MN_BACKEND_CPU;
  o.optimize = false;
  cr_assert_eq(mn_build_inference_session(g, &o, &s), MN_OK, "%s", mn_last_error());
  const mn_plan *plan = mn_session_plan(s);
  const mn_graph *pg = plan->graph;
  mn_node extra = MN_NO_NODE;
  for (size_t i = 0; i < pg->num_nodes; i++)
    if (pg->nodes[i].op == MN_OP_EXTRA_OUTPUT) extra = (mn_node)i;
  cr_assert_neq(extra, MN_NO_NODE);
  const mn_buffer_desc *e = mn_plan_buffer_of(plan, extra);
  for (size_t i = 0; i < pg->num_nodes; i++) {
    mn_op op = pg->nodes[i].op;
    if (i == extra || op == MN_OP_INPUT || op == MN_OP_SCALE) continue;
    /* everything else is live at some dispatch from the producer's to the scale's */
    const mn_buffer_desc *o2 = mn_plan_buffer_of(plan, (mn_node)i);
    bool apart = o2->offset >= e->offset + e->bytes || e->offset >= o2->offset + o2->bytes;
    cr_assert(apart, "node %zu (%s) shares memory with the extra value", i, mn_op_name(op));
  }
  cr_assert_eq(mn_plan_extra_output(plan, pg->nodes[extra].inputs[0], 1), extra);
  mn_session_free(s);
  mn_graph_free(g);
}

/* Every extra_output node and the last node are outputs: the build drops unreachable nodes. */
static void expect_refused(mn_graph *g, const char *fragment) {
  mn_node outs[4];
  size_t n = 0;
  for (size_t i = 0; i + 1 < g->num_nodes; i++)
    if (g->nodes[i].op == MN_OP_EXTRA_OUTPUT) outs[n++] = (mn_node)i;
  outs[n++] = (mn_node)(g->num_nodes - 1);
  mn_set_outputs(g, outs, n);
  cr_assert_eq(mn_graph_status(g), MN_OK, "%s", mn_graph_error(g));
  mn_session_options o = mn_session_options_default();
  o.backend = MN_BACKEND_CPU;
  o.optimize = false;
  mn_session *s = NULL;
  mn_assert_error(mn_build_inference_session(g, &o, &s), MN_ERR_STATE, fragment);
  cr_assert_null(s);
  mn_graph_free(g);
}

Test(multi_output, plan_refuses_unread_or_doubly_read_values) {
  mn_graph *g = mn_graph_new(); /* no extra_output for value 1 */
  mn_node x, y;
  operands(g, &x, &y);
  raw(g, MN_OP_MATMUL_AT_BGRAD, (mn_node[]){x, y}, 2, (int64_t[]){M, N}, 2, 0);
  expect_refused(g, "has no extra_output");

  g = mn_graph_new(); /* read twice */
  operands(g, &x, &y);
  mn_node p = raw(g, MN_OP_MATMUL_AT_BGRAD, (mn_node[]){x, y}, 2, (int64_t[]){M, N}, 2, 0);
  raw(g, MN_OP_EXTRA_OUTPUT, &p, 1, (int64_t[]){M}, 1, 1);
  raw(g, MN_OP_EXTRA_OUTPUT, &p, 1, (int64_t[]){M}, 1, 1);
  expect_refused(g, "is read twice");

  g = mn_graph_new(); /* a value the producer does not write */
  operands(g, &x, &y);
  p = raw(g, MN_OP_MATMUL_AT_BGRAD, (mn_node[]){x, y}, 2, (int64_t[]){M, N}, 2, 0);
  raw(g, MN_OP_EXTRA_OUTPUT, &p, 1, (int64_t[]){M}, 1, 1);
  raw(g, MN_OP_EXTRA_OUTPUT, &p, 1, (int64_t[]){M}, 1, 2);
  expect_refused(g, "reads no extra value");

  g = mn_graph_new(); /* a producer that writes one value only */
  operands(g, &x, &y);
  mn_node one = mn_exp(g, x);
  raw(g, MN_OP_EXTRA_OUTPUT, &one, 1, (int64_t[]){K, M}, 2, 1);
  expect_refused(g, "reads no extra value");
}

/* A plan may come from a cache file whose checksum anyone can recompute: types that the
 * kernels would overrun are refused (host/plan_check.c). */
Test(multi_output, plan_refuses_types_the_kernels_cannot_take) {
  mn_graph *g = mn_graph_new(); /* a bias gradient of the wrong length */
  mn_node x, y;
  operands(g, &x, &y);
  mn_node p = raw(g, MN_OP_MATMUL_AT_BGRAD, (mn_node[]){x, y}, 2, (int64_t[]){M, N}, 2, 1);
  raw(g, MN_OP_EXTRA_OUTPUT, &p, 1, (int64_t[]){1}, 1, 1);
  expect_refused(g, "does not have the type of value 1");

  g = mn_graph_new(); /* a product whose operands do not share K */
  operands(g, &x, &y);
  mn_node q = mn_relu(g, mn_input(g, "c", MN_SHAPE(K + 1, N)));
  p = raw(g, MN_OP_MATMUL_AT_BGRAD, (mn_node[]){x, q}, 2, (int64_t[]){M, N}, 2, 1);
  raw(g, MN_OP_EXTRA_OUTPUT, &p, 1, (int64_t[]){N}, 1, 1);
  expect_refused(g, "has types its kernel cannot take");

  g = mn_graph_new(); /* a bias of the wrong length */
  mn_node a = mn_input(g, "a", MN_SHAPE(M, K)), w = mn_input(g, "w", MN_SHAPE(K, N));
  mn_node bias = mn_input(g, "bias", MN_SHAPE(N - 1));
  raw(g, MN_OP_MATMUL_BIAS_ACT, (mn_node[]){a, w, bias}, 3, (int64_t[]){M, N}, 2, 0);
  expect_refused(g, "has types its kernel cannot take");

  g = mn_graph_new(); /* a pre-activation of another shape */
  a = mn_input(g, "a", MN_SHAPE(M, K));
  w = mn_input(g, "w", MN_SHAPE(N, K));
  mn_node pre = mn_input(g, "pre", MN_SHAPE(M, N + 1));
  raw(g, MN_OP_MATMUL_DGELU, (mn_node[]){a, w, pre}, 3, (int64_t[]){M, N}, 2, 1);
  expect_refused(g, "has types its kernel cannot take");

  g = mn_graph_new(); /* a ReLU input of another shape */
  a = mn_input(g, "a", MN_SHAPE(M, K));
  w = mn_input(g, "w", MN_SHAPE(K, N));
  mn_node gate = mn_input(g, "x", MN_SHAPE(M + 1, N));
  raw(g, MN_OP_MATMUL_DRELU, (mn_node[]){a, w, gate}, 3, (int64_t[]){M, N}, 2, 0);
  expect_refused(g, "has types its kernel cannot take");

  g = mn_graph_new(); /* matmul_drelu_bgrad: sums of the wrong length */
  a = mn_input(g, "a", MN_SHAPE(M, K));
  w = mn_input(g, "w", MN_SHAPE(K, N));
  gate = mn_input(g, "x", MN_SHAPE(M, N));
  p = raw(g, MN_OP_MATMUL_DRELU_BGRAD, (mn_node[]){a, w, gate}, 3, (int64_t[]){M, N}, 2, 0);
  raw(g, MN_OP_EXTRA_OUTPUT, &p, 1, (int64_t[]){N + 1}, 1, 1);
  expect_refused(g, "does not have the type of value 1");

  g = mn_graph_new(); /* matmul_drelu_bgrad: a ReLU input of another shape */
  a = mn_input(g, "a", MN_SHAPE(M, K));
  w = mn_input(g, "w", MN_SHAPE(K, N));
  gate = mn_input(g, "x", MN_SHAPE(M, N + 1));
  p = raw(g, MN_OP_MATMUL_DRELU_BGRAD, (mn_node[]){a, w, gate}, 3, (int64_t[]){M, N}, 2, 0);
  raw(g, MN_OP_EXTRA_OUTPUT, &p, 1, (int64_t[]){N}, 1, 1);
  expect_refused(g, "has types its kernel cannot take");

  g = mn_graph_new(); /* matmul_drelu_bgrad writes no value 2 (gelu_grad_bgrad's gelu(x)) */
  a = mn_input(g, "a", MN_SHAPE(M, K));
  w = mn_input(g, "w", MN_SHAPE(K, N));
  gate = mn_input(g, "x", MN_SHAPE(M, N));
  p = raw(g, MN_OP_MATMUL_DRELU_BGRAD, (mn_node[]){a, w, gate}, 3, (int64_t[]){M, N}, 2, 0);
  raw(g, MN_OP_EXTRA_OUTPUT, &p, 1, (int64_t[]){N}, 1, 1);
  raw(g, MN_OP_EXTRA_OUTPUT, &p, 1, (int64_t[]){M, N}, 2, 2);
  expect_refused(g, "reads no extra value");
}

/* matmul_drelu_bgrad on the CPU: value 0 is relu_grad(x, a b) and value 1 its column sums. */
Test(multi_output, matmul_drelu_bgrad_values_on_the_cpu) {
  mn_graph *g = mn_graph_new();
  mn_node a = mn_input(g, "a", MN_SHAPE(M, K)), w = mn_input(g, "w", MN_SHAPE(K, N));
  mn_node gate = mn_input(g, "x", MN_SHAPE(M, N));
  mn_node p = raw(g, MN_OP_MATMUL_DRELU_BGRAD, (mn_node[]){a, w, gate}, 3, (int64_t[]){M, N}, 2, 0);
  mn_node sums = raw(g, MN_OP_EXTRA_OUTPUT, &p, 1, (int64_t[]){N}, 1, 1);
  mn_set_outputs(g, (mn_node[]){p, sums}, 2);
  mn_session_options o = mn_session_options_default();
  o.backend = MN_BACKEND_CPU;
  o.optimize = false;
  mn_session *s = NULL;
  cr_assert_eq(mn_build_inference_session(g, &o, &s), MN_OK, "%s", mn_last_error());
  float va[M * K], vw[K * N], vx[M * N], got[M * N], got_sums[N];
  mn_rng r = mn_rng_new(3);
  mn_rng_fill(&r, va, M * K, -1, 1);
  mn_rng_fill(&r, vw, K * N, -1, 1);
  mn_rng_fill(&r, vx, M * N, -1, 1);
  cr_assert_eq(mn_session_set_input(s, "a", va, M * K), MN_OK);
  cr_assert_eq(mn_session_set_input(s, "w", vw, K * N), MN_OK);
  cr_assert_eq(mn_session_set_input(s, "x", vx, M * N), MN_OK);
  cr_assert_eq(mn_session_step(s), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_wait(s), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_read_output_by_index(s, 0, got, M * N), MN_OK);
  cr_assert_eq(mn_session_read_output_by_index(s, 1, got_sums, N), MN_OK);
  for (int j = 0; j < N; j++) {
    double col = 0;
    for (int i = 0; i < M; i++) {
      double prod = 0;
      for (int k = 0; k < K; k++)
        prod += (double)va[i * K + k] * vw[k * N + j];
      float want = vx[i * N + j] > 0 ? (float)prod : 0.0f;
      cr_assert_float_eq(got[i * N + j], want, 1e-5f, "[%d, %d]", i, j);
      col += got[i * N + j];
    }
    cr_assert_float_eq(got_sums[j], (float)col, 1e-5f, "sum of column %d", j);
  }
  mn_session_free(s);
  mn_graph_free(g);
}
