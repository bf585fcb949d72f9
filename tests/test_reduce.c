/* Reductions and losses, forward on the reference backend: against float64 numpy values
 * (tests/fixtures/reduce_fixtures.h, from scripts/fixtures/gen_reduce.py) and against
 * values worked out by hand. Builder and runtime errors are in test_reduce_errors.c. */
#include <stdlib.h>

#include "tests/fixtures/reduce_fixtures.h"
#include "tests/support/mn_test.h"

/* fp32 outputs of float64 math on exact fp32 inputs: only the final rounding differs. */
#define TOL 1e-6

typedef mn_node (*unary_builder)(mn_graph *, mn_node);
typedef mn_node (*binary_builder)(mn_graph *, mn_node, mn_node);

static void assert_finite(const float *x, size_t n) {
  for (size_t i = 0; i < n; i++)
    cr_assert(isfinite(x[i]), "element %zu is %g", i, (double)x[i]);
}

static size_t numel_of(const int64_t *shape, int rank) {
  size_t n = 1;
  for (int i = 0; i < rank; i++)
    n *= (size_t)shape[i];
  return n;
}

/* y = f(x) with x of the given shape; y is compared with want (want_n elements). */
static void check_unary(unary_builder f, const float *x, const int64_t *shape, int rank,
                        const float *want, size_t want_n) {
  mn_graph *g = mn_graph_new();
  mn_node in = mn_input(g, "x", shape, rank);
  mn_node y = f(g, in);
  mn_set_outputs(g, &y, 1);
  mn_test_feed feeds[] = {{"x", x, NULL, numel_of(shape, rank), false}};
  mn_session *s = mn_test_run(g, feeds, 1);
  float *out = mn_test_read_output(s, 0, want_n);
  assert_finite(out, want_n);
  mn_assert_close(out, want, want_n, TOL);
  free(out);
  mn_session_free(s);
  mn_graph_free(g);
}

/* loss = f(a, b); b is U32 labels when labels is not NULL. The loss is also read back
 * through mn_session_read_loss, since a [1] output is the session's loss. */
static void check_loss(binary_builder f, const float *a, const int64_t *shape_a, int rank_a,
                       const float *b, const uint32_t *labels, const int64_t *shape_b, int rank_b,
                       float want) {
  mn_graph *g = mn_graph_new();
  mn_node na = mn_input(g, "a", shape_a, rank_a);
  mn_node nb = labels ? mn_input_u32(g, "b", shape_b, rank_b) : mn_input(g, "b", shape_b, rank_b);
  mn_node y = f(g, na, nb);
  mn_set_outputs(g, &y, 1);
  mn_node_info info;
  cr_assert_eq(mn_graph_node(g, y, &info), MN_OK);
  cr_assert(info.type.rank == 1 && info.type.shape[0] == 1 && info.type.dtype == MN_F32);
  mn_test_feed feeds[] = {{"a", a, NULL, numel_of(shape_a, rank_a), false},
                          {"b", b, labels, numel_of(shape_b, rank_b), false}};
  mn_session *s = mn_test_run(g, feeds, 2);
  float *out = mn_test_read_output(s, 0, 1);
  assert_finite(out, 1);
  mn_assert_close(out, &want, 1, TOL);
  cr_assert_eq(mn_session_read_loss(s), out[0]);
  free(out);
  mn_session_free(s);
  mn_graph_free(g);
}

Test(reduce, sum_and_mean_by_hand) {
  const float x[] = {1, 2, 3, 4, -0.5f, 0.5f};
  check_unary(mn_sum_all, x, MN_SHAPE(2, 3), (const float[]){10}, 1);
  check_unary(mn_mean_all, x, MN_SHAPE(2, 3), (const float[]){10.0f / 6}, 1);
  check_unary(mn_mean_all, x, MN_SHAPE(1, 1, 1, 1), (const float[]){1}, 1);
}

Test(reduce, sum_and_mean_fixtures) {
  check_unary(mn_sum_all, rd_x_1, MN_SHAPE(1), rd_sum_1, 1);
  check_unary(mn_mean_all, rd_x_1, MN_SHAPE(1), rd_mean_1, 1);
  check_unary(mn_sum_all, rd_x_37, MN_SHAPE(37), rd_sum_37, 1);
  check_unary(mn_mean_all, rd_x_37, MN_SHAPE(37), rd_mean_37, 1);
  check_unary(mn_sum_all, rd_x_33x37, MN_SHAPE(33, 37), rd_sum_33x37, 1);
  check_unary(mn_mean_all, rd_x_33x37, MN_SHAPE(33, 37), rd_mean_33x37, 1);
  check_unary(mn_sum_all, rd_x_2x3x37, MN_SHAPE(2, 3, 37), rd_sum_2x3x37, 1);
  check_unary(mn_mean_all, rd_x_2x3x37, MN_SHAPE(2, 3, 37), rd_mean_2x3x37, 1);
}

Test(reduce, sum_all_output_is_scalar) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(2, 3, 4));
  mn_node y = mn_sum_all(g, x), z = mn_mean_all(g, x);
  mn_node_info info;
  cr_assert_eq(mn_graph_node(g, y, &info), MN_OK);
  cr_assert_str_eq(info.op, "sum_all");
  cr_assert(info.type.rank == 1 && info.type.shape[0] == 1);
  cr_assert_eq(mn_graph_node(g, z, &info), MN_OK);
  cr_assert_str_eq(info.op, "mean_all");
  cr_assert(info.type.rank == 1 && info.type.shape[0] == 1);
  mn_graph_free(g);
}

Test(reduce, softmax_by_hand) {
  const float x[] = {1000, 1000, -1000, -1000, 0, 0};
  check_unary(mn_softmax, x, MN_SHAPE(3, 2), (const float[]){0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f},
              6);
  const float ln2 = 0.693147180559945f;
  check_unary(mn_log_softmax, x, MN_SHAPE(3, 2),
              (const float[]){-ln2, -ln2, -ln2, -ln2, -ln2, -ln2}, 6);
  const float one[] = {-1000, 1000, 7};
  check_unary(mn_softmax, one, MN_SHAPE(3, 1), (const float[]){1, 1, 1}, 3);
  check_unary(mn_log_softmax, one, MN_SHAPE(3, 1), (const float[]){0, 0, 0}, 3);
}

Test(reduce, softmax_keeps_type) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(2, 3, 37));
  mn_node ops[2] = {mn_softmax(g, x), mn_log_softmax(g, x)};
  for (int i = 0; i < 2; i++) {
    mn_node_info info;
    cr_assert_eq(mn_graph_node(g, ops[i], &info), MN_OK);
    cr_assert_str_eq(info.op, i ? "log_softmax" : "softmax");
    cr_assert(info.type.dtype == MN_F32 && info.type.rank == 3 && info.type.shape[0] == 2 &&
              info.type.shape[1] == 3 && info.type.shape[2] == 37);
  }
  mn_graph_free(g);
}

Test(reduce, softmax_fixtures) {
  check_unary(mn_softmax, rd_x_7, MN_SHAPE(7), rd_softmax_7, 7);
  check_unary(mn_log_softmax, rd_x_7, MN_SHAPE(7), rd_log_softmax_7, 7);
  check_unary(mn_softmax, rd_x_33x37, MN_SHAPE(33, 37), rd_softmax_33x37, 33 * 37);
  check_unary(mn_log_softmax, rd_x_33x37, MN_SHAPE(33, 37), rd_log_softmax_33x37, 33 * 37);
  check_unary(mn_softmax, rd_x_2x3x37, MN_SHAPE(2, 3, 37), rd_softmax_2x3x37, 2 * 3 * 37);
  check_unary(mn_log_softmax, rd_x_2x3x37, MN_SHAPE(2, 3, 37), rd_log_softmax_2x3x37, 2 * 3 * 37);
  check_unary(mn_softmax, rd_x_5x1, MN_SHAPE(5, 1), rd_softmax_5x1, 5);
  check_unary(mn_log_softmax, rd_x_5x1, MN_SHAPE(5, 1), rd_log_softmax_5x1, 5);
}

/* Rows with +-1000 together, all equal, all -1000, and a near-tie at 1000: a softmax
 * that does not subtract the max overflows to inf/NaN here. */
Test(reduce, softmax_extreme_rows) {
  check_unary(mn_softmax, rd_x_ext, MN_SHAPE(4, 4), rd_softmax_ext, 16);
  check_unary(mn_log_softmax, rd_x_ext, MN_SHAPE(4, 4), rd_log_softmax_ext, 16);
  check_unary(mn_softmax, rd_x_ext, MN_SHAPE(2, 2, 4), rd_softmax_ext, 16);
}

Test(reduce, cross_entropy_by_hand) {
  /* Uniform logits over 3 classes with a one-hot target: ln 3. */
  check_loss(mn_cross_entropy_loss, (const float[]){0, 0, 0}, MN_SHAPE(1, 3),
             (const float[]){1, 0, 0}, NULL, MN_SHAPE(1, 3), 1.0986122886681098f);
  /* Two rows, the loss is their mean: ln 2 and 0 (a certain prediction). */
  check_loss(mn_cross_entropy_loss, (const float[]){0, 0, 1000, -1000}, MN_SHAPE(2, 2),
             (const float[]){0.5f, 0.5f, 1, 0}, NULL, MN_SHAPE(2, 2), 0.34657359027997264f);
}

Test(reduce, cross_entropy_fixtures) {
  check_loss(mn_cross_entropy_loss, rd_x_37, MN_SHAPE(37), rd_t_37, NULL, MN_SHAPE(37),
             rd_ce_37[0]);
  check_loss(mn_cross_entropy_loss, rd_x_33x37, MN_SHAPE(33, 37), rd_t_33x37, NULL,
             MN_SHAPE(33, 37), rd_ce_33x37[0]);
  check_loss(mn_cross_entropy_loss, rd_x_2x3x37, MN_SHAPE(2, 3, 37), rd_t_2x3x37, NULL,
             MN_SHAPE(2, 3, 37), rd_ce_2x3x37[0]);
  check_loss(mn_cross_entropy_loss, rd_x_5x1, MN_SHAPE(5, 1), rd_t_5x1, NULL, MN_SHAPE(5, 1),
             rd_ce_5x1[0]);
  check_loss(mn_cross_entropy_loss, rd_x_ext, MN_SHAPE(4, 4), rd_t_ext, NULL, MN_SHAPE(4, 4),
             rd_ce_ext[0]);
}

Test(reduce, sparse_cross_entropy_by_hand) {
  check_loss(mn_sparse_cross_entropy_loss, (const float[]){0, 0}, MN_SHAPE(2), NULL,
             (const uint32_t[]){1}, MN_SHAPE(1), 0.6931471805599453f);
  /* Rows: uniform over 4 (ln 4), certain and right (0), certain and wrong (2000). */
  check_loss(mn_sparse_cross_entropy_loss,
             (const float[]){1, 1, 1, 1, 1000, -1000, -1000, -1000, -1000, 1000, -1000, -1000},
             MN_SHAPE(3, 4), NULL, (const uint32_t[]){2, 0, 0}, MN_SHAPE(3),
             (1.3862943611198906f + 0 + 2000) / 3);
}

Test(reduce, sparse_cross_entropy_fixtures) {
  check_loss(mn_sparse_cross_entropy_loss, rd_x_37, MN_SHAPE(37), NULL, rd_lab_37, MN_SHAPE(1),
             rd_sce_37[0]);
  check_loss(mn_sparse_cross_entropy_loss, rd_x_33x37, MN_SHAPE(33, 37), NULL, rd_lab_33,
             MN_SHAPE(33), rd_sce_33x37[0]);
  check_loss(mn_sparse_cross_entropy_loss, rd_x_2x3x37, MN_SHAPE(2, 3, 37), NULL, rd_lab_2x3,
             MN_SHAPE(2, 3), rd_sce_2x3x37[0]);
  check_loss(mn_sparse_cross_entropy_loss, rd_x_5x1, MN_SHAPE(5, 1), NULL, rd_lab_5, MN_SHAPE(5),
             rd_sce_5x1[0]);
  check_loss(mn_sparse_cross_entropy_loss, rd_x_ext, MN_SHAPE(4, 4), NULL, rd_lab_ext, MN_SHAPE(4),
             rd_sce_ext[0]);
}

Test(reduce, sparse_cross_entropy_feeds_softmax_output) {
  /* A loss mid-graph input: log_softmax then the loss on its output equals the loss
   * on the raw logits, since log_softmax is idempotent. */
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(33, 37));
  mn_node lab = mn_input_u32(g, "lab", MN_SHAPE(33));
  mn_node y = mn_sparse_cross_entropy_loss(g, mn_log_softmax(g, x), lab);
  mn_set_outputs(g, &y, 1);
  mn_test_feed feeds[] = {{"x", rd_x_33x37, NULL, 33 * 37, false},
                          {"lab", NULL, rd_lab_33, 33, false}};
  mn_session *s = mn_test_run(g, feeds, 2);
  float *out = mn_test_read_output(s, 0, 1);
  /* Rounding log_softmax's output to fp32 costs a few ulps of each logit. */
  mn_assert_close(out, rd_sce_33x37, 1, 1e-5);
  free(out);
  mn_session_free(s);
  mn_graph_free(g);
}

Test(reduce, bce_by_hand) {
  /* ln 2 for p = 0.5, whatever t. */
  check_loss(mn_bce_loss, (const float[]){0.5f, 0.5f, 0.5f}, MN_SHAPE(3),
             (const float[]){0, 1, 0.25f}, NULL, MN_SHAPE(3), 0.6931471805599453f);
  /* p at 0 and 1: right answers cost 0, wrong ones 100 each (the log is clamped at
   * -100, as in PyTorch), never inf or NaN. */
  check_loss(mn_bce_loss, (const float[]){0, 1, 0, 1}, MN_SHAPE(2, 2), (const float[]){0, 1, 1, 0},
             NULL, MN_SHAPE(2, 2), 50);
}

Test(reduce, bce_fixtures) {
  check_loss(mn_bce_loss, rd_p_1, MN_SHAPE(1), rd_pt_1, NULL, MN_SHAPE(1), rd_bce_1[0]);
  check_loss(mn_bce_loss, rd_p_33, MN_SHAPE(33), rd_pt_33, NULL, MN_SHAPE(33), rd_bce_33[0]);
  check_loss(mn_bce_loss, rd_p_2x3x37, MN_SHAPE(2, 3, 37), rd_pt_2x3x37, NULL, MN_SHAPE(2, 3, 37),
             rd_bce_2x3x37[0]);
}

Test(reduce, mse_and_l1_by_hand) {
  const float p[] = {1, 2, 3}, t[] = {1, 0, 0};
  check_loss(mn_mse_loss, p, MN_SHAPE(3), t, NULL, MN_SHAPE(3), 13.0f / 3);
  check_loss(mn_l1_loss, p, MN_SHAPE(3), t, NULL, MN_SHAPE(3), 5.0f / 3);
  check_loss(mn_mse_loss, p, MN_SHAPE(3), p, NULL, MN_SHAPE(3), 0);
  check_loss(mn_l1_loss, p, MN_SHAPE(1, 3, 1), p, NULL, MN_SHAPE(1, 3, 1), 0);
}

Test(reduce, mse_and_l1_fixtures) {
  check_loss(mn_mse_loss, rd_p_1, MN_SHAPE(1), rd_pt_1, NULL, MN_SHAPE(1), rd_mse_1[0]);
  check_loss(mn_l1_loss, rd_p_1, MN_SHAPE(1), rd_pt_1, NULL, MN_SHAPE(1), rd_l1_1[0]);
  check_loss(mn_mse_loss, rd_x_33x37, MN_SHAPE(33, 37), rd_t_33x37, NULL, MN_SHAPE(33, 37),
             rd_mse_33x37[0]);
  check_loss(mn_l1_loss, rd_x_33x37, MN_SHAPE(33, 37), rd_t_33x37, NULL, MN_SHAPE(33, 37),
             rd_l1_33x37[0]);
  check_loss(mn_mse_loss, rd_y_2x3x5, MN_SHAPE(2, 3, 5), rd_z_2x3x5, NULL, MN_SHAPE(2, 3, 5),
             rd_mse_2x3x5[0]);
  check_loss(mn_l1_loss, rd_y_2x3x5, MN_SHAPE(2, 3, 5), rd_z_2x3x5, NULL, MN_SHAPE(2, 3, 5),
             rd_l1_2x3x5[0]);
}
