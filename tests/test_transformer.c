/* Forward values of the transformer ops on the reference backend against float64 numpy
 * results (tests/fixtures/transformer_fixtures.h, from scripts/fixtures/gen_transformer.py).
 * Every op here is well conditioned, so the only error left is fp32 rounding: 1e-6. */
#include <stdlib.h>

#include "host/graph.h"
#include "tests/fixtures/transformer_fixtures.h"
#include "tests/support/mn_test.h"

#define TOL   1e-6
#define N_(a) (sizeof(a) / sizeof((a)[0]))

/* Runs y as the graph's only output, checks its element count and values, frees g. */
static void expect_output(mn_graph *g, mn_node y, const mn_test_feed *feeds, size_t num_feeds,
                          const float *want, size_t n) {
  cr_assert_neq(y, MN_NO_NODE, "builder failed: %s", mn_graph_error(g));
  mn_node_info info;
  cr_assert_eq(mn_graph_node(g, y, &info), MN_OK);
  cr_assert_eq((size_t)mn_tensor_type_numel(&info.type), n);
  mn_set_outputs(g, &y, 1);
  mn_session *s = mn_test_run(g, feeds, num_feeds);
  float *out = mn_test_read_output(s, 0, n);
  mn_assert_close(out, want, n, TOL);
  free(out);
  mn_session_free(s);
  mn_graph_free(g);
}

static void expect_shape(const mn_graph *g, mn_node y, const int64_t *shape, int rank) {
  mn_node_info info;
  cr_assert_eq(mn_graph_node(g, y, &info), MN_OK);
  cr_assert_eq(info.type.dtype, MN_F32);
  cr_assert_eq(info.type.rank, rank);
  for (int i = 0; i < rank; i++)
    cr_assert_eq(info.type.shape[i], shape[i], "dim %d is %lld, expected %lld", i,
                 (long long)info.type.shape[i], (long long)shape[i]);
}

static void run_swiglu(const int64_t *shape, int rank, const float *gate, const float *up,
                       const float *want, size_t n) {
  mn_graph *g = mn_graph_new();
  mn_node a = mn_input(g, "gate", shape, rank), b = mn_input(g, "up", shape, rank);
  mn_node y = mn_swiglu(g, a, b);
  expect_shape(g, y, shape, rank);
  mn_test_feed feeds[] = {{"gate", gate, NULL, n, false}, {"up", up, NULL, n, false}};
  expect_output(g, y, feeds, 2, want, n);
}

Test(transformer, swiglu_rank3) {
  run_swiglu(MN_SHAPE(2, 3, 37), sw_a_gate, sw_a_up, sw_a_out, N_(sw_a_out));
}
Test(transformer, swiglu_single_element) {
  run_swiglu(MN_SHAPE(1), sw_b_gate, sw_b_up, sw_b_out, N_(sw_b_out));
}

static void run_rms(const int64_t *shape, int rank, float eps, const float *x, const float *w,
                    const float *want, size_t n) {
  mn_graph *g = mn_graph_new();
  mn_node xn = mn_input(g, "x", shape, rank);
  mn_node wn = mn_parameter(g, "w", &shape[rank - 1], 1);
  mn_node y = mn_rms_norm(g, xn, wn, eps);
  expect_shape(g, y, shape, rank);
  cr_assert_eq(mn_graph_at(g, y)->attrs.eps, eps);
  mn_test_feed feeds[] = {{"x", x, NULL, n, false}, {"w", w, NULL, (size_t)shape[rank - 1], true}};
  expect_output(g, y, feeds, 2, want, n);
}

Test(transformer, rms_norm_2d) {
  run_rms(MN_SHAPE(3, 37), 1e-5f, rms_a_x, rms_a_w, rms_a_out, N_(rms_a_out));
}
Test(transformer, rms_norm_rank3) {
  run_rms(MN_SHAPE(2, 5, 33), 1e-6f, rms_b_x, rms_b_w, rms_b_out, N_(rms_b_out));
}
Test(transformer, rms_norm_width_one) {
  run_rms(MN_SHAPE(4, 1), 1e-5f, rms_c_x, rms_c_w, rms_c_out, N_(rms_c_out));
}
Test(transformer, rms_norm_rank1_zero_eps) {
  run_rms(MN_SHAPE(8), 0.0f, rms_d_x, rms_d_w, rms_d_out, N_(rms_d_out));
}

static void run_ln(const int64_t *shape, int rank, const float *x, const float *w, const float *b,
                   const float *want, size_t n) {
  mn_graph *g = mn_graph_new();
  mn_node xn = mn_input(g, "x", shape, rank);
  mn_node wn = mn_parameter(g, "w", &shape[rank - 1], 1);
  mn_node bn = mn_parameter(g, "b", &shape[rank - 1], 1);
  mn_node y = mn_layer_norm(g, xn, wn, bn, 1e-5f);
  expect_shape(g, y, shape, rank);
  cr_assert_eq(mn_graph_at(g, y)->attrs.eps, 1e-5f);
  size_t d = (size_t)shape[rank - 1];
  mn_test_feed feeds[] = {
      {"x", x, NULL, n, false}, {"w", w, NULL, d, true}, {"b", b, NULL, d, true}};
  expect_output(g, y, feeds, 3, want, n);
}

Test(transformer, layer_norm_2d) {
  run_ln(MN_SHAPE(3, 37), ln_a_x, ln_a_w, ln_a_b, ln_a_out, N_(ln_a_out));
}
Test(transformer, layer_norm_rank3_shifted_mean) {
  run_ln(MN_SHAPE(2, 3, 33), ln_b_x, ln_b_w, ln_b_b, ln_b_out, N_(ln_b_out));
}
/* A single feature is its own mean: the output is the bias. */
Test(transformer, layer_norm_width_one) {
  run_ln(MN_SHAPE(5, 1), ln_c_x, ln_c_w, ln_c_b, ln_c_out, N_(ln_c_out));
  for (size_t i = 0; i < N_(ln_c_out); i++)
    cr_assert_eq(ln_c_out[i], ln_c_b[0]);
}

/* offset < 0 selects mn_rope, else mn_rope_with_offset. */
static void run_rope(const int64_t *shape, int rank, float theta, int head_dim, int offset,
                     const float *x, const float *want, size_t n) {
  mn_graph *g = mn_graph_new();
  mn_node xn = mn_input(g, "x", shape, rank);
  mn_node y = offset < 0 ? mn_rope(g, xn, theta, head_dim)
                         : mn_rope_with_offset(g, xn, theta, offset, head_dim);
  expect_shape(g, y, shape, rank);
  const mn_node_rec *rec = mn_graph_at(g, y);
  cr_assert_eq(rec->op, MN_OP_ROPE);
  cr_assert_eq(rec->attrs.theta, theta);
  cr_assert_eq(rec->attrs.head_dim, head_dim);
  cr_assert_eq(rec->attrs.pos_offset, offset < 0 ? 0 : offset);
  mn_test_feed feeds[] = {{"x", x, NULL, n, false}};
  expect_output(g, y, feeds, 1, want, n);
}

Test(transformer, rope_three_heads) {
  run_rope(MN_SHAPE(5, 12), 10000.0f, 4, -1, rope_a_x, rope_a_out, N_(rope_a_out));
}
/* Positions restart at zero in each batch. */
Test(transformer, rope_rank3) {
  run_rope(MN_SHAPE(2, 3, 16), 10000.0f, 8, -1, rope_b_x, rope_b_out, N_(rope_b_out));
}
Test(transformer, rope_head_dim_2_with_offset) {
  run_rope(MN_SHAPE(4, 6), 100.0f, 2, 7, rope_c_x, rope_c_out, N_(rope_c_out));
}
Test(transformer, rope_head_dim_64_rank3_with_offset) {
  run_rope(MN_SHAPE(1, 5, 128), 500000.0f, 64, 3, rope_d_x, rope_d_out, N_(rope_d_out));
}
Test(transformer, rope_zero_offset_equals_plain_rope) {
  run_rope(MN_SHAPE(5, 12), 10000.0f, 4, 0, rope_a_x, rope_a_out, N_(rope_a_out));
}

static mn_session *cpu_session(const mn_graph *g) {
  mn_session_options o = mn_session_options_default();
  o.backend = MN_BACKEND_CPU;
  mn_session *s = NULL;
  cr_assert_eq(mn_build_inference_session(g, &o, &s), MN_OK, "build: %s", mn_last_error());
  return s;
}

static void step_and_check(mn_session *s, const float *want, size_t n) {
  cr_assert_eq(mn_session_step(s), MN_OK, "step: %s", mn_last_error());
  cr_assert_eq(mn_session_wait(s), MN_OK, "wait: %s", mn_last_error());
  float *out = mn_test_read_output(s, 0, n);
  mn_assert_close(out, want, n, TOL);
  free(out);
}

/* The offset is read at run time: changing it between steps of one session changes the
 * rotation without rebuilding. */
Test(transformer, rope_dynamic_offset_changes_between_steps) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(3, 8));
  mn_node off = mn_input_u32(g, "pos", MN_SHAPE(1));
  mn_node y = mn_rope_dynamic_offset(g, x, 10000.0f, off, 4);
  cr_assert_neq(y, MN_NO_NODE, "%s", mn_graph_error(g));
  cr_assert_eq(mn_graph_at(g, y)->op, MN_OP_ROPE_DYNAMIC);
  cr_assert_eq(mn_graph_at(g, y)->attrs.head_dim, 4);
  expect_shape(g, y, MN_SHAPE(3, 8));
  mn_set_outputs(g, &y, 1);
  mn_session *s = cpu_session(g);
  cr_assert_eq(mn_session_set_input(s, "x", ropedyn_x, N_(ropedyn_x)), MN_OK);
  const uint32_t offsets[] = {0, 5, 1000000};
  const float *wants[] = {ropedyn_out0, ropedyn_out1, ropedyn_out2};
  for (int k = 0; k < 3; k++) {
    cr_assert_eq(mn_session_set_input_u32(s, "pos", &offsets[k], 1), MN_OK, "%s", mn_last_error());
    step_and_check(s, wants[k], N_(ropedyn_out0));
  }
  mn_session_free(s);
  mn_graph_free(g);
}

/* offset + row exceeds 2^32 - 1: positions must keep counting instead of wrapping. */
Test(transformer, rope_dynamic_offset_past_u32_max) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(2, 3, 4));
  mn_node off = mn_input_u32(g, "pos", MN_SHAPE(1));
  mn_node y = mn_rope_dynamic_offset(g, x, 10000.0f, off, 2);
  const uint32_t pos = UINT32_MAX;
  mn_test_feed feeds[] = {{"x", ropewrap_x, NULL, N_(ropewrap_x), false},
                          {"pos", NULL, &pos, 1, false}};
  expect_output(g, y, feeds, 2, ropewrap_out, N_(ropewrap_out));
}

static void run_embedding(const int64_t *ishape, int irank, int64_t rows, int64_t d,
                          const uint32_t *idx, const float *table, const float *want, size_t n) {
  mn_graph *g = mn_graph_new();
  mn_node in = mn_input_u32(g, "idx", ishape, irank);
  mn_node tn = mn_parameter(g, "table", MN_SHAPE(rows, d));
  mn_node y = mn_embedding(g, in, tn);
  int64_t oshape[MN_MAX_RANK];
  for (int i = 0; i < irank; i++)
    oshape[i] = ishape[i];
  oshape[irank] = d;
  expect_shape(g, y, oshape, irank + 1);
  mn_test_feed feeds[] = {{"idx", NULL, idx, n / (size_t)d, false},
                          {"table", table, NULL, (size_t)(rows * d), true}};
  expect_output(g, y, feeds, 2, want, n);
}

Test(transformer, embedding_rank2_indices_with_repeat) {
  run_embedding(MN_SHAPE(2, 3), 7, 5, emb_a_idx, emb_a_table, emb_a_out, N_(emb_a_out));
}
Test(transformer, embedding_width_33) {
  run_embedding(MN_SHAPE(4), 10, 33, emb_b_idx, emb_b_table, emb_b_out, N_(emb_b_out));
}
Test(transformer, embedding_single_row_table) {
  run_embedding(MN_SHAPE(1), 1, 1, emb_c_idx, emb_c_table, emb_c_out, N_(emb_c_out));
}

static void run_scatter(const int64_t *ishape, int irank, int64_t rows, int64_t d,
                        const uint32_t *idx, const float *src, const float *want) {
  mn_graph *g = mn_graph_new();
  int64_t sshape[MN_MAX_RANK];
  size_t ni = 1;
  for (int i = 0; i < irank; i++) {
    sshape[i] = ishape[i];
    ni *= (size_t)ishape[i];
  }
  sshape[irank] = d;
  mn_node in = mn_input_u32(g, "idx", ishape, irank);
  mn_node sn = mn_input(g, "src", sshape, irank + 1);
  mn_node y = mn_scatter_add(g, in, sn, rows);
  expect_shape(g, y, MN_SHAPE(rows, d));
  cr_assert_eq(mn_graph_at(g, y)->attrs.num_rows, rows);
  mn_test_feed feeds[] = {{"idx", NULL, idx, ni, false}, {"src", src, NULL, ni * (size_t)d, false}};
  expect_output(g, y, feeds, 2, want, (size_t)(rows * d));
}

Test(transformer, scatter_add_repeats_accumulate) {
  run_scatter(MN_SHAPE(2, 3), 7, 5, sc_a_idx, sc_a_src, sc_a_out);
}
Test(transformer, scatter_add_untouched_row_is_zero) {
  run_scatter(MN_SHAPE(6), 3, 33, sc_b_idx, sc_b_src, sc_b_out);
  for (size_t j = 0; j < 33; j++)
    cr_assert_eq(sc_b_out[33 + j], 0.0f);
}
Test(transformer, scatter_add_single_element) {
  run_scatter(MN_SHAPE(1), 1, 1, sc_c_idx, sc_c_src, sc_c_out);
}
