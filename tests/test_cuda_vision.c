/* CUDA kernels of the vision ops against the reference backend: conv2d (im2col + matmul)
 * and its input and kernel gradients, group norm and its gradients, concat, split,
 * upsample_2x and its gradient, add_per_channel and the per-channel sum.
 *
 * Each case is a graph builder; CASE makes a compile test (NVRTC, no device) and a GPU
 * comparison of every output and, in training mode, every parameter's gradient. Training
 * graphs end in an MSE loss against an input target and also output the op's value, so
 * the forward result is compared directly and not only through the loss. Sizes are odd
 * or not multiples of 4 unless a case is about the vectorized path. */
#include "tests/support/cuda_check.h"
#include "tests/support/mn_test.h"

#define TOL 1e-5

#define CASE(name, training, builder)                                                              \
  Test(cuda_vision, name##_compiles) {                                                             \
    mn_test_require_cuda_build();                                                                  \
    mn_graph *g = builder();                                                                       \
    mn_test_assert_compiles(g, training);                                                          \
    mn_graph_free(g);                                                                              \
  }                                                                                                \
  Test(cuda_vision, name##_matches_cpu, .timeout = 240) {                                          \
    mn_test_require_cuda_build();                                                                  \
    mn_test_require_cuda_device();                                                                 \
    mn_graph *g = builder();                                                                       \
    double err = mn_test_compare_cuda(g, training, TOL, NULL, 1234);                               \
    cr_log_info("%s: largest relative error %.3g", #name, err);                                    \
    mn_graph_free(g);                                                                              \
  }

/* Sets the outputs: inference graphs output y; training graphs output the MSE of y
 * against a target input, then y. */
static mn_graph *finish(mn_graph *g, mn_node y, bool training) {
  cr_assert_neq(y, MN_NO_NODE, "%s", mn_graph_error(g));
  if (!training) {
    mn_set_outputs(g, &y, 1);
    return g;
  }
  mn_node_info info;
  cr_assert_eq(mn_graph_node(g, y, &info), MN_OK, "%s", mn_last_error());
  mn_node t = mn_input(g, "target", info.type.shape, info.type.rank);
  mn_node loss = mn_mse_loss(g, y, t);
  cr_assert_neq(loss, MN_NO_NODE, "%s", mn_graph_error(g));
  mn_set_outputs(g, (mn_node[]){loss, y}, 2);
  return g;
}

/* ---------------------------------------------------------------- conv2d */

/* x [n, ci, h, w] and kernel [co, ci, kh, kw], both parameters when training (so the
 * backward computes conv2d_grad_input and conv2d_grad_kernel). */
static mn_graph *conv_graph(bool training, int64_t n, int64_t ci, int64_t h, int64_t w, int64_t co,
                            int64_t kh, int64_t kw, int stride, int padding) {
  mn_graph *g = mn_graph_new();
  mn_node x = training ? mn_parameter(g, "x", MN_SHAPE(n, ci, h, w))
                       : mn_input(g, "x", MN_SHAPE(n, ci, h, w));
  mn_node k = mn_parameter(g, "k", MN_SHAPE(co, ci, kh, kw));
  return finish(g, mn_conv2d(g, x, k, stride, padding), training);
}

#define CONV_CASES(name, ...)                                                                      \
  static mn_graph *name##_fwd(void) { return conv_graph(false, __VA_ARGS__); }                     \
  static mn_graph *name##_train(void) { return conv_graph(true, __VA_ARGS__); }                    \
  CASE(name##_forward, false, name##_fwd)                                                          \
  CASE(name##_backward, true, name##_train)

/* n, ci, h, w, co, kh, kw, stride, padding */
CONV_CASES(conv_3x3_s1_p1, 2, 5, 7, 5, 6, 3, 3, 1, 1)
CONV_CASES(conv_3x3_s1_p0, 2, 5, 7, 5, 6, 3, 3, 1, 0)
CONV_CASES(conv_3x3_s2_p0, 2, 5, 7, 5, 6, 3, 3, 2, 0)
CONV_CASES(conv_3x3_s2_p1, 2, 5, 7, 5, 6, 3, 3, 2, 1)
/* 1x1 at stride 1 without padding multiplies x directly (no im2col). */
CONV_CASES(conv_1x1_s1_p0, 2, 5, 7, 5, 6, 1, 1, 1, 0)
CONV_CASES(conv_1x1_s1_p0_one_image, 1, 5, 7, 5, 6, 1, 1, 1, 0)
/* Strided 1x1 skips rows and columns (their input gradient is 0) and reads padding. */
CONV_CASES(conv_1x1_s2_p1, 2, 5, 7, 5, 6, 1, 1, 2, 1)
CONV_CASES(conv_1x1_s2_p0, 2, 5, 7, 5, 6, 1, 1, 2, 0)
CONV_CASES(conv_3x2_s2_p2, 2, 3, 7, 5, 5, 3, 2, 2, 2)
/* Stride larger than the kernel: input pixels between windows get a zero gradient. */
CONV_CASES(conv_2x2_s3_p0, 2, 3, 7, 5, 4, 2, 2, 3, 0)
CONV_CASES(conv_3x3_one_image, 1, 3, 7, 5, 4, 3, 3, 1, 1)
CONV_CASES(conv_unit_spatial, 2, 3, 1, 1, 4, 3, 3, 1, 1)
CONV_CASES(conv_one_row, 2, 3, 1, 9, 4, 1, 3, 1, 0)
CONV_CASES(conv_5x5_s2_p1, 2, 3, 9, 11, 7, 5, 5, 2, 1)
CONV_CASES(conv_wide_channels, 2, 32, 16, 16, 48, 3, 3, 1, 1)
CONV_CASES(conv_1x1_wide, 3, 64, 9, 9, 40, 1, 1, 1, 0)

/* 4 images whose columns take 75 MB each: the scratch budget splits them into chunks of
 * 3 and 1 (two im2col instances, and beta 1 accumulation in the kernel gradient). */
static mn_graph *conv_chunked_train(void) {
  return conv_graph(true, 4, 32, 256, 256, 4, 3, 3, 1, 1);
}
CASE(conv_chunked_over_images, true, conv_chunked_train)

/* ---------------------------------------------------------------- group norm */

static mn_graph *gn_graph(bool training, int64_t n, int64_t c, int64_t h, int64_t w, int groups) {
  mn_graph *g = mn_graph_new();
  mn_node x = training ? mn_parameter(g, "x", MN_SHAPE(n, c, h, w))
                       : mn_input(g, "x", MN_SHAPE(n, c, h, w));
  mn_node wt = mn_parameter(g, "w", MN_SHAPE(c));
  mn_node b = mn_parameter(g, "b", MN_SHAPE(c));
  return finish(g, mn_group_norm(g, x, wt, b, groups, 1e-5f), training);
}

#define GN_CASES(name, ...)                                                                        \
  static mn_graph *name##_fwd(void) { return gn_graph(false, __VA_ARGS__); }                       \
  static mn_graph *name##_train(void) { return gn_graph(true, __VA_ARGS__); }                      \
  CASE(name##_forward, false, name##_fwd)                                                          \
  CASE(name##_backward, true, name##_train)

/* n, c, h, w, groups */
GN_CASES(group_norm_4_groups_odd, 2, 12, 7, 5, 4)
GN_CASES(group_norm_4_groups_vec4, 2, 12, 8, 8, 4)
GN_CASES(group_norm_one_group, 2, 12, 7, 5, 1)
GN_CASES(group_norm_group_per_channel, 2, 12, 3, 2, 12)
GN_CASES(group_norm_unit_spatial, 3, 8, 1, 1, 4)
GN_CASES(group_norm_one_image, 1, 12, 9, 7, 4)
GN_CASES(group_norm_32_groups, 2, 64, 32, 32, 32)
/* 131072 values per group: the largest block, and per-channel rows of 16384. */
GN_CASES(group_norm_large_group, 1, 8, 128, 128, 1)
GN_CASES(group_norm_large_batch, 5, 6, 30, 30, 3)

/* ---------------------------------------------------------------- concat and split */

static mn_graph *concat_graph(bool training, int64_t n, int64_t ca, int64_t cb, int64_t h,
                              int64_t w) {
  mn_graph *g = mn_graph_new();
  mn_node a = mn_parameter(g, "a", MN_SHAPE(n, ca, h, w));
  mn_node b = mn_parameter(g, "b", MN_SHAPE(n, cb, h, w));
  return finish(g, mn_concat(g, a, b), training);
}

#define CONCAT_CASES(name, ...)                                                                    \
  static mn_graph *name##_fwd(void) { return concat_graph(false, __VA_ARGS__); }                   \
  static mn_graph *name##_train(void) { return concat_graph(true, __VA_ARGS__); }                  \
  CASE(name##_forward, false, name##_fwd)                                                          \
  CASE(name##_backward, true, name##_train)

/* n, ca, cb, h, w */
CONCAT_CASES(concat_odd, 2, 3, 5, 7, 5)
CONCAT_CASES(concat_vec4, 2, 4, 8, 4, 4)
CONCAT_CASES(concat_vec2, 3, 1, 2, 3, 2)
CONCAT_CASES(concat_one_image, 1, 7, 2, 5, 3)

static mn_graph *split_graph(bool training, bool first, int64_t n, int64_t c, int64_t h, int64_t w,
                             int ca) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_parameter(g, "x", MN_SHAPE(n, c, h, w));
  return finish(g, first ? mn_split_a(g, x, ca) : mn_split_b(g, x, ca), training);
}

#define SPLIT_CASES(name, first, ...)                                                              \
  static mn_graph *name##_fwd(void) { return split_graph(false, first, __VA_ARGS__); }             \
  static mn_graph *name##_train(void) { return split_graph(true, first, __VA_ARGS__); }            \
  CASE(name##_forward, false, name##_fwd)                                                          \
  CASE(name##_backward, true, name##_train)

/* n, c, h, w, channels_a */
SPLIT_CASES(split_a_odd, true, 2, 7, 7, 5, 3)
SPLIT_CASES(split_b_odd, false, 2, 7, 7, 5, 3)
SPLIT_CASES(split_a_vec4, true, 2, 8, 4, 4, 4)
SPLIT_CASES(split_b_vec4, false, 2, 12, 4, 4, 5)
SPLIT_CASES(split_a_one_channel, true, 1, 2, 3, 3, 1)
SPLIT_CASES(split_b_one_channel, false, 3, 6, 1, 5, 5)

/* ---------------------------------------------------------------- upsample */

static mn_graph *upsample_graph(bool training, int64_t n, int64_t c, int64_t h, int64_t w) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_parameter(g, "x", MN_SHAPE(n, c, h, w));
  return finish(g, mn_upsample_2x(g, x), training);
}

#define UPSAMPLE_CASES(name, ...)                                                                  \
  static mn_graph *name##_fwd(void) { return upsample_graph(false, __VA_ARGS__); }                 \
  static mn_graph *name##_train(void) { return upsample_graph(true, __VA_ARGS__); }                \
  CASE(name##_forward, false, name##_fwd)                                                          \
  CASE(name##_backward, true, name##_train)

UPSAMPLE_CASES(upsample_odd, 2, 3, 7, 5)
UPSAMPLE_CASES(upsample_unit, 1, 1, 1, 1)
UPSAMPLE_CASES(upsample_wide, 2, 16, 33, 40)

/* ---------------------------------------------------------------- add_per_channel */

static mn_graph *add_pc_graph(bool training, int64_t n, int64_t c, int64_t h, int64_t w) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_parameter(g, "x", MN_SHAPE(n, c, h, w));
  mn_node b = mn_parameter(g, "bias", MN_SHAPE(c));
  return finish(g, mn_add_per_channel(g, x, b), training);
}

#define ADD_PC_CASES(name, ...)                                                                    \
  static mn_graph *name##_fwd(void) { return add_pc_graph(false, __VA_ARGS__); }                   \
  static mn_graph *name##_train(void) { return add_pc_graph(true, __VA_ARGS__); }                  \
  CASE(name##_forward, false, name##_fwd)                                                          \
  CASE(name##_backward, true, name##_train)

/* The bias gradient is sum_per_channel: warp-per-row (HW <= 64 values), block-per-row and
 * a single image (no second pass). */
ADD_PC_CASES(add_per_channel_odd, 2, 5, 7, 5)
ADD_PC_CASES(add_per_channel_vec4, 2, 6, 4, 4)
ADD_PC_CASES(add_per_channel_long_rows, 3, 5, 45, 37)
ADD_PC_CASES(add_per_channel_one_image, 1, 7, 20, 20)
ADD_PC_CASES(add_per_channel_many_images, 33, 3, 2, 3)

/* ---------------------------------------------------------------- a conv block */

/* conv -> group_norm -> silu -> conv -> add_per_channel -> upsample -> concat with a
 * parameter skip tensor: every vision op and gradient in one training graph. */
static mn_graph *block_graph(bool training) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(2, 5, 7, 5));
  mn_node k1 = mn_parameter(g, "conv1.weight", MN_SHAPE(8, 5, 3, 3));
  mn_node gw = mn_parameter(g, "norm.weight", MN_SHAPE(8));
  mn_node gb = mn_parameter(g, "norm.bias", MN_SHAPE(8));
  mn_node k2 = mn_parameter(g, "conv2.weight", MN_SHAPE(6, 8, 3, 3));
  mn_node b2 = mn_parameter(g, "conv2.bias", MN_SHAPE(6));
  mn_node skip = mn_parameter(g, "skip", MN_SHAPE(2, 3, 14, 10));
  mn_node h = mn_conv2d(g, x, k1, 1, 1);
  h = mn_silu(g, mn_group_norm(g, h, gw, gb, 4, 1e-5f));
  h = mn_add_per_channel(g, mn_conv2d(g, h, k2, 1, 1), b2);
  return finish(g, mn_concat(g, mn_upsample_2x(g, h), skip), training);
}
static mn_graph *block_fwd(void) { return block_graph(false); }
static mn_graph *block_train(void) { return block_graph(true); }
CASE(conv_block_forward, false, block_fwd)
CASE(conv_block_training, true, block_train)

/* A strided downsampling block and a 1x1 projection, as in a UNet encoder. */
static mn_graph *down_block_graph(bool training) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_parameter(g, "x", MN_SHAPE(2, 6, 9, 7));
  mn_node k1 = mn_parameter(g, "down.weight", MN_SHAPE(10, 6, 3, 3));
  mn_node b1 = mn_parameter(g, "down.bias", MN_SHAPE(10));
  mn_node gw = mn_parameter(g, "norm.weight", MN_SHAPE(10));
  mn_node gb = mn_parameter(g, "norm.bias", MN_SHAPE(10));
  mn_node k2 = mn_parameter(g, "proj.weight", MN_SHAPE(7, 10, 1, 1));
  mn_node h = mn_add_per_channel(g, mn_conv2d(g, x, k1, 2, 1), b1);
  h = mn_silu(g, mn_group_norm(g, h, gw, gb, 5, 1e-5f));
  h = mn_conv2d(g, h, k2, 1, 0);
  return finish(g, mn_split_b(g, h, 3), training);
}
static mn_graph *down_block_fwd(void) { return down_block_graph(false); }
static mn_graph *down_block_train(void) { return down_block_graph(true); }
CASE(down_block_forward, false, down_block_fwd)
CASE(down_block_training, true, down_block_train)
