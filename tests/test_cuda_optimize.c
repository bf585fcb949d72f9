/* The graph optimizer on the GPU: CUDA sessions with the optimizer on and off train and
 * infer alike. On the CPU the rewrites are bit for bit (tests/test_rules_epilogue.c,
 * test_fusion*.c); on the GPU cuBLASLt's epilogue GEMMs and the generated fused kernels may
 * sum in another order, so the sessions agree within fp32 rounding (1e-5 relative) instead.
 * Also checks that the optimizer took dispatches away. Skips without a device. */
#include <stdio.h>
#include <stdlib.h>

#include "benchmarks/gpt_graph.h"
#include "tests/support/cuda_check.h"
#include "tests/support/mn_test.h"
#include "tests/support/models.h"
#include "tests/support/session_util.h"

enum { STEPS = 3 };

typedef void (*feed_fn)(mn_session *s, int step);
typedef void (*configure_fn)(mn_session *s);

static mn_session *cuda_session(const mn_graph *g, bool optimize, bool training) {
  mn_session_options o = mn_session_options_default();
  o.backend = MN_BACKEND_CUDA;
  o.optimize = optimize;
  mn_session *s = NULL;
  mn_status st = training ? mn_build_session(g, &o, &s) : mn_build_inference_session(g, &o, &s);
  cr_assert_eq(st, MN_OK, "%s", mn_last_error());
  return s;
}

static void expect_fewer_dispatches(mn_session *on, mn_session *off) {
  size_t a = mn_plan_num_dispatches(mn_session_plan(on)),
         b = mn_plan_num_dispatches(mn_session_plan(off));
  cr_assert_lt(a, b, "optimized %zu dispatches, unoptimized %zu", a, b);
  cr_log_info("dispatches: %zu unoptimized, %zu optimized", b, a);
}

static void close_enough(const char *what, double got, double want, double tol) {
  double rel = fabs(got - want) / fmax(fabs(want), 1e-30);
  cr_assert(rel <= tol, "%s: optimized %.9g, unoptimized %.9g (relative %.3g)", what, got, want,
            rel);
}

/* Trains both sessions STEPS steps from the same parameters and data; every loss and, at the
 * end, every parameter agree within tol. */
static void agree_training(const mn_graph *g, configure_fn configure, feed_fn feed, double tol) {
  mn_test_require_cuda_device();
  mn_session *on = cuda_session(g, true, true), *off = cuda_session(g, false, true);
  expect_fewer_dispatches(on, off);
  mn_rng r = mn_rng_new(17);
  mn_test_init_normal(g, (mn_session *[]){on, off}, 2, &r, 0.1f, true);
  configure(on);
  configure(off);
  for (int step = 0; step < STEPS; step++) {
    feed(on, step);
    feed(off, step);
    cr_assert_eq(mn_session_step(on), MN_OK, "%s", mn_last_error());
    cr_assert_eq(mn_session_step(off), MN_OK, "%s", mn_last_error());
    cr_assert_eq(mn_session_wait(on), MN_OK, "%s", mn_last_error());
    cr_assert_eq(mn_session_wait(off), MN_OK, "%s", mn_last_error());
    char what[32];
    snprintf(what, sizeof what, "loss of step %d", step);
    close_enough(what, mn_session_read_loss(on), mn_session_read_loss(off), tol);
  }
  mn_test_assert_same_params(g, on, off, tol, "after training");
  mn_session_free(on);
  mn_session_free(off);
}

static void sgd(mn_session *s) { cr_assert_eq(mn_session_set_learning_rate(s, 0.05f), MN_OK); }

static void adamw(mn_session *s) {
  cr_assert_eq(mn_session_set_adamw(s, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f), MN_OK);
}

static void feed_f32(mn_session *s, const char *name, size_t n, uint64_t seed) {
  float *x = malloc(n * sizeof *x);
  mn_rng r = mn_rng_new(seed);
  mn_rng_fill(&r, x, n, -1, 1);
  cr_assert_eq(mn_session_set_input(s, name, x, n), MN_OK, "%s", mn_last_error());
  free(x);
}

/* ---- an MLP with both weight layouts: nn.Linear (matmul_bt, relu) and Conv1D (matmul, gelu) */
enum { MB = 48, MIN = 40, MH = 64, MOUT = 8 };

static mn_graph *mlp(void) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(MB, MIN)), t = mn_input(g, "t", MN_SHAPE(MB, MOUT));
  mn_node h = mn_relu(
      g, mn_bias_add(g, mn_matmul_bt(g, x, mn_parameter(g, "fc1.weight", MN_SHAPE(MH, MIN))),
                     mn_parameter(g, "fc1.bias", MN_SHAPE(MH))));
  h = mn_gelu(g, mn_bias_add(g, mn_matmul(g, h, mn_parameter(g, "fc2.weight", MN_SHAPE(MH, MH))),
                             mn_parameter(g, "fc2.bias", MN_SHAPE(MH))));
  mn_node y = mn_bias_add(g, mn_matmul_bt(g, h, mn_parameter(g, "fc3.weight", MN_SHAPE(MOUT, MH))),
                          mn_parameter(g, "fc3.bias", MN_SHAPE(MOUT)));
  mn_set_outputs(g, (mn_node[]){mn_mse_loss(g, y, t)}, 1);
  cr_assert_eq(mn_graph_status(g), MN_OK, "%s", mn_graph_error(g));
  return g;
}

static void feed_mlp(mn_session *s, int step) {
  feed_f32(s, "x", MB * MIN, 100 + (uint64_t)step);
  feed_f32(s, "t", MB * MOUT, 200 + (uint64_t)step);
}

Test(cuda_optimize, mlp_trains_alike) {
  mn_graph *g = mlp();
  agree_training(g, sgd, feed_mlp, 1e-5);
  agree_training(g, adamw, feed_mlp, 1e-5);
  mn_graph_free(g);
}

/* ---- a GPT-2 style LM (biases, GELU, layer norms, tied head): SGD, since the key bias's exact
 * gradient is 0 and AdamW would turn its rounding noise into steps of the learning rate */
static const gpt_config tiny_gpt = {
    .layers = 2, .heads = 2, .d_model = 64, .d_ff = 256, .vocab = 97, .batch = 2, .seq = 24};

static void feed_gpt(mn_session *s, int step) {
  size_t n = (size_t)(tiny_gpt.batch * tiny_gpt.seq);
  uint32_t *tok = malloc(n * sizeof *tok), *pos = malloc(n * sizeof *pos),
           *lab = malloc(n * sizeof *lab);
  mn_rng r = mn_rng_new(300 + (uint64_t)step);
  mn_rng_fill_u32(&r, tok, n, (uint32_t)tiny_gpt.vocab);
  mn_rng_fill_u32(&r, lab, n, (uint32_t)tiny_gpt.vocab);
  for (size_t i = 0; i < n; i++)
    pos[i] = (uint32_t)(i % (size_t)tiny_gpt.seq);
  cr_assert_eq(mn_session_set_input_u32(s, "tokens", tok, n), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_set_input_u32(s, "positions", pos, n), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_set_input_u32(s, "labels", lab, n), MN_OK, "%s", mn_last_error());
  free(tok);
  free(pos);
  free(lab);
}

Test(cuda_optimize, gpt_trains_alike) {
  mn_graph *g = gpt_graph(&tiny_gpt);
  cr_assert_eq(mn_graph_status(g), MN_OK, "%s", mn_graph_error(g));
  agree_training(g, sgd, feed_gpt, 1e-5);
  mn_graph_free(g);
}

/* ---- two Llama-style blocks (RMS norms, RoPE, GQA, SwiGLU) with AdamW */
enum { LB = 2, LT = 24, LV = 97 };

static void feed_llama(mn_session *s, int step) {
  uint32_t in[LB * LT], lab[LB * LT];
  mn_rng r = mn_rng_new(400 + (uint64_t)step);
  mn_rng_fill_u32(&r, in, LB * LT, LV);
  mn_rng_fill_u32(&r, lab, LB * LT, LV);
  cr_assert_eq(mn_session_set_input_u32(s, "tokens", in, LB * LT), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_set_input_u32(s, "labels", lab, LB * LT), MN_OK, "%s", mn_last_error());
}

Test(cuda_optimize, llama_blocks_train_alike) {
  const mn_test_block_config cfg = MN_TEST_BLOCK_CONFIG(64, 4, 2, 16, 96);
  mn_graph *g = mn_test_lm(&cfg, LB, LT, LV, 2);
  cr_assert_eq(mn_graph_status(g), MN_OK, "%s", mn_graph_error(g));
  agree_training(g, adamw, feed_llama, 1e-5);
  mn_graph_free(g);
}

/* ---- a conv block (conv, group_norm + silu, conv): inference fuses the norm and the silu */
static mn_graph *conv_block(void) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(2, 8, 10, 10));
  mn_node h = mn_conv2d(g, x, mn_parameter(g, "conv1.weight", MN_SHAPE(8, 8, 3, 3)), 1, 1);
  h = mn_group_norm(g, h, mn_parameter(g, "norm.weight", MN_SHAPE(8)),
                    mn_parameter(g, "norm.bias", MN_SHAPE(8)), 4, 1e-5f);
  h = mn_conv2d(g, mn_silu(g, h), mn_parameter(g, "conv2.weight", MN_SHAPE(8, 8, 3, 3)), 1, 1);
  mn_set_outputs(g, (mn_node[]){mn_add(g, x, h)}, 1);
  cr_assert_eq(mn_graph_status(g), MN_OK, "%s", mn_graph_error(g));
  return g;
}

Test(cuda_optimize, conv_block_inference_alike) {
  mn_test_require_cuda_device();
  mn_graph *g = conv_block();
  mn_session *on = cuda_session(g, true, false), *off = cuda_session(g, false, false);
  expect_fewer_dispatches(on, off);
  mn_rng r = mn_rng_new(23);
  mn_test_init_normal(g, (mn_session *[]){on, off}, 2, &r, 0.2f, false);
  size_t n = 2 * 8 * 10 * 10;
  float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
  for (int k = 0; k < 2; k++) {
    mn_session *s = k ? off : on;
    feed_f32(s, "x", n, 500);
    cr_assert_eq(mn_session_step(s), MN_OK, "%s", mn_last_error());
    cr_assert_eq(mn_session_wait(s), MN_OK, "%s", mn_last_error());
    cr_assert_eq(mn_session_read_output_by_index(s, 0, k ? b : a, n), MN_OK, "%s", mn_last_error());
  }
  double err = mn_test_rel_err(a, b, n);
  cr_assert(err <= 1e-5, "outputs differ: relative %.3g", err);
  free(a);
  free(b);
  mn_session_free(on);
  mn_session_free(off);
  mn_graph_free(g);
}
