/* Vision builders on bad input: each failure records the first error in the graph with
 * the builder's name, the nodes, their shapes and the offending value, and returns
 * MN_NO_NODE; later calls leave that first message in place. */
#include <limits.h>
#include <math.h>
#include <stdio.h>

#include "tests/support/mn_test.h"

/* Asserts y failed with `want` and `fragment`, then that a later failing builder call
 * on the same graph neither succeeds nor replaces the message. */
static void assert_first_error(mn_graph *g, mn_node y, mn_status want, const char *fragment) {
  cr_assert_eq(y, MN_NO_NODE);
  mn_assert_graph_error(g, want, fragment);
  cr_assert(strstr(mn_last_error(), fragment) != NULL, "last error \"%s\" lacks \"%s\"",
            mn_last_error(), fragment);
  char first[512];
  snprintf(first, sizeof first, "%s", mn_graph_error(g));
  cr_assert_eq(mn_upsample_2x(g, MN_NO_NODE), MN_NO_NODE);
  cr_assert_eq(mn_split_a(g, 0, -3), MN_NO_NODE);
  cr_assert_eq(mn_graph_status(g), want);
  cr_assert_str_eq(mn_graph_error(g), first);
}

/* A fresh graph with x [2,3,7,5] (node 0), an F32 kernel [5,3,3,3] (node 1), a U32
 * [2,3,7,5] (node 2), a rank-3 [3,7,5] (node 3) and an F32 [3] (node 4, one per channel
 * of x). Each test adds at most one node per builder call, as argument evaluation order
 * would otherwise decide the ids in the messages. */
static mn_graph *setup(void) {
  mn_graph *g = mn_graph_new();
  mn_input(g, "x", MN_SHAPE(2, 3, 7, 5));
  mn_parameter(g, "k", MN_SHAPE(5, 3, 3, 3));
  mn_input_u32(g, "u", MN_SHAPE(2, 3, 7, 5));
  mn_input(g, "r3", MN_SHAPE(3, 7, 5));
  mn_parameter(g, "c", MN_SHAPE(3));
  cr_assert_eq(mn_graph_status(g), MN_OK, "%s", mn_graph_error(g));
  return g;
}

#define EXPECT(call, status, fragment)                                                             \
  do {                                                                                             \
    mn_graph *g = setup();                                                                         \
    mn_node x = 0, k = 1, u = 2, r3 = 3, c = 4;                                                    \
    (void)x, (void)k, (void)u, (void)r3, (void)c;                                                  \
    assert_first_error(g, (call), (status), (fragment));                                           \
    mn_graph_free(g);                                                                              \
  } while (0)

Test(vision_errors, null_graph) {
  cr_assert_eq(mn_conv2d(NULL, 0, 1, 1, 0), MN_NO_NODE);
  cr_assert(strstr(mn_last_error(), "mn_conv2d: graph is NULL"), "%s", mn_last_error());
  cr_assert_eq(mn_group_norm(NULL, 0, 1, 2, 1, 1e-5f), MN_NO_NODE);
  cr_assert(strstr(mn_last_error(), "mn_group_norm: graph is NULL"), "%s", mn_last_error());
  cr_assert_eq(mn_concat(NULL, 0, 1), MN_NO_NODE);
  cr_assert(strstr(mn_last_error(), "mn_concat: graph is NULL"), "%s", mn_last_error());
  cr_assert_eq(mn_split_a(NULL, 0, 1), MN_NO_NODE);
  cr_assert(strstr(mn_last_error(), "mn_split_a: graph is NULL"), "%s", mn_last_error());
  cr_assert_eq(mn_split_b(NULL, 0, 1), MN_NO_NODE);
  cr_assert(strstr(mn_last_error(), "mn_split_b: graph is NULL"), "%s", mn_last_error());
  cr_assert_eq(mn_upsample_2x(NULL, 0), MN_NO_NODE);
  cr_assert(strstr(mn_last_error(), "mn_upsample_2x: graph is NULL"), "%s", mn_last_error());
  cr_assert_eq(mn_add_per_channel(NULL, 0, 1), MN_NO_NODE);
  cr_assert(strstr(mn_last_error(), "mn_add_per_channel: graph is NULL"), "%s", mn_last_error());
}

Test(vision_errors, no_node_and_unknown_ids) {
  EXPECT(mn_conv2d(g, x, MN_NO_NODE, 1, 0), MN_ERR_INVALID_ARGUMENT,
         "mn_conv2d: input 1 is MN_NO_NODE");
  EXPECT(mn_conv2d(g, 99, k, 1, 0), MN_ERR_INVALID_ARGUMENT,
         "mn_conv2d: input 0 is node 99, but the graph has 5 nodes");
  EXPECT(mn_group_norm(g, x, MN_NO_NODE, MN_NO_NODE, 1, 0), MN_ERR_INVALID_ARGUMENT,
         "mn_group_norm: input 1 is MN_NO_NODE");
  EXPECT(mn_group_norm(g, x, 0, 40, 1, 0), MN_ERR_INVALID_ARGUMENT,
         "mn_group_norm: input 2 is node 40");
  EXPECT(mn_concat(g, MN_NO_NODE, x), MN_ERR_INVALID_ARGUMENT, "mn_concat: input 0 is MN_NO_NODE");
  EXPECT(mn_split_a(g, MN_NO_NODE, 1), MN_ERR_INVALID_ARGUMENT,
         "mn_split_a: input 0 is MN_NO_NODE");
  EXPECT(mn_split_b(g, 5, 1), MN_ERR_INVALID_ARGUMENT, "mn_split_b: input 0 is node 5");
  EXPECT(mn_upsample_2x(g, MN_NO_NODE), MN_ERR_INVALID_ARGUMENT,
         "mn_upsample_2x: input 0 is MN_NO_NODE");
  EXPECT(mn_add_per_channel(g, x, 7), MN_ERR_INVALID_ARGUMENT,
         "mn_add_per_channel: input 1 is node 7");
}

Test(vision_errors, conv2d_shapes_and_dtypes) {
  EXPECT(mn_conv2d(g, u, k, 1, 0), MN_ERR_INVALID_ARGUMENT,
         "mn_conv2d: x is node 2 [2,3,7,5] u32 with dtype u32, expected f32");
  EXPECT(mn_conv2d(g, r3, k, 1, 0), MN_ERR_SHAPE,
         "mn_conv2d: x is node 3 [3,7,5] of rank 3, expected rank 4");
  EXPECT(mn_conv2d(g, x, r3, 1, 0), MN_ERR_SHAPE, "mn_conv2d: kernel is node 3 [3,7,5] of rank 3");
  EXPECT(mn_conv2d(g, x, mn_parameter(g, "k4", MN_SHAPE(5, 4, 3, 3)), 1, 0), MN_ERR_SHAPE,
         "mn_conv2d: x node 0 [2,3,7,5] has 3 channels but kernel node 5 [5,4,3,3] expects 4");
  EXPECT(mn_conv2d(g, x, mn_parameter(g, "kt", MN_SHAPE(5, 3, 8, 3)), 1, 0), MN_ERR_SHAPE,
         "mn_conv2d: padded height 7 of x node 0 [2,3,7,5] (padding 0) is smaller than kernel "
         "node 5 [5,3,8,3]'s 8");
  EXPECT(mn_conv2d(g, x, mn_parameter(g, "kw", MN_SHAPE(5, 3, 1, 8)), 2, 1), MN_ERR_SHAPE,
         "padded width 7 of x node 0 [2,3,7,5] (padding 1)");
}

/* Padding 2 widens 5 to 9, exactly a 9-wide kernel: accepted, one output column. */
Test(vision_errors, conv2d_kernel_as_wide_as_padded_input_is_accepted) {
  mn_graph *g = setup();
  mn_node y = mn_conv2d(g, 0, mn_parameter(g, "k9", MN_SHAPE(5, 3, 1, 9)), 1, 2);
  cr_assert_neq(y, MN_NO_NODE, "%s", mn_graph_error(g));
  mn_node_info info;
  cr_assert_eq(mn_graph_node(g, y, &info), MN_OK);
  cr_assert_eq(info.type.shape[2], 11);
  cr_assert_eq(info.type.shape[3], 1);
  mn_graph_free(g);
}

Test(vision_errors, conv2d_attributes) {
  EXPECT(mn_conv2d(g, x, k, 0, 0), MN_ERR_INVALID_ARGUMENT, "mn_conv2d: stride is 0, must be >= 1");
  EXPECT(mn_conv2d(g, x, k, -2, 0), MN_ERR_INVALID_ARGUMENT, "stride is -2");
  EXPECT(mn_conv2d(g, x, k, 1, INT_MIN), MN_ERR_INVALID_ARGUMENT, "padding is -2147483648");
  /* (7 + 2*INT_MAX) x (5 + 2*INT_MAX) outputs per channel cannot be represented */
  EXPECT(mn_conv2d(g, x, k, 1, INT_MAX), MN_ERR_SHAPE, "mn_conv2d: result [2,5,");
}

Test(vision_errors, group_norm) {
  EXPECT(mn_group_norm(g, u, c, c, 1, 1e-5f), MN_ERR_INVALID_ARGUMENT,
         "mn_group_norm: x is node 2 [2,3,7,5] u32 with dtype u32");
  EXPECT(mn_group_norm(g, r3, c, c, 1, 1e-5f), MN_ERR_SHAPE,
         "mn_group_norm: x is node 3 [3,7,5] of rank 3, expected rank 4");
  EXPECT(mn_group_norm(g, x, mn_parameter(g, "w", MN_SHAPE(4)), c, 1, 1e-5f), MN_ERR_SHAPE,
         "mn_group_norm: weight is node 5 [4], expected [3] (the channels of x node 0 [2,3,7,5])");
  EXPECT(mn_group_norm(g, x, c, mn_parameter(g, "b", MN_SHAPE(1, 3)), 1, 1e-5f), MN_ERR_SHAPE,
         "mn_group_norm: bias is node 5 [1,3], expected [3]");
  EXPECT(mn_group_norm(g, x, c, mn_input_u32(g, "b", MN_SHAPE(3)), 1, 1e-5f),
         MN_ERR_INVALID_ARGUMENT, "mn_group_norm: bias is node 5 [3] u32 with dtype u32");
  EXPECT(mn_group_norm(g, x, r3, c, 1, 1e-5f), MN_ERR_SHAPE,
         "mn_group_norm: weight is node 3 [3,7,5], expected [3]");
}

Test(vision_errors, group_norm_attributes) {
  EXPECT(mn_group_norm(g, x, c, c, 0, 1e-5f), MN_ERR_INVALID_ARGUMENT,
         "mn_group_norm: groups is 0, must be >= 1");
  EXPECT(mn_group_norm(g, x, c, c, -1, 1e-5f), MN_ERR_INVALID_ARGUMENT, "groups is -1");
  EXPECT(mn_group_norm(g, x, c, c, 2, 1e-5f), MN_ERR_INVALID_ARGUMENT,
         "mn_group_norm: groups 2 does not divide the 3 channels of x node 0 [2,3,7,5]");
  EXPECT(mn_group_norm(g, x, c, c, 6, 1e-5f), MN_ERR_INVALID_ARGUMENT,
         "groups 6 does not divide the 3 channels");
  EXPECT(mn_group_norm(g, x, c, c, 1, -1e-3f), MN_ERR_INVALID_ARGUMENT,
         "mn_group_norm: eps is -0.001, must be finite and >= 0");
  EXPECT(mn_group_norm(g, x, c, c, 1, NAN), MN_ERR_INVALID_ARGUMENT, "must be finite and >= 0");
  EXPECT(mn_group_norm(g, x, c, c, 3, INFINITY), MN_ERR_INVALID_ARGUMENT,
         "mn_group_norm: eps is inf");
}

Test(vision_errors, concat) {
  EXPECT(mn_concat(g, x, mn_input(g, "h", MN_SHAPE(2, 1, 6, 5))), MN_ERR_SHAPE,
         "mn_concat: node 0 [2,3,7,5] and node 5 [2,1,6,5]: batch, height and width must be "
         "equal");
  EXPECT(mn_concat(g, x, mn_input(g, "w", MN_SHAPE(2, 1, 7, 4))), MN_ERR_SHAPE,
         "node 5 [2,1,7,4]: batch, height and width");
  EXPECT(mn_concat(g, mn_input(g, "n", MN_SHAPE(1, 3, 7, 5)), x), MN_ERR_SHAPE,
         "mn_concat: node 5 [1,3,7,5] and node 0 [2,3,7,5]");
  EXPECT(mn_concat(g, x, r3), MN_ERR_SHAPE, "mn_concat: b is node 3 [3,7,5] of rank 3");
  EXPECT(mn_concat(g, u, x), MN_ERR_INVALID_ARGUMENT, "mn_concat: a is node 2 [2,3,7,5] u32");
}

Test(vision_errors, split) {
  EXPECT(mn_split_a(g, x, 0), MN_ERR_INVALID_ARGUMENT,
         "mn_split_a: channels_a is 0, must be in 1..2 (x node 0 [2,3,7,5] has 3 channels)");
  EXPECT(mn_split_b(g, x, 3), MN_ERR_INVALID_ARGUMENT, "mn_split_b: channels_a is 3");
  EXPECT(mn_split_a(g, x, -1), MN_ERR_INVALID_ARGUMENT, "channels_a is -1");
  EXPECT(mn_split_b(g, x, INT_MAX), MN_ERR_INVALID_ARGUMENT, "channels_a is 2147483647");
  EXPECT(mn_split_a(g, mn_input(g, "c1", MN_SHAPE(2, 1, 3, 3)), 1), MN_ERR_INVALID_ARGUMENT,
         "must be in 1..0");
  EXPECT(mn_split_a(g, r3, 1), MN_ERR_SHAPE, "mn_split_a: x is node 3 [3,7,5] of rank 3");
  EXPECT(mn_split_b(g, u, 1), MN_ERR_INVALID_ARGUMENT, "mn_split_b: x is node 2 [2,3,7,5] u32");
}

Test(vision_errors, upsample_2x) {
  EXPECT(mn_upsample_2x(g, r3), MN_ERR_SHAPE, "mn_upsample_2x: x is node 3 [3,7,5] of rank 3");
  EXPECT(mn_upsample_2x(g, u), MN_ERR_INVALID_ARGUMENT, "mn_upsample_2x: x is node 2");
  /* 2^39 elements are a valid leaf; four times that exceeds the element limit */
  EXPECT(mn_upsample_2x(g, mn_input(g, "big", MN_SHAPE(1, 1, 1 << 19, 1 << 20))), MN_ERR_SHAPE,
         "mn_upsample_2x: result [1,1,1048576,2097152] would have more than");
}

Test(vision_errors, add_per_channel) {
  EXPECT(mn_add_per_channel(g, x, mn_parameter(g, "b", MN_SHAPE(4))), MN_ERR_SHAPE,
         "mn_add_per_channel: bias is node 5 [4], expected [3] (the channels of x node 0 "
         "[2,3,7,5])");
  EXPECT(mn_add_per_channel(g, x, mn_parameter(g, "b", MN_SHAPE(3, 1))), MN_ERR_SHAPE,
         "bias is node 5 [3,1], expected [3]");
  EXPECT(mn_add_per_channel(g, x, mn_input_u32(g, "b", MN_SHAPE(3))), MN_ERR_INVALID_ARGUMENT,
         "mn_add_per_channel: bias is node 5 [3] u32 with dtype u32");
  EXPECT(mn_add_per_channel(g, r3, c), MN_ERR_SHAPE,
         "mn_add_per_channel: x is node 3 [3,7,5] of rank 3");
}

/* A builder error in the middle of a model: every later vision call returns MN_NO_NODE
 * and the session builder refuses the graph with the first message. */
Test(vision_errors, first_error_survives_later_calls_and_build) {
  mn_graph *g = setup();
  mn_node y = mn_conv2d(g, 0, 1, 0, 0);
  mn_node h = mn_upsample_2x(g, mn_add_per_channel(g, y, mn_parameter(g, "b", MN_SHAPE(5))));
  h = mn_concat(g, h, mn_split_a(g, 0, 1));
  h = mn_group_norm(g, h, MN_NO_NODE, MN_NO_NODE, 0, -1);
  cr_assert_eq(h, MN_NO_NODE);
  mn_assert_graph_error(g, MN_ERR_INVALID_ARGUMENT, "mn_conv2d: stride is 0, must be >= 1");
  mn_session *s = NULL;
  mn_assert_error(mn_build_inference_session(g, NULL, &s), MN_ERR_INVALID_ARGUMENT,
                  "mn_conv2d: stride is 0");
  cr_assert_null(s);
  mn_graph_free(g);
}
