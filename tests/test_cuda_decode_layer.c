/* llama_decode_layer on CUDA (cuda/lower_decode_layer.c, kernels/decode_layer.cuh) against the
 * CPU's op: fp32 and bf16, batch 1 to 8, GQA and MHA, widths that the 16-byte weight loads serve
 * and widths they do not, the tensor-core products of bf16 batches, caches of one split and of
 * several; each case runs three steps, so
 * the later steps read the cache rows that the earlier ones wrote; quantized weights in every
 * format; a position past the cache is an error. The kernels compile without a device. */
#include <stdlib.h>

#include "tests/support/cuda_check.h"
#include "tests/support/decode_layer_case.h"
#include "tests/support/mn_test.h"

static const mn_test_dl_case CASES[] = {
    /* a SmolLM2 layer's widths, two sequences, a cache of two splits */
    MN_TEST_DL_SHAPE(2, 576, 9, 3, 64, 1536, 200, 150),
    /* one sequence, one split */
    MN_TEST_DL_SHAPE(1, 64, 4, 2, 16, 96, 40, 30),
    /* the most sequences, widths not a multiple of 8 (scalar loads), MHA, head_dim 12 */
    MN_TEST_DL_SHAPE(8, 36, 3, 3, 12, 20, 300, 255),
    /* twelve query heads over one kv head (two head slices, the second part-filled), head_dim
     * 128 */
    MN_TEST_DL_SHAPE(1, 256, 12, 1, 128, 256, 300, 260),
    /* head_dim 256 */
    MN_TEST_DL_SHAPE(2, 128, 2, 1, 256, 64, 50, 40),
    /* three sequences, one kv head for six query heads */
    MN_TEST_DL_SHAPE(3, 96, 6, 1, 16, 64, 130, 127),
    /* the SmolLM2 widths at the most sequences: in bf16 the tensor-core products
     * (kernels/decode_layer_mma.cuh), in fp32 two weight rows a warp in the residual products */
    MN_TEST_DL_SHAPE(8, 576, 9, 3, 64, 1536, 200, 150),
};

/* The SmolLM2 widths with quantized weights, one case a format (host/quant.h). */
static const mn_test_dl_case QUANT_CASES[] = {
    MN_TEST_DL_QUANT(1, 576, 9, 3, 64, 1536, 200, 150, MN_QUANT_Q8_0, 0),
    MN_TEST_DL_QUANT(2, 576, 9, 3, 64, 1536, 200, 150, MN_QUANT_Q4_0, 0),
    MN_TEST_DL_QUANT(1, 576, 9, 3, 64, 1536, 200, 150, MN_QUANT_Q4_1, 0),
    MN_TEST_DL_QUANT(8, 64, 4, 2, 16, 128, 40, 30, MN_QUANT_AFFINE_INT8, 32),
    MN_TEST_DL_QUANT(1, 576, 9, 3, 64, 1536, 200, 150, MN_QUANT_AFFINE_INT4, 64),
    /* at the most sequences: in bf16 dequantized for the tensor-core products */
    MN_TEST_DL_QUANT(8, 576, 9, 3, 64, 1536, 200, 150, MN_QUANT_AFFINE_INT4, 64),
};

static double cuda_vs_cpu(const mn_test_dl_case *c, mn_precision prec) {
  const int steps = 3;
  size_t n = (size_t)(steps * c->batch * c->dim);
  float *y[2];
  mn_graph *g = mn_test_dl_graph(c, true);
  for (int i = 0; i < 2; i++) {
    y[i] = malloc(n * sizeof(float));
    cr_assert(y[i]);
    mn_session_options o = mn_session_options_default();
    o.backend = i ? MN_BACKEND_CUDA : MN_BACKEND_CPU;
    o.precision = prec;
    mn_test_dl_run(c, g, &o, steps, 91, y[i]);
  }
  for (size_t i = 0; i < n; i++)
    cr_assert(isfinite(y[1][i]), "output %zu is %g", i, (double)y[1][i]);
  double err = mn_test_rel_err(y[1], y[0], n);
  free(y[0]);
  free(y[1]);
  mn_graph_free(g);
  return err;
}

Test(cuda_decode_layer, kernels_compile) {
  mn_test_require_cuda_build();
  for (size_t i = 0; i < sizeof CASES / sizeof *CASES; i++) {
    mn_graph *g = mn_test_dl_graph(&CASES[i], true);
    mn_test_assert_compiles(g, false);
    mn_graph_free(g);
  }
  for (size_t i = 0; i < sizeof QUANT_CASES / sizeof *QUANT_CASES; i++) {
    mn_graph *g = mn_test_dl_graph(&QUANT_CASES[i], true);
    mn_test_assert_compiles(g, false);
    mn_graph_free(g);
  }
}

/* Every case of cases against the CPU in precision prec, each within tol. */
static void all_match(const mn_test_dl_case *cases, size_t n, mn_precision prec, double tol,
                      const char *what) {
  mn_test_require_cuda_device();
  for (size_t i = 0; i < n; i++) {
    double err = cuda_vs_cpu(&cases[i], prec);
    cr_log_info("%s case %zu %s: relative error %.3g", what, i, mn_test_precision_name(prec), err);
    cr_assert_leq(err, tol, "%s case %zu: relative error %g", what, i, err);
  }
}

/* Both backends dequantize the same blocks to the same floats; the sums differ in order only. */
Test(cuda_decode_layer, matches_the_cpu_with_quantized_weights) {
  all_match(QUANT_CASES, sizeof QUANT_CASES / sizeof *QUANT_CASES, MN_PRECISION_F32, 1e-5, "quant");
}

/* In bf16 sessions batches of 2-8 round the dequantized weights and the activations to bf16 for
 * the tensor cores (kernels/decode_layer_mma.cuh); the CPU keeps both exact. */
Test(cuda_decode_layer, matches_the_cpu_with_quantized_weights_in_bf16) {
  all_match(QUANT_CASES, sizeof QUANT_CASES / sizeof *QUANT_CASES, MN_PRECISION_BF16,
            MN_TEST_BF16_TOL, "quant");
}

Test(cuda_decode_layer, matches_the_cpu_in_fp32) {
  all_match(CASES, sizeof CASES / sizeof *CASES, MN_PRECISION_F32, 1e-5, "plain");
}

/* A position past the cache writes nothing and is reported from the device's error record. */
Test(cuda_decode_layer, a_position_past_the_cache_fails_the_step) {
  mn_test_require_cuda_device();
  mn_test_dl_case c = MN_TEST_DL_SHAPE(1, 64, 4, 2, 16, 96, 8, 8);
  mn_assert_error(mn_test_dl_step_at(&c, MN_BACKEND_CUDA, 8, 9), MN_ERR_INVALID_ARGUMENT,
                  "(llama_decode_layer): kv_pos 8");
}

/* Both backends read bf16 weights; at batch 1 both keep the intermediates in fp32 and the output
 * rounds once, at batch 2-8 the tensor-core products round their activations to bf16. */
Test(cuda_decode_layer, matches_the_cpu_in_bf16) {
  all_match(CASES, sizeof CASES / sizeof *CASES, MN_PRECISION_BF16, MN_TEST_BF16_TOL, "plain");
}
