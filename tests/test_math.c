/* Matrix products and element-wise ops (host/build_math.c): builder errors and forward
 * values on the reference backend against hand-computed values and numpy fixtures; GELU's
 * float form (the device's) against long double. */
#include <float.h>
#include <math.h>
#include <stdlib.h>

#include "host/pointwise.h"
#include "tests/fixtures/math_fixtures.h"
#include "tests/support/mn_test.h"

#define LEN(a) (sizeof(a) / sizeof((a)[0]))

/* fp32 results against float64 references rounded to fp32. */
#define TOL 2e-6

/* Asserts that a builder failed with `want` and `fragment` and added no node. */
#define assert_build_fails(g, call, want, fragment)                                                \
  do {                                                                                             \
    size_t nodes_before_ = mn_graph_num_nodes(g);                                                  \
    mn_node got_ = (call);                                                                         \
    cr_assert_eq(got_, MN_NO_NODE, "%s returned node %u", #call, got_);                            \
    mn_assert_graph_error(g, want, fragment);                                                      \
    mn_assert_error(mn_graph_status(g), want, fragment);                                           \
    cr_assert_eq(mn_graph_num_nodes(g), nodes_before_, "%s added a node", #call);                  \
  } while (0)

/* Runs out = op(x) for a unary builder on an [3,37] input and compares to `want`. */
static void check_unary(mn_node (*op)(mn_graph *, mn_node), const float *x, const float *want,
                        const char *what) {
  mn_graph *g = mn_graph_new();
  mn_node in = mn_input(g, "x", MN_SHAPE(3, 37));
  mn_node y = op(g, in);
  mn_set_outputs(g, &y, 1);
  mn_test_feed feeds[] = {{"x", x, NULL, 111, false}};
  mn_session *s = mn_test_run(g, feeds, 1);
  float *out = mn_test_read_output(s, 0, 111);
  mn_assert_close_impl(out, want, 111, TOL, what);
  free(out);
  mn_session_free(s);
  mn_graph_free(g);
}

static void check_binary(mn_node (*op)(mn_graph *, mn_node, mn_node), const float *a,
                         const float *b, const float *want, double tol, const char *what) {
  mn_graph *g = mn_graph_new();
  mn_node na = mn_input(g, "a", MN_SHAPE(3, 37));
  mn_node nb = mn_input(g, "b", MN_SHAPE(3, 37));
  mn_node y = op(g, na, nb);
  mn_set_outputs(g, &y, 1);
  mn_test_feed feeds[] = {{"a", a, NULL, 111, false}, {"b", b, NULL, 111, false}};
  mn_session *s = mn_test_run(g, feeds, 2);
  float *out = mn_test_read_output(s, 0, 111);
  mn_assert_close_impl(out, want, 111, tol, what);
  free(out);
  mn_session_free(s);
  mn_graph_free(g);
}

/* ---------------------------------------------------------------- matmul errors */

Test(math, matmul_inner_mismatch_message_as_in_api_md) {
  mn_graph *g = mn_graph_new();
  mn_input(g, "pad0", MN_SHAPE(1));
  mn_input(g, "pad1", MN_SHAPE(1));
  mn_input(g, "pad2", MN_SHAPE(1));
  mn_input(g, "pad3", MN_SHAPE(1));
  mn_input(g, "pad4", MN_SHAPE(1));
  mn_input(g, "pad5", MN_SHAPE(1));
  mn_input(g, "pad6", MN_SHAPE(1));
  mn_node x = mn_input(g, "x", MN_SHAPE(32, 784));
  mn_input(g, "pad8", MN_SHAPE(1));
  mn_node w = mn_parameter(g, "w", MN_SHAPE(512, 10));
  cr_assert_eq(x, 7);
  cr_assert_eq(w, 9);
  assert_build_fails(g, mn_matmul(g, x, w), MN_ERR_SHAPE,
                     "mn_matmul: node 7 [32,784] x node 9 [512,10]: inner dimensions 784 and 512 "
                     "differ");
  cr_assert_str_eq(mn_graph_error(g), "mn_matmul: node 7 [32,784] x node 9 [512,10]: inner "
                                      "dimensions 784 and 512 differ");
  mn_graph_free(g);
}

Test(math, matmul_bt_and_at_inner_mismatch) {
  mn_graph *g = mn_graph_new();
  mn_node a = mn_input(g, "a", MN_SHAPE(4, 6));
  mn_node b = mn_input(g, "b", MN_SHAPE(3, 5));
  assert_build_fails(g, mn_matmul_bt(g, a, b), MN_ERR_SHAPE,
                     "mn_matmul_bt: node 0 [4,6] x node 1 [3,5]: inner dimensions 6 and 5 differ");
  mn_graph_free(g);

  g = mn_graph_new();
  a = mn_input(g, "a", MN_SHAPE(2, 3, 4)); /* K = 6 */
  b = mn_input(g, "b", MN_SHAPE(5, 7));    /* K = 5 */
  assert_build_fails(
      g, mn_matmul_at(g, a, b), MN_ERR_SHAPE,
      "mn_matmul_at: node 0 [2,3,4] x node 1 [5,7]: inner dimensions 6 and 5 differ");
  mn_graph_free(g);
}

Test(math, matmul_family_rejects_u32_operands) {
  mn_node (*fns[])(mn_graph *, mn_node, mn_node) = {mn_matmul, mn_matmul_at, mn_matmul_bt};
  const char *names[] = {"mn_matmul:", "mn_matmul_at:", "mn_matmul_bt:"};
  for (int i = 0; i < 3; i++) {
    mn_graph *g = mn_graph_new();
    mn_node a = mn_input(g, "a", MN_SHAPE(4, 4));
    mn_node idx = mn_input_u32(g, "idx", MN_SHAPE(4, 4));
    assert_build_fails(g, fns[i](g, a, idx), MN_ERR_INVALID_ARGUMENT, names[i]);
    mn_assert_graph_error(g, MN_ERR_INVALID_ARGUMENT, "b is node 1 [4,4] u32 with dtype u32");
    mn_graph_free(g);

    g = mn_graph_new();
    idx = mn_input_u32(g, "idx", MN_SHAPE(4, 4));
    a = mn_input(g, "a", MN_SHAPE(4, 4));
    assert_build_fails(g, fns[i](g, idx, a), MN_ERR_INVALID_ARGUMENT, "a is node 0");
    mn_assert_graph_error(g, MN_ERR_INVALID_ARGUMENT, "expected f32");
    mn_graph_free(g);
  }
}

Test(math, matmul_family_rank_errors) {
  mn_graph *g = mn_graph_new();
  mn_node v = mn_input(g, "v", MN_SHAPE(4));
  mn_node m = mn_input(g, "m", MN_SHAPE(4, 4));
  assert_build_fails(g, mn_matmul(g, v, m), MN_ERR_SHAPE,
                     "mn_matmul: a is node 0 [4] of rank 1, expected rank 2 to 6");
  mn_graph_free(g);

  g = mn_graph_new();
  m = mn_input(g, "m", MN_SHAPE(4, 4));
  mn_node b3 = mn_input(g, "b3", MN_SHAPE(2, 4, 4));
  assert_build_fails(g, mn_matmul(g, m, b3), MN_ERR_SHAPE, "b is node 1 [2,4,4] of rank 3");
  mn_graph_free(g);

  g = mn_graph_new();
  m = mn_input(g, "m", MN_SHAPE(4, 4));
  b3 = mn_input(g, "b3", MN_SHAPE(2, 4, 4));
  assert_build_fails(g, mn_matmul_bt(g, m, b3), MN_ERR_SHAPE, "expected rank 2");
  mn_graph_free(g);

  g = mn_graph_new();
  m = mn_input(g, "m", MN_SHAPE(4, 4));
  v = mn_input(g, "v", MN_SHAPE(4));
  assert_build_fails(g, mn_matmul_at(g, m, v), MN_ERR_SHAPE, "mn_matmul_at: b is node 1 [4]");
  mn_graph_free(g);
}

Test(math, matmul_shapes_keep_leading_dims) {
  mn_graph *g = mn_graph_new();
  mn_node a = mn_input(g, "a", MN_SHAPE(2, 3, 4));
  mn_node b = mn_input(g, "b", MN_SHAPE(4, 5));
  mn_node bt = mn_input(g, "bt", MN_SHAPE(5, 4));
  mn_node c = mn_input(g, "c", MN_SHAPE(2, 3, 7));
  mn_node y = mn_matmul(g, a, b), ybt = mn_matmul_bt(g, a, bt), yat = mn_matmul_at(g, a, c);
  mn_node_info info;
  cr_assert_eq(mn_graph_node(g, y, &info), MN_OK);
  cr_assert_eq(info.type.rank, 3);
  cr_assert(info.type.shape[0] == 2 && info.type.shape[1] == 3 && info.type.shape[2] == 5);
  cr_assert_eq(mn_graph_node(g, ybt, &info), MN_OK);
  cr_assert(info.type.rank == 3 && info.type.shape[2] == 5);
  cr_assert_eq(mn_graph_node(g, yat, &info), MN_OK);
  cr_assert(info.type.rank == 2 && info.type.shape[0] == 4 && info.type.shape[1] == 7);
  cr_assert_str_eq(info.op, "matmul_at");
  mn_graph_free(g);
}

/* ---------------------------------------------------------------- element-wise errors */

Test(math, binary_ops_shape_and_dtype_errors) {
  mn_node (*fns[])(mn_graph *, mn_node, mn_node) = {mn_add, mn_mul, mn_div, mn_greater};
  const char *names[] = {"mn_add:", "mn_mul:", "mn_div:", "mn_greater:"};
  for (int i = 0; i < 4; i++) {
    mn_graph *g = mn_graph_new();
    mn_node a = mn_input(g, "a", MN_SHAPE(2, 3));
    mn_node b = mn_input(g, "b", MN_SHAPE(3, 2));
    assert_build_fails(g, fns[i](g, a, b), MN_ERR_SHAPE, names[i]);
    mn_assert_graph_error(g, MN_ERR_SHAPE, "node 0 [2,3] and node 1 [3,2]: shapes differ");
    mn_graph_free(g);

    g = mn_graph_new();
    a = mn_input(g, "a", MN_SHAPE(2, 3));
    b = mn_input_u32(g, "b", MN_SHAPE(2, 3));
    assert_build_fails(g, fns[i](g, a, b), MN_ERR_INVALID_ARGUMENT, "with dtype u32, expected f32");
    mn_graph_free(g);
  }
}

Test(math, unary_ops_reject_u32_and_missing_nodes) {
  mn_node (*fns[])(mn_graph *, mn_node) = {mn_relu, mn_sigmoid, mn_tanh,  mn_neg,  mn_abs,
                                           mn_log,  mn_exp,     mn_recip, mn_silu, mn_gelu};
  const char *names[] = {"mn_relu:", "mn_sigmoid:", "mn_tanh:",  "mn_neg:",  "mn_abs:",
                         "mn_log:",  "mn_exp:",     "mn_recip:", "mn_silu:", "mn_gelu:"};
  for (int i = 0; i < 10; i++) {
    mn_graph *g = mn_graph_new();
    mn_node idx = mn_input_u32(g, "idx", MN_SHAPE(3));
    assert_build_fails(g, fns[i](g, idx), MN_ERR_INVALID_ARGUMENT, names[i]);
    mn_assert_graph_error(g, MN_ERR_INVALID_ARGUMENT, "x is node 0 [3] u32 with dtype u32");
    mn_graph_free(g);

    g = mn_graph_new();
    assert_build_fails(g, fns[i](g, 5), MN_ERR_INVALID_ARGUMENT,
                       "input 0 is node 5, but the graph has 0 nodes");
    mn_graph_free(g);
  }
  mn_graph *g = mn_graph_new();
  mn_node idx = mn_input_u32(g, "idx", MN_SHAPE(3));
  assert_build_fails(g, mn_scale(g, idx, 2.0f), MN_ERR_INVALID_ARGUMENT, "mn_scale: x is node 0");
  mn_graph_free(g);
}

Test(math, bias_add_errors) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(4, 6));
  mn_node b = mn_parameter(g, "b", MN_SHAPE(5));
  assert_build_fails(g, mn_bias_add(g, x, b), MN_ERR_SHAPE,
                     "mn_bias_add: node 0 [4,6] + node 1 [5]: expected [N] = [6]");
  mn_graph_free(g);

  g = mn_graph_new();
  x = mn_input(g, "x", MN_SHAPE(4, 6));
  b = mn_parameter(g, "b", MN_SHAPE(1, 6));
  assert_build_fails(g, mn_bias_add(g, x, b), MN_ERR_SHAPE,
                     "mn_bias_add: bias is node 1 [1,6] of rank 2, expected rank 1");
  mn_graph_free(g);

  g = mn_graph_new();
  x = mn_input(g, "x", MN_SHAPE(4, 6));
  b = mn_input_u32(g, "b", MN_SHAPE(6));
  assert_build_fails(g, mn_bias_add(g, x, b), MN_ERR_INVALID_ARGUMENT,
                     "mn_bias_add: bias is node 1 [6] u32 with dtype u32");
  mn_graph_free(g);
}

Test(math, broadcast_add_errors) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(4, 6));
  mn_node r = mn_input(g, "r", MN_SHAPE(2, 6));
  assert_build_fails(g, mn_broadcast_add(g, x, r), MN_ERR_SHAPE,
                     "mn_broadcast_add: node 0 [4,6] + node 1 [2,6]: expected [1,N] = [6]");
  mn_graph_free(g);

  g = mn_graph_new();
  x = mn_input(g, "x", MN_SHAPE(4, 6));
  r = mn_input(g, "r", MN_SHAPE(1, 5));
  assert_build_fails(g, mn_broadcast_add(g, x, r), MN_ERR_SHAPE, "expected [1,N] = [6]");
  mn_graph_free(g);

  g = mn_graph_new();
  x = mn_input(g, "x", MN_SHAPE(4, 6));
  r = mn_input(g, "r", MN_SHAPE(6));
  assert_build_fails(g, mn_broadcast_add(g, x, r), MN_ERR_SHAPE,
                     "mn_broadcast_add: row is node 1 [6] of rank 1, expected rank 2");
  mn_graph_free(g);

  g = mn_graph_new();
  x = mn_input(g, "x", MN_SHAPE(6));
  r = mn_input(g, "r", MN_SHAPE(1, 6));
  assert_build_fails(g, mn_broadcast_add(g, x, r), MN_ERR_SHAPE,
                     "mn_broadcast_add: x is node 0 [6] of rank 1, expected rank 2 to 6");
  mn_graph_free(g);
}

/* ---------------------------------------------------------------- forward values */

Test(math, matmul_hand_computed) {
  /* [2,2,3] x [3,2]: rows (1,2,3), (4,5,6), (-1,0,1), (0,0,0). */
  mn_graph *g = mn_graph_new();
  mn_node a = mn_input(g, "a", MN_SHAPE(2, 2, 3));
  mn_node b = mn_parameter(g, "b", MN_SHAPE(3, 2));
  mn_node y = mn_matmul(g, a, b);
  mn_set_outputs(g, &y, 1);
  float ad[] = {1, 2, 3, 4, 5, 6, -1, 0, 1, 0, 0, 0};
  float bd[] = {1, -1, 0, 2, 0.5f, 0};
  mn_test_feed feeds[] = {{"a", ad, NULL, 12, false}, {"b", bd, NULL, 6, true}};
  mn_session *s = mn_test_run(g, feeds, 2);
  float *out = mn_test_read_output(s, 0, 8);
  float want[] = {2.5f, 3, 7, 6, -0.5f, 1, 0, 0};
  mn_assert_close(out, want, 8, 0);
  free(out);
  mn_session_free(s);
  mn_graph_free(g);
}

Test(math, matmul_fixture_with_leading_dims) {
  mn_graph *g = mn_graph_new();
  mn_node a = mn_input(g, "a", MN_SHAPE(2, 3, 37));
  mn_node b = mn_input(g, "b", MN_SHAPE(37, 5));
  mn_node bt = mn_input(g, "bt", MN_SHAPE(5, 37));
  mn_node outs[] = {mn_matmul(g, a, b), mn_matmul_bt(g, a, bt)};
  mn_set_outputs(g, outs, 2);
  mn_test_feed feeds[] = {{"a", mm_a, NULL, LEN(mm_a), false},
                          {"b", mm_b, NULL, LEN(mm_b), false},
                          {"bt", mmbt_b, NULL, LEN(mmbt_b), false}};
  mn_session *s = mn_test_run(g, feeds, 3);
  float *out = mn_test_read_output(s, 0, LEN(mm_out));
  mn_assert_close(out, mm_out, LEN(mm_out), TOL);
  free(out);
  out = mn_test_read_output(s, 1, LEN(mmbt_out));
  mn_assert_close(out, mmbt_out, LEN(mmbt_out), TOL);
  free(out);
  mn_session_free(s);
  mn_graph_free(g);
}

Test(math, matmul_at_fixture_flattens_k) {
  mn_graph *g = mn_graph_new();
  mn_node a = mn_input(g, "a", MN_SHAPE(2, 3, 4));
  mn_node b = mn_input(g, "b", MN_SHAPE(2, 3, 33));
  mn_node y = mn_matmul_at(g, a, b);
  mn_set_outputs(g, &y, 1);
  mn_test_feed feeds[] = {{"a", mmat_a, NULL, LEN(mmat_a), false},
                          {"b", mmat_b, NULL, LEN(mmat_b), false}};
  mn_session *s = mn_test_run(g, feeds, 2);
  float *out = mn_test_read_output(s, 0, LEN(mmat_out));
  mn_assert_close(out, mmat_out, LEN(mmat_out), TOL);
  free(out);
  mn_session_free(s);
  mn_graph_free(g);
}

Test(math, matmul_size_one_dims) {
  mn_graph *g = mn_graph_new();
  mn_node a = mn_input(g, "a", MN_SHAPE(1, 1, 45));
  mn_node b = mn_input(g, "b", MN_SHAPE(45, 1));
  mn_node y = mn_matmul(g, a, b);
  mn_set_outputs(g, &y, 1);
  mn_test_feed feeds[] = {{"a", mm1_a, NULL, 45, false}, {"b", mm1_b, NULL, 45, false}};
  mn_session *s = mn_test_run(g, feeds, 2);
  float *out = mn_test_read_output(s, 0, 1);
  mn_assert_close(out, mm1_out, 1, TOL);
  free(out);
  mn_session_free(s);
  mn_graph_free(g);
}

Test(math, matmul_at_and_bt_hand_computed) {
  /* a [2,2] = [[1,2],[3,4]], b [2,2] = [[5,6],[7,8]]:
   * a^T b = [[26,30],[38,44]], a b^T = [[17,23],[39,53]]. */
  mn_graph *g = mn_graph_new();
  mn_node a = mn_input(g, "a", MN_SHAPE(2, 2));
  mn_node b = mn_input(g, "b", MN_SHAPE(2, 2));
  mn_node outs[] = {mn_matmul_at(g, a, b), mn_matmul_bt(g, a, b)};
  mn_set_outputs(g, outs, 2);
  float ad[] = {1, 2, 3, 4}, bd[] = {5, 6, 7, 8};
  mn_test_feed feeds[] = {{"a", ad, NULL, 4, false}, {"b", bd, NULL, 4, false}};
  mn_session *s = mn_test_run(g, feeds, 2);
  float *at = mn_test_read_output(s, 0, 4), *bt = mn_test_read_output(s, 1, 4);
  float want_at[] = {26, 30, 38, 44}, want_bt[] = {17, 23, 39, 53};
  mn_assert_close(at, want_at, 4, 0);
  mn_assert_close(bt, want_bt, 4, 0);
  free(at);
  free(bt);
  mn_session_free(s);
  mn_graph_free(g);
}

Test(math, binary_hand_computed) {
  mn_graph *g = mn_graph_new();
  mn_node a = mn_input(g, "a", MN_SHAPE(4));
  mn_node b = mn_input(g, "b", MN_SHAPE(4));
  mn_node outs[] = {mn_add(g, a, b), mn_mul(g, a, b), mn_div(g, a, b), mn_greater(g, a, b)};
  mn_set_outputs(g, outs, 4);
  float ad[] = {1, -2, 3, 0.5f}, bd[] = {2, 4, 3, -0.25f};
  mn_test_feed feeds[] = {{"a", ad, NULL, 4, false}, {"b", bd, NULL, 4, false}};
  mn_session *s = mn_test_run(g, feeds, 2);
  float want[4][4] = {{3, 2, 6, 0.25f}, {2, -8, 9, -0.125f}, {0.5f, -0.5f, 1, -2}, {0, 0, 0, 1}};
  for (size_t i = 0; i < 4; i++) {
    float *out = mn_test_read_output(s, i, 4);
    mn_assert_close(out, want[i], 4, 0);
    free(out);
  }
  mn_session_free(s);
  mn_graph_free(g);
}

Test(math, binary_fixtures) {
  check_binary(mn_add, ew_x, ew_y, ew_add, TOL, "add");
  check_binary(mn_mul, ew_x, ew_y, ew_mul, TOL, "mul");
  check_binary(mn_div, ew_x, ew_y, ew_div, TOL, "div");
  check_binary(mn_greater, ew_x, ew_y_gt, ew_greater, 0, "greater");
}

Test(math, unary_hand_computed) {
  /* x = (-2, 0, 0.5, 3); values from the closed forms, to 9 digits. */
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(4));
  mn_node outs[] = {mn_relu(g, x),        mn_neg(g, x),     mn_abs(g, x),
                    mn_scale(g, x, 1.5f), mn_sigmoid(g, x), mn_tanh(g, x),
                    mn_silu(g, x),        mn_gelu(g, x),    mn_exp(g, x)};
  mn_set_outputs(g, outs, LEN(outs));
  const char *names[] = {"relu", "neg", "abs", "scale", "sigmoid", "tanh", "silu", "gelu", "exp"};
  float xd[] = {-2, 0, 0.5f, 3};
  mn_test_feed feeds[] = {{"x", xd, NULL, 4, false}};
  mn_session *s = mn_test_run(g, feeds, 1);
  float want[][4] = {
      {0, 0, 0.5f, 3},
      {2, 0, -0.5f, -3},
      {2, 0, 0.5f, 3},
      {-3, 0, 0.75f, 4.5f},
      {0.119202922f, 0.5f, 0.622459331f, 0.952574127f},
      {-0.964027580f, 0, 0.462117157f, 0.995054754f},
      {-0.238405844f, 0, 0.311229666f, 2.857722380f},
      /* gelu: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
      {-0.045402306f, 0, 0.345714010f, 2.996362608f},
      {0.135335283f, 1, 1.648721271f, 20.085536923f},
  };
  for (size_t i = 0; i < LEN(outs); i++) {
    float *out = mn_test_read_output(s, i, 4);
    mn_assert_close_impl(out, want[i], 4, 1e-6, names[i]);
    free(out);
  }
  mn_session_free(s);
  mn_graph_free(g);
}

Test(math, log_and_recip_hand_computed) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(3));
  mn_node outs[] = {mn_log(g, x), mn_recip(g, x)};
  mn_set_outputs(g, outs, 2);
  float xd[] = {1, 4, 0.5f};
  mn_test_feed feeds[] = {{"x", xd, NULL, 3, false}};
  mn_session *s = mn_test_run(g, feeds, 1);
  float *lg = mn_test_read_output(s, 0, 3), *rc = mn_test_read_output(s, 1, 3);
  float want_log[] = {0, 1.386294361f, -0.693147181f}, want_recip[] = {1, 0.25f, 2};
  mn_assert_close(lg, want_log, 3, 1e-7);
  mn_assert_close(rc, want_recip, 3, 0);
  free(lg);
  free(rc);
  mn_session_free(s);
  mn_graph_free(g);
}

static mn_node scale_neg_0375(mn_graph *g, mn_node x) { return mn_scale(g, x, -0.375f); }

Test(math, unary_fixtures) {
  check_unary(mn_relu, ew_x, ew_relu, "relu");
  check_unary(mn_sigmoid, ew_x, ew_sigmoid, "sigmoid");
  check_unary(mn_tanh, ew_x, ew_tanh, "tanh");
  check_unary(mn_neg, ew_x, ew_neg, "neg");
  check_unary(mn_abs, ew_x, ew_abs, "abs");
  check_unary(mn_exp, ew_x, ew_exp, "exp");
  check_unary(mn_silu, ew_x, ew_silu, "silu");
  check_unary(mn_gelu, ew_x, ew_gelu, "gelu");
  check_unary(mn_log, ew_pos, ew_log, "log");
  check_unary(mn_recip, ew_pos, ew_recip, "recip");
  check_unary(scale_neg_0375, ew_x, ew_scale, "scale");
}

Test(math, bias_add_fixture_over_leading_dims) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(2, 3, 7));
  mn_node b = mn_parameter(g, "b", MN_SHAPE(7));
  mn_node y = mn_bias_add(g, x, b);
  mn_set_outputs(g, &y, 1);
  mn_test_feed feeds[] = {{"x", ba_x, NULL, LEN(ba_x), false},
                          {"b", ba_bias, NULL, LEN(ba_bias), true}};
  mn_session *s = mn_test_run(g, feeds, 2);
  float *out = mn_test_read_output(s, 0, LEN(ba_out));
  mn_assert_close(out, ba_out, LEN(ba_out), TOL);
  free(out);
  mn_session_free(s);
  mn_graph_free(g);
}

Test(math, broadcast_add_fixture) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(5, 7));
  mn_node r = mn_input(g, "r", MN_SHAPE(1, 7));
  mn_node y = mn_broadcast_add(g, x, r);
  mn_set_outputs(g, &y, 1);
  mn_test_feed feeds[] = {{"x", bc_x, NULL, LEN(bc_x), false},
                          {"r", bc_row, NULL, LEN(bc_row), false}};
  mn_session *s = mn_test_run(g, feeds, 2);
  float *out = mn_test_read_output(s, 0, LEN(bc_out));
  mn_assert_close(out, bc_out, LEN(bc_out), TOL);
  free(out);
  mn_session_free(s);
  mn_graph_free(g);
}

Test(math, bias_add_and_broadcast_add_hand_computed) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(2, 3));
  mn_node b = mn_constant(g, (const float[]){10, 20, 30}, MN_SHAPE(3));
  mn_node r = mn_constant(g, (const float[]){-1, -2, -3}, MN_SHAPE(1, 3));
  mn_node outs[] = {mn_bias_add(g, x, b), mn_broadcast_add(g, x, r)};
  mn_set_outputs(g, outs, 2);
  float xd[] = {1, 2, 3, 4, 5, 6};
  mn_test_feed feeds[] = {{"x", xd, NULL, 6, false}};
  mn_session *s = mn_test_run(g, feeds, 1);
  float *o0 = mn_test_read_output(s, 0, 6), *o1 = mn_test_read_output(s, 1, 6);
  float w0[] = {11, 22, 33, 14, 25, 36}, w1[] = {0, 0, 0, 3, 3, 3};
  mn_assert_close(o0, w0, 6, 0);
  mn_assert_close(o1, w1, 6, 0);
  free(o0);
  free(o1);
  mn_session_free(s);
  mn_graph_free(g);
}

/* ---------------------------------------------------------------- GELU's float form */

/* The device computes GELU and its slope in float (host/pointwise.h, suffix _f32 on the host,
 * with expf where the device's exp of -|2u| is ex2.approx, up to half an ulp more per unit of
 * |2u| and two ulps, which these do not measure); these measure that arithmetic against the tanh
 * formula in long double, written as
 * x sigmoid(2u) as well, since 0.5 (1 + tanh(u)) loses digits even in long double below x of
 * about -4. */
typedef struct gelu_ref {
  long double value, slope;
  long double slope_terms; /* |s| + |x s (1 - s) 2K (1 + 3C x^2)|: the slope's scale at its zero */
  long double amp;         /* -2u where u < 0, else 0: how exp magnifies an error in u */
} gelu_ref;

#define GELU_K 0.79788456080286535587989211986876373695L /* sqrt(2 / pi) */
#define GELU_C 0.044715L

static gelu_ref gelu_long_double(float xf) {
  long double x = xf, u = GELU_K * (x + GELU_C * x * x * x), e = expl(-2 * u);
  long double s = 1 / (1 + e), one_minus_s = e / (1 + e);
  long double w = 2 * x * s * one_minus_s * GELU_K * (1 + 3 * GELU_C * x * x);
  return (gelu_ref){x * s, s + w, fabsl(s) + fabsl(w), u < 0 ? -2 * u : 0};
}

/* The identity the reference rests on, checked where the tanh form does not cancel in long
 * double. */
Test(math, gelu_reference_matches_the_tanh_formula) {
  for (int i = 0; i <= 16000; i++) {
    float x = -4.0f + (float)i * 1e-3f;
    long double xl = x, t = tanhl(GELU_K * (xl + GELU_C * xl * xl * xl));
    long double value = 0.5L * xl * (1 + t);
    long double slope =
        0.5L * (1 + t) + 0.5L * xl * (1 - t * t) * GELU_K * (1 + 3 * GELU_C * xl * xl);
    gelu_ref r = gelu_long_double(x);
    cr_assert_leq(fabsl(value - r.value), 1e-13L * fabsl(r.value), "x = %.9g", (double)x);
    cr_assert_leq(fabsl(slope - r.slope), 1e-13L * r.slope_terms, "x = %.9g", (double)x);
  }
}

/* Bound, in ulps of 1 (FLT_EPSILON): 3, for the few roundings of the sigmoid and the product
 * (measured up to 1.4 for the value and 1.9 for the slope), plus 2 per unit of -2u where u < 0:
 * u is rounded a few times before exp, and exp turns an error d in -2u into a relative d |2u|
 * of s = e / (1 + e) (measured up to 1.6 per unit). That growth is GELU's own: its condition
 * number |x f' / f| is at least |2u| there, and the error beyond 3 ulp stays below 0.8 of what
 * a relative change of 2^-23 in x does, so the float form costs about one more ulp of input.
 * Relative to the value, and for the slope to its terms' magnitudes (it crosses 0 at
 * x = -0.7518). Both are floored at 2^-100 (the value is below it for x under -9.27): smaller
 * values matter to no sum, and from 2^-126 (x under -10.1) they are float subnormals with
 * fewer bits to be relative to. */
static long double gelu_bound(long double amp, long double scale) {
  return (3 + 2 * amp) * FLT_EPSILON * fmaxl(scale, 0x1p-100L);
}

Test(math, gelu_float_form_within_a_few_ulps) {
  enum { N = 240000 };
  double worst_value = 0, worst_slope = 0, at_value = 0, at_slope = 0;
  double worst_value_core = 0, worst_slope_core = 0; /* u >= 0, where nothing magnifies */
  for (int i = 0; i <= N; i++) {
    float x = (float)(-12.0 + 24.0 * i / N);
    gelu_ref r = gelu_long_double(x);
    float value = mn_pw_gelu_tanh_f32(x), slope = mn_pw_gelu_tanh_grad_f32(x);
    cr_assert(!isnan(value) && !isnan(slope), "x = %.9g: %g, slope %g", (double)x, value, slope);
    long double ev = fabsl(value - r.value), es = fabsl(slope - r.slope);
    double qv = (double)(ev / gelu_bound(r.amp, fabsl(r.value)));
    double qs = (double)(es / gelu_bound(r.amp, r.slope_terms));
    cr_assert_leq(qv, 1.0, "x = %.9g: gelu %.9g, long double %.12Lg", (double)x, value, r.value);
    cr_assert_leq(qs, 1.0, "x = %.9g: slope %.9g, long double %.12Lg", (double)x, slope, r.slope);
    if (qv > worst_value) worst_value = qv, at_value = x;
    if (qs > worst_slope) worst_slope = qs, at_slope = x;
    if (r.amp == 0) {
      worst_value_core = fmax(worst_value_core, (double)(ev / fabsl(r.value)) / FLT_EPSILON);
      worst_slope_core = fmax(worst_slope_core, (double)(es / r.slope_terms) / FLT_EPSILON);
    }
  }
  cr_log_info("gelu: at most %.2f of the bound (x = %g), %.2f ulp where u >= 0; slope: %.2f of "
              "the bound (x = %g), %.2f ulp",
              worst_value, at_value, worst_value_core, worst_slope, at_slope, worst_slope_core);
  /* The rows compute in double on the host and round once. */
  for (int i = 0; i <= N; i += 7) {
    float x = (float)(-12.0 + 24.0 * i / N);
    gelu_ref r = gelu_long_double(x);
    long double value = (float)mn_pw_gelu_tanh(x), slope = (float)mn_pw_gelu_tanh_grad(x);
    cr_assert_leq(fabsl(value - r.value), 0x1.01p-24L * fmaxl(fabsl(r.value), 0x1p-100L), "x = %g",
                  (double)x);
    cr_assert_leq(fabsl(slope - r.slope), 0x1.01p-24L * fmaxl(r.slope_terms, 0x1p-100L), "x = %g",
                  (double)x);
  }
}

/* The limits where exp under- or overflows, and what the float form makes of 0, tiny, huge,
 * infinite and NaN inputs, the same as the rows. */
Test(math, gelu_float_form_limits) {
  static const struct {
    float x, value, slope;
  } cases[] = {
      {0.0f, 0.0f, 0.5f},       {0x1p-149f, 0.0f, 0.5f},  {1e-30f, 5e-31f, 0.5f},
      {-1e-30f, -5e-31f, 0.5f}, {11.0f, 11.0f, 1.0f},     {1e4f, 1e4f, 1.0f},
      {1e20f, 1e20f, 1.0f},     {FLT_MAX, FLT_MAX, 1.0f}, {INFINITY, INFINITY, 1.0f},
      {-11.0f, -0.0f, 0.0f},    {-1e4f, -0.0f, 0.0f},     {-1e20f, -0.0f, 0.0f},
      {-FLT_MAX, -0.0f, 0.0f},  {-INFINITY, -0.0f, 0.0f},
  };
  for (size_t i = 0; i < LEN(cases); i++) {
    float x = cases[i].x;
    float v[2] = {mn_pw_gelu_tanh_f32(x), (float)mn_pw_gelu_tanh(x)};
    float d[2] = {mn_pw_gelu_tanh_grad_f32(x), (float)mn_pw_gelu_tanh_grad(x)};
    for (int k = 0; k < 2; k++) {
      cr_expect_eq(v[k], cases[i].value, "%s gelu(%g) = %g", k ? "double" : "float", x, v[k]);
      cr_expect_eq(!!signbit(v[k]), !!signbit(cases[i].value), "%s gelu(%g) = %g",
                   k ? "double" : "float", x, v[k]);
      cr_expect_eq(d[k], cases[i].slope, "%s gelu'(%g) = %g", k ? "double" : "float", x, d[k]);
    }
  }
  cr_expect(signbit(mn_pw_gelu_tanh_f32(-0.0f)), "gelu(-0) is -0");
  cr_expect(isnan(mn_pw_gelu_tanh_f32(NAN)) && isnan(mn_pw_gelu_tanh_grad_f32(NAN)));
  cr_expect(isnan(mn_pw_gelu_tanh(NAN)) && isnan(mn_pw_gelu_tanh_grad(NAN)));
}
