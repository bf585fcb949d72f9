/* CUDA kernels of the matrix products and element-wise ops against the reference
 * backend: every graph is compiled with NVRTC (no device needed), then, on a GPU, run
 * on both backends with the same random data. Backward ops are reached through
 * training graphs whose loss multiplies the op's output by an input, so that the
 * upstream gradient is not uniform. */
#include <stdlib.h>
#include <string.h>

#include "tests/support/cuda_check.h"
#include "tests/support/mn_test.h"

typedef mn_node (*binary_fn)(mn_graph *, mn_node, mn_node);

static void check_binary(binary_fn f, const int64_t *sa, int ra, const int64_t *sb, int rb,
                         double lo_b, double hi_b, uint64_t seed) {
  mn_graph *g = mn_graph_new();
  mn_node a = mn_parameter(g, "a", sa, ra), b = mn_parameter(g, "b", sb, rb);
  mn_test_finish_training_graph(g, f(g, a, b));
  const mn_test_range ranges[] = {{"a", -1, 1}, {"b", lo_b, hi_b}, {NULL, 0, 0}};
  mn_test_check_cuda(g, true, ranges, seed);
  mn_graph_free(g);
}

/* ------------------------------------------------------------------ whole graphs */

Test(cuda_math, mlp_training_graph) {
  mn_test_require_cuda_build();
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(37, 29));
  mn_node w1 = mn_parameter(g, "w1", MN_SHAPE(29, 64)), b1 = mn_parameter(g, "b1", MN_SHAPE(64));
  mn_node w2 = mn_parameter(g, "w2", MN_SHAPE(64, 5)), b2 = mn_parameter(g, "b2", MN_SHAPE(5));
  mn_node h = mn_relu(g, mn_bias_add(g, mn_matmul(g, x, w1), b1));
  mn_node y = mn_bias_add(g, mn_matmul(g, h, w2), b2);
  mn_node t = mn_input(g, "t", MN_SHAPE(37, 5));
  mn_set_outputs(g, (mn_node[]){mn_mse_loss(g, y, t)}, 1);
  mn_test_check_cuda(g, true, NULL, 1);
  mn_graph_free(g);
  mn_test_require_cuda_device(); /* reports the GPU comparisons as skipped */
}

Test(cuda_math, mlp_inference_graph) {
  mn_test_require_cuda_build();
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(3, 7, 16));
  mn_node w = mn_parameter(g, "w", MN_SHAPE(16, 9)), b = mn_parameter(g, "b", MN_SHAPE(9));
  mn_set_outputs(g, (mn_node[]){mn_gelu(g, mn_bias_add(g, mn_matmul(g, x, w), b))}, 1);
  mn_test_check_cuda(g, false, NULL, 2);
  mn_graph_free(g);
  mn_test_require_cuda_device(); /* reports the GPU comparisons as skipped */
}

/* ------------------------------------------------------------------ matmuls */

Test(cuda_math, matmul) {
  mn_test_require_cuda_build();
  check_binary(mn_matmul, MN_SHAPE(5, 7), MN_SHAPE(7, 3), -1, 1, 3);
  check_binary(mn_matmul, MN_SHAPE(2, 33, 70), MN_SHAPE(70, 45), -1, 1, 4);
  check_binary(mn_matmul, MN_SHAPE(1, 1), MN_SHAPE(1, 1), -1, 1, 5);
  check_binary(mn_matmul, MN_SHAPE(4, 17), MN_SHAPE(17, 1), -1, 1, 6);
  mn_test_require_cuda_device(); /* reports the GPU comparisons as skipped */
}

/* matmul_at products of 4 GFLOP and more whose A rows are not a multiple of 16 bytes copy
 * A into scratch with a padded row pitch (lower_math.c): here the gradient of b. The other
 * products have odd rows too and must not change. */
Test(cuda_math, matmul_padded_row_pitch) {
  mn_test_require_cuda_build();
  check_binary(mn_matmul, MN_SHAPE(2048, 1001), MN_SHAPE(1001, 1003), -1, 1, 12);
  mn_test_require_cuda_device(); /* reports the GPU comparisons as skipped */
}

Test(cuda_math, matmul_bt) {
  mn_test_require_cuda_build();
  check_binary(mn_matmul_bt, MN_SHAPE(5, 7), MN_SHAPE(3, 7), -1, 1, 7);
  check_binary(mn_matmul_bt, MN_SHAPE(2, 33, 70), MN_SHAPE(45, 70), -1, 1, 8);
  mn_test_require_cuda_device(); /* reports the GPU comparisons as skipped */
}

Test(cuda_math, matmul_at) {
  mn_test_require_cuda_build();
  check_binary(mn_matmul_at, MN_SHAPE(6, 3), MN_SHAPE(6, 4), -1, 1, 9);
  check_binary(mn_matmul_at, MN_SHAPE(2, 33, 17), MN_SHAPE(66, 9), -1, 1, 10);
  /* Leading dims laid out differently on the two sides: the gradients need a reshape. */
  check_binary(mn_matmul_at, MN_SHAPE(3, 4, 5), MN_SHAPE(2, 6, 7), -1, 1, 11);
  mn_test_require_cuda_device(); /* reports the GPU comparisons as skipped */
}

/* ------------------------------------------------------------------ skinny products */

/* mse(0.5 (a b), t): the scale folds into the product as its alpha (optimizer/scale_fold.h). */
static mn_graph *half_product(int64_t m, int64_t k, int64_t n) {
  mn_graph *g = mn_graph_new();
  mn_node a = mn_parameter(g, "a", MN_SHAPE(m, k)), b = mn_parameter(g, "b", MN_SHAPE(k, n));
  mn_node t = mn_input(g, "t", MN_SHAPE(m, n));
  mn_set_outputs(g, (mn_node[]){mn_mse_loss(g, mn_scale(g, mn_matmul(g, a, b), 0.5f), t)}, 1);
  return g;
}

/* act(x w + b) with x [m, k] and w [k, n]: the epilogue of the skinny kernels. */
static mn_graph *dense_layer(int64_t m, int64_t k, int64_t n, mn_node (*act)(mn_graph *, mn_node)) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_parameter(g, "x", MN_SHAPE(m, k));
  mn_node w = mn_parameter(g, "w", MN_SHAPE(k, n)), b = mn_parameter(g, "b", MN_SHAPE(n));
  mn_node y = mn_bias_add(g, mn_matmul(g, x, w), b);
  if (act) y = act(g, y);
  mn_node t = mn_input(g, "t", MN_SHAPE(m, n));
  mn_set_outputs(g, (mn_node[]){mn_mse_loss(g, y, t)}, 1);
  return g;
}

/* Products with n (A not transposed) or k of at most 16 and at most 16 MFLOP run as
 * mn_mm_narrow / mn_mm_short_k in fp32 sessions (lower_skinny.h), cuBLASLt otherwise. */
Test(cuda_math, skinny_products_take_their_kernels) {
  mn_test_require_cuda_build();
  mn_graph *g = dense_layer(128, 512, 10, NULL);
  char *f32 = mn_test_plan_source(g, true, MN_PRECISION_F32);
  char *bf16 = mn_test_plan_source(g, true, MN_PRECISION_BF16);
  /* The classifier (n 10) and its input gradient (k 10); the weight gradient's k is 128. */
  cr_assert(
      strstr(f32, "mn_mm_narrow<8, 128LL, 10, 512LL, 512LL, 10LL, 10LL, false, -1, -1, true,"),
      "%s", f32);
  cr_assert(
      strstr(f32, "mn_mm_short_k<128LL, 512LL, 10, 10LL, 10LL, 512LL, false, true, -1, -1, false"));
  cr_assert_null(strstr(bf16, "mn_mm_narrow<"));
  cr_assert_null(strstr(bf16, "mn_mm_short_k<"));
  free(f32);
  free(bf16);
  mn_graph_free(g);
  /* A scale folded into the product is the kernel's alpha (0.5: 0x3f000000). */
  g = half_product(64, 40, 8);
  f32 = mn_test_plan_source(g, true, MN_PRECISION_F32);
  cr_assert(
      strstr(f32,
             "mn_mm_narrow<8, 64LL, 8, 40LL, 40LL, 8LL, 8LL, false, -1, -1, false, 1056964608u>"),
      "%s", f32);
  free(f32);
  mn_graph_free(g);
  /* n 17; then k 20000, which a warp would walk alone. */
  const int64_t wide[][3] = {{128, 512, 17}, {1, 20000, 8}};
  for (size_t i = 0; i < 2; i++) {
    g = dense_layer(wide[i][0], wide[i][1], wide[i][2], NULL);
    f32 = mn_test_plan_source(g, true, MN_PRECISION_F32);
    cr_assert_null(strstr(f32, "mn_mm_narrow<"), "%s", f32);
    free(f32);
    mn_graph_free(g);
  }
}

/* The offline source (bench_plan_kernels, the compile checks of mn_test_assert_compiles_*) holds
 * the kernels that refresh a 2-byte session's weight copy, as the session's does: one for the
 * update block in training, one a parameter in inference; none in fp32. */
Test(cuda_math, offline_source_holds_the_weights_conversion) {
  mn_test_require_cuda_build();
  mn_graph *g = dense_layer(16, 32, 8, NULL);
  char *f32 = mn_test_plan_source(g, true, MN_PRECISION_F32);
  cr_assert_null(strstr(f32, "mn_convert<"), "%s", f32);
  free(f32);
  char *train = mn_test_plan_source(g, true, MN_PRECISION_BF16);
  cr_assert_not_null(strstr(train, "mn_convert<"), "no conversion in a bf16 training plan");
  free(train);
  char *infer = mn_test_plan_source(g, false, MN_PRECISION_BF16);
  /* x [16, 32], w [32, 8], b [8]. */
  cr_assert_not_null(strstr(infer, "mn_convert<512LL>"), "%s", infer);
  cr_assert_not_null(strstr(infer, "mn_convert<256LL>"));
  cr_assert_not_null(strstr(infer, "mn_convert<8LL>"));
  free(infer);
  mn_graph_free(g);
}

Test(cuda_math, skinny_products) {
  mn_test_require_cuda_build();
  mn_node (*acts[])(mn_graph *, mn_node) = {NULL, mn_relu, mn_gelu, mn_silu};
  /* An MLP's classifier, the widest narrow product (n 16), a single column, a shape whose rows
   * leave a block's warps idle; each with every activation, so the fused bias_relu and
   * bias_gelu and the unfused silu all meet the kernels. */
  const int64_t shapes[][3] = {{128, 512, 10}, {37, 33, 16}, {5, 100, 1}, {1001, 70, 3}};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
    for (size_t a = 0; a < sizeof acts / sizeof acts[0]; a++) {
      mn_graph *g = dense_layer(shapes[s][0], shapes[s][1], shapes[s][2], acts[a]);
      mn_test_check_cuda(g, true, NULL, 40 + 4 * s + a);
      mn_graph_free(g);
    }
  /* k of at most 16 on every side: a transposed B (k 12), a transposed A (k 9), k 16 and 1. */
  check_binary(mn_matmul_bt, MN_SHAPE(64, 12), MN_SHAPE(300, 12), -1, 1, 60);
  check_binary(mn_matmul_at, MN_SHAPE(9, 70), MN_SHAPE(9, 20), -1, 1, 61);
  check_binary(mn_matmul, MN_SHAPE(3, 50, 16), MN_SHAPE(16, 40), -1, 1, 62);
  check_binary(mn_matmul, MN_SHAPE(200, 1), MN_SHAPE(1, 33), -1, 1, 63);
  /* A scale folded into the product (its alpha), and the forward alone in an inference session. */
  const int64_t scaled[][3] = {{64, 40, 8}, {64, 12, 40}};
  for (size_t s = 0; s < 2; s++) {
    mn_graph *g = half_product(scaled[s][0], scaled[s][1], scaled[s][2]);
    mn_test_check_cuda(g, true, NULL, 64 + s);
    mn_graph_free(g);
  }
  mn_graph *g = dense_layer(96, 300, 12, mn_gelu);
  mn_test_check_cuda(g, false, NULL, 66);
  mn_graph_free(g);
  mn_test_require_cuda_device(); /* reports the GPU comparisons as skipped */
}

/* A GPT-2 block's projections: [B, T, D] activations, T = 64, D = 768. */
Test(cuda_math, gpt2_projection_shapes) {
  mn_test_require_cuda_build();
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(2, 64, 768));
  mn_node w = mn_parameter(g, "w", MN_SHAPE(768, 3072)), b = mn_parameter(g, "b", MN_SHAPE(3072));
  mn_node w2 = mn_parameter(g, "w2", MN_SHAPE(768, 3072));
  mn_node h = mn_gelu(g, mn_bias_add(g, mn_matmul(g, x, w), b));
  mn_node y = mn_matmul_bt(g, h, w2);
  mn_node t = mn_input(g, "t", MN_SHAPE(2, 64, 768));
  mn_set_outputs(g, (mn_node[]){mn_mse_loss(g, y, t)}, 1);
  const mn_test_range ranges[] = {{"w", -0.05, 0.05}, {"w2", -0.05, 0.05}, {NULL, 0, 0}};
  mn_test_check_cuda(g, true, ranges, 12);
  mn_graph_free(g);
  mn_test_require_cuda_device(); /* reports the GPU comparisons as skipped */
}

/* ------------------------------------------------------------------ element-wise */

Test(cuda_math, add_mul_div) {
  mn_test_require_cuda_build();
  check_binary(mn_add, MN_SHAPE(3, 5, 7), MN_SHAPE(3, 5, 7), -1, 1, 13);
  check_binary(mn_add, MN_SHAPE(64, 768), MN_SHAPE(64, 768), -1, 1, 14);
  check_binary(mn_mul, MN_SHAPE(3, 5, 7), MN_SHAPE(3, 5, 7), -1, 1, 15);
  check_binary(mn_mul, MN_SHAPE(1), MN_SHAPE(1), -1, 1, 16);
  check_binary(mn_div, MN_SHAPE(4099), MN_SHAPE(4099), 0.5, 2, 17);
  check_binary(mn_div, MN_SHAPE(2, 3, 4), MN_SHAPE(2, 3, 4), 0.5, 2, 18);
  mn_test_require_cuda_device(); /* reports the GPU comparisons as skipped */
}

Test(cuda_math, bias_add_broadcast_add) {
  mn_test_require_cuda_build();
  check_binary(mn_bias_add, MN_SHAPE(3, 5, 7), MN_SHAPE(7), -1, 1, 19);
  check_binary(mn_bias_add, MN_SHAPE(2, 64, 768), MN_SHAPE(768), -1, 1, 20);
  check_binary(mn_bias_add, MN_SHAPE(1, 1), MN_SHAPE(1), -1, 1, 21);
  /* 3000 rows: sum_rows splits the rows into chunks. */
  check_binary(mn_bias_add, MN_SHAPE(3000, 13), MN_SHAPE(13), -1, 1, 22);
  check_binary(mn_broadcast_add, MN_SHAPE(7, 5), MN_SHAPE(1, 5), -1, 1, 23);
  check_binary(mn_broadcast_add, MN_SHAPE(4, 9, 12), MN_SHAPE(1, 12), -1, 1, 24);
  mn_test_require_cuda_device(); /* reports the GPU comparisons as skipped */
}

Test(cuda_math, greater) {
  mn_test_require_cuda_build();
  mn_graph *g = mn_graph_new();
  mn_node a = mn_input(g, "a", MN_SHAPE(5, 131)), b = mn_input(g, "b", MN_SHAPE(5, 131));
  mn_set_outputs(g, (mn_node[]){mn_greater(g, a, b)}, 1);
  mn_test_check_cuda(g, false, NULL, 25);
  mn_graph_free(g);
  mn_test_require_cuda_device(); /* reports the GPU comparisons as skipped */
}

static mn_node scale_by_m3(mn_graph *g, mn_node x) { return mn_scale(g, x, -3.0f); }
static mn_node scale_by_tenth(mn_graph *g, mn_node x) { return mn_scale(g, x, 0.1f); }

Test(cuda_math, scale_neg_abs_relu) {
  mn_test_require_cuda_build();
  mn_test_check_cuda_unary(scale_by_m3, MN_SHAPE(3, 5, 7), -1, 1, 26);
  mn_test_check_cuda_unary(scale_by_tenth, MN_SHAPE(1027), -1, 1, 27);
  mn_test_check_cuda_unary(mn_neg, MN_SHAPE(1, 1), -1, 1, 28);
  mn_test_check_cuda_unary(mn_neg, MN_SHAPE(64, 768), -1, 1, 29);
  mn_test_check_cuda_unary(mn_abs, MN_SHAPE(3, 5, 7), -2, 2, 30);
  mn_test_check_cuda_unary(mn_abs, MN_SHAPE(64, 768), -2, 2, 31);
  mn_test_check_cuda_unary(mn_relu, MN_SHAPE(3, 5, 7), -2, 2, 32);
  mn_test_check_cuda_unary(mn_relu, MN_SHAPE(2, 64, 768), -2, 2, 33);
  mn_test_require_cuda_device(); /* reports the GPU comparisons as skipped */
}

Test(cuda_math, sigmoid_tanh) {
  mn_test_require_cuda_build();
  mn_test_check_cuda_unary(mn_sigmoid, MN_SHAPE(3, 5, 7), -6, 6, 34);
  mn_test_check_cuda_unary(mn_sigmoid, MN_SHAPE(64, 768), -6, 6, 35);
  mn_test_check_cuda_unary(mn_tanh, MN_SHAPE(3, 5, 7), -3, 3, 36);
  mn_test_check_cuda_unary(mn_tanh, MN_SHAPE(64, 768), -3, 3, 37);
  mn_test_require_cuda_device(); /* reports the GPU comparisons as skipped */
}

Test(cuda_math, log_exp_recip) {
  mn_test_require_cuda_build();
  mn_test_check_cuda_unary(mn_log, MN_SHAPE(3, 5, 7), 0.1, 4, 38);
  mn_test_check_cuda_unary(mn_log, MN_SHAPE(4099), 0.1, 4, 39);
  mn_test_check_cuda_unary(mn_exp, MN_SHAPE(3, 5, 7), -3, 2, 40);
  mn_test_check_cuda_unary(mn_exp, MN_SHAPE(64, 768), -3, 2, 41);
  mn_test_check_cuda_unary(mn_recip, MN_SHAPE(3, 5, 7), 0.5, 2, 42);
  mn_test_check_cuda_unary(mn_recip, MN_SHAPE(1), 0.5, 2, 43);
  mn_test_require_cuda_device(); /* reports the GPU comparisons as skipped */
}

Test(cuda_math, silu_gelu) {
  mn_test_require_cuda_build();
  mn_test_check_cuda_unary(mn_silu, MN_SHAPE(3, 5, 7), -6, 6, 44);
  mn_test_check_cuda_unary(mn_silu, MN_SHAPE(2, 64, 768), -6, 6, 45);
  mn_test_check_cuda_unary(mn_gelu, MN_SHAPE(3, 5, 7), -5, 5, 46);
  mn_test_check_cuda_unary(mn_gelu, MN_SHAPE(2, 64, 768), -5, 5, 47);
  mn_test_check_cuda_unary(mn_gelu, MN_SHAPE(1), -5, 5, 48);
  mn_test_require_cuda_device(); /* reports the GPU comparisons as skipped */
}

Test(cuda_math, swiglu) {
  mn_test_require_cuda_build();
  check_binary(mn_swiglu, MN_SHAPE(3, 5, 7), MN_SHAPE(3, 5, 7), -1, 1, 49);
  check_binary(mn_swiglu, MN_SHAPE(2, 64, 2048), MN_SHAPE(2, 64, 2048), -1, 1, 50);
  mn_test_require_cuda_device(); /* reports the GPU comparisons as skipped */
}

/* sum_all and mean_all are lowered with the reductions, but their gradient is
 * expand_scalar, an element-wise kernel of this file's ops. */
Test(cuda_math, expand_scalar) {
  mn_test_require_cuda_build();
  mn_graph *g = mn_graph_new();
  mn_node a = mn_parameter(g, "a", MN_SHAPE(3, 5, 7)), b = mn_parameter(g, "b", MN_SHAPE(1001));
  mn_node s = mn_add(g, mn_scale(g, mn_mean_all(g, mn_tanh(g, a)), 3.0f), mn_sum_all(g, b));
  mn_node t = mn_input(g, "t", MN_SHAPE(1));
  mn_set_outputs(g, (mn_node[]){mn_mse_loss(g, s, t)}, 1);
  mn_test_check_cuda(g, true, NULL, 51);
  mn_graph_free(g);
  mn_test_require_cuda_device(); /* reports the GPU comparisons as skipped */
}

/* split_a's gradient pads dy with zeros (a zeros node) and concatenates. */
Test(cuda_math, zeros) {
  mn_test_require_cuda_build();
  mn_graph *g = mn_graph_new();
  mn_node x = mn_parameter(g, "x", MN_SHAPE(2, 5, 3, 4));
  mn_test_finish_training_graph(g, mn_split_a(g, x, 2));
  mn_test_check_cuda(g, true, NULL, 52);
  mn_graph_free(g);
  mn_test_require_cuda_device(); /* reports the GPU comparisons as skipped */
}

/* The same activation feeding two branches: gradients accumulate with adds. */
Test(cuda_math, fan_out) {
  mn_test_require_cuda_build();
  mn_graph *g = mn_graph_new();
  mn_node a = mn_parameter(g, "a", MN_SHAPE(9, 11)), w = mn_parameter(g, "w", MN_SHAPE(11, 11));
  mn_node y = mn_add(g, mn_tanh(g, mn_mul(g, a, a)), mn_matmul(g, a, w));
  mn_test_finish_training_graph(
      g, mn_div(g, y, mn_add(g, mn_exp(g, a), mn_exp(g, mn_matmul(g, a, w)))));
  mn_test_check_cuda(g, true, NULL, 53);
  mn_graph_free(g);
  mn_test_require_cuda_device(); /* reports the GPU comparisons as skipped */
}
