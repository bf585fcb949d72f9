/* CUDA kernels of the reductions, softmax, losses and their gradients against the
 * reference backend: every graph is compiled with NVRTC (no device needed), then, on a
 * GPU, run on both backends with the same random data; plus the runtime errors of an
 * out-of-range label and of labels that are all MN_IGNORE_LABEL. */
#include "tests/support/cuda_check.h"
#include "tests/support/mn_test.h"
#include "tests/support/session_util.h"

typedef mn_node (*binary_fn)(mn_graph *, mn_node, mn_node);

/* A loss of two parameters, scaled by 3 so that the loss gradient's dy is not 1. */
static void check_loss(binary_fn f, const int64_t *shape, int rank, const mn_test_range *ranges,
                       uint64_t seed) {
  mn_graph *g = mn_graph_new();
  mn_node a = mn_parameter(g, "a", shape, rank), b = mn_parameter(g, "b", shape, rank);
  mn_node loss = mn_scale(g, f(g, a, b), 3.0f);
  mn_set_outputs(g, (mn_node[]){loss}, 1);
  mn_test_check_cuda(g, true, ranges, seed);
  mn_graph_free(g);
}

/* ------------------------------------------------------------------ sum_all, mean_all */

Test(cuda_reduce, sum_all_mean_all) {
  mn_test_require_cuda_build();
  mn_test_check_cuda_unary(mn_sum_all, MN_SHAPE(1), -1, 1, 1);
  mn_test_check_cuda_unary(mn_sum_all, MN_SHAPE(3, 5, 7), -1, 1, 2);
  mn_test_check_cuda_unary(mn_mean_all, MN_SHAPE(3, 5, 7), -1, 1, 3);
  /* One block (up to 4096 elements), then two passes with few and with capped parts. */
  mn_test_check_cuda_unary(mn_mean_all, MN_SHAPE(4099), -1, 1, 4);
  mn_test_check_cuda_unary(mn_sum_all, MN_SHAPE(64, 768), 0, 1, 5);
  mn_test_check_cuda_unary(mn_mean_all, MN_SHAPE(2000, 2501), 0, 1, 6);
  mn_test_require_cuda_device(); /* reports the GPU comparisons as skipped */
}

/* ------------------------------------------------------------------ softmax */

/* Rows of 1; a warp per row (short rows, float4 and not); a block per row (4096-wide
 * and a GPT-2 vocabulary row); GPT-2 attention-sized rows. */
Test(cuda_reduce, softmax) {
  mn_test_require_cuda_build();
  mn_test_check_cuda_unary(mn_softmax, MN_SHAPE(5, 1), -3, 3, 7);
  mn_test_check_cuda_unary(mn_softmax, MN_SHAPE(3, 5, 7), -3, 3, 8);
  mn_test_check_cuda_unary(mn_softmax, MN_SHAPE(2, 64, 768), -3, 3, 9);
  mn_test_check_cuda_unary(mn_softmax, MN_SHAPE(12, 64, 64), -3, 3, 10);
  mn_test_check_cuda_unary(mn_softmax, MN_SHAPE(3, 4096), -3, 3, 11);
  mn_test_check_cuda_unary(mn_softmax, MN_SHAPE(3, 50257), -3, 3, 12);
  mn_test_check_cuda_unary(mn_softmax, MN_SHAPE(1000, 13), -3, 3, 13);
  mn_test_require_cuda_device(); /* reports the GPU comparisons as skipped */
}

Test(cuda_reduce, log_softmax) {
  mn_test_require_cuda_build();
  mn_test_check_cuda_unary(mn_log_softmax, MN_SHAPE(1, 1), -3, 3, 14);
  mn_test_check_cuda_unary(mn_log_softmax, MN_SHAPE(3, 5, 7), -3, 3, 15);
  mn_test_check_cuda_unary(mn_log_softmax, MN_SHAPE(2, 64, 768), -3, 3, 16);
  mn_test_check_cuda_unary(mn_log_softmax, MN_SHAPE(3, 4096), -3, 3, 17);
  mn_test_check_cuda_unary(mn_log_softmax, MN_SHAPE(3, 50257), -3, 3, 18);
  mn_test_check_cuda_unary(mn_log_softmax, MN_SHAPE(37), -3, 3, 19);
  mn_test_require_cuda_device(); /* reports the GPU comparisons as skipped */
}

/* Wide-ranged logits: the max subtraction must keep exp finite. */
Test(cuda_reduce, softmax_large_logits) {
  mn_test_require_cuda_build();
  mn_test_check_cuda_unary(mn_softmax, MN_SHAPE(4, 1000), -80, 80, 20);
  mn_test_check_cuda_unary(mn_log_softmax, MN_SHAPE(4, 1000), -80, 80, 21);
  mn_test_require_cuda_device(); /* reports the GPU comparisons as skipped */
}

/* ------------------------------------------------------------------ cross-entropy */

Test(cuda_reduce, cross_entropy) {
  mn_test_require_cuda_build();
  const mn_test_range r[] = {{"a", -3, 3}, {"b", 0, 1}, {NULL, 0, 0}};
  check_loss(mn_cross_entropy_loss, MN_SHAPE(3, 5, 7), r, 22);
  check_loss(mn_cross_entropy_loss, MN_SHAPE(1, 1), r, 23);
  check_loss(mn_cross_entropy_loss, MN_SHAPE(64, 768), r, 24);
  check_loss(mn_cross_entropy_loss, MN_SHAPE(4, 50257), r, 25);
  check_loss(mn_cross_entropy_loss, MN_SHAPE(37), r, 26);
  mn_test_require_cuda_device(); /* reports the GPU comparisons as skipped */
}

/* logits [.., C] from a parameter through a matmul, labels U32 [..]. */
static void check_sparse(const int64_t *shape, int rank, uint64_t seed) {
  mn_graph *g = mn_graph_new();
  int64_t c = shape[rank - 1];
  mn_node logits = mn_parameter(g, "logits", shape, rank);
  mn_node labels = rank == 1 ? mn_input_u32(g, "labels", MN_SHAPE(1))
                             : mn_input_u32(g, "labels", shape, rank - 1);
  mn_node loss = mn_scale(g, mn_sparse_cross_entropy_loss(g, logits, labels), 0.5f);
  mn_set_outputs(g, (mn_node[]){loss}, 1);
  const mn_test_range r[] = {{"logits", -4, 4}, {"labels", 0, (double)c}, {NULL, 0, 0}};
  mn_test_check_cuda(g, true, r, seed);
  mn_graph_free(g);
}

Test(cuda_reduce, sparse_cross_entropy) {
  mn_test_require_cuda_build();
  check_sparse(MN_SHAPE(5, 1), 1);
  check_sparse(MN_SHAPE(37), 2);
  check_sparse(MN_SHAPE(3, 5, 7), 3);
  check_sparse(MN_SHAPE(2, 64, 768), 4);
  check_sparse(MN_SHAPE(2, 64, 50257), 5);
  mn_test_require_cuda_device(); /* reports the GPU comparisons as skipped */
}

/* Labels of which about a third are MN_IGNORE_LABEL: the loss of the forward alone, and in
 * training the loss and the logits' gradient (the one-pass loss gradient of
 * optimizer/loss_grad.h in every precision), fp32 at 1e-5 and bf16 at MN_TEST_BF16_TOL. Every
 * shape has enough rows that some count. */
static void check_sparse_ignoring(const int64_t *shape, int rank, uint64_t seed) {
  mn_graph *g = mn_graph_new();
  mn_node logits = mn_parameter(g, "logits", shape, rank);
  mn_node labels = mn_input_u32(g, "labels", shape, rank - 1);
  mn_node loss = mn_scale(g, mn_sparse_cross_entropy_loss(g, logits, labels), 0.5f);
  mn_set_outputs(g, (mn_node[]){loss}, 1);
  mn_test_assert_compiles(g, true);
  mn_test_assert_compiles(g, false);
  if (mn_test_cuda_device_present()) {
    const mn_test_range r[] = {
        {"logits", -4, 4}, {"labels", 0, (double)shape[rank - 1]}, {NULL, 0, 0}};
    double e[3] = {
        mn_test_compare_cuda_ignoring(g, false, MN_PRECISION_F32, 1e-5, r, "labels", 0.35, seed),
        mn_test_compare_cuda_ignoring(g, true, MN_PRECISION_F32, 1e-5, r, "labels", 0.35, seed),
        mn_test_compare_cuda_ignoring(g, true, MN_PRECISION_BF16, MN_TEST_BF16_TOL, r, "labels",
                                      0.35, seed)};
    cr_log_info("ignored labels, %lld classes: largest relative error fp32 forward %.3g, fp32 "
                "training %.3g, bf16 training %.3g",
                (long long)shape[rank - 1], e[0], e[1], e[2]);
  }
  mn_graph_free(g);
}

Test(cuda_reduce, sparse_cross_entropy_with_ignored_labels) {
  mn_test_require_cuda_build();
  check_sparse_ignoring(MN_SHAPE(40, 1), 41);
  /* The one-block loss (at most 65536 logits) with lane groups of 16 and of 32. */
  check_sparse_ignoring(MN_SHAPE(20, 100), 45);
  check_sparse_ignoring(MN_SHAPE(40, 300), 46);
  check_sparse_ignoring(MN_SHAPE(3, 5, 7), 42);
  check_sparse_ignoring(MN_SHAPE(2, 64, 768), 43);
  check_sparse_ignoring(MN_SHAPE(2, 64, 50257), 44);
  mn_test_require_cuda_device(); /* reports the GPU comparisons as skipped */
}

/* Logits made by a product, so that a bf16 plan stores them in bf16 and the loss gradient,
 * written over them, takes the row held in registers (kernels/reduce_loss.cuh): vocabularies
 * of GPT-2 (50257, padded to 50304: a row of 7 chunks a lane, the last cut by the row), one chunk
 * (768), and one not a multiple of 8 wide (1003), a third of the labels ignored; against the
 * CPU in bf16 at MN_TEST_BF16_TOL. Rows of a [batch, seq] input. */
static void check_sparse_of_product(int64_t classes, int64_t batch, int64_t seq, uint64_t seed) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(batch, seq, 32));
  /* A tied head's layout, [classes, 32]: both products of the backward read the logits'
   * gradient as a row-pitched operand, so a padded row pitch reaches the loss (storage_layout.c).
   */
  mn_node logits = mn_matmul_bt(g, x, mn_parameter(g, "w", MN_SHAPE(classes, 32)));
  mn_node labels = mn_input_u32(g, "labels", MN_SHAPE(batch, seq));
  mn_set_outputs(g, (mn_node[]){mn_sparse_cross_entropy_loss(g, logits, labels)}, 1);
  mn_test_assert_compiles_precision(g, true, MN_PRECISION_BF16);
  if (mn_test_cuda_device_present()) {
    const mn_test_range r[] = {
        {"x", -1, 1}, {"w", -0.5, 0.5}, {"labels", 0, (double)classes}, {NULL, 0, 0}};
    double e = mn_test_compare_cuda_ignoring(g, true, MN_PRECISION_BF16, MN_TEST_BF16_TOL, r,
                                             "labels", 0.35, seed);
    cr_log_info("%lld rows of %lld classes from a product, bf16 training: largest relative error "
                "%.3g",
                (long long)(batch * seq), (long long)classes, e);
  }
  mn_graph_free(g);
}

/* One test a width, so that a sanitizer run can take them one at a time. */
Test(cuda_reduce, sparse_cross_entropy_of_bf16_logits_from_a_product_gpt2_vocabulary) {
  mn_test_require_cuda_build();
  check_sparse_of_product(50257, 2, 48, 51);
  mn_test_require_cuda_device(); /* reports the GPU comparisons as skipped */
}

/* 1001 rows: 4 rows a block, each row's loads staged in shared memory while the row before is
 * worked on (mn_loss_sparse_ce_pipe), the last block one row. */
Test(cuda_reduce, sparse_cross_entropy_of_bf16_logits_from_a_product_rows_a_block) {
  mn_test_require_cuda_build();
  check_sparse_of_product(50257, 7, 143, 54);
  mn_test_require_cuda_device(); /* reports the GPU comparisons as skipped */
}

Test(cuda_reduce, sparse_cross_entropy_of_bf16_logits_from_a_product_one_chunk) {
  mn_test_require_cuda_build();
  check_sparse_of_product(768, 2, 48, 52);
  mn_test_require_cuda_device(); /* reports the GPU comparisons as skipped */
}

Test(cuda_reduce, sparse_cross_entropy_of_bf16_logits_from_a_product_odd_width) {
  mn_test_require_cuda_build();
  check_sparse_of_product(1003, 2, 48, 53);
  mn_test_require_cuda_device(); /* reports the GPU comparisons as skipped */
}

/* A classifier: matmul, bias, softmax cross-entropy on soft targets and sparse
 * cross-entropy on labels, trained together. */
Test(cuda_reduce, classifier_training_graph) {
  mn_test_require_cuda_build();
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(33, 20));
  mn_node w = mn_parameter(g, "w", MN_SHAPE(20, 10)), b = mn_parameter(g, "b", MN_SHAPE(10));
  mn_node logits = mn_bias_add(g, mn_matmul(g, x, w), b);
  mn_node probs = mn_input(g, "probs", MN_SHAPE(33, 10));
  mn_node labels = mn_input_u32(g, "labels", MN_SHAPE(33));
  mn_node loss = mn_add(g, mn_cross_entropy_loss(g, logits, mn_softmax(g, probs)),
                        mn_sparse_cross_entropy_loss(g, logits, labels));
  mn_set_outputs(g, (mn_node[]){loss, mn_softmax(g, logits)}, 2);
  const mn_test_range r[] = {{"labels", 0, 10}, {NULL, 0, 0}};
  mn_test_check_cuda(g, true, r, 6);
  mn_graph_free(g);
  mn_test_require_cuda_device(); /* reports the GPU comparisons as skipped */
}

/* ------------------------------------------------------------------ other losses */

Test(cuda_reduce, mse_l1) {
  mn_test_require_cuda_build();
  check_loss(mn_mse_loss, MN_SHAPE(1), NULL, 27);
  check_loss(mn_mse_loss, MN_SHAPE(3, 5, 7), NULL, 28);
  check_loss(mn_mse_loss, MN_SHAPE(1000, 1001), NULL, 29);
  check_loss(mn_l1_loss, MN_SHAPE(3, 5, 7), NULL, 30);
  check_loss(mn_l1_loss, MN_SHAPE(64, 768), NULL, 31);
  mn_test_require_cuda_device(); /* reports the GPU comparisons as skipped */
}

Test(cuda_reduce, bce) {
  mn_test_require_cuda_build();
  const mn_test_range r[] = {{"a", 0.02, 0.98}, {"b", 0, 1}, {NULL, 0, 0}};
  check_loss(mn_bce_loss, MN_SHAPE(3, 5, 7), r, 32);
  check_loss(mn_bce_loss, MN_SHAPE(64, 768), r, 33);
  check_loss(mn_bce_loss, MN_SHAPE(1), r, 34);
  mn_test_require_cuda_device(); /* reports the GPU comparisons as skipped */
}

/* Predictions from a sigmoid, as a binary classifier makes them. */
Test(cuda_reduce, bce_of_sigmoid) {
  mn_test_require_cuda_build();
  mn_graph *g = mn_graph_new();
  mn_node a = mn_parameter(g, "a", MN_SHAPE(17, 3)), t = mn_input(g, "t", MN_SHAPE(17, 3));
  mn_set_outputs(g, (mn_node[]){mn_bce_loss(g, mn_sigmoid(g, a), t)}, 1);
  const mn_test_range r[] = {{"a", -4, 4}, {"t", 0, 1}, {NULL, 0, 0}};
  mn_test_check_cuda(g, true, r, 35);
  mn_graph_free(g);
  mn_test_require_cuda_device(); /* reports the GPU comparisons as skipped */
}

/* ------------------------------------------------------------------ sum_rows */

/* A bias over 16 x 1024 rows of 768 (a GPT-2 batch): sum_rows in row chunks. */
Test(cuda_reduce, sum_rows_gpt2_batch) {
  mn_test_require_cuda_build();
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(16, 1024, 768));
  mn_node b = mn_parameter(g, "b", MN_SHAPE(768));
  mn_set_outputs(g, (mn_node[]){mn_sum_all(g, mn_tanh(g, mn_bias_add(g, x, b)))}, 1);
  mn_test_check_cuda(g, true, NULL, 36);
  mn_graph_free(g);
  mn_test_require_cuda_device(); /* reports the GPU comparisons as skipped */
}

/* The row's gradient is sum_rows of [rows, cols]: 40 rows in one kernel of 32 row lanes, 300 in
 * row chunks and their sums, a column a thread or, in rows of 8k (8, 2312: a block's 256 columns
 * cut by the row's end), 8 a thread; in bf16 storage too. */
Test(cuda_reduce, sum_rows_shapes) {
  mn_test_require_cuda_build();
  const int64_t cols[] = {1, 5, 8, 255, 257, 2312, 50257}, rows[] = {40, 300};
  for (size_t r = 0; r < 2; r++)
    for (size_t i = 0; i < sizeof cols / sizeof cols[0]; i++) {
      mn_graph *g = mn_graph_new();
      mn_node x = mn_input(g, "x", MN_SHAPE(rows[r], cols[i]));
      mn_node row = mn_parameter(g, "row", MN_SHAPE(1, cols[i]));
      mn_test_finish_training_graph(g, mn_broadcast_add(g, x, row));
      mn_test_check_cuda(g, true, NULL, 37 + i + 10 * r);
      if ((cols[i] == 257 || cols[i] == 2312) && mn_test_cuda_device_present()) {
        double e = mn_test_compare_cuda_precision(g, true, MN_PRECISION_BF16, 2 * MN_TEST_BF16_TOL,
                                                  NULL, 60 + r + 2 * i);
        cr_log_info("sum_rows of %lld rows of %lld in bf16: largest relative error %.3g",
                    (long long)rows[r], (long long)cols[i], e);
      }
      mn_graph_free(g);
    }
  mn_test_require_cuda_device(); /* reports the GPU comparisons as skipped */
}

/* ------------------------------------------------------------------ label errors */

/* Steps a CUDA session whose labels hold one value >= C and expects wait to fail. */
static void expect_label_error(bool training) {
  mn_graph *g = mn_graph_new();
  mn_node logits = mn_parameter(g, "logits", MN_SHAPE(2, 3, 37));
  mn_node labels = mn_input_u32(g, "labels", MN_SHAPE(2, 3));
  mn_set_outputs(g, (mn_node[]){mn_sparse_cross_entropy_loss(g, logits, labels)}, 1);
  mn_test_assert_compiles(g, training);
  mn_test_require_cuda_device();
  mn_session_options o = mn_session_options_default();
  o.backend = MN_BACKEND_CUDA;
  mn_session *s = NULL;
  mn_status st = training ? mn_build_session(g, &o, &s) : mn_build_inference_session(g, &o, &s);
  cr_assert_eq(st, MN_OK, "%s", mn_last_error());
  float w[2 * 3 * 37];
  mn_rng rng = mn_rng_new(7);
  mn_rng_fill(&rng, w, 2 * 3 * 37, -1, 1);
  cr_assert_eq(mn_session_set_parameter(s, "logits", w, 2 * 3 * 37), MN_OK, "%s", mn_last_error());
  uint32_t bad[6] = {0, 36, 5, 1, 2, 37};
  cr_assert_eq(mn_session_set_input_u32(s, "labels", bad, 6), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_step(s), MN_OK, "%s", mn_last_error());
  mn_assert_error(mn_session_wait(s), MN_ERR_INVALID_ARGUMENT, "37");
  cr_assert(strstr(mn_last_error(), "sparse_cross_entropy"), "%s", mn_last_error());
  cr_assert(strstr(mn_last_error(), "label"), "%s", mn_last_error());

  /* Valid labels on the next step give a finite loss. */
  bad[5] = 3;
  cr_assert_eq(mn_session_set_input_u32(s, "labels", bad, 6), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_step(s), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_wait(s), MN_OK, "%s", mn_last_error());
  float loss = NAN;
  cr_assert_eq(mn_session_read_output_by_index(s, 0, &loss, 1), MN_OK, "%s", mn_last_error());
  cr_assert(isfinite(loss) && loss > 0, "loss %g", (double)loss);
  mn_session_free(s);
  mn_graph_free(g);
}

Test(cuda_reduce, label_out_of_range_inference) {
  mn_test_require_cuda_build();
  expect_label_error(false);
}

Test(cuda_reduce, label_out_of_range_training) {
  mn_test_require_cuda_build();
  expect_label_error(true);
}

/* ------------------------------------------------------------------ every label ignored */

/* Steps a CUDA session (training in `prec` with SGD, or inference) whose labels are all
 * MN_IGNORE_LABEL and expects wait to fail with the ignore-label message and, in training, the
 * logits left as they were; then a batch with some counted rows runs. */
static void expect_all_ignored_error(bool training, mn_precision prec) {
  mn_graph *g = mn_graph_new();
  mn_node logits = mn_parameter(g, "logits", MN_SHAPE(2, 3, 37));
  mn_node labels = mn_input_u32(g, "labels", MN_SHAPE(2, 3));
  mn_set_outputs(g, (mn_node[]){mn_sparse_cross_entropy_loss(g, logits, labels)}, 1);
  mn_test_assert_compiles_precision(g, training, prec);
  mn_test_require_cuda_device();
  mn_session_options o = mn_session_options_default();
  o.backend = MN_BACKEND_CUDA;
  o.precision = prec;
  mn_session *s = NULL;
  mn_status st = training ? mn_build_session(g, &o, &s) : mn_build_inference_session(g, &o, &s);
  cr_assert_eq(st, MN_OK, "%s", mn_last_error());
  if (training) cr_assert_eq(mn_session_set_learning_rate(s, 0.1f), MN_OK);
  float w[2 * 3 * 37], after[2 * 3 * 37];
  mn_rng rng = mn_rng_new(8);
  mn_rng_fill(&rng, w, 2 * 3 * 37, -1, 1);
  cr_assert_eq(mn_session_set_parameter(s, "logits", w, 2 * 3 * 37), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_read_param(s, "logits", w, 2 * 3 * 37), MN_OK, "%s", mn_last_error());
  const uint32_t none[6] = {MN_IGNORE_LABEL, MN_IGNORE_LABEL, MN_IGNORE_LABEL,
                            MN_IGNORE_LABEL, MN_IGNORE_LABEL, MN_IGNORE_LABEL};
  cr_assert_eq(mn_session_set_input_u32(s, "labels", none, 6), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_step(s), MN_OK, "%s", mn_last_error());
  mn_assert_error(mn_session_wait(s), MN_ERR_INVALID_ARGUMENT,
                  "every label of labels node 1 (6 rows) is the ignore label");
  cr_assert(strstr(mn_last_error(), "sparse_cross_entropy"), "%s", mn_last_error());
  cr_assert_eq(mn_session_read_param(s, "logits", after, 2 * 3 * 37), MN_OK, "%s", mn_last_error());
  cr_assert_arr_eq(after, w, sizeof w, "the failed step changed the logits");

  const uint32_t some[6] = {MN_IGNORE_LABEL, 36, 5, MN_IGNORE_LABEL, 2, 0};
  cr_assert_eq(mn_session_set_input_u32(s, "labels", some, 6), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_step(s), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_wait(s), MN_OK, "%s", mn_last_error());
  float loss = NAN;
  cr_assert_eq(mn_session_read_output_by_index(s, 0, &loss, 1), MN_OK, "%s", mn_last_error());
  cr_assert(isfinite(loss) && loss > 0, "loss %g", (double)loss);
  mn_session_free(s);
  mn_graph_free(g);
}

Test(cuda_reduce, every_label_ignored_inference) {
  mn_test_require_cuda_build();
  expect_all_ignored_error(false, MN_PRECISION_F32);
}

Test(cuda_reduce, every_label_ignored_training) {
  mn_test_require_cuda_build();
  expect_all_ignored_error(true, MN_PRECISION_F32);
}

/* bf16: the one-pass loss gradient. */
Test(cuda_reduce, every_label_ignored_training_bf16) {
  mn_test_require_cuda_build();
  expect_all_ignored_error(true, MN_PRECISION_BF16);
}

/* A small training step runs on two streams with the readback beside the optimizer update
 * (cuda/capture.c), which then reports the step a failure skipped: a failed AdamW step must
 * leave the step count, and so the bias corrections of the steps after it, as the CPU's. Steps:
 * good, a label out of range, good, good; the logits against the CPU's at 1e-5. */
Test(cuda_reduce, a_failed_step_beside_the_update_counts_adamw_steps_as_the_cpu) {
  mn_test_require_cuda_build();
  mn_graph *g = mn_graph_new();
  mn_node logits = mn_parameter(g, "logits", MN_SHAPE(2, 3, 37));
  mn_node labels = mn_input_u32(g, "labels", MN_SHAPE(2, 3));
  mn_set_outputs(g, (mn_node[]){mn_sparse_cross_entropy_loss(g, logits, labels)}, 1);
  mn_test_require_cuda_device();
  mn_session *s[2] = {mn_test_session(g, MN_BACKEND_CPU, true),
                      mn_test_session(g, MN_BACKEND_CUDA, true)};
  float w[2 * 3 * 37], got[2][2 * 3 * 37];
  mn_rng rng = mn_rng_new(9);
  mn_rng_fill(&rng, w, 2 * 3 * 37, -1, 1);
  const uint32_t good[6] = {0, 36, 5, 1, 2, 3}, bad[6] = {0, 36, 5, 1, 2, 37};
  for (int b = 0; b < 2; b++) {
    cr_assert_eq(mn_session_set_adamw(s[b], 0.05f, 0.9f, 0.999f, 1e-8f, 0.01f), MN_OK);
    cr_assert_eq(mn_session_set_parameter(s[b], "logits", w, 2 * 3 * 37), MN_OK, "%s",
                 mn_last_error());
    for (int step = 0; step < 4; step++) {
      cr_assert_eq(mn_session_set_input_u32(s[b], "labels", step == 1 ? bad : good, 6), MN_OK, "%s",
                   mn_last_error());
      mn_status st = mn_session_step(s[b]);
      if (st == MN_OK) st = mn_session_wait(s[b]);
      if (step == 1)
        mn_assert_error(st, MN_ERR_INVALID_ARGUMENT, "37");
      else
        cr_assert_eq(st, MN_OK, "backend %d, step %d: %s", b, step, mn_last_error());
    }
    cr_assert_eq(mn_session_read_param(s[b], "logits", got[b], 2 * 3 * 37), MN_OK, "%s",
                 mn_last_error());
  }
  mn_session_stats stats;
  cr_assert_eq(mn_session_get_stats(s[1], &stats), MN_OK);
  cr_expect_geq(stats.graph_width, 2u, "the step was captured as one chain");
  for (int i = 0; i < 2 * 3 * 37; i++)
    cr_assert_float_eq(got[1][i], got[0][i], 1e-5f * (1.0f + fabsf(got[0][i])),
                       "logits[%d]: CUDA %.9g, CPU %.9g", i, (double)got[1][i], (double)got[0][i]);
  mn_session_free(s[0]);
  mn_session_free(s[1]);
  mn_graph_free(g);
}
