/* The warp-per-row weight gradient of rms_norm and layer_norm (cuda/kernels/norm_grad_w.cuh)
 * at the edges of its launch (cuda/lower_transformer.c, NORM_GW_SHAPES): rows of 576, 768
 * (8 warps a block, up to 264 blocks), 1000 and 1024 floats (4 warps, up to 396 blocks), 37
 * and 1; row counts that leave a warp several rows, a last chunk shorter than the others, rows
 * not a multiple of the warps, fewer rows than blocks, and one row; rows far from zero; in a
 * bf16 session x a bf16 activation (8-element loads) or an fp32 parameter (4-element ones). Every
 * graph is compiled with NVRTC in fp32 and bf16 (no device needed), then, on a GPU, compared
 * with the reference in fp32 at 1e-5 and in bf16 at MN_TEST_BF16_TOL (outputs and every
 * gradient, the weight's and bias's among them); and the weight gradients of two steps must
 * be the same bits. */
#include <stdlib.h>

#include "tests/support/cuda_check.h"
#include "tests/support/mn_test.h"
#include "tests/support/session_util.h"

/* loss = mse(norm(h) * c, t) over h [rows, n], with parameters x, w (and b for layer_norm):
 * h = x + x, an activation as in a model (bf16 in a bf16 session, so the kernel reads x and dy
 * 8 elements at a time where n allows), or x itself when `direct` (an fp32 parameter beside a
 * bf16 dy in a bf16 session: 4 elements at a time). */
static mn_graph *norm_graph(bool layer, int64_t rows, int64_t n, bool direct) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_parameter(g, "x", MN_SHAPE(rows, n));
  mn_node h = direct ? x : mn_add(g, x, x);
  mn_node w = mn_parameter(g, "w", MN_SHAPE(n));
  mn_node y = layer ? mn_layer_norm(g, h, w, mn_parameter(g, "b", MN_SHAPE(n)), 1e-5f)
                    : mn_rms_norm(g, h, w, 1e-5f);
  mn_test_finish_training_graph(g, y);
  return g;
}

typedef struct shape {
  int64_t rows, n;
  bool direct;
} shape;

/* Compiles every shape's graphs (both norms, fp32 and bf16), then compares them with the
 * reference; x is uniform in [lo, hi). */
static void check_shapes(const shape *shapes, size_t count, double lo, double hi, uint64_t seed) {
  mn_test_require_cuda_build();
  for (size_t i = 0; i < count; i++)
    for (int layer = 0; layer < 2; layer++) {
      mn_graph *g = norm_graph(layer, shapes[i].rows, shapes[i].n, shapes[i].direct);
      mn_test_assert_compiles(g, true);
      mn_graph_free(g);
    }
  const mn_test_range ranges[] = {{"x", lo, hi}, {"w", 0.5, 1.5}, {NULL, 0, 0}};
  for (size_t i = 0; i < count; i++)
    for (int layer = 0; layer < 2; layer++) {
      mn_graph *g = norm_graph(layer, shapes[i].rows, shapes[i].n, shapes[i].direct);
      uint64_t s = seed + 2 * i + (uint64_t)layer;
      double f32 = mn_test_compare_cuda(g, true, 1e-5, ranges, s);
      double bf16 =
          mn_test_compare_cuda_precision(g, true, MN_PRECISION_BF16, MN_TEST_BF16_TOL, ranges, s);
      cr_log_info("%s [%lld, %lld]%s: largest error fp32 %.3g, bf16 %.3g",
                  layer ? "layer_norm" : "rms_norm", (long long)shapes[i].rows,
                  (long long)shapes[i].n, shapes[i].direct ? " (x a parameter)" : "", f32, bf16);
      mn_graph_free(g);
    }
}

/* 4227 = 2 x 264 x 8 + 3 rows: chunks of 24 rows (3 a warp), the last of 3; 100 rows: fewer
 * than the blocks, chunks of 8 and a last of 4; one row: one warp of one block works. */
Test(cuda_norm_grad_w, gpt2_and_smollm_widths, .timeout = 240) {
  const shape s[] = {
      {4227, 768, false}, {100, 768, false}, {1, 768, false}, {4227, 576, false}, {13, 576, true}};
  check_shapes(s, sizeof s / sizeof s[0], -1, 3, 1);
}

/* Rows of 4 warps a block (1000: a last vector slot that only some lanes fill; 1024: every
 * slot full) and widths that are no multiple of 32 x 4 (37: one float a vector; 1: one lane):
 * 1589 rows make chunks of 8 and a last of 5, 3169 chunks of 12 and a last of 1. */
Test(cuda_norm_grad_w, other_widths, .timeout = 240) {
  const shape s[] = {
      {1589, 1000, false}, {3169, 1024, true}, {300, 37, false}, {9, 37, true}, {21, 1, false}};
  check_shapes(s, sizeof s / sizeof s[0], -1, 3, 20);
}

/* Rows far from zero, where a mean formed and subtracted in plain fp32 would lose digits: the
 * kernel centres each row on its first element before its fp32 work. */
Test(cuda_norm_grad_w, rows_far_from_zero, .timeout = 240) {
  const shape s[] = {{517, 768, false}, {64, 1000, true}};
  check_shapes(s, sizeof s / sizeof s[0], 100, 102, 40);
}

/* The weight (and bias) gradients of two steps of one session on the same data are the same
 * bits: rows go to warps and sums are added in an order fixed by the shape. */
static void check_repeatable(const mn_graph *g, bool layer, mn_precision precision, uint64_t seed) {
  mn_session *s = mn_test_session_precision(g, MN_BACKEND_CUDA, precision, true);
  mn_rng r = mn_rng_new(seed);
  mn_test_init_uniform(g, s, &r, -1.0f, 3.0f, true);
  const char *names[] = {"w", "b"};
  float *first[2], *second[2];
  for (int step = 0; step < 2; step++) {
    mn_test_step_loss(s);
    for (int i = 0; i < 1 + layer; i++) {
      float *v = malloc(768 * sizeof *v);
      cr_assert_eq(mn_session_read_grad(s, names[i], v, 768), MN_OK, "%s", mn_last_error());
      (step ? second : first)[i] = v;
    }
  }
  for (int i = 0; i < 1 + layer; i++) {
    cr_assert_eq(memcmp(first[i], second[i], 768 * sizeof(float)), 0,
                 "%s %s: the gradient of %s differs between two steps",
                 layer ? "layer_norm" : "rms_norm", mn_test_precision_name(precision), names[i]);
    free(first[i]);
    free(second[i]);
  }
  mn_session_free(s);
}

Test(cuda_norm_grad_w, two_steps_give_the_same_bits, .timeout = 240) {
  mn_test_require_cuda_build();
  mn_graph *g[2] = {norm_graph(false, 4227, 768, false), norm_graph(true, 4227, 768, false)};
  for (int layer = 0; layer < 2; layer++)
    mn_test_assert_compiles(g[layer], true);
  mn_test_require_cuda_device();
  for (int layer = 0; layer < 2; layer++) {
    check_repeatable(g[layer], layer, MN_PRECISION_F32, 60 + (uint64_t)layer);
    check_repeatable(g[layer], layer, MN_PRECISION_BF16, 62 + (uint64_t)layer);
    mn_graph_free(g[layer]);
  }
}
