/* bf16 training on CUDA as a whole (the op suites compare each op in bf16 against the CPU
 * emulation): a small transformer trained on both backends in bf16 follows the same losses;
 * a bf16 MLP converges as the fp32 one does; a bf16 step is still one graph launch; the arena
 * holds low-precision values in 2 bytes; parameters written by the host reach the weights'
 * low-precision copy; outputs read back as bf16 values. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/cuda_check.h"
#include "tests/support/mn_test.h"
#include "tests/support/models.h"
#include "tests/support/session_util.h"

static mn_session *session(const mn_graph *g, mn_backend backend, mn_precision prec,
                           bool training) {
  mn_session_options o = mn_session_options_default();
  o.backend = backend;
  o.precision = prec;
  mn_session *s = NULL;
  mn_status st = training ? mn_build_session(g, &o, &s) : mn_build_inference_session(g, &o, &s);
  cr_assert_eq(st, MN_OK, "%s", mn_last_error());
  return s;
}

/* ---- two pre-norm transformer blocks (RoPE, causal GQA 6/2, SwiGLU), tied LM head */
enum { TB_B = 2, TB_T = 40, TB_V = 97, STEPS = 20 };

static mn_graph *transformer(void) {
  const mn_test_block_config cfg = MN_TEST_BLOCK_CONFIG(96, 6, 2, 16, 160);
  mn_graph *g = mn_test_lm(&cfg, TB_B, TB_T, TB_V, 2);
  cr_assert_eq(mn_graph_status(g), MN_OK, "%s", mn_graph_error(g));
  return g;
}

static void feed_tokens(mn_session *s, int step) {
  mn_rng r = mn_rng_new(900 + (uint64_t)(step % 4));
  uint32_t in[TB_B * TB_T], lab[TB_B * TB_T];
  mn_rng_fill_u32(&r, in, TB_B * TB_T, TB_V);
  for (int i = 0; i < TB_B * TB_T; i++)
    lab[i] = (in[i] * 7u + 3u) % TB_V; /* a learnable map */
  cr_assert_eq(mn_session_set_input_u32(s, "tokens", in, TB_B * TB_T), MN_OK);
  cr_assert_eq(mn_session_set_input_u32(s, "labels", lab, TB_B * TB_T), MN_OK);
}

static float train_step(mn_session *s, int step) {
  feed_tokens(s, step);
  cr_assert_eq(mn_session_step(s), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_wait(s), MN_OK, "%s", mn_last_error());
  return mn_session_read_loss(s);
}

/* The CPU emulates the storage table the CUDA kernels obey; what differs is the order of
 * fp32 sums and the odd rounding that goes the other way, which training then carries
 * along. Each step's loss stays within 2^-6 relative (4 bf16 units of roundoff). */
Test(cuda_precision, bf16_transformer_training_follows_the_cpu_emulation) {
  mn_test_require_cuda_device();
  mn_graph *g = transformer();
  mn_session *cpu = session(g, MN_BACKEND_CPU, MN_PRECISION_BF16, true),
             *gpu = session(g, MN_BACKEND_CUDA, MN_PRECISION_BF16, true);
  mn_rng r = mn_rng_new(11);
  mn_test_init_normal(g, (mn_session *[]){cpu, gpu}, 2, &r, 0.1f, true);
  for (int k = 0; k < 2; k++) {
    mn_session *s = k ? gpu : cpu;
    cr_assert_eq(mn_session_set_adamw(s, 2e-3f, 0.9f, 0.95f, 1e-8f, 0.1f), MN_OK);
    cr_assert_eq(mn_session_set_grad_clip(s, 1.0f), MN_OK);
  }
  double worst = 0;
  for (int step = 0; step < STEPS; step++) {
    float lc = train_step(cpu, step), lg = train_step(gpu, step);
    double rel = fabs((double)lg - lc) / fabs((double)lc);
    cr_assert(rel <= 0x1p-6, "step %d: bf16 loss cuda %.7g vs cpu %.7g (relative %.3g)", step, lg,
              lc, rel);
    worst = rel > worst ? rel : worst;
  }
  cr_log_info("bf16: largest relative loss difference over %d steps: %.3g", STEPS, worst);
  mn_test_assert_same_params(g, gpu, cpu, 0x1p-5, "after 20 bf16 steps");
  mn_session_stats st;
  mn_session_get_stats(gpu, &st);
  cr_assert_eq(st.graph_launches, (uint64_t)STEPS, "one graph launch per bf16 step");
  mn_session_free(cpu);
  mn_session_free(gpu);
  mn_graph_free(g);
}

/* 60 AdamW steps of the transformer on CUDA from the same start: bf16 learns as fp32 does. */
Test(cuda_precision, bf16_training_converges_like_fp32_on_the_gpu) {
  mn_test_require_cuda_device();
  mn_graph *g = transformer();
  mn_session *s[2] = {session(g, MN_BACKEND_CUDA, MN_PRECISION_F32, true),
                      session(g, MN_BACKEND_CUDA, MN_PRECISION_BF16, true)};
  mn_rng r = mn_rng_new(12);
  mn_test_init_normal(g, s, 2, &r, 0.1f, true);
  float first[2], last[2];
  for (int k = 0; k < 2; k++) {
    cr_assert_eq(mn_session_set_adamw(s[k], 1e-2f, 0.9f, 0.95f, 1e-8f, 0.0f), MN_OK);
    for (int i = 0; i < 60; i++) {
      float l = train_step(s[k], i);
      if (i == 0) first[k] = l;
      last[k] = l;
    }
  }
  cr_log_info("fp32 %.4f -> %.4f, bf16 %.4f -> %.4f", first[0], last[0], first[1], last[1]);
  cr_expect_lt(fabsf(first[1] - first[0]), 0.02f * first[0], "step 1: bf16 %g vs fp32 %g", first[1],
               first[0]);
  cr_expect_lt(last[1], 0.5f * first[1], "bf16 did not learn: %g -> %g", first[1], last[1]);
  cr_expect_lt(fabsf(last[1] - last[0]), 0.05f * first[0] + 0.1f * last[0],
               "step 60: bf16 %g vs fp32 %g", last[1], last[0]);
  mn_session_free(s[0]);
  mn_session_free(s[1]);
  mn_graph_free(g);
}

/* Activations take 2 bytes: the bf16 arena is smaller than the fp32 one. */
Test(cuda_precision, the_bf16_arena_stores_activations_in_two_bytes) {
  mn_test_require_cuda_device();
  mn_graph *g = transformer();
  mn_session *f = session(g, MN_BACKEND_CUDA, MN_PRECISION_F32, true),
             *b = session(g, MN_BACKEND_CUDA, MN_PRECISION_BF16, true);
  mn_memory_summary mf = mn_session_memory_summary(f), mb = mn_session_memory_summary(b);
  cr_log_info("arena: fp32 %zu bytes, bf16 %zu bytes", mf.total_buffer_bytes,
              mb.total_buffer_bytes);
  cr_assert_lt(mb.total_buffer_bytes, mf.total_buffer_bytes);
  mn_session_free(f);
  mn_session_free(b);
  mn_graph_free(g);
}

/* Inference: y = x W. A parameter written after a step reaches the next step's product (the
 * low-precision copy is refreshed), and the output reads back as bf16 values equal to the
 * CPU emulation's. */
Test(cuda_precision, written_parameters_reach_the_bf16_product) {
  mn_test_require_cuda_device();
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", (int64_t[]){4, 64}, 2);
  mn_node w = mn_parameter(g, "w", (int64_t[]){64, 32}, 2);
  mn_set_outputs(g, (mn_node[]){mn_matmul(g, x, w)}, 1);
  mn_session *cpu = session(g, MN_BACKEND_CPU, MN_PRECISION_BF16, false),
             *gpu = session(g, MN_BACKEND_CUDA, MN_PRECISION_BF16, false);
  float xs[4 * 64], ws[64 * 32], yc[4 * 32], yg[4 * 32];
  mn_rng r = mn_rng_new(5);
  mn_rng_fill(&r, xs, 4 * 64, -1.0f, 1.0f);
  for (int round = 0; round < 2; round++) {
    mn_rng_fill(&r, ws, 64 * 32, -1.0f, 1.0f);
    for (int k = 0; k < 2; k++) {
      mn_session *s = k ? gpu : cpu;
      cr_assert_eq(mn_session_set_input(s, "x", xs, 4 * 64), MN_OK);
      cr_assert_eq(mn_session_set_parameter(s, "w", ws, 64 * 32), MN_OK);
      cr_assert_eq(mn_session_step(s), MN_OK, "%s", mn_last_error());
      cr_assert_eq(mn_session_wait(s), MN_OK, "%s", mn_last_error());
      cr_assert_eq(mn_session_read_output_by_index(s, 0, k ? yg : yc, 4 * 32), MN_OK);
    }
    int differ = 0;
    for (int i = 0; i < 4 * 32; i++) {
      uint32_t u;
      memcpy(&u, &yg[i], sizeof u);
      cr_assert_eq(u & 0xffffu, 0u, "round %d: output %d (%g) is not a bf16 value", round, i,
                   (double)yg[i]);
      /* fp32 sums in another order round to the same bf16 value or a neighbour */
      cr_assert_leq(fabsf(yg[i] - yc[i]), 0x1p-7f * fabsf(yc[i]) + 1e-6f,
                    "round %d: y[%d] cuda %g vs cpu %g", round, i, (double)yg[i], (double)yc[i]);
      differ += yg[i] != yc[i];
    }
    cr_log_info("round %d: %d of %d outputs one bf16 ulp apart", round, differ, 4 * 32);
  }
  mn_session_free(cpu);
  mn_session_free(gpu);
  mn_graph_free(g);
}

/* F16 training waits for the CUDA loss scaler: refused clearly, building nothing. */
Test(cuda_precision, f16_training_on_cuda_is_refused_clearly) {
  mn_test_require_cuda_device();
  mn_graph *g = transformer();
  mn_session_options o = mn_session_options_default();
  o.backend = MN_BACKEND_CUDA;
  o.precision = MN_PRECISION_F16;
  mn_session *s = NULL;
  cr_assert_eq(mn_build_session(g, &o, &s), MN_ERR_UNSUPPORTED);
  cr_assert_null(s);
  cr_assert(strstr(mn_last_error(), "f16") != NULL, "%s", mn_last_error());
  mn_graph_free(g);
}

/* A vocabulary of 1031 (bf16 rows of 2062 bytes, not a 16-byte multiple): the backend pads
 * the rows of the logits and of their gradient to 1088 values for the products, and the
 * loss kernels read them at that pitch. Loss and every gradient agree with the CPU. */
Test(cuda_precision, wide_unaligned_logits_train_as_on_the_cpu) {
  mn_test_require_cuda_build();
  const mn_test_block_config cfg = MN_TEST_BLOCK_CONFIG(64, 4, 2, 16, 96);
  mn_graph *g = mn_test_lm(&cfg, 2, 24, 1031, 1);
  cr_assert_eq(mn_graph_status(g), MN_OK, "%s", mn_graph_error(g));
  mn_test_assert_compiles_precision(g, true, MN_PRECISION_BF16);
  mn_test_require_cuda_device();
  const mn_test_range ranges[] = {{"tokens", 0, 1031}, {"labels", 0, 1031}, {NULL, 0, 0}};
  double err = mn_test_compare_cuda_precision(g, true, MN_PRECISION_BF16, 2 * MN_TEST_BF16_TOL,
                                              ranges, 3);
  cr_log_info("largest norm-wise difference: %.3g", err);
  mn_graph_free(g);
}
