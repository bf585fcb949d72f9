/* llama_decode_layer on the CPU (host/decode_layer.h): the op gives the values of the ops it
 * replaces, over several steps that each append a row to the caches and read it back; its
 * builder refuses what it cannot serve, and a position past the cache fails the step. */
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
  mn_test_dl_case cases[] = {
      {.batch = 2,
       .dim = 32,
       .heads = 4,
       .kv_heads = 2,
       .head_dim = 8,
       .ff = 48,
       .max_seq = 16,
       .pos = 5},
      {.batch = 1,
       .dim = 24,
       .heads = 3,
       .kv_heads = 3,
       .head_dim = 8,
       .ff = 20,
       .max_seq = 9,
       .pos = 0},
      {.batch = 3,
       .dim = 36,
       .heads = 6,
       .kv_heads = 1,
       .head_dim = 6,
       .ff = 40,
       .max_seq = 12,
       .pos = 9},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    double err = fused_vs_unfused(&cases[i], MN_PRECISION_F32, 3);
    cr_assert_leq(err, 1e-5, "case %zu: relative error %g", i, err);
  }
}

/* In bf16 the unfused layer rounds each intermediate to bf16 and the op does not: they agree to
 * a few bf16 units. */
Test(decode_layer, is_close_to_the_unfused_layer_in_bf16) {
  mn_test_dl_case c = {.batch = 2,
                       .dim = 32,
                       .heads = 4,
                       .kv_heads = 2,
                       .head_dim = 8,
                       .ff = 48,
                       .max_seq = 16,
                       .pos = 5};
  double err = fused_vs_unfused(&c, MN_PRECISION_BF16, 3);
  cr_assert_leq(err, 0x1p-5, "relative error %g", err);
  cr_assert_gt(err, 0, "bf16 and fp32 intermediates should differ somewhere");
}

static mn_node build(mn_graph *g, int64_t batch, int64_t dim, int64_t wq_rows, int heads) {
  int64_t kv = 2 * 8, ff = 24;
  mn_node x = mn_input(g, "x", MN_SHAPE(batch, 1, dim));
  mn_node w[9] = {
      mn_parameter(g, "ln1", MN_SHAPE(dim)),    mn_parameter(g, "wq", MN_SHAPE(wq_rows, dim)),
      mn_parameter(g, "wk", MN_SHAPE(kv, dim)), mn_parameter(g, "wv", MN_SHAPE(kv, dim)),
      mn_parameter(g, "wo", MN_SHAPE(dim, 32)), mn_parameter(g, "ln2", MN_SHAPE(dim)),
      mn_parameter(g, "wg", MN_SHAPE(ff, dim)), mn_parameter(g, "wu", MN_SHAPE(ff, dim)),
      mn_parameter(g, "wd", MN_SHAPE(dim, ff))};
  mn_node kc = mn_input(g, "k_cache", MN_SHAPE(batch, 10, kv));
  mn_node vc = mn_input(g, "v_cache", MN_SHAPE(batch, 10, kv));
  mn_node pos = mn_input_u32(g, "pos", MN_SHAPE(1)), len = mn_input_u32(g, "kv_len", MN_SHAPE(1));
  return mn_llama_decode_layer(g, x, w, kc, vc, pos, len, heads, 2, 8, 1e-5f, 1e4f);
}

Test(decode_layer, the_builder_checks_every_shape) {
  mn_graph *g = mn_graph_new();
  cr_assert_neq(build(g, 2, 32, 32, 4), MN_NO_NODE, "%s", mn_graph_error(g));
  mn_graph_free(g);

  g = mn_graph_new();
  cr_assert_eq(build(g, MN_DECODE_LAYER_MAX_BATCH + 1, 32, 32, 4), MN_NO_NODE);
  mn_assert_graph_error(g, MN_ERR_INVALID_ARGUMENT, "batch 9 is above 8");
  mn_graph_free(g);

  g = mn_graph_new();
  cr_assert_eq(build(g, 2, 32, 24, 4), MN_NO_NODE);
  mn_assert_graph_error(g, MN_ERR_SHAPE, "q_proj");
  mn_graph_free(g);

  g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(1, 1, 16));
  mn_node w[9];
  for (int i = 0; i < 9; i++)
    w[i] = x;
  mn_node cache = mn_input(g, "cache", MN_SHAPE(1, 4, 16));
  mn_node one = mn_input_u32(g, "one", MN_SHAPE(1));
  cr_assert_eq(mn_llama_decode_layer(g, x, w, cache, cache, one, one, 2, 2, 8, 1e-5f, 1e4f),
               MN_NO_NODE);
  mn_assert_graph_error(g, MN_ERR_INVALID_ARGUMENT, "must be two graph inputs");
  mn_graph_free(g);

  g = mn_graph_new();
  cr_assert_eq(build(g, 2, 32, 32, 3), MN_NO_NODE);
  mn_assert_graph_error(g, MN_ERR_INVALID_ARGUMENT, "must be a multiple of num_kv_heads");
  mn_graph_free(g);
}

Test(decode_layer, a_position_past_the_cache_fails_the_step) {
  mn_test_dl_case c = {.batch = 1,
                       .dim = 16,
                       .heads = 2,
                       .kv_heads = 1,
                       .head_dim = 8,
                       .ff = 16,
                       .max_seq = 4,
                       .pos = 4};
  mn_graph *g = mn_test_dl_graph(&c, true);
  mn_session *s = NULL;
  mn_session_options o = mn_session_options_default();
  o.backend = MN_BACKEND_CPU;
  cr_assert_eq(mn_build_inference_session(g, &o, &s), MN_OK, "%s", mn_last_error());
  uint32_t pos = 4, len = 5;
  cr_assert_eq(mn_session_set_input_u32(s, "pos", &pos, 1), MN_OK);
  cr_assert_eq(mn_session_set_input_u32(s, "kv_len", &len, 1), MN_OK);
  mn_status st = mn_session_step(s);
  if (st == MN_OK) st = mn_session_wait(s);
  mn_assert_error(st, MN_ERR_INVALID_ARGUMENT, "kv_pos 4 is out of range");
  mn_session_free(s);
  mn_graph_free(g);
}
