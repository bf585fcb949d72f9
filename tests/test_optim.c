/* Optimizers (SGD, Adam, AdamW, clipping) against trajectories computed independently
 * by scripts/fixtures/gen_optim.py, and the training-session API around them. */
#include <stdlib.h>

#include "host/graph.h"
#include "tests/fixtures/optim_fixtures.h"
#include "tests/support/mn_test.h"

typedef mn_status (*configure_fn)(mn_session *s);

/* pred = x w + b; loss = mse(pred, y); "unused" is a parameter the loss ignores. */
static mn_graph *regression_graph(void) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(OPT_M, OPT_K));
  mn_node y = mn_input(g, "y", MN_SHAPE(OPT_M, OPT_N));
  mn_node w = mn_parameter(g, "w", MN_SHAPE(OPT_K, OPT_N));
  mn_node b = mn_parameter(g, "b", MN_SHAPE(OPT_N));
  mn_parameter(g, "unused", MN_SHAPE(2));
  mn_node loss = mn_mse_loss(g, mn_bias_add(g, mn_matmul(g, x, w), b), y);
  mn_set_outputs(g, &loss, 1);
  return g;
}

static mn_session *regression_session(void) {
  mn_graph *g = regression_graph();
  mn_session_options o = mn_session_options_default();
  o.backend = MN_BACKEND_CPU;
  mn_session *s = NULL;
  cr_assert_eq(mn_build_session(g, &o, &s), MN_OK, "%s", mn_last_error());
  mn_graph_free(g);
  float unused[2] = {0.5f, -0.5f};
  cr_assert_eq(mn_session_set_input(s, "x", opt_x, OPT_M * OPT_K), MN_OK);
  cr_assert_eq(mn_session_set_input(s, "y", opt_y, OPT_M * OPT_N), MN_OK);
  cr_assert_eq(mn_session_set_parameter(s, "w", opt_w0, OPT_K * OPT_N), MN_OK);
  cr_assert_eq(mn_session_set_parameter(s, "b", opt_b0, OPT_N), MN_OK);
  cr_assert_eq(mn_session_set_parameter(s, "unused", unused, 2), MN_OK);
  return s;
}

static void check_trajectory(configure_fn configure, const float *losses, const float *w_want,
                             const float *b_want) {
  mn_session *s = regression_session();
  cr_assert_eq(configure(s), MN_OK, "%s", mn_last_error());
  float got[OPT_STEPS];
  for (int t = 0; t < OPT_STEPS; t++) {
    cr_assert_eq(mn_session_step(s), MN_OK, "%s", mn_last_error());
    cr_assert_eq(mn_session_wait(s), MN_OK, "%s", mn_last_error());
    got[t] = mn_session_read_loss(s);
  }
  mn_assert_close(got, losses, OPT_STEPS, 1e-6);
  float w[OPT_K * OPT_N], b[OPT_N], unused[2];
  cr_assert_eq(mn_session_read_param(s, "w", w, OPT_K * OPT_N), MN_OK);
  cr_assert_eq(mn_session_read_param(s, "b", b, OPT_N), MN_OK);
  cr_assert_eq(mn_session_read_param(s, "unused", unused, 2), MN_OK);
  mn_assert_close(w, w_want, OPT_K * OPT_N, 2e-6);
  mn_assert_close(b, b_want, OPT_N, 2e-6);
  /* As in PyTorch, a parameter without a gradient is not stepped (not even decayed). */
  cr_assert(unused[0] == 0.5f && unused[1] == -0.5f, "unused moved: %g %g", unused[0], unused[1]);
  mn_session_free(s);
}

static mn_status sgd(mn_session *s) { return mn_session_set_learning_rate(s, 0.1f); }
static mn_status adam(mn_session *s) { return mn_session_set_adam(s, 0.05f, 0.9f, 0.999f, 1e-8f); }
static mn_status adamw(mn_session *s) {
  return mn_session_set_adamw(s, 0.05f, 0.9f, 0.999f, 1e-8f, 0.1f);
}
static mn_status adam_clip(mn_session *s) {
  mn_status st = adam(s);
  return st == MN_OK ? mn_session_set_grad_clip(s, 0.05f) : st;
}
static mn_status sgd_clip(mn_session *s) {
  mn_status st = sgd(s);
  return st == MN_OK ? mn_session_set_grad_clip(s, 0.05f) : st;
}

Test(optim, sgd) { check_trajectory(sgd, opt_sgd_losses, opt_sgd_w, opt_sgd_b); }
Test(optim, adam) { check_trajectory(adam, opt_adam_losses, opt_adam_w, opt_adam_b); }
Test(optim, adamw) { check_trajectory(adamw, opt_adamw_losses, opt_adamw_w, opt_adamw_b); }
Test(optim, adam_with_clipping) {
  check_trajectory(adam_clip, opt_adam_clip_losses, opt_adam_clip_w, opt_adam_clip_b);
}
Test(optim, sgd_with_clipping) {
  check_trajectory(sgd_clip, opt_sgd_clip_losses, opt_sgd_clip_w, opt_sgd_clip_b);
}

Test(optim, no_optimizer_computes_gradients_only) {
  mn_session *s = regression_session();
  cr_assert_eq(mn_session_step(s), MN_OK);
  cr_assert_eq(mn_session_wait(s), MN_OK);
  float w[OPT_K * OPT_N], gw[OPT_K * OPT_N], gu[2] = {7, 7};
  cr_assert_eq(mn_session_read_param(s, "w", w, OPT_K * OPT_N), MN_OK);
  mn_assert_close(w, opt_w0, OPT_K * OPT_N, 0);
  cr_assert_eq(mn_session_read_grad(s, "w", gw, OPT_K * OPT_N), MN_OK);
  /* SGD with lr 0.1 moved w by -0.1 * grad in the fixture's first step. */
  float want[OPT_K * OPT_N];
  mn_session *s2 = regression_session();
  cr_assert_eq(sgd(s2), MN_OK);
  cr_assert_eq(mn_session_step(s2), MN_OK);
  cr_assert_eq(mn_session_wait(s2), MN_OK);
  cr_assert_eq(mn_session_read_param(s2, "w", want, OPT_K * OPT_N), MN_OK);
  for (int i = 0; i < OPT_K * OPT_N; i++)
    want[i] = (opt_w0[i] - want[i]) / 0.1f;
  mn_assert_close(gw, want, OPT_K * OPT_N, 1e-5);
  cr_assert_eq(mn_session_read_grad(s, "unused", gu, 2), MN_OK);
  cr_assert(gu[0] == 0 && gu[1] == 0, "gradient of an unused parameter must be zero");
  mn_session_free(s);
  mn_session_free(s2);
}

Test(optim, learning_rate_changes_between_steps) {
  mn_session *a = regression_session(), *b = regression_session();
  const mn_plan *plan_before = mn_session_plan(a);
  cr_assert_eq(mn_session_set_learning_rate(a, 0.1f), MN_OK);
  cr_assert_eq(mn_session_set_learning_rate(b, 0.1f), MN_OK);
  for (int t = 0; t < 3; t++) {
    /* a and b follow the same decaying schedule; c (below) keeps the first rate. */
    float lr = 0.1f / (float)(t + 1);
    cr_assert_eq(mn_session_set_learning_rate(a, lr), MN_OK);
    cr_assert_eq(mn_session_set_learning_rate(b, lr), MN_OK);
    cr_assert_eq(mn_session_step(a), MN_OK);
    cr_assert_eq(mn_session_wait(a), MN_OK);
    cr_assert_eq(mn_session_step(b), MN_OK);
    cr_assert_eq(mn_session_wait(b), MN_OK);
  }
  cr_assert_eq(mn_session_plan(a), plan_before, "changing the rate must not rebuild the plan");
  float wa[OPT_K * OPT_N], wb[OPT_K * OPT_N], w1[OPT_K * OPT_N];
  mn_session_read_param(a, "w", wa, OPT_K * OPT_N);
  mn_session_read_param(b, "w", wb, OPT_K * OPT_N);
  mn_assert_close(wa, wb, OPT_K * OPT_N, 0);
  mn_session *c = regression_session();
  mn_session_set_learning_rate(c, 0.1f);
  for (int t = 0; t < 3; t++) {
    mn_session_step(c);
    mn_session_wait(c);
  }
  mn_session_read_param(c, "w", w1, OPT_K * OPT_N);
  cr_assert_gt(mn_test_max_abs_diff(wa, w1, OPT_K * OPT_N), 1e-6, "the new rate had no effect");
  mn_session_free(a);
  mn_session_free(b);
  mn_session_free(c);
}

Test(optim, memory_summary_counts_adam_state) {
  mn_session *s = regression_session();
  mn_memory_summary before = mn_session_memory_summary(s);
  cr_assert_eq(before.adam_state_bytes, 0);
  cr_assert_eq(adam(s), MN_OK);
  mn_memory_summary after = mn_session_memory_summary(s);
  /* two moments of w [4,3] and b [3]; "unused" has no gradient and no state */
  cr_assert_eq(after.adam_state_bytes, 2 * (OPT_K * OPT_N + OPT_N) * sizeof(float));
  cr_assert_eq(after.total_buffer_bytes, before.total_buffer_bytes + after.adam_state_bytes);
  mn_session_free(s);
}

Test(optim, setter_errors) {
  mn_session *s = regression_session();
  mn_assert_error(mn_session_set_learning_rate(NULL, 0.1f), MN_ERR_INVALID_ARGUMENT,
                  "session is NULL");
  mn_assert_error(mn_session_set_learning_rate(s, -1.0f), MN_ERR_INVALID_ARGUMENT, "lr = -1");
  mn_assert_error(mn_session_set_learning_rate(s, NAN), MN_ERR_INVALID_ARGUMENT, "lr = nan");
  mn_assert_error(mn_session_set_adam(s, 0.1f, 1.0f, 0.999f, 1e-8f), MN_ERR_INVALID_ARGUMENT,
                  "beta1 = 1");
  mn_assert_error(mn_session_set_adam(s, 0.1f, 0.9f, -0.1f, 1e-8f), MN_ERR_INVALID_ARGUMENT,
                  "beta2 = -0.1");
  mn_assert_error(mn_session_set_adam(s, 0.1f, 0.9f, 0.999f, -1.0f), MN_ERR_INVALID_ARGUMENT,
                  "eps = -1");
  mn_assert_error(mn_session_set_adamw(s, 0.1f, 0.9f, 0.999f, 1e-8f, -1.0f),
                  MN_ERR_INVALID_ARGUMENT, "weight_decay = -1");
  mn_assert_error(mn_session_set_grad_clip(s, -2.0f), MN_ERR_INVALID_ARGUMENT,
                  "max_global_norm = -2");
  /* nothing was configured by the failed calls: a step leaves parameters alone */
  mn_session_step(s);
  mn_session_wait(s);
  float w[OPT_K * OPT_N];
  mn_session_read_param(s, "w", w, OPT_K * OPT_N);
  mn_assert_close(w, opt_w0, OPT_K * OPT_N, 0);
  mn_session_free(s);
}

Test(optim, inference_sessions_have_no_optimizer_or_gradients) {
  mn_graph *g = regression_graph();
  mn_session_options o = mn_session_options_default();
  o.backend = MN_BACKEND_CPU;
  mn_session *s = NULL;
  cr_assert_eq(mn_build_inference_session(g, &o, &s), MN_OK);
  float gw[OPT_K * OPT_N];
  mn_assert_error(mn_session_set_learning_rate(s, 0.1f), MN_ERR_STATE, "inference session");
  mn_assert_error(mn_session_set_adam(s, 0.1f, 0.9f, 0.999f, 1e-8f), MN_ERR_STATE,
                  "inference session");
  mn_assert_error(mn_session_set_grad_clip(s, 1.0f), MN_ERR_STATE, "inference session");
  mn_assert_error(mn_session_read_grad(s, "w", gw, OPT_K * OPT_N), MN_ERR_STATE, "no gradients");
  mn_session_free(s);
  mn_graph_free(g);
}

Test(optim, read_grad_errors) {
  mn_session *s = regression_session();
  float g[12];
  mn_assert_error(mn_session_read_grad(NULL, "w", g, 12), MN_ERR_INVALID_ARGUMENT,
                  "session is NULL");
  mn_assert_error(mn_session_read_grad(s, NULL, g, 12), MN_ERR_INVALID_ARGUMENT, "name is NULL");
  mn_assert_error(mn_session_read_grad(s, "w", NULL, 12), MN_ERR_INVALID_ARGUMENT, "data is NULL");
  mn_assert_error(mn_session_read_grad(s, "nope", g, 12), MN_ERR_NOT_FOUND,
                  "no parameter named \"nope\"");
  mn_assert_error(mn_session_read_grad(s, "x", g, 24), MN_ERR_NOT_FOUND,
                  "no parameter named \"x\"");
  mn_assert_error(mn_session_read_grad(s, "w", g, 11), MN_ERR_SHAPE, "has 12 elements, n is 11");
  mn_session_free(s);
}

Test(optim, build_session_errors) {
  mn_session *s = (mn_session *)1;
  mn_assert_error(mn_build_session(NULL, NULL, &s), MN_ERR_INVALID_ARGUMENT, "graph is NULL");
  cr_assert_null(s);
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(2, 3));
  mn_node w = mn_parameter(g, "w", MN_SHAPE(3, 4));
  mn_assert_error(mn_build_session(g, NULL, NULL), MN_ERR_INVALID_ARGUMENT, "out is NULL");
  mn_assert_error(mn_build_session(g, NULL, &s), MN_ERR_INVALID_ARGUMENT, "no outputs");
  mn_node y = mn_matmul(g, x, w);
  mn_set_outputs(g, &y, 1);
  mn_assert_error(mn_build_session(g, NULL, &s), MN_ERR_SHAPE, "must be a [1] f32 tensor");
  mn_matmul(g, w, w); /* inner dims 4 and 3 differ: the graph is now in error */
  mn_assert_error(mn_build_session(g, NULL, &s), MN_ERR_SHAPE, "inner dimensions 4 and 3 differ");
  cr_assert_null(s);
  mn_graph_free(g);
}

Test(optim, kv_cache_ops_are_not_differentiable) {
  mn_graph *g = mn_graph_new();
  mn_node kv = mn_parameter(g, "kv", MN_SHAPE(1, 4));
  mn_node cache = mn_input(g, "cache", MN_SHAPE(8, 4));
  mn_node pos = mn_input_u32(g, "pos", MN_SHAPE(1));
  mn_node loss = mn_sum_all(g, mn_cache_write(g, kv, cache, pos));
  mn_set_outputs(g, &loss, 1);
  mn_session *s = NULL;
  mn_session_options o = mn_session_options_default();
  o.backend = MN_BACKEND_CPU;
  mn_assert_error(mn_build_session(g, &o, &s), MN_ERR_UNSUPPORTED,
                  "(cache_write) is not differentiable");
  mn_graph_free(g);
}

/* greater() passes no gradient: its derivative is zero almost everywhere. */
Test(optim, greater_cuts_the_gradient) {
  mn_graph *g = mn_graph_new();
  mn_node a = mn_parameter(g, "a", MN_SHAPE(3));
  mn_node b = mn_parameter(g, "b", MN_SHAPE(3));
  mn_node loss = mn_sum_all(g, mn_add(g, mn_greater(g, a, b), mn_mul(g, b, b)));
  mn_set_outputs(g, &loss, 1);
  float av[3] = {1, 2, 3}, bv[3] = {3, 2, 1}, ga[3] = {9, 9, 9}, gb[3];
  mn_session_options o = mn_session_options_default();
  o.backend = MN_BACKEND_CPU;
  mn_session *s = NULL;
  cr_assert_eq(mn_build_session(g, &o, &s), MN_OK, "%s", mn_last_error());
  mn_session_set_parameter(s, "a", av, 3);
  mn_session_set_parameter(s, "b", bv, 3);
  cr_assert_eq(mn_session_step(s), MN_OK);
  cr_assert_eq(mn_session_wait(s), MN_OK);
  cr_assert_float_eq(mn_session_read_loss(s), 1.0f + 14.0f, 1e-6);
  cr_assert_eq(mn_session_read_grad(s, "a", ga, 3), MN_OK);
  cr_assert_eq(mn_session_read_grad(s, "b", gb, 3), MN_OK);
  float zero[3] = {0, 0, 0}, twice_b[3] = {6, 4, 2};
  mn_assert_close(ga, zero, 3, 0);
  mn_assert_close(gb, twice_b, 3, 0);
  mn_session_free(s);
  mn_graph_free(g);
}

/* A rewrite may append a node that earlier nodes then read; the pipeline sorts it. */
Test(optim, out_of_order_graph_trains_like_the_ordered_one) {
  mn_graph *ordered = regression_graph();
  mn_graph *shuffled = regression_graph();
  /* Append a copy of "w * 1" and make the matmul (an earlier node) read it. */
  mn_node w = mn_graph_find_leaf(shuffled, MN_OP_PARAMETER, "w");
  mn_node matmul = MN_NO_NODE;
  for (size_t i = 0; i < shuffled->num_nodes; i++)
    if (shuffled->nodes[i].op == MN_OP_MATMUL) matmul = (mn_node)i;
  mn_node late = mn_scale(shuffled, w, 1.0f);
  cr_assert_lt(matmul, late);
  shuffled->nodes[matmul].inputs[1] = late;
  mn_session_options o = mn_session_options_default();
  o.backend = MN_BACKEND_CPU;
  mn_session *sa = NULL, *sb = NULL;
  cr_assert_eq(mn_build_session(ordered, &o, &sa), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_build_session(shuffled, &o, &sb), MN_OK, "%s", mn_last_error());
  mn_session *ss[2] = {sa, sb};
  for (int k = 0; k < 2; k++) {
    mn_session_set_input(ss[k], "x", opt_x, OPT_M * OPT_K);
    mn_session_set_input(ss[k], "y", opt_y, OPT_M * OPT_N);
    mn_session_set_parameter(ss[k], "w", opt_w0, OPT_K * OPT_N);
    mn_session_set_parameter(ss[k], "b", opt_b0, OPT_N);
    mn_session_set_adam(ss[k], 0.05f, 0.9f, 0.999f, 1e-8f);
    for (int t = 0; t < OPT_STEPS; t++) {
      cr_assert_eq(mn_session_step(ss[k]), MN_OK);
      cr_assert_eq(mn_session_wait(ss[k]), MN_OK, "%s", mn_last_error());
    }
  }
  float wa[OPT_K * OPT_N], wb[OPT_K * OPT_N];
  mn_session_read_param(sa, "w", wa, OPT_K * OPT_N);
  mn_session_read_param(sb, "w", wb, OPT_K * OPT_N);
  mn_assert_close(wb, wa, OPT_K * OPT_N, 0);
  mn_assert_close(wa, opt_adam_w, OPT_K * OPT_N, 2e-6);
  mn_session_free(sa);
  mn_session_free(sb);
  mn_graph_free(ordered);
  mn_graph_free(shuffled);
}
