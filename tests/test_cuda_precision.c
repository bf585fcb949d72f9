/* bf16 training on CUDA as a whole (the op suites compare each op in bf16 against the CPU
 * emulation): a small transformer trained on both backends in bf16 follows the same losses;
 * a bf16 MLP converges as the fp32 one does; a bf16 step is still one graph launch; the arena
 * holds low-precision values in 2 bytes; parameters written by the host reach the weights'
 * low-precision copy; outputs read back as bf16 values. F16 training with the device's loss
 * scaler: the transformer follows the CPU emulation, an overflowing step is skipped as on the
 * CPU (also with steps in flight and gradient accumulation), checkpoints carry the scaler. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "session/session.h"
#include "tests/support/cuda_check.h"
#include "tests/support/mn_test.h"
#include "tests/support/models.h"
#include "tests/support/precision_check.h"
#include "tests/support/session_util.h"
#include "tests/support/tmp_dir.h"

/* ---- two pre-norm transformer blocks (RoPE, causal GQA 6/2, SwiGLU), tied LM head */
enum { STEPS = 20 };

static mn_graph *transformer(void) {
  mn_graph *g = mn_test_two_block_lm();
  cr_assert_eq(mn_graph_status(g), MN_OK, "%s", mn_graph_error(g));
  return g;
}

/* With `prompt`, the labels of each sequence's first 8 positions are MN_IGNORE_LABEL. */
static void feed_tokens(mn_session *s, int step, bool prompt) {
  mn_rng r = mn_rng_new(900 + (uint64_t)(step % 4));
  uint32_t in[MN_TEST_TB_B * MN_TEST_TB_T], lab[MN_TEST_TB_B * MN_TEST_TB_T];
  mn_rng_fill_u32(&r, in, MN_TEST_TB_B * MN_TEST_TB_T, MN_TEST_TB_V);
  for (int i = 0; i < MN_TEST_TB_B * MN_TEST_TB_T; i++)
    lab[i] = prompt && i % MN_TEST_TB_T < 8
                 ? MN_IGNORE_LABEL
                 : (in[i] * 7u + 3u) % MN_TEST_TB_V; /* a learnable map */
  cr_assert_eq(mn_session_set_input_u32(s, "tokens", in, MN_TEST_TB_B * MN_TEST_TB_T), MN_OK);
  cr_assert_eq(mn_session_set_input_u32(s, "labels", lab, MN_TEST_TB_B * MN_TEST_TB_T), MN_OK);
}

static float train_step(mn_session *s, int step, bool prompt) {
  feed_tokens(s, step, prompt);
  return mn_test_step_loss(s);
}

/* The transformer trained on both backends in `prec` for STEPS AdamW steps from the same start:
 * each step's loss within loss_tol relative of the CPU emulation's (after each step `check`, when
 * given, compares more), parameters within param_tol at the end, one graph launch per step. */
static void follow_the_cpu(mn_precision prec, double loss_tol, double param_tol,
                           void (*check)(mn_session *gpu, mn_session *cpu, const char *when),
                           bool prompt) {
  mn_graph *g = transformer();
  mn_session *cpu = mn_test_session_precision(g, MN_BACKEND_CPU, prec, true),
             *gpu = mn_test_session_precision(g, MN_BACKEND_CUDA, prec, true);
  const char *name = mn_test_precision_name(prec);
  mn_rng r = mn_rng_new(11);
  mn_test_init_normal(g, (mn_session *[]){cpu, gpu}, 2, &r, 0.1f, true);
  for (int k = 0; k < 2; k++) {
    mn_session *s = k ? gpu : cpu;
    cr_assert_eq(mn_session_set_adamw(s, 2e-3f, 0.9f, 0.95f, 1e-8f, 0.1f), MN_OK);
    cr_assert_eq(mn_session_set_grad_clip(s, 1.0f), MN_OK);
  }
  double worst = 0;
  for (int step = 0; step < STEPS; step++) {
    float lc = train_step(cpu, step, prompt), lg = train_step(gpu, step, prompt);
    double rel = fabs((double)lg - lc) / fabs((double)lc);
    cr_assert(rel <= loss_tol, "step %d: %s loss cuda %.7g vs cpu %.7g (relative %.3g)", step, name,
              lg, lc, rel);
    worst = rel > worst ? rel : worst;
    char when[32];
    snprintf(when, sizeof when, "step %d", step);
    if (check) check(gpu, cpu, when);
  }
  mn_session_stats st;
  mn_session_get_stats(gpu, &st);
  cr_log_info("%s: largest relative loss difference over %d steps: %.3g; scale %g, %llu skipped",
              name, STEPS, worst, (double)st.loss_scale, (unsigned long long)st.skipped_steps);
  char when[48];
  snprintf(when, sizeof when, "after %d %s steps", STEPS, name);
  mn_test_assert_same_params(g, gpu, cpu, param_tol, when);
  cr_assert_eq(st.graph_launches, (uint64_t)STEPS, "one graph launch per %s step", name);
  cr_assert_eq(st.graph_captures, 1u, "one capture");
  mn_session_free(cpu);
  mn_session_free(gpu);
  mn_graph_free(g);
}

/* The CPU emulates the storage table the CUDA kernels obey; what differs is the order of
 * fp32 sums and the odd rounding that goes the other way, which training then carries
 * along. Each step's loss stays within 2^-6 relative (4 bf16 units of roundoff). */
Test(cuda_precision, bf16_transformer_training_follows_the_cpu_emulation) {
  mn_test_require_cuda_device();
  follow_the_cpu(MN_PRECISION_BF16, 0x1p-6, 0x1p-5, NULL, false);
}

/* 60 AdamW steps of the transformer on CUDA from the same start: bf16 learns as fp32 does. */
Test(cuda_precision, bf16_training_converges_like_fp32_on_the_gpu) {
  mn_test_require_cuda_device();
  mn_graph *g = transformer();
  mn_session *s[2] = {mn_test_session_precision(g, MN_BACKEND_CUDA, MN_PRECISION_F32, true),
                      mn_test_session_precision(g, MN_BACKEND_CUDA, MN_PRECISION_BF16, true)};
  mn_rng r = mn_rng_new(12);
  mn_test_init_normal(g, s, 2, &r, 0.1f, true);
  float first[2], last[2];
  for (int k = 0; k < 2; k++) {
    cr_assert_eq(mn_session_set_adamw(s[k], 1e-2f, 0.9f, 0.95f, 1e-8f, 0.0f), MN_OK);
    for (int i = 0; i < 60; i++) {
      float l = train_step(s[k], i, false);
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
  mn_session *f = mn_test_session_precision(g, MN_BACKEND_CUDA, MN_PRECISION_F32, true),
             *b = mn_test_session_precision(g, MN_BACKEND_CUDA, MN_PRECISION_BF16, true);
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
  mn_session *cpu = mn_test_session_precision(g, MN_BACKEND_CPU, MN_PRECISION_BF16, false),
             *gpu = mn_test_session_precision(g, MN_BACKEND_CUDA, MN_PRECISION_BF16, false);
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

/* ---- F16 training: the loss scaler runs on the device (cuda/loss_scale.c) */

static mn_session_stats stats_of(const mn_session *s) {
  mn_session_stats st;
  cr_assert_eq(mn_session_get_stats(s, &st), MN_OK);
  return st;
}

/* Both sessions' scalers, step counts and accumulation rounds agree. */
static void assert_same_scaler(mn_session *gpu, mn_session *cpu, const char *when) {
  cr_assert_eq(stats_of(gpu).loss_scale, stats_of(cpu).loss_scale, "%s: loss scale cuda %g, cpu %g",
               when, (double)stats_of(gpu).loss_scale, (double)stats_of(cpu).loss_scale);
  cr_assert_eq(stats_of(gpu).skipped_steps, stats_of(cpu).skipped_steps,
               "%s: skipped steps cuda %llu, cpu %llu", when,
               (unsigned long long)stats_of(gpu).skipped_steps,
               (unsigned long long)stats_of(cpu).skipped_steps);
  cr_assert_eq(gpu->scaler.good_steps, cpu->scaler.good_steps, "%s: good steps cuda %u, cpu %u",
               when, gpu->scaler.good_steps, cpu->scaler.good_steps);
  cr_assert_eq(gpu->step_count, cpu->step_count, "%s: optimizer steps cuda %llu, cpu %llu", when,
               (unsigned long long)gpu->step_count, (unsigned long long)cpu->step_count);
  cr_assert_eq(gpu->accum_index, cpu->accum_index, "%s: accumulation round cuda %u, cpu %u", when,
               gpu->accum_index, cpu->accum_index);
}

/* The transformer above in f16 on both backends: each step's loss within 2^-8 relative (4 fp16
 * units of roundoff, the bound the bf16 run keeps in bf16 units, with a factor 2 for fp16's
 * range effects), the same loss scale and skipped steps after every step, parameters within
 * 2^-7 after 20 AdamW steps, and one graph launch per step. */
Test(cuda_precision, f16_transformer_training_follows_the_cpu_emulation) {
  mn_test_require_cuda_build();
  mn_graph *g = transformer();
  mn_test_assert_compiles_precision(g, true, MN_PRECISION_F16);
  mn_graph_free(g);
  mn_test_require_cuda_device();
  follow_the_cpu(MN_PRECISION_F16, 0x1p-8, 0x1p-7, assert_same_scaler, false);
}

/* The same with each sequence's first 8 labels ignored: the loss gradient seeded with the scale
 * is divided by the counted rows only, on the device as on the CPU. */
Test(cuda_precision, f16_training_with_ignored_labels_follows_the_cpu_emulation) {
  mn_test_require_cuda_device();
  follow_the_cpu(MN_PRECISION_F16, 0x1p-8, 0x1p-7, assert_same_scaler, true);
}

/* The MLP of tests/support (mn_pc_mlp) in f16 on both backends, with AdamW and far targets:
 * loss gradients of about 94 overflow fp16 once multiplied by the initial scale of 65536, and
 * keep overflowing until the scale falls to 512 (the largest activation gradient is then
 * 48400); near targets (in [-1, 1]) overflow at no scale up to 65536 (at most 5900). */
static void f16_mlp_pair(const mn_graph *g, mn_session **cpu, mn_session **gpu) {
  *cpu = mn_test_session_precision(g, MN_BACKEND_CPU, MN_PRECISION_F16, true);
  *gpu = mn_test_session_precision(g, MN_BACKEND_CUDA, MN_PRECISION_F16, true);
  mn_pc_fill_mlp((mn_session *[]){*cpu, *gpu}, 2, g, true);
  for (int k = 0; k < 2; k++)
    cr_assert_eq(mn_session_set_adamw(k ? *gpu : *cpu, 1e-2f, 0.9f, 0.999f, 1e-8f, 0.01f), MN_OK);
}

/* A step whose scaled gradients overflow fp16 updates nothing on CUDA, exactly as on the CPU:
 * the parameters keep every bit, the skipped step counts, the scale halves, Adam's step count
 * stays. Once the scale is small enough the first update is Adam's step 1 on both backends,
 * the gradients read back unscaled, and every step stayed one graph launch. */
Test(cuda_precision, an_overflowing_f16_step_is_skipped_on_cuda_as_on_the_cpu) {
  mn_test_require_cuda_build();
  mn_graph *g = mn_pc_mlp();
  mn_test_assert_compiles_precision(g, true, MN_PRECISION_F16);
  mn_test_require_cuda_device();
  mn_session *cpu, *gpu;
  f16_mlp_pair(g, &cpu, &gpu);
  cr_assert_eq(stats_of(gpu).loss_scale, 65536.0f);
  float *before = mn_test_read_params(g, gpu);
  float lc = mn_test_step_loss(cpu), lg = mn_test_step_loss(gpu);
  cr_expect(isfinite(lg), "the loss is computed before the scale: %g", (double)lg);
  cr_expect_leq(fabsf(lg - lc), 0x1p-8f * fabsf(lc), "loss cuda %g vs cpu %g", (double)lg,
                (double)lc);
  mn_session_stats st = stats_of(gpu);
  cr_assert_eq(st.skipped_steps, 1u);
  cr_assert_eq(st.loss_scale, 32768.0f);
  assert_same_scaler(gpu, cpu, "after the overflowing step");
  float *same = mn_test_read_params(g, gpu);
  cr_assert(memcmp(before, same, mn_test_param_count(g) * sizeof(float)) == 0,
            "an overflowing step changed the parameters on CUDA");
  mn_test_assert_same_params(g, gpu, cpu, 0, "after the overflowing step");
  uint64_t submissions = st.submissions;
  int steps = 1;
  while (stats_of(cpu).skipped_steps == (uint64_t)steps && steps < 30) {
    mn_test_step_loss(cpu);
    mn_test_step_loss(gpu);
    steps++;
    char when[32];
    snprintf(when, sizeof when, "step %d", steps);
    assert_same_scaler(gpu, cpu, when);
  }
  st = stats_of(gpu);
  cr_log_info("%llu steps skipped, scale %g", (unsigned long long)st.skipped_steps,
              (double)st.loss_scale);
  cr_assert_lt(st.skipped_steps, (uint64_t)steps, "every step overflowed");
  cr_assert_eq(gpu->step_count, 1u, "the first update is Adam's step 1");
  cr_assert_eq(st.graph_launches, (uint64_t)steps, "one graph launch per f16 step");
  cr_assert_eq(st.submissions - submissions, (uint64_t)(steps - 1),
               "the scaler adds no submission to a step");
  float *after = mn_test_read_params(g, gpu);
  cr_assert(memcmp(before, after, mn_test_param_count(g) * sizeof(float)) != 0,
            "the first finite step updated nothing");
  mn_test_assert_same_params(g, gpu, cpu, 0x1p-8, "after the first update");
  float gg[4], gc[4];
  cr_assert_eq(mn_session_read_grad(gpu, "b2", gg, 4), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_read_grad(cpu, "b2", gc, 4), MN_OK, "%s", mn_last_error());
  for (int i = 0; i < 4; i++) {
    cr_expect(fabsf(gg[i]) < 1e4f && fabsf(gg[i]) > 1.0f, "b2's gradient is read unscaled: %g",
              (double)gg[i]);
    cr_expect_leq(fabsf(gg[i] - gc[i]), 0x1p-8f * fabsf(gc[i]), "b2 gradient %d: cuda %g, cpu %g",
                  i, (double)gg[i], (double)gc[i]);
  }
  free(before), free(same), free(after);
  mn_session_free(cpu);
  mn_session_free(gpu);
  mn_graph_free(g);
}

/* Steps submitted without waiting, with gradient accumulation over 2: the device alone knows
 * which steps overflowed, and it keeps the round and Adam's step count as the CPU does (a
 * skipped step advances neither), so after one wait both backends agree on the scaler, the
 * step count, the round and the parameters. */
Test(cuda_precision, f16_steps_in_flight_skip_and_accumulate_as_on_the_cpu) {
  mn_test_require_cuda_build();
  mn_graph *g = mn_pc_mlp();
  mn_test_assert_compiles_precision(g, true, MN_PRECISION_F16);
  mn_test_require_cuda_device();
  mn_session *cpu, *gpu;
  f16_mlp_pair(g, &cpu, &gpu);
  for (int k = 0; k < 2; k++)
    cr_assert_eq(mn_session_set_grad_accumulation(k ? gpu : cpu, 2), MN_OK);
  enum { N = 17 };
  for (int i = 0; i < N; i++) {
    mn_test_step_loss(cpu);
    cr_assert_eq(mn_session_step(gpu), MN_OK, "%s", mn_last_error());
  }
  cr_assert_eq(mn_session_wait(gpu), MN_OK, "%s", mn_last_error());
  cr_log_info("after %d steps: %llu skipped, %llu updates, round at %u", N,
              (unsigned long long)stats_of(cpu).skipped_steps, (unsigned long long)cpu->step_count,
              cpu->accum_index);
  cr_assert_gt(stats_of(cpu).skipped_steps, 0u, "no step overflowed");
  cr_assert_gt(cpu->step_count, 1u, "fewer than two updates");
  assert_same_scaler(gpu, cpu, "after the steps in flight");
  mn_test_assert_same_params(g, gpu, cpu, 0x1p-7, "after the steps in flight");
  cr_assert_eq(stats_of(gpu).graph_launches, (uint64_t)N);
  mn_session_free(cpu);
  mn_session_free(gpu);
  mn_graph_free(g);
}

/* Checkpoints carry the device's scaler both ways: a CUDA run saved while steps are in flight
 * records the scale its device reached, and a CUDA session that loads a checkpoint takes its
 * scaler, step count and round before its next step (it had a scaler of its own). */
Test(cuda_precision, f16_checkpoints_carry_the_device_loss_scaler) {
  mn_test_require_cuda_device();
  mn_tmp_dir t = mn_tmp_dir_make("mn_cuda_precision");
  const char *path = mn_tmp_path(&t, "ck.safetensors");
  mn_graph *g = mn_pc_mlp();
  mn_session *gpu = mn_test_session_precision(g, MN_BACKEND_CUDA, MN_PRECISION_F16, true),
             *cpu = mn_test_session_precision(g, MN_BACKEND_CPU, MN_PRECISION_F16, true),
             *fresh = mn_test_session_precision(g, MN_BACKEND_CUDA, MN_PRECISION_F16, true);
  mn_pc_fill_mlp((mn_session *[]){gpu}, 1, g, true);
  mn_pc_fill_mlp((mn_session *[]){cpu, fresh}, 2, g, false);
  mn_session *all[3] = {gpu, cpu, fresh};
  for (int k = 0; k < 3; k++)
    cr_assert_eq(mn_session_set_adamw(all[k], 1e-2f, 0.9f, 0.999f, 1e-8f, 0.01f), MN_OK);
  for (int i = 0; i < 3; i++)
    cr_assert_eq(mn_session_step(gpu), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_save_checkpoint(gpu, path), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_wait(gpu), MN_OK, "%s", mn_last_error());
  mn_session_stats sg = stats_of(gpu);
  cr_assert_eq(sg.skipped_steps, 3u);
  cr_assert_eq(sg.loss_scale, 8192.0f);
  /* The fresh session has trained on its own: scale 65536, two good steps, two updates. */
  mn_test_step_loss(fresh);
  mn_test_step_loss(fresh);
  cr_assert_eq(fresh->step_count, 2u);
  cr_assert_eq(mn_session_load_checkpoint(cpu, path), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_load_checkpoint(fresh, path), MN_OK, "%s", mn_last_error());
  cr_assert_eq(stats_of(cpu).loss_scale, 8192.0f, "the checkpoint has the device's scale");
  cr_assert_eq(stats_of(cpu).skipped_steps, 3u);
  assert_same_scaler(fresh, cpu, "after loading");
  /* Near targets: a finite step at scale 8192, Adam's step 1 from the checkpoint's moments. */
  float lc = mn_test_step_loss(cpu), lf = mn_test_step_loss(fresh);
  cr_expect_leq(fabsf(lf - lc), 0x1p-8f * fabsf(lc), "loss cuda %g vs cpu %g", (double)lf,
                (double)lc);
  assert_same_scaler(fresh, cpu, "a step after loading");
  cr_assert_eq(fresh->step_count, 1u, "the device took the checkpoint's step count");
  cr_assert_eq(stats_of(fresh).loss_scale, 8192.0f);
  mn_test_assert_same_params(g, fresh, cpu, 0x1p-8, "a step after loading");
  mn_session_free(gpu);
  mn_session_free(cpu);
  mn_session_free(fresh);
  mn_graph_free(g);
  mn_tmp_dir_remove(&t);
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
  double err =
      mn_test_compare_cuda_precision(g, true, MN_PRECISION_BF16, 2 * MN_TEST_BF16_TOL, ranges, 3);
  cr_log_info("largest norm-wise difference: %.3g", err);
  mn_graph_free(g);
}
