/* Pointwise fusion (optimizer/fusion.h): groups form where they should (chains, diamonds,
 * gradient chains of training graphs, values read outside the group written as extra values)
 * and not where they must not (another shape, U32, a non-pointwise op between, a path that
 * leaves a group and comes back, more than MN_MAX_EXTRA_OUTPUTS values leaving); fused
 * sessions compute bit for bit what unfused ones do (MLP, transformer block, conv block over
 * three AdamW steps; random graphs in test_fusion_random.c; reductions in
 * test_fusion_reduce.c); the report counts the fused nodes; the plan cache keeps them; and
 * every fused graph's CUDA kernels compile (NVRTC, no device needed) and, with a device, agree
 * with the CPU. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "io/plan_cache.h"
#include "optimizer/cost.h"
#include "optimizer/optimize.h"
#include "optimizer/report.h"
#include "session/session.h"
#include "tests/support/cuda_check.h"
#include "tests/support/fusion_check.h"
#include "tests/support/graph_check.h"
#include "tests/support/mn_test.h"
#include "tests/support/models.h"
#include "tests/support/session_util.h"
#include "tests/support/tmp_dir.h"

enum { STEPS = 3 };

static size_t count_pointwise(const mn_graph *g) {
  size_t n = 0;
  for (size_t i = 0; i < g->num_nodes; i++)
    n += (mn_op_flags(g->nodes[i].op) & MN_OPF_POINTWISE) && g->nodes[i].op != MN_OP_FUSED;
  return n;
}

/* The i-th fused node of g (in node order). */
static const mn_node_rec *fused_at(const mn_graph *g, size_t i) {
  for (size_t k = 0; k < g->num_nodes; k++)
    if (g->nodes[k].op == MN_OP_FUSED && i-- == 0) return &g->nodes[k];
  cr_assert_fail("no fused node %zu", i);
  return NULL;
}

/* Asserts the lowered inference graph of g has `fused` fused nodes holding `instrs` ops in
 * all and `left` pointwise ops outside them. */
static void expect_groups(mn_graph *g, size_t fused, int instrs, size_t left) {
  cr_assert_eq(mn_graph_status(g), MN_OK, "%s", mn_graph_error(g));
  mn_plan *p = mn_fz_lower(g, false);
  const mn_graph *lg = p->graph;
  cr_assert_eq(mn_fz_count_op(lg, MN_OP_FUSED), fused, "%zu fused nodes, expected %zu",
               mn_fz_count_op(lg, MN_OP_FUSED), fused);
  int total = 0;
  for (size_t i = 0; i < fused; i++) {
    const mn_node_rec *f = fused_at(lg, i);
    char why[128] = "";
    cr_assert(mn_fused_prog_check(f->fused, f->num_inputs, why, sizeof why), "%s", why);
    cr_assert_leq(f->num_inputs, MN_MAX_INPUTS);
    total += f->fused->num_instrs;
  }
  cr_assert_eq(total, instrs, "%d fused ops, expected %d", total, instrs);
  cr_assert_eq(count_pointwise(lg), left, "%zu pointwise ops left, expected %zu",
               count_pointwise(lg), left);
  mn_plan_free(p);
}

/* Fused nodes in the lowered training graph of g. */
static size_t training_fusions(const mn_graph *g) {
  mn_plan *p = mn_fz_lower(g, true);
  size_t n = mn_fz_count_op(p->graph, MN_OP_FUSED);
  mn_plan_free(p);
  return n;
}

/* ---------------------------------------------------------------- models */

static mn_graph *mlp(void) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(8, 12)), t = mn_input(g, "t", MN_SHAPE(8, 4));
  mn_node h = mn_bias_add(g, mn_matmul(g, x, mn_parameter(g, "w1", MN_SHAPE(12, 16))),
                          mn_parameter(g, "b1", MN_SHAPE(16)));
  h = mn_gelu(g, mn_scale(g, mn_relu(g, h), 0.5f));
  mn_node y = mn_bias_add(g, mn_matmul(g, h, mn_parameter(g, "w2", MN_SHAPE(16, 4))),
                          mn_parameter(g, "b2", MN_SHAPE(4)));
  mn_set_outputs(g, (mn_node[]){mn_mse_loss(g, mn_tanh(g, y), t), h}, 2);
  cr_assert_eq(mn_graph_status(g), MN_OK, "%s", mn_graph_error(g));
  return g;
}

static mn_graph *block(int64_t batch) {
  const mn_test_block_config *c = &mn_test_tiny_block;
  mn_graph *g = mn_graph_new();
  mn_node h = batch ? mn_input(g, "h", MN_SHAPE(batch, 5, c->d_model))
                    : mn_input(g, "h", MN_SHAPE(6, c->d_model));
  mn_node target = batch ? mn_input(g, "target", MN_SHAPE(batch, 5, c->d_model))
                         : mn_input(g, "target", MN_SHAPE(6, c->d_model));
  mn_test_block_weights w = mn_test_block_params(g, c, 0);
  mn_node out = mn_test_block(g, c, &w, h);
  mn_set_outputs(g, (mn_node[]){mn_mse_loss(g, out, target)}, 1);
  cr_assert_eq(mn_graph_status(g), MN_OK, "%s", mn_graph_error(g));
  return g;
}

/* conv -> group_norm -> silu -> conv, a scaled residual and a gated output. */
static mn_graph *conv_block(void) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(2, 4, 6, 6)), t = mn_input(g, "t", MN_SHAPE(2, 4, 6, 6));
  mn_node k1 = mn_parameter(g, "conv1.weight", MN_SHAPE(4, 4, 3, 3));
  mn_node k2 = mn_parameter(g, "conv2.weight", MN_SHAPE(4, 4, 3, 3));
  mn_node h = mn_conv2d(g, x, k1, 1, 1);
  h = mn_group_norm(g, h, mn_parameter(g, "norm.weight", MN_SHAPE(4)),
                    mn_parameter(g, "norm.bias", MN_SHAPE(4)), 2, 1e-5f);
  h = mn_conv2d(g, mn_silu(g, h), k2, 1, 1);
  h = mn_add_per_channel(g, h, mn_parameter(g, "conv2.bias", MN_SHAPE(4)));
  mn_node y = mn_add(g, x, mn_scale(g, h, 0.5f));
  y = mn_mul(g, mn_sigmoid(g, y), mn_tanh(g, y));
  mn_set_outputs(g, (mn_node[]){mn_mse_loss(g, y, t)}, 1);
  cr_assert_eq(mn_graph_status(g), MN_OK, "%s", mn_graph_error(g));
  return g;
}

/* ---------------------------------------------------------------- where groups form */

/* A node past the builders' checks, so that shapes or dtypes can disagree. */
static mn_node raw(mn_graph *g, mn_op op, mn_node in, mn_dtype dt, const int64_t *shape, int rank) {
  mn_tensor_type t = mn_type_make(dt, shape, rank);
  mn_node id = mn_graph_append(g, op, &in, 1, &t, NULL, NULL);
  cr_assert_neq(id, MN_NO_NODE);
  return id;
}

Test(fusion, chain_becomes_one_node) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(4, 9));
  MN_TEST_OUTPUTS(g, mn_exp(g, mn_scale(g, mn_tanh(g, mn_relu(g, x)), 0.5f)));
  expect_groups(g, 1, 4, 0);
  mn_fz_agree_inference(g, MN_FZ_UNOPTIMIZED, 1, -2, 2);
  mn_graph_free(g);
}

Test(fusion, diamond_inside_a_group) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(5, 8)), w = mn_input(g, "w", MN_SHAPE(5, 8));
  mn_node a = mn_mul(g, x, w);
  MN_TEST_OUTPUTS(g, mn_add(g, mn_relu(g, a), mn_gelu(g, a)));
  expect_groups(g, 1, 4, 0);
  mn_plan *p = mn_fz_lower(g, false);
  cr_assert_eq(fused_at(p->graph, 0)->num_inputs, 2, "x and w, each read once");
  mn_plan_free(p);
  mn_fz_agree_inference(g, MN_FZ_UNOPTIMIZED, 2, -2, 2);
  mn_graph_free(g);
}

/* The extra_output node of g that reads value k of node `of`, or MN_NO_NODE. */
static mn_node extra_of(const mn_graph *g, mn_node of, int k) {
  for (size_t i = 0; i < g->num_nodes; i++)
    if (g->nodes[i].op == MN_OP_EXTRA_OUTPUT && g->nodes[i].inputs[0] == of &&
        g->nodes[i].attrs.variant == k)
      return (mn_node)i;
  return MN_NO_NODE;
}

static mn_node fused_id(const mn_graph *g, size_t i) {
  return (mn_node)(fused_at(g, i) - g->nodes);
}

Test(fusion, intermediate_output_becomes_an_extra_value) {
  mn_graph *g = mn_graph_new();
  mn_node a = mn_tanh(g, mn_input(g, "x", MN_SHAPE(16)));
  MN_TEST_OUTPUTS(g, mn_relu(g, mn_exp(g, a)), a);
  expect_groups(g, 1, 3, 0); /* tanh, exp, relu; tanh also written out */
  mn_plan *p = mn_fz_lower(g, false);
  const mn_graph *lg = p->graph;
  mn_node f = fused_id(lg, 0);
  const mn_fused_prog *prog = lg->nodes[f].fused;
  cr_assert_eq(prog->instrs[0].op, MN_OP_TANH);
  cr_assert_eq(prog->instrs[0].out, 1);
  cr_assert_eq(prog->instrs[2].out, 0, "the last result is the node's own value");
  cr_assert_eq(mn_node_num_extra_outputs(&lg->nodes[f]), 1);
  cr_assert_eq(lg->outputs[0], f);
  cr_assert_eq(lg->outputs[1], extra_of(lg, f, 1), "output 1 is read through extra value 1");
  cr_assert_eq(p->num_dispatches, 1);
  mn_plan_free(p);
  mn_fz_agree_inference(g, MN_FZ_UNOPTIMIZED, 3, -2, 2);
  mn_graph_free(g);
}

Test(fusion, intermediate_with_an_outside_user_is_written_out) {
  mn_graph *g = mn_graph_new();
  mn_node a = mn_tanh(g, mn_input(g, "x", MN_SHAPE(3, 7)));
  MN_TEST_OUTPUTS(g, mn_relu(g, mn_exp(g, a)), mn_softmax(g, a));
  expect_groups(g, 1, 3, 0);
  mn_plan *p = mn_fz_lower(g, false);
  const mn_graph *lg = p->graph;
  mn_node f = fused_id(lg, 0), x = extra_of(lg, f, 1);
  cr_assert_neq(x, MN_NO_NODE);
  cr_assert_eq(lg->nodes[lg->outputs[1]].op, MN_OP_SOFTMAX);
  cr_assert_eq(lg->nodes[lg->outputs[1]].inputs[0], x, "softmax reads tanh's extra value");
  mn_plan_free(p);
  mn_fz_agree_inference(g, MN_FZ_UNOPTIMIZED, 4, -2, 2);
  mn_graph_free(g);
}

/* The outside reader of tanh comes before the group's root, so the fused node moves up to
 * where tanh was; the softmax between reads its extra value. */
Test(fusion, extra_value_read_before_the_root) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(4, 8));
  mn_node a = mn_tanh(g, x);
  mn_node s = mn_softmax(g, a);
  mn_node y = mn_add(g, mn_exp(g, a), x);
  MN_TEST_OUTPUTS(g, y, s);
  expect_groups(g, 1, 3, 0);
  mn_plan *p = mn_fz_lower(g, false);
  const mn_graph *lg = p->graph;
  mn_node f = fused_id(lg, 0);
  cr_assert_lt(f, lg->outputs[1], "the fused node comes before the softmax");
  cr_assert_eq(lg->nodes[lg->outputs[1]].inputs[0], extra_of(lg, f, 1));
  mn_plan_free(p);
  mn_fz_agree_inference(g, MN_FZ_UNOPTIMIZED, 5, -2, 2);

  /* With the product of both, the group cannot take tanh: softmax lies on a path from
   * tanh back into the group. */
  mn_graph_free(g);
  g = mn_graph_new();
  x = mn_input(g, "x", MN_SHAPE(4, 8));
  a = mn_tanh(g, x);
  s = mn_softmax(g, a);
  y = mn_add(g, mn_exp(g, a), x);
  MN_TEST_OUTPUTS(g, mn_mul(g, y, s));
  expect_groups(g, 1, 3, 1); /* {exp, add, mul}; tanh alone */
  mn_fz_agree_inference(g, MN_FZ_UNOPTIMIZED, 5, -2, 2);
  mn_graph_free(g);
}

/* a = tanh(x) is read by a matmul whose product the group reads too: with a in the group,
 * the product would both need the fused node and feed it. */
Test(fusion, no_group_where_a_path_leaves_and_comes_back) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(4, 4)), w = mn_input(g, "w", MN_SHAPE(4, 4));
  mn_node a = mn_tanh(g, x);
  MN_TEST_OUTPUTS(g, mn_exp(g, mn_add(g, a, mn_matmul(g, a, w))));
  expect_groups(g, 1, 2, 1); /* {add, exp}; tanh alone */
  mn_fz_agree_inference(g, MN_FZ_UNOPTIMIZED, 6, -2, 2);
  mn_graph_free(g);
}

Test(fusion, at_most_three_extra_values) {
  mn_graph *g = mn_graph_new();
  mn_node a1 = mn_tanh(g, mn_input(g, "x", MN_SHAPE(12)));
  mn_node a2 = mn_exp(g, a1), a3 = mn_neg(g, a2), a4 = mn_abs(g, a3);
  MN_TEST_OUTPUTS(g, mn_relu(g, a4), a1, a2, a3, a4);
  expect_groups(g, 1, 4, 1); /* {exp, neg, abs, relu} with three extra values; tanh alone */
  mn_plan *p = mn_fz_lower(g, false);
  cr_assert_eq(mn_fz_count_op(p->graph, MN_OP_EXTRA_OUTPUT), MN_MAX_EXTRA_OUTPUTS);
  mn_plan_free(p);
  mn_fz_agree_inference(g, MN_FZ_UNOPTIMIZED, 7, -2, 2);
  mn_graph_free(g);
}

/* b = mul(x, p1) + p2 through tanh: p2's gradient is tanh_grad's value, which the group that
 * makes p1's gradient (mul by x) also reads, so it is an extra value, and the gradient is
 * read from the extra_output node that owns its buffer. */
Test(fusion, gradient_output_as_an_extra_value) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(6, 5)), t = mn_input(g, "t", MN_SHAPE(6, 5));
  mn_node p1 = mn_parameter(g, "p1", MN_SHAPE(6, 5)), p2 = mn_parameter(g, "p2", MN_SHAPE(6, 5));
  mn_node y = mn_tanh(g, mn_add(g, mn_mul(g, x, p1), p2));
  MN_TEST_OUTPUTS(g, mn_mse_loss(g, y, t));
  mn_plan *p = mn_fz_lower(g, true);
  const mn_graph *lg = p->graph;
  mn_node g1 = p->params[0].grad, g2 = p->params[1].grad;
  cr_assert_eq(lg->nodes[g1].op, MN_OP_FUSED, "p1's gradient is %s", mn_op_name(lg->nodes[g1].op));
  cr_assert_eq(lg->nodes[g2].op, MN_OP_EXTRA_OUTPUT, "p2's gradient is %s",
               mn_op_name(lg->nodes[g2].op));
  cr_assert_eq(lg->nodes[g2].inputs[0], g1);
  cr_assert_neq(p->node_buffer[g1], p->node_buffer[g2]);
  mn_plan_free(p);
  mn_fz_agree_training(g, MN_FZ_UNOPTIMIZED, STEPS, 12, -1, 1);
  mn_graph_free(g);
}

Test(fusion, extra_values_cost_their_writes) {
  int64_t n = 1000;
  mn_tensor_type t = mn_type_make(MN_F32, &n, 1);
  const mn_tensor_type *ins[1] = {&t};
  cr_assert_eq(mn_cost_op(MN_OP_EXTRA_OUTPUT, &t, ins, 1), 4000.0);
  /* A fused node with an extra value costs less than the two ops it replaces. */
  double fused = mn_cost_op(MN_OP_FUSED, &t, ins, 1) + mn_cost_op(MN_OP_EXTRA_OUTPUT, &t, NULL, 0);
  cr_assert_lt(fused, 2 * mn_cost_op(MN_OP_TANH, &t, ins, 1));
}

Test(fusion, other_shapes_and_u32_are_not_fused) {
  mn_graph *g = mn_graph_new();
  mn_node a = mn_tanh(g, mn_input(g, "x", MN_SHAPE(2, 4)));
  mn_node b = raw(g, MN_OP_EXP, a, MN_F32, MN_SHAPE(8)); /* reads [2,4] as [8] */
  MN_TEST_OUTPUTS(g, raw(g, MN_OP_RELU, b, MN_F32, MN_SHAPE(8)));
  expect_groups(g, 0, 0, 3);
  mn_graph_free(g);

  g = mn_graph_new();
  mn_node u = mn_input_u32(g, "u", MN_SHAPE(8));
  mn_node n = raw(g, MN_OP_NEG, u, MN_U32, MN_SHAPE(8));
  MN_TEST_OUTPUTS(g, raw(g, MN_OP_ABS, n, MN_U32, MN_SHAPE(8)));
  expect_groups(g, 0, 0, 2);
  mn_graph_free(g);
}

Test(fusion, non_pointwise_op_between_splits_groups) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(4, 6)), b = mn_input(g, "b", MN_SHAPE(6));
  mn_node s = mn_softmax(g, mn_relu(g, x));
  MN_TEST_OUTPUTS(g, mn_exp(g, s), mn_tanh(g, mn_bias_add(g, mn_sigmoid(g, x), b)));
  expect_groups(g, 0, 0, 4);
  mn_fz_agree_inference(g, MN_FZ_UNOPTIMIZED, 5, -2, 2);
  mn_graph_free(g);
}

Test(fusion, groups_read_at_most_four_values) {
  mn_graph *g = mn_graph_new();
  mn_node y = mn_input(g, "x0", MN_SHAPE(10));
  const char *names[] = {"x1", "x2", "x3", "x4"};
  for (int i = 0; i < 4; i++)
    y = mn_add(g, y, mn_input(g, names[i], MN_SHAPE(10)));
  MN_TEST_OUTPUTS(g, y);
  expect_groups(g, 1, 3, 1); /* the first add reads two more values than fit */
  mn_fz_agree_inference(g, MN_FZ_UNOPTIMIZED, 6, -2, 2);
  mn_graph_free(g);
}

Test(fusion, long_chains_split_at_the_instruction_limit) {
  mn_graph *g = mn_graph_new();
  mn_node y = mn_input(g, "x", MN_SHAPE(300));
  for (int i = 0; i < 100; i++)
    y = i % 2 ? mn_tanh(g, y) : mn_scale(g, y, 1.5f);
  MN_TEST_OUTPUTS(g, y);
  expect_groups(g, 2, 100, 0);
  mn_fz_agree_inference(g, MN_FZ_UNOPTIMIZED, 7, -2, 2);
  mn_graph_free(g);
}

/* tanh(sigmoid(x * w)): forward {mul, sigmoid} (sigmoid's output feeds its gradient), and
 * the gradient chain tanh_grad -> sigmoid_grad -> mul into w's gradient, an output. */
static mn_graph *gradient_chain(void) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(6, 5)), t = mn_input(g, "t", MN_SHAPE(6, 5));
  mn_node w = mn_parameter(g, "w", MN_SHAPE(6, 5));
  mn_node y = mn_tanh(g, mn_sigmoid(g, mn_mul(g, x, w)));
  return MN_TEST_OUTPUTS(g, mn_mse_loss(g, y, t));
}

Test(fusion, gradient_chains_of_training_graphs) {
  mn_graph *g = gradient_chain();
  mn_plan *p = mn_fz_lower(g, true);
  const mn_graph *lg = p->graph;
  cr_assert_eq(mn_fz_count_op(lg, MN_OP_FUSED), 2);
  mn_node grad = p->params[0].grad;
  cr_assert_eq(lg->nodes[grad].op, MN_OP_FUSED, "w's gradient is %s",
               mn_op_name(lg->nodes[grad].op));
  const mn_fused_prog *prog = lg->nodes[grad].fused;
  cr_assert_eq(prog->num_instrs, 3);
  cr_assert_eq(prog->instrs[0].op, MN_OP_TANH_GRAD);
  cr_assert_eq(prog->instrs[1].op, MN_OP_SIGMOID_GRAD);
  cr_assert_eq(prog->instrs[2].op, MN_OP_MUL);
  mn_plan_free(p);
  mn_fz_agree_training(g, MN_FZ_UNOPTIMIZED, STEPS, 11, -1, 1);
  mn_graph_free(g);
}

Test(fusion, report_counts_fusions) {
  mn_graph *g = gradient_chain();
  mn_session_options o = mn_fz_cpu(true);
  mn_session *s = NULL;
  mn_optimize_report *r = NULL;
  cr_assert_eq(mn_build_session_with_report(g, &o, &s, &r), MN_OK, "%s", mn_last_error());
  const mn_optimize_stage_report *f = &r->stage[MN_OPTIMIZE_FORWARD],
                                 *u = &r->stage[MN_OPTIMIZE_FULL];
  cr_assert_eq(f->fusions, 0, "the forward stage never fuses (autodiff follows it)");
  cr_assert_eq(u->fusions, mn_fz_count_op(mn_session_plan(s)->graph, MN_OP_FUSED));
  cr_assert_eq(u->fusions, 2);
  cr_assert_eq(u->dispatches_after, r->plan_dispatches);
  char text[4096];
  mn_optimize_report_format(r, text, sizeof text);
  cr_assert(strstr(text, "fusions applied: 2"), "%s", text);
  mn_optimize_report_free(r);
  mn_session_free(s);

  /* With the optimizer off nothing is fused. */
  o = mn_fz_cpu(false);
  cr_assert_eq(mn_build_session_with_report(g, &o, &s, &r), MN_OK, "%s", mn_last_error());
  cr_assert_eq(r->stage[MN_OPTIMIZE_FULL].fusions, 0);
  cr_assert_eq(mn_fz_count_op(mn_session_plan(s)->graph, MN_OP_FUSED), 0);
  mn_optimize_report_free(r);
  mn_session_free(s);
  mn_graph_free(g);
}

/* ---------------------------------------------------------------- models agree */

Test(fusion, mlp_trains_bit_for_bit) {
  mn_graph *g = mlp();
  cr_assert_gt(training_fusions(g), 0);
  mn_fz_agree_training(g, MN_FZ_UNOPTIMIZED, STEPS, 11, -1, 1);
  mn_graph_free(g);
}

/* Against the optimized graph without fusion only: in the backward graph the swiglu rule
 * turns mul(silu(gate), dy) into swiglu(gate, dy), which skips rounding silu to float, so the
 * unoptimized block differs in the last bits whether or not anything is fused. */
Test(fusion, transformer_block_trains_bit_for_bit) {
  for (int64_t batch = 0; batch <= 2; batch += 2) {
    mn_graph *g = block(batch);
    cr_assert_gt(training_fusions(g), 0);
    mn_fz_agree_training(g, MN_FZ_OPTIMIZED_UNFUSED, STEPS, 11, -1, 1);
    mn_graph_free(g);
  }
}

Test(fusion, conv_block_trains_bit_for_bit) {
  mn_graph *g = conv_block();
  cr_assert_gt(training_fusions(g), 0);
  mn_fz_agree_training(g, MN_FZ_UNOPTIMIZED, STEPS, 11, -1, 1);
  mn_graph_free(g);
}

/* ---------------------------------------------------------------- plan cache */

/* Losses, parameters and gradients after STEPS steps of a session built by `make`. */
typedef struct run {
  float losses[STEPS];
  float *params, *grads;
  size_t num_params;
} run;

static run train(const mn_graph *g, mn_session *s) {
  mn_rng r = mn_rng_new(5);
  mn_test_init_uniform(g, s, &r, -1, 1, true);
  cr_assert_eq(mn_session_set_adamw(s, 0.01f, 0.9f, 0.999f, 1e-8f, 0.1f), MN_OK);
  run out = {.num_params = mn_test_param_count(g)};
  for (int t = 0; t < STEPS; t++) {
    cr_assert_eq(mn_session_step(s), MN_OK, "%s", mn_last_error());
    cr_assert_eq(mn_session_wait(s), MN_OK, "%s", mn_last_error());
    out.losses[t] = mn_session_read_loss(s);
  }
  out.params = mn_test_read_params(g, s);
  out.grads = malloc(out.num_params * sizeof *out.grads);
  float *at = out.grads;
  for (size_t i = 0; i < g->num_nodes; i++) {
    const mn_node_rec *p = &g->nodes[i];
    if (p->op != MN_OP_PARAMETER) continue;
    size_t m = (size_t)mn_tensor_type_numel(&p->type);
    cr_assert_eq(mn_session_read_grad(s, p->name, at, m), MN_OK, "%s", mn_last_error());
    at += m;
  }
  mn_session_free(s);
  return out;
}

static void assert_same_run(run *a, run *b) {
  cr_assert(memcmp(a->losses, b->losses, sizeof a->losses) == 0, "losses differ");
  cr_assert(memcmp(a->params, b->params, a->num_params * sizeof(float)) == 0, "params differ");
  cr_assert(memcmp(a->grads, b->grads, a->num_params * sizeof(float)) == 0, "grads differ");
  free(b->params);
  free(b->grads);
}

static run train_cached(const mn_graph *g, const char *path) {
  mn_session_options o = mn_fz_cpu(true);
  mn_session *s = NULL;
  cr_assert_eq(mn_build_session_cached(g, path, &o, &s), MN_OK, "%s", mn_last_error());
  cr_assert_gt(mn_fz_count_op(mn_session_plan(s)->graph, MN_OP_FUSED), 0);
  return train(g, s);
}

Test(fusion, plan_cache_keeps_fused_nodes) {
  mn_graph *g = conv_block();
  mn_tmp_dir t = mn_tmp_dir_make("mn_fusion_cache");
  char path[128];
  snprintf(path, sizeof path, "%s", mn_tmp_path(&t, "plan.json"));
  run ref = train(g, mn_fz_build(g, MN_FZ_FUSED, true));
  run cold = train_cached(g, path);
  assert_same_run(&ref, &cold);
  char *text = mn_test_read_file(path, NULL);
  cr_assert_not_null(strstr(text, "\"op\":\"fused\""));
  cr_assert_not_null(strstr(text, "\"program\":[{\"op\":"));
  /* A hit leaves the file alone: set its time back and see that it stays. */
  struct timespec old[2] = {{.tv_sec = 1000000000}, {.tv_sec = 1000000000}};
  cr_assert_eq(utimensat(AT_FDCWD, path, old, 0), 0);
  run warm = train_cached(g, path);
  assert_same_run(&ref, &warm);
  struct stat sb;
  cr_assert_eq(stat(path, &sb), 0);
  cr_assert_eq(sb.st_mtim.tv_sec, 1000000000, "the second build missed the cache");

  /* The reader checks programs: an operand that is no earlier value is corrupt. */
  mn_session_options o = mn_fz_cpu(true);
  const char *from = "\"program\":[";
  const char *bad[] = {"\"program\":[{\"op\":\"add\",\"args\":[9,0]},",
                       "\"program\":[{\"op\":\"softmax\",\"args\":[0]},",
                       "\"program\":[{\"op\":\"relu\",\"args\":[0],\"attrs\":{\"scale\":2}},",
                       "\"program\":[{\"op\":\"scale\",\"args\":[0],\"attrs\":{\"eps\":2}},",
                       "\"program\":[{\"op\":\"scale\",\"args\":[0],\"bogus\":1},"};
  const char *why_part[] = {"operand 9", "instruction 0: not a pointwise or row op",
                            "instruction 0: bad attrs", "instruction 0: bad attrs",
                            "instruction 0: bad field"};
  for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
    const char *at = strstr(text, from);
    size_t head = (size_t)(at - text);
    char *edited = malloc(strlen(text) + strlen(bad[k]) + 1);
    memcpy(edited, text, head);
    strcpy(edited + head, bad[k]);
    strcat(edited, at + strlen(from));
    mn_plan *plan = NULL;
    char why[256] = "";
    cr_assert_eq(mn_plan_cache_parse(edited, strlen(edited), g, &o, 0, &plan, why, sizeof why),
                 MN_ERR_FORMAT, "edit %zu accepted", k);
    cr_assert(strstr(why, why_part[k]), "\"%s\" lacks \"%s\"", why, why_part[k]);
    cr_assert_null(plan);
    free(edited);
  }
  free(text);
  free(ref.params);
  free(ref.grads);
  mn_tmp_dir_remove(&t);
  mn_graph_free(g);
}

/* ---------------------------------------------------------------- CUDA */

Test(fusion_cuda, fused_kernels_compile) {
  mn_test_require_cuda_build();
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(4, 9)), w = mn_input(g, "w", MN_SHAPE(4, 9));
  mn_node a = mn_mul(g, x, w);
  MN_TEST_OUTPUTS(g, mn_exp(g, mn_scale(g, mn_tanh(g, mn_relu(g, x)), 0.5f)),
                  mn_add(g, mn_relu(g, a), mn_gelu(g, a)));
  mn_test_assert_compiles(g, false);
  mn_graph_free(g);
  mn_graph *models[] = {gradient_chain(), mlp(), block(2), conv_block()};
  for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) {
    mn_test_assert_compiles(models[i], true);
    mn_graph_free(models[i]);
  }
}

Test(fusion_cuda, fused_graphs_match_the_cpu) {
  mn_test_require_cuda_device();
  mn_graph *chain = gradient_chain(); /* three element-wise ops: the op bound */
  mn_test_check_cuda(chain, true, NULL, 17);
  mn_graph_free(chain);
  mn_graph *models[] = {mlp(), block(0), block(2), conv_block()};
  for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) {
    mn_test_check_cuda_model(models[i], true, NULL, 18 + i);
    mn_graph_free(models[i]);
  }
}
