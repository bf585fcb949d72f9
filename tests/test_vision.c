/* Vision ops, forward on the reference backend against float64 numpy results
 * (scripts/fixtures/gen_vision.py). Inputs are float32 and the kernels accumulate in
 * double, so each output differs from numpy by about one float32 rounding: 1e-6. */
#include <stdlib.h>

#include "tests/fixtures/vision_fixtures.h"
#include "tests/support/mn_test.h"

#define TOL    1e-6
#define LEN(a) (sizeof(a) / sizeof((a)[0]))

static void assert_shape(const mn_graph *g, mn_node id, const int64_t *shape, int rank) {
  mn_node_info info;
  cr_assert_eq(mn_graph_node(g, id, &info), MN_OK, "%s", mn_last_error());
  cr_assert_eq(info.type.rank, rank);
  for (int i = 0; i < rank; i++)
    cr_assert_eq(info.type.shape[i], shape[i], "dim %d is %lld, expected %lld", i,
                 (long long)info.type.shape[i], (long long)shape[i]);
}

/* Runs the single output y of g and compares it with want. */
static void run_and_check(mn_graph *g, mn_node y, const mn_test_feed *feeds, size_t nf,
                          const float *want, size_t n) {
  mn_set_outputs(g, &y, 1);
  mn_session *s = mn_test_run(g, feeds, nf);
  float *out = mn_test_read_output(s, 0, n);
  mn_assert_close(out, want, n, TOL);
  free(out);
  mn_session_free(s);
}

static void conv_case(const int64_t *kshape, int stride, int padding, const float *k,
                      const float *want, size_t want_n, const int64_t *oshape) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(2, 3, 7, 5));
  mn_node kn = mn_parameter(g, "k", kshape, 4);
  mn_node y = mn_conv2d(g, x, kn, stride, padding);
  cr_assert_neq(y, MN_NO_NODE, "%s", mn_graph_error(g));
  assert_shape(g, y, oshape, 4);
  size_t kn_n = (size_t)(kshape[0] * kshape[1] * kshape[2] * kshape[3]);
  mn_test_feed feeds[] = {{"x", conv_x, NULL, LEN(conv_x), false}, {"k", k, NULL, kn_n, true}};
  run_and_check(g, y, feeds, 2, want, want_n);
  mn_graph_free(g);
}

#define CONV_CASE(name, co, kh, kw, stride, padding, ho, wo)                                       \
  conv_case((const int64_t[]){co, 3, kh, kw}, stride, padding, name##_k, name##_out,               \
            LEN(name##_out), (const int64_t[]){2, co, ho, wo})

Test(vision, conv2d_3x3_stride1_pad1_keeps_size) { CONV_CASE(conv_k3_s1_p1, 5, 3, 3, 1, 1, 7, 5); }
Test(vision, conv2d_3x3_stride2_pad0) { CONV_CASE(conv_k3_s2_p0, 5, 3, 3, 2, 0, 3, 2); }
Test(vision, conv2d_3x2_stride2_pad2) { CONV_CASE(conv_k32_s2_p2, 5, 3, 2, 2, 2, 5, 4); }
Test(vision, conv2d_2x3_stride1_pad2) { CONV_CASE(conv_k23_s1_p2, 5, 2, 3, 1, 2, 10, 7); }
Test(vision, conv2d_1x1_stride1_pad0) { CONV_CASE(conv_k1_s1_p0, 5, 1, 1, 1, 0, 7, 5); }
Test(vision, conv2d_1x1_stride2_pad1_reads_padding) {
  CONV_CASE(conv_k1_s2_p1, 5, 1, 1, 2, 1, 5, 4);
}
Test(vision, conv2d_5x5_stride2_pad1) { CONV_CASE(conv_k5_s2_p1, 5, 5, 5, 2, 1, 3, 2); }

Test(vision, conv2d_size1_dims_and_kernel_as_tall_as_padded_input) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(1, 1, 1, 33));
  mn_node k = mn_parameter(g, "k", MN_SHAPE(2, 1, 3, 4));
  mn_node y = mn_conv2d(g, x, k, 1, 1);
  assert_shape(g, y, MN_SHAPE(1, 2, 1, 32));
  mn_test_feed feeds[] = {{"x", conv_small_x, NULL, LEN(conv_small_x), false},
                          {"k", conv_small_k, NULL, LEN(conv_small_k), true}};
  run_and_check(g, y, feeds, 2, conv_small_out, LEN(conv_small_out));
  mn_graph_free(g);
}

/* A 1x1 kernel of ones over one channel with no padding is the identity: exact. */
Test(vision, conv2d_identity_kernel_is_exact) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(2, 1, 3, 4));
  mn_node k = mn_constant(g, (const float[]){1.0f}, MN_SHAPE(1, 1, 1, 1));
  mn_node y = mn_conv2d(g, x, k, 1, 0);
  float xd[24];
  for (int i = 0; i < 24; i++)
    xd[i] = (float)i - 7.5f;
  mn_test_feed feeds[] = {{"x", xd, NULL, 24, false}};
  mn_set_outputs(g, &y, 1);
  mn_session *s = mn_test_run(g, feeds, 1);
  float *out = mn_test_read_output(s, 0, 24);
  mn_assert_close(out, xd, 24, 0);
  free(out);
  mn_session_free(s);
  mn_graph_free(g);
}

static void gn_case(const char *xname, const float *xd, const float *want, int groups, float eps) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, xname, MN_SHAPE(2, 6, 5, 3));
  mn_node w = mn_parameter(g, "w", MN_SHAPE(6));
  mn_node b = mn_parameter(g, "b", MN_SHAPE(6));
  mn_node y = mn_group_norm(g, x, w, b, groups, eps);
  assert_shape(g, y, MN_SHAPE(2, 6, 5, 3));
  mn_test_feed feeds[] = {
      {xname, xd, NULL, LEN(gn_x), false}, {"w", gn_w, NULL, 6, true}, {"b", gn_b, NULL, 6, true}};
  run_and_check(g, y, feeds, 3, want, LEN(gn_x));
  mn_graph_free(g);
}

Test(vision, group_norm_3_groups) { gn_case("x", gn_x, gn_g3_out, 3, 1e-5f); }
Test(vision, group_norm_1_group) { gn_case("x", gn_x, gn_g1_out, 1, 1e-5f); }
Test(vision, group_norm_group_per_channel_eps) { gn_case("x", gn_x, gn_g6_out, 6, 1e-2f); }
/* The inputs sit near 100 with a spread of about 5: a one-pass E[x^2] - E[x]^2 in float
 * would lose most digits of the variance. */
Test(vision, group_norm_large_offset) { gn_case("x_offset", gn_offset_x, gn_offset_out, 2, 1e-5f); }

Test(vision, group_norm_size1_batch_width_and_eps_zero) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(1, 2, 33, 1));
  mn_node w = mn_parameter(g, "w", MN_SHAPE(2));
  mn_node b = mn_parameter(g, "b", MN_SHAPE(2));
  mn_node y = mn_group_norm(g, x, w, b, 1, 0.0f);
  mn_test_feed feeds[] = {{"x", gn_tall_x, NULL, LEN(gn_tall_x), false},
                          {"w", gn_tall_w, NULL, 2, true},
                          {"b", gn_tall_b, NULL, 2, true}};
  run_and_check(g, y, feeds, 3, gn_tall_out, LEN(gn_tall_out));
  mn_graph_free(g);
}

/* One element per group: x - mean is exactly 0, so the output is the bias. */
Test(vision, group_norm_single_element_groups_give_bias) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(1, 4, 1, 1));
  mn_node w = mn_constant(g, (const float[]){2, 3, 4, 5}, MN_SHAPE(4));
  mn_node b = mn_constant(g, (const float[]){-1, 0.5f, 7, 0}, MN_SHAPE(4));
  mn_node y = mn_group_norm(g, x, w, b, 4, 1e-5f);
  mn_test_feed feeds[] = {{"x", (const float[]){3, -2, 1e3f, 0}, NULL, 4, false}};
  run_and_check(g, y, feeds, 1, (const float[]){-1, 0.5f, 7, 0}, 4);
  mn_graph_free(g);
}

Test(vision, concat_along_channels) {
  mn_graph *g = mn_graph_new();
  mn_node a = mn_input(g, "a", MN_SHAPE(2, 3, 4, 5));
  mn_node b = mn_input(g, "b", MN_SHAPE(2, 2, 4, 5));
  mn_node y = mn_concat(g, a, b);
  assert_shape(g, y, MN_SHAPE(2, 5, 4, 5));
  mn_test_feed feeds[] = {{"a", cat_a, NULL, LEN(cat_a), false},
                          {"b", cat_b, NULL, LEN(cat_b), false}};
  run_and_check(g, y, feeds, 2, cat_out, LEN(cat_out));
  mn_graph_free(g);
}

Test(vision, concat_size1) {
  mn_graph *g = mn_graph_new();
  mn_node a = mn_input(g, "a", MN_SHAPE(1, 1, 1, 1));
  mn_node b = mn_input(g, "b", MN_SHAPE(1, 2, 1, 1));
  mn_node y = mn_concat(g, a, b);
  assert_shape(g, y, MN_SHAPE(1, 3, 1, 1));
  mn_test_feed feeds[] = {{"a", (const float[]){4}, NULL, 1, false},
                          {"b", (const float[]){-5, 6}, NULL, 2, false}};
  run_and_check(g, y, feeds, 2, (const float[]){4, -5, 6}, 3);
  mn_graph_free(g);
}

Test(vision, split_a_and_b) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(2, 5, 3, 33));
  mn_node ya = mn_split_a(g, x, 2), yb = mn_split_b(g, x, 2);
  assert_shape(g, ya, MN_SHAPE(2, 2, 3, 33));
  assert_shape(g, yb, MN_SHAPE(2, 3, 3, 33));
  mn_node outs[2] = {ya, yb};
  mn_set_outputs(g, outs, 2);
  mn_test_feed feeds[] = {{"x", split_x, NULL, LEN(split_x), false}};
  mn_session *s = mn_test_run(g, feeds, 1);
  float *oa = mn_test_read_output(s, 0, LEN(split_a_out));
  float *ob = mn_test_read_output(s, 1, LEN(split_b_out));
  mn_assert_close(oa, split_a_out, LEN(split_a_out), 0);
  mn_assert_close(ob, split_b_out, LEN(split_b_out), 0);
  free(oa);
  free(ob);
  mn_session_free(s);
  mn_graph_free(g);
}

Test(vision, concat_of_splits_is_identity) {
  static const int cuts[] = {1, 2, 4};
  for (size_t i = 0; i < LEN(cuts); i++) {
    mn_graph *g = mn_graph_new();
    mn_node x = mn_input(g, "x", MN_SHAPE(2, 5, 3, 33));
    mn_node y = mn_concat(g, mn_split_a(g, x, cuts[i]), mn_split_b(g, x, cuts[i]));
    assert_shape(g, y, MN_SHAPE(2, 5, 3, 33));
    mn_test_feed feeds[] = {{"x", split_x, NULL, LEN(split_x), false}};
    mn_set_outputs(g, &y, 1);
    mn_session *s = mn_test_run(g, feeds, 1);
    float *out = mn_test_read_output(s, 0, LEN(split_x));
    mn_assert_close(out, split_x, LEN(split_x), 0);
    free(out);
    mn_session_free(s);
    mn_graph_free(g);
  }
}

Test(vision, upsample_2x_nearest) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(2, 3, 3, 5));
  mn_node y = mn_upsample_2x(g, x);
  assert_shape(g, y, MN_SHAPE(2, 3, 6, 10));
  mn_test_feed feeds[] = {{"x", up_x, NULL, LEN(up_x), false}};
  run_and_check(g, y, feeds, 1, up_out, LEN(up_out));
  mn_graph_free(g);
}

Test(vision, upsample_2x_size1) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(1, 2, 1, 1));
  mn_node y = mn_upsample_2x(g, x);
  assert_shape(g, y, MN_SHAPE(1, 2, 2, 2));
  mn_test_feed feeds[] = {{"x", (const float[]){1.5f, -2}, NULL, 2, false}};
  run_and_check(g, y, feeds, 1, (const float[]){1.5f, 1.5f, 1.5f, 1.5f, -2, -2, -2, -2}, 8);
  mn_graph_free(g);
}

Test(vision, add_per_channel) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(2, 3, 4, 5));
  mn_node b = mn_parameter(g, "b", MN_SHAPE(3));
  mn_node y = mn_add_per_channel(g, x, b);
  assert_shape(g, y, MN_SHAPE(2, 3, 4, 5));
  mn_test_feed feeds[] = {{"x", apc_x, NULL, LEN(apc_x), false}, {"b", apc_b, NULL, 3, true}};
  run_and_check(g, y, feeds, 2, apc_out, LEN(apc_out));
  mn_graph_free(g);
}

Test(vision, add_per_channel_size1) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(1, 1, 1, 33));
  mn_node b = mn_parameter(g, "b", MN_SHAPE(1));
  mn_node y = mn_add_per_channel(g, x, b);
  mn_test_feed feeds[] = {{"x", apc_small_x, NULL, LEN(apc_small_x), false},
                          {"b", apc_small_b, NULL, 1, true}};
  run_and_check(g, y, feeds, 2, apc_small_out, LEN(apc_small_out));
  mn_graph_free(g);
}

/* The ops chained as in a U-Net decoder block; both the concat and the final split are
 * read so an op that depends on its input's buffer layout shows. */
Test(vision, decoder_block_chain) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(1, 4, 3, 5));
  mn_node skip = mn_input(g, "skip", MN_SHAPE(1, 2, 6, 10));
  mn_node k = mn_parameter(g, "k", MN_SHAPE(6, 4, 3, 3));
  mn_node bias = mn_parameter(g, "bias", MN_SHAPE(6));
  mn_node w = mn_parameter(g, "gn.weight", MN_SHAPE(6));
  mn_node b = mn_parameter(g, "gn.bias", MN_SHAPE(6));
  mn_node h = mn_add_per_channel(g, mn_conv2d(g, x, k, 1, 1), bias);
  h = mn_upsample_2x(g, mn_group_norm(g, h, w, b, 2, 1e-5f));
  mn_node cat = mn_concat(g, skip, h);
  mn_node outs[2] = {cat, mn_split_b(g, cat, 2)};
  cr_assert_eq(mn_graph_status(g), MN_OK, "%s", mn_graph_error(g));
  assert_shape(g, outs[1], MN_SHAPE(1, 6, 6, 10));
  mn_set_outputs(g, outs, 2);
  mn_test_feed feeds[] = {
      {"x", blk_x, NULL, LEN(blk_x), false},        {"skip", blk_skip, NULL, LEN(blk_skip), false},
      {"k", blk_k, NULL, LEN(blk_k), true},         {"bias", blk_bias, NULL, LEN(blk_bias), true},
      {"gn.weight", blk_w, NULL, LEN(blk_w), true}, {"gn.bias", blk_b, NULL, LEN(blk_b), true}};
  mn_session *s = mn_test_run(g, feeds, LEN(feeds));
  float *oc = mn_test_read_output(s, 0, LEN(blk_cat));
  float *ob = mn_test_read_output(s, 1, LEN(blk_out));
  mn_assert_close(oc, blk_cat, LEN(blk_cat), TOL);
  mn_assert_close(ob, blk_out, LEN(blk_out), TOL);
  free(oc);
  free(ob);
  mn_session_free(s);
  mn_graph_free(g);
}
