/* llama_decode_layer on the CPU (host/decode_layer.h): the op gives the values of the ops it
 * replaces, over several steps that each append a row to the caches and read it back; its
 * builder refuses what it cannot serve, and a position past the cache fails the step. */
#include <stdio.h>
#include <stdlib.h>

#include "host/decode_layer.h"
#include "tests/support/decode_layer_case.h"
#include "tests/support/mn_test.h"

static double fused_vs_unfused(const mn_test_dl_case *c, mn_precision prec, int steps) {
  size_t n = (size_t)(steps * c->batch * c->dim);
  float *y[2];
  for (int fused = 0; fused < 2; fused++) {
    y[fused] = malloc(n * sizeof(float));
    cr_assert(y[fused]);
    mn_graph *g = mn_test_dl_graph(c, fused);
    mn_session_options o = mn_session_options_default();
    o.backend = MN_BACKEND_CPU;
    o.precision = prec;
    mn_test_dl_run(c, g, &o, steps, 77, y[fused]);
    mn_graph_free(g);
  }
  double err = mn_test_rel_err(y[1], y[0], n);
  free(y[0]);
  free(y[1]);
  return err;
}

/* GQA, batch 2, the cache half full; three steps, so the second and third read the rows that
 * the first and second wrote. */
Test(decode_layer, equals_the_unfused_layer_in_fp32) {
  const mn_test_dl_case cases[] = {
      MN_TEST_DL_SHAPE(2, 32, 4, 2, 8, 48, 16, 5),
      MN_TEST_DL_SHAPE(1, 24, 3, 3, 8, 20, 9, 0),
      MN_TEST_DL_SHAPE(3, 36, 6, 1, 6, 40, 12, 9),
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    double err = fused_vs_unfused(&cases[i], MN_PRECISION_F32, 3);
    cr_assert_leq(err, 1e-5, "case %zu: relative error %g", i, err);
  }
}

/* Quantized Linear weights (each format of host/quant.h): the op's products are the unfused
 * layer's mn_matmul_quant. */
Test(decode_layer, equals_the_unfused_quantized_layer) {
  const mn_quant formats[5] = {MN_QUANT_Q8_0, MN_QUANT_Q4_0, MN_QUANT_Q4_1, MN_QUANT_AFFINE_INT8,
                               MN_QUANT_AFFINE_INT4};
  const int groups[5] = {0, 0, 0, 32, 64};
  for (int i = 0; i < 5; i++) {
    mn_test_dl_case c = MN_TEST_DL_QUANT(2, 64, 4, 2, 16, 128, 16, 5, formats[i], groups[i]);
    double err = fused_vs_unfused(&c, MN_PRECISION_F32, 3);
    cr_assert_leq(err, 1e-5, "format %d: relative error %g", (int)formats[i], err);
  }
}

/* In bf16 the unfused layer rounds each intermediate to bf16 and the op does not: they agree to
 * a few bf16 units. */
Test(decode_layer, is_close_to_the_unfused_layer_in_bf16) {
  mn_test_dl_case c = MN_TEST_DL_SHAPE(2, 32, 4, 2, 8, 48, 16, 5);
  double err = fused_vs_unfused(&c, MN_PRECISION_BF16, 3);
  cr_assert_leq(err, 0x1p-5, "relative error %g", err);
  cr_assert_gt(err, 0, "bf16 and fp32 intermediates should differ somewhere");
}

/* A decode layer's graph with x [batch, rows, dim], q_proj [wq_rows, dim], `heads` query heads
 * of 8 over 2 kv heads and RoPE base theta; every other shape consistent. */
typedef struct builder_case {
  int64_t batch, rows, dim, wq_rows;
  int heads;
  float theta;
  mn_status want;
  const char *fragment;
} builder_case;

static mn_node build(mn_graph *g, const builder_case *b) {
  int64_t kv = 2 * 8, ff = 24, q_dim = 8 * (int64_t)b->heads;
  mn_node x = mn_input(g, "x", MN_SHAPE(b->batch, b->rows, b->dim));
  mn_node w[9] = {mn_parameter(g, "ln1", MN_SHAPE(b->dim)),
                  mn_parameter(g, "wq", MN_SHAPE(b->wq_rows, b->dim)),
                  mn_parameter(g, "wk", MN_SHAPE(kv, b->dim)),
                  mn_parameter(g, "wv", MN_SHAPE(kv, b->dim)),
                  mn_parameter(g, "wo", MN_SHAPE(b->dim, q_dim)),
                  mn_parameter(g, "ln2", MN_SHAPE(b->dim)),
                  mn_parameter(g, "wg", MN_SHAPE(ff, b->dim)),
                  mn_parameter(g, "wu", MN_SHAPE(ff, b->dim)),
                  mn_parameter(g, "wd", MN_SHAPE(b->dim, ff))};
  mn_node kc = mn_input(g, "k_cache", MN_SHAPE(b->batch, 10, kv));
  mn_node vc = mn_input(g, "v_cache", MN_SHAPE(b->batch, 10, kv));
  mn_node pos = mn_input_u32(g, "pos", MN_SHAPE(1)), len = mn_input_u32(g, "kv_len", MN_SHAPE(1));
  return mn_llama_decode_layer(g, x, w, kc, vc, pos, len, b->heads, 2, 8, 1e-5f, b->theta,
                               MN_QUANT_NONE, 0);
}

Test(decode_layer, the_builder_checks_every_shape) {
  const builder_case cases[] = {
      {2, 1, 32, 32, 4, 1e4f, MN_OK, ""},
      {MN_DECODE_LAYER_MAX_BATCH + 1, 1, 32, 32, 4, 1e4f, MN_ERR_INVALID_ARGUMENT,
       "batch 9 is above 8"},
      {2, 1, 32, 24, 4, 1e4f, MN_ERR_SHAPE, "q_proj"},
      {2, 1, 32, 24, 3, 1e4f, MN_ERR_INVALID_ARGUMENT, "must be a multiple of num_kv_heads"},
      {2, 2, 32, 32, 4, 1e4f, MN_ERR_SHAPE, "expected one row per sequence"},
      {2, 1, 32, 32, 4, 0.0f, MN_ERR_INVALID_ARGUMENT, "theta 0 must be positive"},
      {8, 1, 4096, 32, 4, 1e4f, MN_ERR_INVALID_ARGUMENT, "is above 24576 floats"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    mn_graph *g = mn_graph_new();
    mn_node y = build(g, &cases[i]);
    if (cases[i].want == MN_OK)
      cr_assert_neq(y, MN_NO_NODE, "case %zu: %s", i, mn_graph_error(g));
    else
      mn_assert_graph_error(g, cases[i].want, cases[i].fragment);
    mn_graph_free(g);
  }

  /* The caches are written in place: one node cannot be both. */
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(1, 1, 16));
  mn_node w[9];
  for (int i = 0; i < 9; i++)
    w[i] = x;
  mn_node cache = mn_input(g, "cache", MN_SHAPE(1, 4, 16));
  mn_node one = mn_input_u32(g, "one", MN_SHAPE(1));
  cr_assert_eq(mn_llama_decode_layer(g, x, w, cache, cache, one, one, 2, 2, 8, 1e-5f, 1e4f,
                                     MN_QUANT_NONE, 0),
               MN_NO_NODE);
  mn_assert_graph_error(g, MN_ERR_INVALID_ARGUMENT, "must be two graph inputs");
  mn_graph_free(g);
}

/* Quantized weights: the layer of dim 64, 4 heads of 16 over 2, intermediate 128, its Linear
 * weights U32 packed rows of `packed` (or f32 [out, in] when packed is MN_QUANT_NONE), built with
 * quant and group. */
static mn_node build_quantized(mn_graph *g, mn_quant packed, mn_quant quant, int group) {
  const int64_t dim = 64, q_dim = 64, kv = 32, ff = 128;
  const int64_t outs[7] = {q_dim, kv, kv, dim, ff, ff, dim},
                ins[7] = {dim, dim, dim, q_dim, dim, dim, ff};
  mn_node x = mn_input(g, "x", MN_SHAPE(1, dim)), w[9];
  w[0] = mn_parameter(g, "ln1", MN_SHAPE(dim));
  w[5] = mn_parameter(g, "ln2", MN_SHAPE(dim));
  const int linear[7] = {1, 2, 3, 4, 6, 7, 8};
  for (int i = 0; i < 7; i++) {
    char name[8];
    snprintf(name, sizeof name, "w%d", i);
    w[linear[i]] =
        packed == MN_QUANT_NONE
            ? mn_parameter(g, name, MN_SHAPE(outs[i], ins[i]))
            : mn_input_u32(g, name,
                           MN_SHAPE(outs[i], (int64_t)mn_quant_row_words(packed, group, ins[i])));
  }
  mn_node kc = mn_input(g, "k_cache", MN_SHAPE(1, 8, kv)),
          vc = mn_input(g, "v_cache", MN_SHAPE(1, 8, kv));
  mn_node pos = mn_input_u32(g, "pos", MN_SHAPE(1)), len = mn_input_u32(g, "kv_len", MN_SHAPE(1));
  return mn_llama_decode_layer(g, x, w, kc, vc, pos, len, 4, 2, 16, 1e-5f, 1e4f, quant, group);
}

Test(decode_layer, the_builder_checks_quantized_weights) {
  const struct {
    mn_quant packed, quant;
    int group;
    mn_status want;
    const char *fragment;
  } cases[] = {
      {MN_QUANT_Q8_0, MN_QUANT_Q8_0, 0, MN_OK, ""},
      {MN_QUANT_AFFINE_INT4, MN_QUANT_AFFINE_INT4, 32, MN_OK, ""},
      /* a group size the affine formats do not have */
      {MN_QUANT_NONE, MN_QUANT_AFFINE_INT8, 48, MN_ERR_INVALID_ARGUMENT,
       "is not a quantized format"},
      /* a block of 128 does not divide the 64-wide rows */
      {MN_QUANT_NONE, MN_QUANT_AFFINE_INT4, 128, MN_ERR_INVALID_ARGUMENT,
       "must be multiples of the int4 block of 128"},
      /* f32 weights where packed rows are expected, and rows packed in another format */
      {MN_QUANT_NONE, MN_QUANT_Q4_0, 0, MN_ERR_SHAPE, "expected u32"},
      {MN_QUANT_Q8_0, MN_QUANT_Q4_0, 0, MN_ERR_SHAPE, "q_proj"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    mn_graph *g = mn_graph_new();
    mn_node y = build_quantized(g, cases[i].packed, cases[i].quant, cases[i].group);
    if (cases[i].want == MN_OK)
      cr_assert_neq(y, MN_NO_NODE, "case %zu: %s", i, mn_graph_error(g));
    else
      mn_assert_graph_error(g, cases[i].want, cases[i].fragment);
    mn_graph_free(g);
  }
}

Test(decode_layer, a_position_past_the_cache_fails_the_step) {
  mn_test_dl_case c = MN_TEST_DL_SHAPE(1, 16, 2, 1, 8, 16, 4, 4);
  mn_assert_error(mn_test_dl_step_at(&c, MN_BACKEND_CPU, 4, 5), MN_ERR_INVALID_ARGUMENT,
                  "kv_pos 4 is out of range");
  mn_assert_error(mn_test_dl_step_at(&c, MN_BACKEND_CPU, 2, 0), MN_ERR_INVALID_ARGUMENT,
                  "kv_len 0 is out of range");
}

/* The op is inference only: a training graph through it is refused by name. */
Test(decode_layer, is_not_differentiable) {
  mn_test_dl_case c = MN_TEST_DL_SHAPE(1, 16, 2, 1, 8, 16, 4, 0);
  mn_graph *g = mn_test_dl_graph(&c, true);
  mn_node y = (mn_node)(mn_graph_num_nodes(g) - 1);
  mn_node_info info;
  cr_assert_eq(mn_graph_node(g, y, &info), MN_OK);
  cr_assert_str_eq(info.op, "llama_decode_layer");
  mn_node loss = mn_sum_all(g, y);
  mn_set_outputs(g, &loss, 1);
  mn_session *s = NULL;
  mn_session_options o = mn_session_options_default();
  o.backend = MN_BACKEND_CPU;
  mn_assert_error(mn_build_session(g, &o, &s), MN_ERR_UNSUPPORTED,
                  "(llama_decode_layer) is not differentiable");
  cr_assert_null(s);
  mn_graph_free(g);
}
