/* Mixed precision on the CPU backend: the rounding to bf16 / fp16, the storage table the plan
 * chooses, and sessions that store low-precision values as the CUDA backend will (bounds from
 * docs/precision.md). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "host/pointwise.h"
#include "host/storage.h"
#include "io/plan_cache.h"
#include "io/safetensors.h"
#include "session/session.h"
#include "tests/support/mn_test.h"
#include "tests/support/precision_check.h"
#include "tests/support/session_util.h"
#include "tests/support/tmp_dir.h"

/* bf16 keeps 8 significant bits: a value rounded once to nearest is within half an ulp, a
 * relative 2^-8 of where it was. */
#define BF16_U 0x1p-8

static mn_session_options cpu_options(mn_precision prec) {
  mn_session_options o = mn_session_options_default();
  o.backend = MN_BACKEND_CPU;
  o.precision = prec;
  return o;
}

static float from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

Test(precision, bf16_rounds_to_nearest_even) {
  cr_expect_eq(mn_storage_round(MN_BF16, 1.0f + 0x1p-8f), 1.0f, "a tie goes to the even 1.0");
  cr_expect_eq(mn_storage_round(MN_BF16, 1.0f + 3 * 0x1p-8f), 1.0f + 0x1p-6f,
               "a tie goes to the even neighbour above");
  cr_expect_eq(mn_storage_round(MN_BF16, 1.0f + 0x1p-8f + 0x1p-20f), 1.0f + 0x1p-7f);
  cr_expect_eq(mn_storage_round(MN_BF16, -3.0f), -3.0f);
  cr_expect(isinf(mn_storage_round(MN_BF16, from_bits(0x7f7fffffu))),
            "past the largest bf16 rounds to infinity");
  cr_expect(isnan(mn_storage_round(MN_BF16, NAN)));
  cr_expect_eq(mn_storage_round(MN_F32, 1.0f + 0x1p-20f), 1.0f + 0x1p-20f, "fp32 is unchanged");
}

Test(precision, f16_rounds_to_nearest_even_with_subnormals_and_overflow) {
  cr_expect_eq(mn_storage_round(MN_F16, 1.0f + 0x1p-11f), 1.0f, "a tie goes to the even 1.0");
  cr_expect_eq(mn_storage_round(MN_F16, 1.0f + 3 * 0x1p-11f), 1.0f + 0x1p-9f);
  cr_expect_eq(mn_storage_round(MN_F16, 65504.0f), 65504.0f);
  cr_expect_eq(mn_storage_round(MN_F16, 65519.0f), 65504.0f);
  cr_expect(isinf(mn_storage_round(MN_F16, 65520.0f)), "the tie with 65536 overflows");
  cr_expect_eq(mn_storage_round(MN_F16, 0x1p-25f), 0.0f, "half the smallest subnormal: to 0");
  cr_expect_eq(mn_storage_round(MN_F16, 3 * 0x1p-25f), 0x1p-23f);
  cr_expect_eq(mn_storage_round(MN_F16, -5 * 0x1p-24f), -5 * 0x1p-24f, "subnormals are exact");
  cr_expect(isnan(mn_storage_round(MN_F16, NAN)));
}

/* The 16-bit patterns a 2-byte buffer holds (what the CUDA backend reads and writes through the
 * API): each is the rounded value's encoding, and decodes back to it. */
Test(precision, storage_bits_encode_the_rounded_value) {
  cr_expect_eq(mn_storage_bits(MN_BF16, 1.0f), 0x3f80u);
  cr_expect_eq(mn_storage_bits(MN_BF16, -2.0f), 0xc000u);
  cr_expect_eq(mn_storage_bits(MN_F16, 1.0f), 0x3c00u);
  cr_expect_eq(mn_storage_bits(MN_F16, -2.0f), 0xc000u);
  cr_expect_eq(mn_storage_bits(MN_F16, 65504.0f), 0x7bffu, "the largest finite fp16");
  cr_expect_eq(mn_storage_bits(MN_F16, 65520.0f), 0x7c00u, "overflow is infinity");
  cr_expect_eq(mn_storage_bits(MN_F16, 0x1p-24f), 0x0001u, "the smallest subnormal");
  cr_expect_eq(mn_storage_bits(MN_F16, 0x1p-14f), 0x0400u, "the smallest normal");
  cr_expect_eq(mn_storage_bits(MN_F16, 1.0f + 0x1p-11f), 0x3c00u, "a tie goes to the even 1.0");
  cr_expect(isnan(mn_storage_value(MN_F16, mn_storage_bits(MN_F16, NAN))));
  cr_expect(isnan(mn_storage_value(MN_BF16, mn_storage_bits(MN_BF16, NAN))));
  mn_rng r = mn_rng_new(7);
  for (int i = 0; i < 4000; i++) {
    float x = (float)(mn_rng_uniform(&r) * 2.0 - 1.0) * ldexpf(1.0f, (int)(i % 60) - 40);
    for (int k = 0; k < 2; k++) {
      mn_dtype dt = k ? MN_F16 : MN_BF16;
      float want = mn_storage_round(dt, x);
      float got = mn_storage_value(dt, mn_storage_bits(dt, x));
      cr_assert(got == want || (isinf(got) && isinf(want) && got == want),
                "%s: %.9g encodes to %.9g, rounds to %.9g", k ? "f16" : "bf16", (double)x,
                (double)got, (double)want);
    }
  }
}

Test(precision, the_plan_stores_activations_low_and_keeps_the_rest_fp32) {
  mn_graph *g = mn_pc_mlp();
  mn_session_options o = cpu_options(MN_PRECISION_BF16);
  mn_plan *p = NULL;
  cr_assert_eq(mn_lower_training("test", g, &o, &p), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_plan_set_precision(p, MN_PRECISION_BF16), MN_OK);
  size_t low = 0;
  for (size_t b = 0; b < p->num_buffers; b++) {
    const mn_buffer_desc *d = &p->buffers[b];
    const mn_node_rec *n = &p->graph->nodes[d->node];
    bool fp32 = d->role == MN_BUF_INPUT || d->role == MN_BUF_PARAMETER ||
                d->role == MN_BUF_CONSTANT || d->role == MN_BUF_GRADIENT ||
                (mn_op_flags(n->op) & MN_OPF_LOSS) || mn_tensor_type_numel(&n->type) == 1;
    if (fp32)
      cr_expect_eq(d->storage, MN_F32, "%s (node %u) must stay fp32", mn_op_name(n->op), d->node);
    low += d->storage == MN_BF16;
  }
  /* The ReLU's input gradient has no buffer of its own since matmul_drelu gates the product
   * that makes it. */
  cr_expect_geq(low, 5, "the activations and their gradients are bf16 (%zu buffers)", low);
  cr_assert_eq(mn_plan_set_precision(p, MN_PRECISION_F32), MN_OK);
  for (size_t b = 0; b < p->num_buffers; b++)
    cr_expect_eq(p->buffers[b].storage, MN_F32);
  mn_plan_free(p);
  mn_graph_free(g);
}

/* A backend that stores low-precision values in 2 bytes sizes those buffers at 2 bytes a value
 * (and padded rows by their pitch) and plans again: the arena shrinks, fp32 buffers keep
 * their size. */
Test(precision, narrow_storage_halves_the_low_precision_buffers) {
  mn_graph *g = mn_pc_mlp();
  mn_session_options o = cpu_options(MN_PRECISION_BF16);
  mn_plan *p = NULL;
  cr_assert_eq(mn_lower_training("test", g, &o, &p), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_plan_set_precision(p, MN_PRECISION_BF16), MN_OK);
  size_t before = p->arena_bytes, padded = SIZE_MAX;
  for (size_t b = 0; b < p->num_buffers && padded == SIZE_MAX; b++) {
    const mn_tensor_type *t = &p->graph->nodes[p->buffers[b].node].type;
    if (p->buffers[b].storage == MN_BF16 && t->rank == 2) padded = b;
  }
  cr_assert_neq(padded, SIZE_MAX, "a two-dimensional bf16 buffer");
  p->buffers[padded].pitch = 64;
  cr_assert_eq(mn_plan_store_narrow(p), MN_OK, "%s", mn_last_error());
  for (size_t b = 0; b < p->num_buffers; b++) {
    const mn_buffer_desc *d = &p->buffers[b];
    const mn_tensor_type *t = &p->graph->nodes[d->node].type;
    size_t n = (size_t)mn_tensor_type_numel(t);
    if (b == padded)
      cr_expect_eq(d->bytes, n / (size_t)t->shape[1] * 64 * 2, "rows of 64 values, 2 bytes each");
    else if (d->storage == MN_BF16)
      cr_expect_eq(d->bytes, n * 2);
    else
      cr_expect_eq(d->bytes, mn_tensor_type_bytes(t));
  }
  cr_expect_lt(p->arena_bytes, before, "arena %zu, was %zu", p->arena_bytes, before);
  mn_plan_free(p);
  mn_graph_free(g);
}

Test(precision, an_unknown_precision_builds_nothing) {
  mn_graph *g = mn_pc_mlp();
  mn_session_options o = cpu_options((mn_precision)7);
  mn_session *s = NULL;
  cr_assert_eq(mn_build_session(g, &o, &s), MN_ERR_INVALID_ARGUMENT);
  cr_expect_null(s);
  cr_expect(strstr(mn_last_error(), "precision") != NULL, "%s", mn_last_error());
  cr_assert_eq(mn_build_inference_session(g, &o, &s), MN_ERR_INVALID_ARGUMENT);
  cr_expect_null(s);
  mn_graph_free(g);
}

static mn_session *build(const mn_graph *g, mn_precision prec, bool training) {
  return mn_test_session_precision(g, MN_BACKEND_CPU, prec, training);
}

/* Every pointwise op of one fp32 input: the op computes in fp32 and stores once, so the bf16
 * and f16 values are the fp32 value rounded, within half an ulp. */
Test(precision, every_unary_pointwise_op_is_its_fp32_value_rounded_once) {
  static mn_node (*const ops[])(mn_graph *, mn_node) = {
      mn_relu, mn_sigmoid, mn_tanh, mn_neg, mn_abs, mn_log, mn_exp, mn_recip, mn_silu, mn_gelu};
  enum { N = 64 };
  float x[N], want[N], got[N];
  mn_rng r = mn_rng_new(5);
  mn_rng_fill(&r, x, N, 0.05f, 3.0f);
  for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
    mn_graph *g = mn_graph_new();
    mn_node y = ops[i](g, mn_input(g, "x", MN_SHAPE(N)));
    mn_set_outputs(g, &y, 1);
    mn_session *f32 = build(g, MN_PRECISION_F32, false);
    cr_assert_eq(mn_session_set_input(f32, "x", x, N), MN_OK);
    cr_assert_eq(mn_session_step(f32), MN_OK);
    cr_assert_eq(mn_session_wait(f32), MN_OK);
    cr_assert_eq(mn_session_read_output_by_index(f32, 0, want, N), MN_OK);
    for (int prec = MN_PRECISION_BF16; prec <= MN_PRECISION_F16; prec++) {
      mn_session *low = build(g, (mn_precision)prec, false);
      cr_assert_eq(mn_session_set_input(low, "x", x, N), MN_OK);
      cr_assert_eq(mn_session_step(low), MN_OK);
      cr_assert_eq(mn_session_wait(low), MN_OK);
      cr_assert_eq(mn_session_read_output_by_index(low, 0, got, N), MN_OK);
      mn_dtype dt = prec == MN_PRECISION_BF16 ? MN_BF16 : MN_F16;
      for (int k = 0; k < N; k++)
        cr_expect_eq(got[k], mn_storage_round(dt, want[k]), "op %zu, %s, x = %g: %g, not %g", i,
                     prec == MN_PRECISION_BF16 ? "bf16" : "f16", x[k], got[k],
                     mn_storage_round(dt, want[k]));
      mn_session_free(low);
    }
    mn_session_free(f32);
    mn_graph_free(g);
  }
}

Test(precision, outputs_read_back_exactly_as_stored) {
  mn_graph *g = mn_pc_mlp();
  mn_session *s = build(g, MN_PRECISION_BF16, true);
  mn_pc_fill_mlp(&s, 1, g, false);
  mn_test_step_loss(s);
  float y[16 * 4];
  cr_assert_eq(mn_session_read_output_by_index(s, 1, y, 16 * 4), MN_OK);
  for (int i = 0; i < 16 * 4; i++)
    cr_expect_eq(y[i], mn_storage_round(MN_BF16, y[i]), "y[%d] = %.9g is no bf16 value", i, y[i]);
  mn_session_free(s);
  mn_graph_free(g);
}

/* An update far below a bf16 ulp of the weight still moves the fp32 master weight. */
Test(precision, master_weights_take_updates_smaller_than_a_bf16_ulp) {
  mn_graph *g = mn_pc_mlp();
  mn_session *s = build(g, MN_PRECISION_BF16, true);
  mn_pc_fill_mlp(&s, 1, g, false);
  float ones[8 * 32];
  for (int i = 0; i < 8 * 32; i++)
    ones[i] = 1.0f;
  cr_assert_eq(mn_session_set_parameter(s, "w1", ones, 8 * 32), MN_OK);
  cr_assert_eq(mn_session_set_learning_rate(s, 1e-6f), MN_OK);
  mn_test_step_loss(s);
  float after[8 * 32];
  cr_assert_eq(mn_session_read_param(s, "w1", after, 8 * 32), MN_OK);
  size_t moved = 0;
  for (int i = 0; i < 8 * 32; i++) {
    moved += after[i] != 1.0f;
    cr_expect_lt(fabsf(after[i] - 1.0f), 0x1p-9f, "w1[%d] moved %g", i, after[i] - 1.0f);
  }
  cr_expect_gt(moved, 0, "no weight moved: the update was lost to bf16 rounding");
  mn_session_free(s);
  mn_graph_free(g);
}

/* 40 AdamW steps from the same start: the bf16 and f16 runs converge as the fp32 one does. */
Test(precision, adamw_training_converges_like_fp32) {
  mn_graph *g = mn_pc_mlp();
  mn_session *s[3] = {build(g, MN_PRECISION_F32, true), build(g, MN_PRECISION_BF16, true),
                      build(g, MN_PRECISION_F16, true)};
  mn_pc_fill_mlp(s, 3, g, false);
  float first[3], last[3];
  for (int k = 0; k < 3; k++) {
    cr_assert_eq(mn_session_set_adamw(s[k], 1e-2f, 0.9f, 0.999f, 1e-8f, 0.01f), MN_OK);
    for (int i = 0; i < 40; i++) {
      float l = mn_test_step_loss(s[k]);
      if (i == 0) first[k] = l;
      last[k] = l;
    }
  }
  for (int k = 1; k < 3; k++) {
    cr_expect_lt(fabsf(first[k] - first[0]), 0.02f * first[0], "step 1: %g vs fp32 %g", first[k],
                 first[0]);
    cr_expect_lt(last[k], 0.5f * first[k], "%s did not learn: %g -> %g", k == 1 ? "bf16" : "f16",
                 first[k], last[k]);
    cr_expect_lt(fabsf(last[k] - last[0]), 0.05f * first[0] + 0.1f * last[0],
                 "step 40: %g vs fp32 %g", last[k], last[0]);
  }
  for (int k = 0; k < 3; k++)
    mn_session_free(s[k]);
  mn_graph_free(g);
}

typedef mn_node (*binary_fn)(mn_graph *, mn_node, mn_node);

/* y = f(a, b) of one fp32 session and of a low-precision one on the same data. */
static void run_binary(binary_fn f, mn_precision prec, const float *a, const float *b, float *y,
                       int n) {
  mn_graph *g = mn_graph_new();
  mn_node out = f(g, mn_input(g, "a", MN_SHAPE(n)), mn_input(g, "b", MN_SHAPE(n)));
  mn_set_outputs(g, &out, 1);
  mn_session *s = build(g, prec, false);
  cr_assert_eq(mn_session_set_input(s, "a", a, (size_t)n), MN_OK);
  cr_assert_eq(mn_session_set_input(s, "b", b, (size_t)n), MN_OK);
  cr_assert_eq(mn_session_step(s), MN_OK);
  cr_assert_eq(mn_session_wait(s), MN_OK);
  cr_assert_eq(mn_session_read_output_by_index(s, 0, y, (size_t)n), MN_OK);
  mn_session_free(s);
  mn_graph_free(g);
}

Test(precision, every_binary_pointwise_op_is_its_fp32_value_rounded_once) {
  static const binary_fn ops[] = {mn_add, mn_mul, mn_div, mn_greater, mn_swiglu};
  enum { N = 48 };
  float a[N], b[N], want[N], got[N];
  mn_rng r = mn_rng_new(8);
  mn_rng_fill(&r, a, N, -2, 2);
  mn_rng_fill(&r, b, N, 0.25f, 2);
  for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
    run_binary(ops[i], MN_PRECISION_F32, a, b, want, N);
    run_binary(ops[i], MN_PRECISION_BF16, a, b, got, N);
    for (int k = 0; k < N; k++)
      cr_expect_eq(got[k], mn_storage_round(MN_BF16, want[k]), "op %zu at %d: %g, not %g", i, k,
                   got[k], mn_storage_round(MN_BF16, want[k]));
  }
}

/* A product reads both operands rounded: per element the error stays within
 * u |c| + (2u + u^2) sum_k |a_ik b_kj| (docs/precision.md), and the bound is not slack: the
 * operands' rounding does show. */
Test(precision, products_stay_within_the_operand_rounding_bound) {
  enum { M = 12, K = 40, N = 9 };
  mn_graph *g = mn_graph_new();
  mn_node c = mn_matmul(g, mn_input(g, "a", MN_SHAPE(M, K)), mn_parameter(g, "w", MN_SHAPE(K, N)));
  mn_set_outputs(g, &c, 1);
  float a[M * K], w[K * N], want[M * N], got[M * N];
  mn_rng r = mn_rng_new(21);
  mn_rng_fill(&r, a, M * K, -1, 1);
  mn_rng_fill(&r, w, K * N, -1, 1);
  mn_session *s[2] = {build(g, MN_PRECISION_F32, false), build(g, MN_PRECISION_BF16, false)};
  float *out[2] = {want, got};
  for (int k = 0; k < 2; k++) {
    cr_assert_eq(mn_session_set_input(s[k], "a", a, M * K), MN_OK);
    cr_assert_eq(mn_session_set_parameter(s[k], "w", w, K * N), MN_OK);
    cr_assert_eq(mn_session_step(s[k]), MN_OK);
    cr_assert_eq(mn_session_wait(s[k]), MN_OK);
    cr_assert_eq(mn_session_read_output_by_index(s[k], 0, out[k], M * N), MN_OK);
    mn_session_free(s[k]);
  }
  double worst = 0;
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) {
      double mag = 0;
      for (int p = 0; p < K; p++)
        mag += fabs((double)a[i * K + p] * w[p * N + j]);
      double err = fabs((double)got[i * N + j] - want[i * N + j]);
      double bound = BF16_U * fabs(want[i * N + j]) + (2 * BF16_U + BF16_U * BF16_U) * mag;
      cr_expect_leq(err, bound, "c[%d][%d]: error %g above %g", i, j, err, bound);
      if (err / bound > worst) worst = err / bound;
    }
  cr_expect_gt(worst, 0.01, "the bf16 product matches fp32 too well: operands not rounded?");
  mn_graph_free(g);
}

/* A bf16 run saved and resumed continues exactly as the run that did not stop. */
Test(precision, resuming_a_bf16_run_from_a_checkpoint_is_bitwise_exact) {
  mn_tmp_dir t = mn_tmp_dir_make("mn_precision");
  const char *path = mn_tmp_path(&t, "ck.safetensors");
  mn_graph *g = mn_pc_mlp();
  mn_session *a = build(g, MN_PRECISION_BF16, true), *b = build(g, MN_PRECISION_BF16, true);
  mn_session *both[2] = {a, b};
  mn_pc_fill_mlp(both, 2, g, false);
  cr_assert_eq(mn_session_set_adamw(a, 1e-2f, 0.9f, 0.999f, 1e-8f, 0.01f), MN_OK);
  for (int i = 0; i < 5; i++)
    mn_test_step_loss(a);
  cr_assert_eq(mn_session_save_checkpoint(a, path), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_load_checkpoint(b, path), MN_OK, "%s", mn_last_error());
  for (int i = 0; i < 5; i++) {
    float la = mn_test_step_loss(a), lb = mn_test_step_loss(b);
    cr_expect_eq(la, lb, "step %d after resuming: %.9g vs %.9g", i, lb, la);
  }
  mn_test_assert_same_params(g, a, b, 0, "after resuming a bf16 run");
  mn_session_free(a);
  mn_session_free(b);
  mn_graph_free(g);
  mn_tmp_dir_remove(&t);
}

static mn_session_stats stats_of(const mn_session *s) {
  mn_session_stats st;
  cr_assert_eq(mn_session_get_stats(s, &st), MN_OK);
  return st;
}

/* F16: targets far from the predictions give gradients that overflow fp16 once multiplied by
 * the initial scale; such a step updates nothing and halves the scale, and once the scale is
 * small enough the steps update again. */
Test(precision, f16_loss_scaling_skips_overflowing_steps_and_leaves_parameters_alone) {
  mn_graph *g = mn_pc_mlp();
  mn_session *s = build(g, MN_PRECISION_F16, true);
  mn_pc_fill_mlp(&s, 1, g, false);
  float t[16 * 4];
  for (int i = 0; i < 16 * 4; i++)
    t[i] = 3000.0f;
  cr_assert_eq(mn_session_set_input(s, "t", t, 16 * 4), MN_OK);
  cr_assert_eq(mn_session_set_learning_rate(s, 1e-9f), MN_OK);
  cr_expect_eq(stats_of(s).loss_scale, 65536.0f);
  float *before = mn_test_read_params(g, s);
  float loss = mn_test_step_loss(s);
  cr_expect(isfinite(loss), "the loss is computed before the scale: %g", loss);
  mn_session_stats st = stats_of(s);
  cr_expect_eq(st.skipped_steps, 1);
  cr_expect_eq(st.loss_scale, 32768.0f);
  float *same = mn_test_read_params(g, s);
  cr_expect(memcmp(before, same, mn_test_param_count(g) * sizeof(float)) == 0,
            "an overflowing step changed the parameters");
  int steps = 1;
  while (stats_of(s).skipped_steps == (uint64_t)steps && steps < 30) {
    mn_test_step_loss(s);
    steps++;
  }
  st = stats_of(s);
  cr_expect_lt(st.skipped_steps, (uint64_t)steps, "every step overflowed");
  cr_expect_lt(st.loss_scale, 65536.0f / 4);
  float *after = mn_test_read_params(g, s);
  cr_expect(memcmp(before, after, mn_test_param_count(g) * sizeof(float)) != 0,
            "the first finite step updated nothing");
  float grad[4];
  cr_assert_eq(mn_session_read_grad(s, "b2", grad, 4), MN_OK);
  for (int i = 0; i < 4; i++)
    cr_expect(fabsf(grad[i]) < 1e4f && fabsf(grad[i]) > 1.0f, "b2's gradient is read unscaled: %g",
              grad[i]);
  free(before), free(same), free(after);
  mn_session_free(s);
  mn_graph_free(g);
}

Test(precision, only_f16_training_sessions_scale_the_loss) {
  mn_graph *g = mn_pc_mlp();
  for (int prec = MN_PRECISION_F32; prec <= MN_PRECISION_BF16; prec++) {
    mn_session *s = build(g, (mn_precision)prec, true);
    cr_expect_eq(stats_of(s).loss_scale, 0.0f);
    cr_expect_null(s->plan->loss_scale == MN_NO_NODE ? NULL : s, "precision %d", prec);
    mn_session_free(s);
  }
  mn_session *inf = build(g, MN_PRECISION_F16, false);
  cr_expect_eq(stats_of(inf).loss_scale, 0.0f, "inference has no loss to scale");
  mn_session_free(inf);
  mn_graph_free(g);
}

/* The loss-scale input is the library's: an F16 plan goes through the plan cache with it, and
 * a cache written for another precision is stale. */
Test(precision, an_f16_plan_goes_through_the_plan_cache) {
  mn_graph *g = mn_pc_mlp();
  mn_session_options o = cpu_options(MN_PRECISION_F16);
  mn_plan *p = NULL, *back = NULL;
  cr_assert_eq(mn_lower_training("test", g, &o, &p), MN_OK, "%s", mn_last_error());
  cr_assert_neq(p->loss_scale, MN_NO_NODE);
  char *json = NULL, why[256];
  cr_assert_eq(mn_plan_cache_serialize(p, g, &o, &json), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_plan_cache_parse(json, strlen(json), g, &o, MN_PLAN_CACHE_VERIFY_CHECKSUM, &back,
                                   why, sizeof why),
               MN_OK, "%s", why);
  cr_expect_neq(back->loss_scale, MN_NO_NODE);
  mn_plan_free(back);
  mn_session_options bf16 = cpu_options(MN_PRECISION_BF16);
  cr_expect_eq(mn_plan_cache_parse(json, strlen(json), g, &bf16, MN_PLAN_CACHE_VERIFY_CHECKSUM,
                                   &back, why, sizeof why),
               MN_ERR_STATE, "a cache of another precision is stale");
  cr_expect_null(back);
  free(json);
  mn_plan_free(p);
  mn_graph_free(g);
}

/* The loss-scale input is the library's: a user leaf may not take its name (or any name the
 * library keeps, starting with '#'), so an F32 session is never scaled by accident. */
Test(precision, names_the_library_keeps_are_refused) {
  mn_graph *g = mn_graph_new();
  cr_expect_eq(mn_input(g, "#loss_scale", MN_SHAPE(1)), MN_NO_NODE);
  cr_expect_eq(mn_graph_status(g), MN_ERR_INVALID_ARGUMENT);
  cr_expect(strstr(mn_graph_error(g), "starts with '#'") != NULL, "%s", mn_graph_error(g));
  mn_graph_free(g);
  g = mn_graph_new();
  cr_expect_eq(mn_parameter(g, "#siblings(a,b)", MN_SHAPE(2)), MN_NO_NODE);
  mn_graph_free(g);
}

/* An F16 run resumed from its checkpoint keeps the loss scale it had reached, so it skips the
 * steps the run that did not stop would skip. */
Test(precision, an_f16_checkpoint_keeps_the_loss_scale) {
  mn_tmp_dir t = mn_tmp_dir_make("mn_precision");
  const char *path = mn_tmp_path(&t, "ck.safetensors");
  mn_graph *g = mn_pc_mlp();
  mn_session *a = build(g, MN_PRECISION_F16, true), *b = build(g, MN_PRECISION_F16, true);
  mn_session *both[2] = {a, b};
  mn_pc_fill_mlp(both, 2, g, false);
  float t_big[16 * 4];
  for (int i = 0; i < 16 * 4; i++)
    t_big[i] = 3000.0f;
  cr_assert_eq(mn_session_set_input(a, "t", t_big, 16 * 4), MN_OK);
  cr_assert_eq(mn_session_set_learning_rate(a, 1e-9f), MN_OK);
  for (int i = 0; i < 3; i++)
    mn_test_step_loss(a);
  mn_session_stats sa = stats_of(a);
  cr_assert_lt(sa.loss_scale, 65536.0f, "the scale never fell");
  cr_assert_eq(mn_session_save_checkpoint(a, path), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_load_checkpoint(b, path), MN_OK, "%s", mn_last_error());
  mn_session_stats sb = stats_of(b);
  cr_expect_eq(sb.loss_scale, sa.loss_scale);
  cr_expect_eq(sb.skipped_steps, sa.skipped_steps);
  mn_session_free(a);
  mn_session_free(b);
  mn_graph_free(g);
  mn_tmp_dir_remove(&t);
}

/* Weights files are fp32 or converted exactly: a bf16 file (as HF checkpoints come) loads into
 * a bf16 session bit for bit, and an fp32 checkpoint loads into a session of any precision. */
Test(precision, weights_load_exactly_into_any_precision) {
  mn_tmp_dir t = mn_tmp_dir_make("mn_precision");
  const char *bf16_path = mn_tmp_path(&t, "bf16.safetensors");
  static const char *const names[] = {"w1", "b1", "w2", "b2"};
  static const int64_t shapes[][2] = {{8, 32}, {32, 0}, {32, 4}, {4, 0}};
  enum { MAX = 8 * 32 };
  float want[4][MAX];
  uint16_t bits[4][MAX];
  mn_st_tensor tensors[4];
  mn_rng r = mn_rng_new(77);
  for (int k = 0; k < 4; k++) {
    size_t n = (size_t)shapes[k][0] * (size_t)(shapes[k][1] ? shapes[k][1] : 1);
    for (size_t i = 0; i < n; i++) {
      float v = mn_storage_round(MN_BF16, (float)mn_rng_normal(&r));
      uint32_t u;
      memcpy(&u, &v, sizeof u);
      want[k][i] = v;
      bits[k][i] = (uint16_t)(u >> 16);
    }
    tensors[k] = (mn_st_tensor){.name = names[k],
                                .dtype = "BF16",
                                .rank = shapes[k][1] ? 2 : 1,
                                .shape = {shapes[k][0], shapes[k][1]},
                                .data = bits[k],
                                .bytes = n * sizeof(uint16_t)};
  }
  cr_assert_eq(mn_safetensors_write(bf16_path, tensors, 4, NULL, 0), MN_OK, "%s", mn_last_error());
  mn_graph *g = mn_pc_mlp();
  mn_session *low = build(g, MN_PRECISION_BF16, true);
  cr_assert_eq(mn_session_load_safetensors(low, bf16_path, true), MN_OK, "%s", mn_last_error());
  float got[MAX];
  for (int k = 0; k < 4; k++) {
    size_t n = (size_t)shapes[k][0] * (size_t)(shapes[k][1] ? shapes[k][1] : 1);
    cr_assert_eq(mn_session_read_param(low, names[k], got, n), MN_OK);
    cr_expect(memcmp(got, want[k], n * sizeof(float)) == 0, "%s changed on loading", names[k]);
  }
  /* An fp32 checkpoint of an fp32 run into the bf16 session: the master weights are exact. */
  const char *ck = mn_tmp_path(&t, "ck.safetensors");
  mn_session *f32 = build(g, MN_PRECISION_F32, true);
  mn_pc_fill_mlp(&f32, 1, g, false);
  cr_assert_eq(mn_session_set_learning_rate(f32, 1e-2f), MN_OK);
  mn_test_step_loss(f32);
  cr_assert_eq(mn_session_save_checkpoint(f32, ck), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_load_checkpoint(low, ck), MN_OK, "%s", mn_last_error());
  mn_test_assert_same_params(g, low, f32, 0, "after loading an fp32 checkpoint into bf16");
  mn_session_free(low);
  mn_session_free(f32);
  mn_graph_free(g);
  mn_tmp_dir_remove(&t);
}
