/* Whole models trained on CUDA and on the reference backend from the same weights and
 * data: the loss trajectories over 20 steps and the final weights must agree. Also the
 * planned step against inputs that change every step (staging through pinned memory). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/plan.h"
#ifdef MN_WITH_CUDA
#include "cuda/matmul_tune.h"
#include "cuda/storage_layout.h"
#endif
#include "session/session.h"
#include "tests/support/cuda_check.h"
#include "tests/support/mn_test.h"
#include "tests/support/models.h"
#include "tests/support/session_util.h"
#include "tests/support/tmp_dir.h"

enum { STEPS = 20 };

typedef void (*configure_fn)(mn_session *s);
typedef void (*feed_fn)(mn_session *s, int step);

/* The same random weights (seed 11) into every session: normal(0, 0.1), norms at 1. */
static void init_params(const mn_graph *g, mn_session *const *sessions, size_t n) {
  mn_rng r = mn_rng_new(11);
  mn_test_init_normal(g, sessions, n, &r, 0.1f, true);
}

/* Trains both for STEPS steps, feeding per-step data, and compares every loss. */
static void compare_training(const mn_graph *g, configure_fn configure, feed_fn feed, double tol) {
  mn_test_require_cuda_device();
  mn_session *cpu = mn_test_session(g, MN_BACKEND_CPU, true),
             *gpu = mn_test_session(g, MN_BACKEND_CUDA, true);
  init_params(g, (mn_session *[]){cpu, gpu}, 2);
  configure(cpu);
  configure(gpu);
  double worst = 0;
  for (int step = 0; step < STEPS; step++) {
    feed(cpu, step);
    feed(gpu, step);
    cr_assert_eq(mn_session_step(cpu), MN_OK);
    cr_assert_eq(mn_session_step(gpu), MN_OK, "%s", mn_last_error());
    cr_assert_eq(mn_session_wait(cpu), MN_OK, "%s", mn_last_error());
    cr_assert_eq(mn_session_wait(gpu), MN_OK, "%s", mn_last_error());
    float lc = mn_session_read_loss(cpu), lg = mn_session_read_loss(gpu);
    double rel = fabs((double)lg - lc) / fmax(fabs((double)lc), 1e-30);
    cr_assert(rel <= tol, "step %d: loss cuda %.9g vs cpu %.9g (relative %.3g)", step, lg, lc, rel);
    worst = rel > worst ? rel : worst;
  }
  cr_log_info("largest relative loss difference over %d steps: %.3g", STEPS, worst);
  char when[32];
  snprintf(when, sizeof when, "after %d steps", STEPS);
  mn_test_assert_same_params(g, gpu, cpu, 10 * tol, when);
  mn_session_stats stats;
  mn_session_get_stats(gpu, &stats);
  cr_assert_eq(stats.graph_launches, (uint64_t)STEPS);
  mn_session_free(cpu);
  mn_session_free(gpu);
}

/* ---- MLP classifier, 64-128-128-10, batch 32, new batch every step */
enum { MLP_B = 32, MLP_IN = 64, MLP_H = 128, MLP_OUT = 10 };

static mn_graph *mlp(void) {
  mn_graph *g = mn_test_relu_mlp(MLP_B, MLP_IN, MLP_H, MLP_OUT);
  cr_assert_eq(mn_graph_status(g), MN_OK, "%s", mn_graph_error(g));
  return g;
}

static void feed_mlp(mn_session *s, int step) {
  mn_rng r = mn_rng_new(100 + (uint64_t)step);
  float x[MLP_B * MLP_IN];
  uint32_t labels[MLP_B];
  mn_rng_fill(&r, x, MLP_B * MLP_IN, -1, 1);
  mn_rng_fill_u32(&r, labels, MLP_B, MLP_OUT);
  cr_assert_eq(mn_session_set_input(s, "x", x, MLP_B * MLP_IN), MN_OK);
  cr_assert_eq(mn_session_set_input_u32(s, "labels", labels, MLP_B), MN_OK);
}

static void sgd(mn_session *s) { cr_assert_eq(mn_session_set_learning_rate(s, 0.05f), MN_OK); }
/* Clipping rewrites the gradients the update reads, four at a time where aligned. */
static void sgd_clip(mn_session *s) {
  sgd(s);
  cr_assert_eq(mn_session_set_grad_clip(s, 0.5f), MN_OK);
}
static void adamw_clip(mn_session *s) {
  cr_assert_eq(mn_session_set_adamw(s, 3e-3f, 0.9f, 0.999f, 1e-8f, 0.01f), MN_OK);
  cr_assert_eq(mn_session_set_grad_clip(s, 0.5f), MN_OK);
}
/* Three steps per update: the sum, the mean and the gated update run inside the step graph. */
static void adamw_clip_accumulate(mn_session *s) {
  adamw_clip(s);
  cr_assert_eq(mn_session_set_grad_accumulation(s, 3), MN_OK);
}

Test(cuda_models, mlp_sgd_matches_the_reference_for_20_steps) {
  mn_graph *g = mlp();
  compare_training(g, sgd, feed_mlp, 1e-5);
  mn_graph_free(g);
}

Test(cuda_models, mlp_sgd_with_clipping_matches_the_reference_for_20_steps) {
  mn_graph *g = mlp();
  compare_training(g, sgd_clip, feed_mlp, 1e-5);
  mn_graph_free(g);
}

Test(cuda_models, mlp_adamw_with_clipping_and_gradient_accumulation_matches_the_reference) {
  mn_graph *g = mlp();
  compare_training(g, adamw_clip_accumulate, feed_mlp, 1e-5);
  mn_graph_free(g);
}

Test(cuda_models, mlp_adamw_with_clipping_matches_the_reference_for_20_steps) {
  mn_graph *g = mlp();
  compare_training(g, adamw_clip, feed_mlp, 1e-5);
  mn_graph_free(g);
}

/* ---- two pre-norm transformer blocks (RoPE, causal GQA 6/2, SwiGLU), tied LM head */
static mn_graph *transformer(void) {
  mn_graph *g = mn_test_two_block_lm();
  cr_assert_eq(mn_graph_status(g), MN_OK, "%s", mn_graph_error(g));
  return g;
}

enum { TB_BT = MN_TEST_TB_B * MN_TEST_TB_T };

/* The tokens of step `step` and, shifted by one, their labels; with `prompt`, the labels of each
 * sequence's first 5 + step % 7 positions are MN_IGNORE_LABEL (a prompt, as in instruction
 * tuning, whose tokens are read but not trained on). */
static void feed_token_batch(mn_session *s, int step, bool prompt) {
  mn_rng r = mn_rng_new(500 + (uint64_t)(step % 4));
  uint32_t tok[MN_TEST_TB_B * (MN_TEST_TB_T + 1)], in[TB_BT], lab[TB_BT];
  mn_rng_fill_u32(&r, tok, MN_TEST_TB_B * (MN_TEST_TB_T + 1), MN_TEST_TB_V);
  for (int b = 0; b < MN_TEST_TB_B; b++)
    for (int t = 0; t < MN_TEST_TB_T; t++) {
      in[b * MN_TEST_TB_T + t] = tok[b * (MN_TEST_TB_T + 1) + t];
      lab[b * MN_TEST_TB_T + t] =
          prompt && t < 5 + step % 7 ? MN_IGNORE_LABEL : tok[b * (MN_TEST_TB_T + 1) + t + 1];
    }
  cr_assert_eq(mn_session_set_input_u32(s, "tokens", in, TB_BT), MN_OK);
  cr_assert_eq(mn_session_set_input_u32(s, "labels", lab, TB_BT), MN_OK);
}

static void feed_tokens(mn_session *s, int step) { feed_token_batch(s, step, false); }
static void feed_prompted_tokens(mn_session *s, int step) { feed_token_batch(s, step, true); }

static void adamw(mn_session *s) {
  cr_assert_eq(mn_session_set_adamw(s, 2e-3f, 0.9f, 0.95f, 1e-8f, 0.1f), MN_OK);
  cr_assert_eq(mn_session_set_grad_clip(s, 1.0f), MN_OK);
}

Test(cuda_models, transformer_blocks_adamw_match_the_reference_for_20_steps) {
  mn_graph *g = transformer();
  compare_training(g, adamw, feed_tokens, 1e-4);
  mn_graph_free(g);
}

Test(cuda_models, transformer_blocks_with_ignored_prompt_labels_match_the_reference) {
  mn_graph *g = transformer();
  compare_training(g, adamw, feed_prompted_tokens, 1e-4);
  mn_graph_free(g);
}

/* The same model in bf16, whose plan computes the loss and its gradient in one pass
 * (optimizer/loss_grad.h), with the prompts' labels ignored: one step's loss within 2^-6 and
 * every parameter's gradient within MN_TEST_BF16_MODEL_TOL of the CPU emulation's. */
Test(cuda_models, bf16_transformer_gradients_with_ignored_prompt_labels_match_the_reference) {
  mn_test_require_cuda_build();
  mn_graph *g = transformer();
  mn_test_assert_compiles_precision(g, true, MN_PRECISION_BF16);
  mn_test_require_cuda_device();
  mn_session *cpu = mn_test_session_precision(g, MN_BACKEND_CPU, MN_PRECISION_BF16, true),
             *gpu = mn_test_session_precision(g, MN_BACKEND_CUDA, MN_PRECISION_BF16, true);
  size_t one_pass = 0;
  const mn_graph *pg = gpu->plan->graph;
  for (size_t i = 0; i < pg->num_nodes; i++)
    one_pass += pg->nodes[i].op == MN_OP_SPARSE_CROSS_ENTROPY_LOSS_GRAD;
  cr_assert_eq(one_pass, 1, "the bf16 plan has no one-pass loss gradient");
  init_params(g, (mn_session *[]){cpu, gpu}, 2);
  feed_prompted_tokens(cpu, 3);
  feed_prompted_tokens(gpu, 3);
  float lc = mn_test_step_loss(cpu), lg = mn_test_step_loss(gpu);
  double rel = fabs((double)lg - lc) / fabs((double)lc);
  cr_assert(rel <= 0x1p-6, "bf16 loss cuda %.7g vs cpu %.7g (relative %.3g)", lg, lc, rel);
  double worst = 0;
  for (size_t i = 0; i < g->num_nodes; i++) {
    const mn_node_rec *n = &g->nodes[i];
    if (n->op != MN_OP_PARAMETER) continue;
    size_t count = (size_t)mn_tensor_type_numel(&n->type);
    float *a = malloc(count * sizeof *a), *b = malloc(count * sizeof *b);
    cr_assert_eq(mn_session_read_grad(gpu, n->name, a, count), MN_OK, "%s", mn_last_error());
    cr_assert_eq(mn_session_read_grad(cpu, n->name, b, count), MN_OK, "%s", mn_last_error());
    double e = mn_test_rel_err(a, b, count);
    cr_assert_leq(e, MN_TEST_BF16_MODEL_TOL, "bf16 gradient of %s: relative error %.3g", n->name,
                  e);
    worst = e > worst ? e : worst;
    free(a);
    free(b);
  }
  cr_log_info("bf16, ignored prompt labels: loss relative %.3g, largest gradient error %.3g", rel,
              worst);
  mn_session_free(cpu);
  mn_session_free(gpu);
  mn_graph_free(g);
}

Test(cuda_models, transformer_training_graph_compiles_for_sm90) {
  mn_test_require_cuda_build();
  mn_graph *g = transformer();
  mn_test_assert_compiles(g, true);
  mn_graph_free(g);
}

/* ---- TF32: matmuls may round their operands to 10-bit mantissas. The documented level
 * (README, docs/performance.md) is a relative error of 2e-3 on single products and
 * their gradients, and 5e-3 on a 20-step loss trajectory. */
Test(cuda_models, tf32_matmuls_stay_within_the_documented_level) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(2, 33, 512));
  mn_node w = mn_parameter(g, "w", MN_SHAPE(512, 130));
  mn_node wt = mn_parameter(g, "wt", MN_SHAPE(96, 130));
  mn_node y = mn_matmul_bt(g, mn_matmul(g, x, w), wt);
  mn_node t = mn_input(g, "t", MN_SHAPE(2, 33, 96));
  mn_set_outputs(g, (mn_node[]){mn_mse_loss(g, y, t), y}, 2);
  mn_test_assert_compiles(g, true);
  double err = mn_test_compare_cuda_tf32(g, true, 2e-3, NULL, 31);
  cr_log_info("tf32 products and gradients: largest relative error %.3g", err);
  mn_graph_free(g);
}

/* fp32 and TF32 sessions pad wide unaligned logits as bf16 ones do (GPT-2's 50257): a
 * vocabulary of 4099 (rows of 16396 bytes) is stored at a pitch of 4160 values, and at 2 x 1024
 * tokens of width 256 the head products (4.3 GFLOP each) multiply zero-padded copies of the
 * weight in scratch. The loss and every gradient agree with the CPU: in fp32 at 1e-4, in TF32
 * within its documented level. */
Test(cuda_models, wide_unaligned_logits_are_padded_in_fp32_and_tf32) {
  mn_test_require_cuda_build();
  const mn_test_block_config cfg = MN_TEST_BLOCK_CONFIG(256, 4, 4, 64, 512);
  mn_graph *g = mn_test_lm(&cfg, 2, 1024, 4099, 1);
  cr_assert_eq(mn_graph_status(g), MN_OK, "%s", mn_graph_error(g));
#ifdef MN_WITH_CUDA
  mn_session_options o = mn_session_options_default();
  o.backend = MN_BACKEND_CUDA;
  mn_plan *p = NULL;
  cr_assert_eq(mn_lower_training("test", g, &o, &p), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_cu_size_plan(p), MN_OK, "%s", mn_last_error());
  int padded = 0;
  for (size_t b = 0; b < p->num_buffers; b++)
    if (p->buffers[b].pitch) {
      cr_assert_eq(p->buffers[b].pitch, 4160);
      cr_assert_geq(p->buffers[b].bytes, (size_t)2048 * 4160 * sizeof(float));
      padded++;
    }
  cr_assert_geq(padded, 1, "the logits are padded");
  mn_plan_free(p);
#endif
  mn_test_assert_compiles(g, true);
  mn_test_require_cuda_device();
  const mn_test_range ranges[] = {{"tokens", 0, 4099}, {"labels", 0, 4099}, {NULL, 0, 0}};
  double f32 = mn_test_compare_cuda(g, true, 1e-4, ranges, 5);
  double tf32 = mn_test_compare_cuda_tf32(g, true, 5e-3, ranges, 5);
  cr_log_info("largest norm-wise difference: fp32 %.3g, tf32 %.3g", f32, tf32);
  mn_graph_free(g);
}

static void sgd_tf32_trajectory(const mn_graph *g, double tol) {
  mn_test_require_cuda_device();
  mn_session *cpu = mn_test_session(g, MN_BACKEND_CPU, true);
  mn_session_options o = mn_session_options_default();
  o.backend = MN_BACKEND_CUDA;
  o.allow_tf32 = true;
  mn_session *gpu = NULL;
  cr_assert_eq(mn_build_session(g, &o, &gpu), MN_OK, "%s", mn_last_error());
  init_params(g, (mn_session *[]){cpu, gpu}, 2);
  sgd(cpu);
  sgd(gpu);
  for (int step = 0; step < STEPS; step++) {
    feed_mlp(cpu, step);
    feed_mlp(gpu, step);
    cr_assert_eq(mn_session_step(cpu), MN_OK);
    cr_assert_eq(mn_session_step(gpu), MN_OK);
    cr_assert_eq(mn_session_wait(cpu), MN_OK);
    cr_assert_eq(mn_session_wait(gpu), MN_OK);
    float lc = mn_session_read_loss(cpu), lg = mn_session_read_loss(gpu);
    double rel = fabs((double)lg - lc) / fabs((double)lc);
    cr_assert(rel <= tol, "tf32 step %d: loss %.9g vs %.9g (relative %.3g)", step, lg, lc, rel);
  }
  mn_session_free(cpu);
  mn_session_free(gpu);
}

Test(cuda_models, mlp_trained_with_tf32_follows_the_reference_within_the_documented_level) {
  mn_graph *g = mlp();
  sgd_tf32_trajectory(g, 5e-3);
  mn_graph_free(g);
}

/* ---- checkpoints on the GPU: 10 steps, save, 10 more; a fresh session that loads the
 * checkpoint and takes the same 10 steps must give bitwise the same losses and weights
 * (every kernel of this model is deterministic). */
static void train(mn_session *s, int first, int count, float *losses) {
  for (int i = 0; i < count; i++) {
    feed_mlp(s, first + i);
    cr_assert_eq(mn_session_step(s), MN_OK, "%s", mn_last_error());
    cr_assert_eq(mn_session_wait(s), MN_OK, "%s", mn_last_error());
    losses[i] = mn_session_read_loss(s);
  }
}

Test(cuda_models, checkpoint_resume_is_bitwise_exact_on_the_gpu) {
  mn_test_require_cuda_device();
  mn_graph *g = mlp();
  mn_session *a = mn_test_session(g, MN_BACKEND_CUDA, true),
             *b = mn_test_session(g, MN_BACKEND_CUDA, true);
  init_params(g, &a, 1);
  adamw_clip(a);
  float warm[10], after_a[10], after_b[10];
  train(a, 0, 10, warm);
  mn_tmp_dir t = mn_tmp_dir_make("mn_cuda_ckpt");
  const char *path = mn_tmp_path(&t, "ck.safetensors");
  cr_assert_eq(mn_session_save_checkpoint(a, path), MN_OK, "%s", mn_last_error());
  train(a, 10, 10, after_a);
  cr_assert_eq(mn_session_load_checkpoint(b, path), MN_OK, "%s", mn_last_error());
  train(b, 10, 10, after_b);
  cr_assert_eq(memcmp(after_a, after_b, sizeof after_a), 0, "losses after resume differ");
  mn_test_assert_same_params(g, a, b, 0, "after resume");
  mn_tmp_dir_remove(&t);
  mn_session_free(a);
  mn_session_free(b);
  mn_graph_free(g);
}

/* A bf16 MLP of products of a few GFLOP (cuda/matmul_tune.h times them at build). */
enum { TUNE_ROWS = 4096, TUNE_IN = 512, TUNE_HID = 1024 };

static mn_graph *tune_mlp(void) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(TUNE_ROWS, TUNE_IN));
  mn_node t = mn_input(g, "t", MN_SHAPE(TUNE_ROWS, TUNE_IN));
  mn_node h = mn_gelu(g, mn_matmul(g, x, mn_parameter(g, "w1", MN_SHAPE(TUNE_IN, TUNE_HID))));
  mn_node y = mn_matmul(g, h, mn_parameter(g, "w2", MN_SHAPE(TUNE_HID, TUNE_IN)));
  mn_set_outputs(g, (mn_node[]){mn_mse_loss(g, y, t)}, 1);
  cr_assert_eq(mn_graph_status(g), MN_OK, "%s", mn_graph_error(g));
  return g;
}

/* A bf16 session of g, MN_MATMUL_TUNE set to `tune` while it is built (NULL: unset). */
static mn_session *tune_session(const mn_graph *g, const char *tune) {
  if (tune) setenv("MN_MATMUL_TUNE", tune, 1);
  mn_session *s = mn_test_session_precision(g, MN_BACKEND_CUDA, MN_PRECISION_BF16, true);
  unsetenv("MN_MATMUL_TUNE");
  cr_assert_eq(mn_session_set_adamw(s, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f), MN_OK, "%s",
               mn_last_error());
  return s;
}

/* The same weights and data into every session, then three steps each. */
static void tune_train(const mn_graph *g, mn_session **s, int n) {
  init_params(g, s, (size_t)n);
  mn_rng r = mn_rng_new(5);
  size_t count = (size_t)TUNE_ROWS * TUNE_IN;
  float *xt = malloc(2 * count * sizeof *xt);
  cr_assert(xt);
  mn_rng_fill(&r, xt, 2 * count, -1.0f, 1.0f);
  for (int i = 0; i < n; i++) {
    cr_assert_eq(mn_session_set_input(s[i], "x", xt, count), MN_OK);
    cr_assert_eq(mn_session_set_input(s[i], "t", xt + count, count), MN_OK);
    for (int step = 0; step < 3; step++)
      mn_test_step_loss(s[i]);
  }
  free(xt);
}

/* Two sessions of one graph in one process run the same measured algorithms, so they train bit
 * for bit alike; against the heuristic's first choices (MN_MATMUL_TUNE=0: maybe other
 * algorithms, other summation orders) the weights stay within bf16's level. */
/* MN_MATMUL_TUNE picks which products are timed: 1 GFLOP and more by default, none with 0,
 * every one with all; other values keep the default. */
Test(cuda_models, the_tuning_switch_sets_the_smallest_timed_product) {
#ifdef MN_WITH_CUDA
  unsetenv("MN_MATMUL_TUNE");
  cr_assert_eq(mn_cu_tune_min_flops(), MN_TUNE_MIN_FLOPS);
  setenv("MN_MATMUL_TUNE", "0", 1);
  cr_assert(isinf(mn_cu_tune_min_flops()), "MN_MATMUL_TUNE=0 times nothing");
  setenv("MN_MATMUL_TUNE", "all", 1);
  cr_assert_eq(mn_cu_tune_min_flops(), 0.0);
  setenv("MN_MATMUL_TUNE", "1", 1);
  cr_assert_eq(mn_cu_tune_min_flops(), MN_TUNE_MIN_FLOPS);
  unsetenv("MN_MATMUL_TUNE");
#else
  cr_skip_test("built without the CUDA backend");
#endif
}

Test(cuda_models, timed_products_agree_with_each_other_and_with_the_heuristic) {
  mn_test_require_cuda_device();
  mn_tmp_dir dir = mn_tmp_dir_make("mn_tune_agree");
  setenv("MN_CACHE_DIR", dir.path, 1);
  mn_graph *g = tune_mlp();
  mn_session *s[3] = {tune_session(g, "0"), tune_session(g, NULL), tune_session(g, NULL)};
  tune_train(g, s, 3);
  mn_test_assert_same_params(g, s[1], s[2], 0.0, "two timed sessions, 3 steps");
  mn_test_assert_same_params(g, s[1], s[0], 0x1p-7, "timed against the heuristic, 3 steps");
  for (int i = 0; i < 3; i++)
    mn_session_free(s[i]);
  mn_graph_free(g);
  unsetenv("MN_CACHE_DIR");
  mn_tmp_dir_remove(&dir);
}

#ifdef MN_WITH_CUDA
/* The choices go to the cache folder's file (after malformed lines, which are passed over): a
 * process that has forgotten them reads them back and times nothing, and trains as the session
 * that timed them, bit for bit. Gradients read as
 * zeros before the first step although the timing runs wrote them. */
Test(cuda_models, timed_choices_are_read_back_from_the_cache_file) {
  mn_test_require_cuda_device();
  mn_tmp_dir dir = mn_tmp_dir_make("mn_tune_cache");
  setenv("MN_CACHE_DIR", dir.path, 1);
  /* Lines the reader must pass over: no tab, short and odd-length hex, not hex at all. */
  char junk[128];
  snprintf(junk, sizeof junk, "%s/matmul-tune-v1.txt", dir.path);
  FILE *f = fopen(junk, "w");
  cr_assert_not_null(f);
  fprintf(f, "no tab here\nkey\tabc\nkey\t%0127d\nkey\t%s\n", 0,
          "zz00000000000000000000000000000000000000000000000000000000000000000000000000000000000"
          "00000000000000000000000000000000000000000");
  fclose(f);
  mn_cu_tune_forget();
  mn_graph *g = tune_mlp();
  size_t before = mn_cu_tune_timings();
  mn_session *s[2] = {tune_session(g, NULL), NULL};
  cr_assert_gt(mn_cu_tune_timings(), before, "nothing was timed");
  float *grad = malloc((size_t)TUNE_IN * TUNE_HID * sizeof *grad);
  cr_assert(grad);
  cr_assert_eq(mn_session_read_grad(s[0], "w1", grad, (size_t)TUNE_IN * TUNE_HID), MN_OK, "%s",
               mn_last_error());
  for (size_t i = 0; i < (size_t)TUNE_IN * TUNE_HID; i++)
    cr_assert_eq(grad[i], 0.0f, "w1's gradient before the first step: %g at %zu", grad[i], i);
  free(grad);
  mn_cu_tune_forget();
  before = mn_cu_tune_timings();
  s[1] = tune_session(g, NULL);
  cr_assert_eq(mn_cu_tune_timings(), before, "the second build timed again");
  tune_train(g, s, 2);
  mn_test_assert_same_params(g, s[0], s[1], 0.0, "a timed session and one read from the file");
  for (int i = 0; i < 2; i++)
    mn_session_free(s[i]);
  mn_graph_free(g);
  unsetenv("MN_CACHE_DIR");
  mn_tmp_dir_remove(&dir);
}
#endif
