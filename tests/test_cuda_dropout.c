/* mn_dropout on CUDA against the reference backend: the kernels compile in fp32 and bf16 (no
 * device needed); on a GPU the masks and the gradients of several steps in a row, each one
 * launch of the captured step graph, equal the CPU's bit for bit in fp32, and a bf16 plan
 * stays within bf16's tolerance with the same masks. */
#include <stdio.h>
#include <stdlib.h>

#include "session/session.h"
#include "tests/support/cuda_check.h"
#include "tests/support/mn_test.h"
#include "tests/support/session_util.h"

/* Not a multiple of 4 or 8: the vector loop and the tail both run. */
enum { N = 100003, STEPS = 4 };

/* loss = sum(dropout(x, p) * r), or of tanh(x) with `tanh`, outputs loss then the dropout's
 * value. Without tanh every value is the dropout's alone (the upstream gradient is r exactly),
 * so the backends agree bit for bit; the reference computes tanh in double, CUDA in float. */
static mn_graph *masked_sum(float p, bool tanh) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_parameter(g, "x", MN_SHAPE(N)), r = mn_input(g, "r", MN_SHAPE(N));
  mn_node y = mn_dropout(g, tanh ? mn_tanh(g, x) : x, p);
  mn_set_outputs(g, (mn_node[]){mn_sum_all(g, mn_mul(g, y, r)), y}, 2);
  cr_assert_eq(mn_graph_status(g), MN_OK, "%s", mn_graph_error(g));
  return g;
}

static mn_graph *dropout_mlp(void) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(37, 29)), t = mn_input(g, "t", MN_SHAPE(37, 5));
  mn_node w1 = mn_parameter(g, "w1", MN_SHAPE(29, 64)), b1 = mn_parameter(g, "b1", MN_SHAPE(64));
  mn_node w2 = mn_parameter(g, "w2", MN_SHAPE(64, 5)), b2 = mn_parameter(g, "b2", MN_SHAPE(5));
  mn_node h = mn_dropout(g, mn_relu(g, mn_bias_add(g, mn_matmul(g, x, w1), b1)), 0.3f);
  mn_node y = mn_bias_add(g, mn_matmul(g, h, w2), b2);
  mn_set_outputs(g, (mn_node[]){mn_mse_loss(g, mn_dropout(g, y, 0.1f), t)}, 1);
  cr_assert_eq(mn_graph_status(g), MN_OK, "%s", mn_graph_error(g));
  return g;
}

static void feed(mn_session *s) {
  static float x[N], r[N];
  mn_rng rng = mn_rng_new(17);
  mn_rng_fill(&rng, x, N, -2, 2);
  mn_rng_fill(&rng, r, N, -1, 1);
  cr_assert_eq(mn_session_set_parameter(s, "x", x, N), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_set_input(s, "r", r, N), MN_OK, "%s", mn_last_error());
}

static size_t count_zeros(const float *y) {
  size_t z = 0;
  for (size_t i = 0; i < N; i++)
    z += y[i] == 0.0f;
  return z;
}

/* Element i where the zero patterns of a and b differ, or N. */
static size_t first_mask_difference(const float *a, const float *b) {
  for (size_t i = 0; i < N; i++)
    if ((a[i] == 0.0f) != (b[i] == 0.0f)) return i;
  return N;
}

Test(cuda_dropout, kernels_compile) {
  mn_test_require_cuda_build();
  mn_graph *g = masked_sum(0.5f, true);
  mn_test_assert_compiles(g, true);
  mn_graph_free(g);
  g = dropout_mlp();
  mn_test_assert_compiles(g, true);
  mn_graph_free(g);
}

Test(cuda_dropout, masks_and_gradients_equal_the_cpu_step_after_step) {
  mn_test_require_cuda_build();
  mn_test_require_cuda_device();
  mn_graph *g = masked_sum(0.4f, false);
  mn_session *cpu = mn_test_session(g, MN_BACKEND_CPU, true);
  mn_session *gpu = mn_test_session(g, MN_BACKEND_CUDA, true);
  feed(cpu);
  feed(gpu);
  float *prev = NULL;
  for (int step = 0; step < STEPS; step++) {
    mn_test_step_loss(cpu);
    mn_test_step_loss(gpu);
    float *yc = mn_test_read_output(cpu, 1, N), *yg = mn_test_read_output(gpu, 1, N);
    static float gc[N], gg[N];
    cr_assert_eq(mn_session_read_grad(cpu, "x", gc, N), MN_OK, "%s", mn_last_error());
    cr_assert_eq(mn_session_read_grad(gpu, "x", gg, N), MN_OK, "%s", mn_last_error());
    size_t at = first_mask_difference(yg, yc);
    cr_expect_eq(at, (size_t)N, "step %d: element %zu: cuda %g, cpu %g", step, at,
                 at < N ? (double)yg[at] : 0.0, at < N ? (double)yc[at] : 0.0);
    double dy = mn_test_max_abs_diff(yg, yc, N), dg = mn_test_max_abs_diff(gg, gc, N);
    fprintf(stderr,
            "cuda_dropout fp32 step %d: %zu of %d dropped; max |cuda - cpu| %g (y), %g (dx)\n",
            step, count_zeros(yc), N, dy, dg);
    cr_expect_arr_eq(yg, yc, N * sizeof *yg, "step %d: the outputs differ (max %g)", step, dy);
    cr_expect_arr_eq(gg, gc, N * sizeof *gg, "step %d: the gradients differ (max %g)", step, dg);
    /* The device's counter moved on: another mask than the step before. */
    if (prev)
      cr_expect_lt(first_mask_difference(yg, prev), (size_t)N, "step %d drew step %d's mask", step,
                   step - 1);
    free(prev);
    free(yc);
    prev = yg;
  }
  mn_session_stats st;
  cr_assert_eq(mn_session_get_stats(gpu, &st), MN_OK);
  cr_expect_eq(st.graph_captures, 1, "a step was captured again (%zu captures)",
               (size_t)st.graph_captures);
  free(prev);
  mn_session_free(cpu);
  mn_session_free(gpu);
  mn_graph_free(g);
}

Test(cuda_dropout, bf16_plan_within_tolerance_with_the_same_masks) {
  mn_test_require_cuda_build();
  mn_test_require_cuda_device();
  mn_graph *g = masked_sum(0.25f, true);
  mn_session *cpu = mn_test_session_precision(g, MN_BACKEND_CPU, MN_PRECISION_BF16, true);
  mn_session *gpu = mn_test_session_precision(g, MN_BACKEND_CUDA, MN_PRECISION_BF16, true);
  feed(cpu);
  feed(gpu);
  for (int step = 0; step < STEPS; step++) {
    mn_test_step_loss(cpu);
    mn_test_step_loss(gpu);
    float *yc = mn_test_read_output(cpu, 1, N), *yg = mn_test_read_output(gpu, 1, N);
    static float gc[N], gg[N];
    cr_assert_eq(mn_session_read_grad(cpu, "x", gc, N), MN_OK, "%s", mn_last_error());
    cr_assert_eq(mn_session_read_grad(gpu, "x", gg, N), MN_OK, "%s", mn_last_error());
    size_t at = first_mask_difference(yg, yc);
    cr_expect_eq(at, (size_t)N, "bf16 step %d: element %zu is dropped on one backend only", step,
                 at);
    double ey = mn_test_rel_err(yg, yc, N), eg = mn_test_rel_err(gg, gc, N);
    fprintf(stderr, "cuda_dropout bf16 step %d: relative error %g (y), %g (dx); tolerance %g\n",
            step, ey, eg, MN_TEST_BF16_TOL);
    cr_expect_leq(ey, MN_TEST_BF16_TOL, "bf16 step %d: y", step);
    cr_expect_leq(eg, MN_TEST_BF16_TOL, "bf16 step %d: dx", step);
    free(yc);
    free(yg);
  }
  mn_session_free(cpu);
  mn_session_free(gpu);
  mn_graph_free(g);
}

/* Accumulation steps and updates in the captured graph: each micro-step draws the CPU's mask. */
Test(cuda_dropout, accumulation_steps_draw_the_cpus_masks) {
  mn_test_require_cuda_build();
  mn_test_require_cuda_device();
  mn_graph *g = masked_sum(0.5f, false);
  mn_session *s[2] = {mn_test_session(g, MN_BACKEND_CPU, true),
                      mn_test_session(g, MN_BACKEND_CUDA, true)};
  for (int b = 0; b < 2; b++) {
    feed(s[b]);
    cr_assert_eq(mn_session_set_learning_rate(s[b], 0.1f), MN_OK);
    cr_assert_eq(mn_session_set_grad_accumulation(s[b], 3), MN_OK, "%s", mn_last_error());
  }
  double worst = 0;
  for (int step = 0; step < 7; step++) {
    mn_test_step_loss(s[0]);
    mn_test_step_loss(s[1]);
    float *yc = mn_test_read_output(s[0], 1, N), *yg = mn_test_read_output(s[1], 1, N);
    size_t at = first_mask_difference(yg, yc);
    cr_expect_eq(at, (size_t)N, "micro-step %d: element %zu is dropped on one backend only", step,
                 at);
    double e = mn_test_rel_err(yg, yc, N);
    worst = e > worst ? e : worst;
    cr_expect_leq(e, 1e-6, "micro-step %d: y", step);
    free(yc);
    free(yg);
  }
  fprintf(stderr, "cuda_dropout accumulation: 7 micro-steps, largest relative error %g\n", worst);
  mn_session_free(s[0]);
  mn_session_free(s[1]);
  mn_graph_free(g);
}

/* The op-suite routine on a model: fp32 at 1e-5 and bf16 at the model tolerance, one step. */
Test(cuda_dropout, mlp_with_dropout_matches_the_cpu) {
  mn_test_require_cuda_build();
  mn_graph *g = dropout_mlp();
  mn_test_check_cuda_model(g, true, NULL, 7);
  mn_graph_free(g);
  mn_test_require_cuda_device(); /* reports the GPU comparisons as skipped */
}
