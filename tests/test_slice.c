/* mn_slice_last, the last-axis slice that cuts GPT-2's fused c_attn output into q, k and v:
 * forward against hand values, its gradient (zeros outside the slice, several slices of one
 * tensor summed) by hand and against finite differences, the builder's error paths, and the
 * CUDA kernels (NVRTC compile here, a comparison with the reference on a GPU). */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>

#include "tests/support/cuda_check.h"
#include "tests/support/gradcheck.h"
#include "tests/support/mn_test.h"

#define LEN(a) (sizeof(a) / sizeof((a)[0]))

static void assert_shape(const mn_graph *g, mn_node id, const int64_t *shape, int rank) {
  mn_node_info info;
  cr_assert_eq(mn_graph_node(g, id, &info), MN_OK, "%s", mn_last_error());
  cr_assert_str_eq(info.op, "slice_last");
  cr_assert_eq(info.type.rank, rank);
  for (int i = 0; i < rank; i++)
    cr_assert_eq(info.type.shape[i], shape[i], "dim %d is %lld, expected %lld", i,
                 (long long)info.type.shape[i], (long long)shape[i]);
}

/* ---------------------------------------------------------------- forward */

Test(slice, forward_hand_values) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(2, 2, 6));
  mn_node mid = mn_slice_last(g, x, 1, 3), all = mn_slice_last(g, x, 0, 6);
  mn_node last = mn_slice_last(g, x, 5, 1);
  assert_shape(g, mid, MN_SHAPE(2, 2, 3));
  assert_shape(g, all, MN_SHAPE(2, 2, 6));
  assert_shape(g, last, MN_SHAPE(2, 2, 1));
  mn_set_outputs(g, (mn_node[]){mid, all, last}, 3);
  float xd[24];
  for (int i = 0; i < 24; i++)
    xd[i] = (float)i * 0.5f - 3.0f;
  mn_test_feed feed = {"x", xd, NULL, 24, false};
  mn_session *s = mn_test_run(g, &feed, 1);
  /* Row r of x is 0.5 * (6r .. 6r+5) - 3. */
  const float want_mid[] = {-2.5f, -2.0f, -1.5f, 0.5f, 1.0f, 1.5f,
                            3.5f,  4.0f,  4.5f,  6.5f, 7.0f, 7.5f};
  const float want_last[] = {-0.5f, 2.5f, 5.5f, 8.5f};
  float *o = mn_test_read_output(s, 0, LEN(want_mid));
  mn_assert_close(o, want_mid, LEN(want_mid), 0);
  free(o);
  o = mn_test_read_output(s, 1, 24);
  mn_assert_close(o, xd, 24, 0);
  free(o);
  o = mn_test_read_output(s, 2, LEN(want_last));
  mn_assert_close(o, want_last, LEN(want_last), 0);
  free(o);
  mn_session_free(s);
  mn_graph_free(g);
}

Test(slice, rank_one_and_chained) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(7));
  /* A slice of a slice: columns 2..5 of x, then 1..2 of those. */
  mn_node y = mn_slice_last(g, mn_slice_last(g, x, 2, 4), 1, 2);
  assert_shape(g, y, MN_SHAPE(2));
  mn_set_outputs(g, &y, 1);
  const float xd[] = {10, 11, 12, 13, 14, 15, 16};
  mn_test_feed feed = {"x", xd, NULL, 7, false};
  mn_session *s = mn_test_run(g, &feed, 1);
  float *o = mn_test_read_output(s, 0, 2);
  mn_assert_close(o, ((const float[]){13, 14}), 2, 0);
  free(o);
  mn_session_free(s);
  mn_graph_free(g);
}

/* ---------------------------------------------------------------- gradient */

/* Gradients of loss = sum(q + 2k + 3v) for q, k, v three slices of one parameter x [2, 7]
 * (columns 0-1, 2-3 and 5-6; column 4 is in none): each slice's columns get its coefficient,
 * column 4 gets 0, so the three contributions must be placed and summed. */
Test(slice, gradient_of_three_slices_by_hand) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_parameter(g, "x", MN_SHAPE(2, 7));
  mn_node q = mn_slice_last(g, x, 0, 2), k = mn_slice_last(g, x, 2, 2);
  mn_node v = mn_slice_last(g, x, 5, 2);
  mn_node sum = mn_add(g, mn_add(g, q, mn_scale(g, k, 2.0f)), mn_scale(g, v, 3.0f));
  mn_node loss = mn_sum_all(g, sum);
  mn_set_outputs(g, &loss, 1);
  cr_assert_eq(mn_graph_status(g), MN_OK, "%s", mn_graph_error(g));
  mn_session_options o = mn_session_options_default();
  o.backend = MN_BACKEND_CPU;
  mn_session *s = NULL;
  cr_assert_eq(mn_build_session(g, &o, &s), MN_OK, "%s", mn_last_error());
  float xd[14];
  for (int i = 0; i < 14; i++)
    xd[i] = (float)i;
  cr_assert_eq(mn_session_set_parameter(s, "x", xd, 14), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_step(s), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_wait(s), MN_OK, "%s", mn_last_error());
  /* Row 0: 0 + 1 + 2*(2 + 3) + 3*(5 + 6) = 44; row 1 adds 7 * (1 + 1 + 2 + 2 + 3 + 3) to
   * that: 128. */
  cr_assert_float_eq(mn_session_read_loss(s), 172.0f, 1e-5f);
  float grad[14];
  cr_assert_eq(mn_session_read_grad(s, "x", grad, 14), MN_OK, "%s", mn_last_error());
  const float want[14] = {1, 1, 2, 2, 0, 3, 3, 1, 1, 2, 2, 0, 3, 3};
  mn_assert_close(grad, want, 14, 0);
  mn_session_free(s);
  mn_graph_free(g);
}

typedef struct slice_args {
  int64_t start, len;
} slice_args;

static mn_node build_slice(mn_graph *g, const mn_node *x, void *u) {
  const slice_args *a = u;
  return mn_slice_last(g, x[0], a->start, a->len);
}

#define LEAF(nm, ...)                                                                              \
  {                                                                                                \
    .name = nm, .rank = (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)),                 \
    .shape = {__VA_ARGS__}, .lo = -1.0f, .hi = 1.0f                                                \
  }

Test(slice, gradient_matches_finite_differences) {
  mn_gc_leaf l3[] = {LEAF("x", 2, 3, 9)}, l1[] = {LEAF("x", 5)};
  slice_args first = {0, 4}, mid = {3, 5}, last = {8, 1}, all = {0, 9}, one = {2, 2};
  mn_gradcheck("slice first", l3, 1, build_slice, &first, NULL);
  mn_gradcheck("slice middle", l3, 1, build_slice, &mid, NULL);
  mn_gradcheck("slice last column", l3, 1, build_slice, &last, NULL);
  mn_gradcheck("slice everything", l3, 1, build_slice, &all, NULL);
  mn_gradcheck("slice rank 1", l1, 1, build_slice, &one, NULL);
}

/* GPT-2's attention input: q, k, v slices of one [B, T, 3D] tensor, used non-linearly and
 * overlapping slices too (columns in two slices get both contributions). */
static mn_node build_qkv(mn_graph *g, const mn_node *x, void *u) {
  (void)u;
  mn_node q = mn_slice_last(g, x[0], 0, 4), k = mn_slice_last(g, x[0], 4, 4);
  mn_node v = mn_slice_last(g, x[0], 8, 4), overlap = mn_slice_last(g, x[0], 2, 4);
  return mn_add(g, mn_mul(g, mn_tanh(g, q), k), mn_mul(g, v, overlap));
}

Test(slice, gradient_of_qkv_slices_accumulates) {
  mn_gc_leaf l[] = {LEAF("x", 2, 3, 12)};
  mn_gradcheck("q, k, v and an overlapping slice", l, 1, build_qkv, NULL, NULL);
}

/* ---------------------------------------------------------------- errors */

static void assert_first_error(mn_graph *g, mn_node y, mn_status want, const char *fragment) {
  cr_assert_eq(y, MN_NO_NODE);
  mn_assert_graph_error(g, want, fragment);
  cr_assert(strstr(mn_last_error(), fragment) != NULL, "last error \"%s\" lacks \"%s\"",
            mn_last_error(), fragment);
  char first[512];
  snprintf(first, sizeof first, "%s", mn_graph_error(g));
  /* Sticky: a later failing call returns MN_NO_NODE and leaves the first message. */
  cr_assert_eq(mn_slice_last(g, 0, -1, 0), MN_NO_NODE);
  cr_assert_eq(mn_slice_last(g, 0, 0, 1), MN_NO_NODE);
  cr_assert_eq(mn_graph_status(g), want);
  cr_assert_str_eq(mn_graph_error(g), first);
}

/* Node 0: x [2, 3, 8]; node 1: u32 [2, 8]; node 2: a last axis longer than INT_MAX. */
#define EXPECT(call, status, fragment)                                                             \
  do {                                                                                             \
    mn_graph *g = mn_graph_new();                                                                  \
    mn_node x = mn_input(g, "x", MN_SHAPE(2, 3, 8));                                               \
    mn_node u = mn_input_u32(g, "u", MN_SHAPE(2, 8));                                              \
    mn_node wide = mn_input(g, "wide", MN_SHAPE((int64_t)INT_MAX + 10));                           \
    cr_assert_eq(mn_graph_status(g), MN_OK, "%s", mn_graph_error(g));                              \
    (void)x, (void)u, (void)wide;                                                                  \
    assert_first_error(g, (call), (status), (fragment));                                           \
    mn_graph_free(g);                                                                              \
  } while (0)

Test(slice_errors, null_graph_and_bad_nodes) {
  cr_assert_eq(mn_slice_last(NULL, 0, 0, 1), MN_NO_NODE);
  cr_assert(strstr(mn_last_error(), "mn_slice_last: graph is NULL"), "%s", mn_last_error());
  EXPECT(mn_slice_last(g, MN_NO_NODE, 0, 1), MN_ERR_INVALID_ARGUMENT,
         "mn_slice_last: input 0 is MN_NO_NODE");
  EXPECT(mn_slice_last(g, 7, 0, 1), MN_ERR_INVALID_ARGUMENT,
         "mn_slice_last: input 0 is node 7, but the graph has 3 nodes");
  EXPECT(mn_slice_last(g, u, 0, 1), MN_ERR_INVALID_ARGUMENT,
         "mn_slice_last: x is node 1 [2,8] u32 with dtype u32, expected f32");
}

Test(slice_errors, range_outside_the_last_axis) {
  EXPECT(mn_slice_last(g, x, 0, 0), MN_ERR_INVALID_ARGUMENT,
         "mn_slice_last: len is 0, must be positive");
  EXPECT(mn_slice_last(g, x, 2, -3), MN_ERR_INVALID_ARGUMENT, "len is -3, must be positive");
  EXPECT(mn_slice_last(g, x, -1, 2), MN_ERR_INVALID_ARGUMENT,
         "mn_slice_last: start -1 and len 2 do not fit the last dimension 8 of x node 0 [2,3,8] "
         "(need 0 <= start and start + len <= 8)");
  EXPECT(mn_slice_last(g, x, 5, 4), MN_ERR_INVALID_ARGUMENT, "start 5 and len 4 do not fit");
  EXPECT(mn_slice_last(g, x, 8, 1), MN_ERR_INVALID_ARGUMENT, "start 8 and len 1 do not fit");
  EXPECT(mn_slice_last(g, x, 0, 9), MN_ERR_INVALID_ARGUMENT, "start 0 and len 9 do not fit");
  /* start + len would overflow int64: still a clean error. */
  EXPECT(mn_slice_last(g, x, INT64_MAX, 2), MN_ERR_INVALID_ARGUMENT,
         "start 9223372036854775807 and len 2 do not fit");
  EXPECT(mn_slice_last(g, x, 1, INT64_MAX), MN_ERR_INVALID_ARGUMENT,
         "start 1 and len 9223372036854775807 do not fit");
  EXPECT(mn_slice_last(g, wide, (int64_t)INT_MAX + 1, 2), MN_ERR_INVALID_ARGUMENT,
         "mn_slice_last: start 2147483648 of x node 2 [2147483657] is above 2147483647");
}

Test(slice_errors, valid_call_after_error_is_refused) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(4, 6));
  cr_assert_eq(mn_slice_last(g, x, 4, 4), MN_NO_NODE);
  /* The graph stays in error: even a valid slice returns MN_NO_NODE. */
  cr_assert_eq(mn_slice_last(g, x, 0, 2), MN_NO_NODE);
  mn_assert_graph_error(g, MN_ERR_INVALID_ARGUMENT, "start 4 and len 4 do not fit");
  mn_graph_free(g);
}

/* ---------------------------------------------------------------- CUDA */

/* A training graph of slice(x) for x a parameter of `shape` (so the backward runs the
 * gradient kernel); the sizes pick the kernels' vector width (4, 2 or 1). */
static void check_cuda_slice(const int64_t *shape, int rank, int64_t start, int64_t len,
                             uint64_t seed) {
  mn_graph *g = mn_graph_new();
  mn_test_finish_training_graph(g, mn_slice_last(g, mn_parameter(g, "a", shape, rank), start, len));
  mn_test_check_cuda(g, true, NULL, seed);
  mn_graph_free(g);
  g = mn_graph_new();
  mn_node y = mn_slice_last(g, mn_input(g, "x", shape, rank), start, len);
  mn_set_outputs(g, &y, 1);
  mn_test_check_cuda(g, false, NULL, seed + 1);
  mn_graph_free(g);
}

Test(slice_cuda, vector_widths) {
  mn_test_require_cuda_build();
  check_cuda_slice(MN_SHAPE(3, 5, 24), 8, 8, 1);    /* VEC 4 */
  check_cuda_slice(MN_SHAPE(3, 5, 12), 6, 2, 2);    /* VEC 2 */
  check_cuda_slice(MN_SHAPE(2, 7, 9), 3, 5, 3);     /* VEC 1 */
  check_cuda_slice(MN_SHAPE(11), 10, 1, 4);         /* rank 1, last column */
  check_cuda_slice(MN_SHAPE(1, 1, 40), 0, 40, 5);   /* the whole axis */
  check_cuda_slice(MN_SHAPE(70, 3, 96), 32, 32, 6); /* more rows than one block covers */
  mn_test_require_cuda_device();                    /* reports the GPU comparisons as skipped */
}

/* GPT-2's pattern: three slices of one [B, T, 3D] tensor, each through its own path, so
 * the backward sums three slice gradients into one. */
Test(slice_cuda, qkv_slices_of_one_tensor) {
  mn_test_require_cuda_build();
  mn_graph *g = mn_graph_new();
  mn_node x = mn_parameter(g, "qkv", MN_SHAPE(2, 5, 3 * 12));
  mn_node q = mn_slice_last(g, x, 0, 12), k = mn_slice_last(g, x, 12, 12);
  mn_node v = mn_slice_last(g, x, 24, 12);
  mn_test_finish_training_graph(g, mn_causal_attention(g, q, k, v, 3, 3, 4));
  mn_test_check_cuda(g, true, NULL, 7);
  mn_graph_free(g);
  mn_test_require_cuda_device(); /* reports the GPU comparisons as skipped */
}
