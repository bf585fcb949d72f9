/* Error paths of the transformer builders (sticky graph errors) and the runtime index
 * errors of embedding and scatter_add (reported by mn_session_wait). */
#include <stdio.h>
#include <stdlib.h>

#include "tests/support/mn_test.h"

/* The builder returned MN_NO_NODE with status `st` and a message holding `frag`, the
 * thread's last error agrees, and a later failing call leaves the first error in place. */
static void expect_fail(mn_graph *g, mn_node got, mn_status st, const char *frag) {
  cr_assert_eq(got, MN_NO_NODE);
  mn_assert_graph_error(g, st, frag);
  mn_assert_error(st, st, frag);
  char first[512];
  snprintf(first, sizeof first, "%s", mn_graph_error(g));
  mn_node x = mn_input(g, "late", MN_SHAPE(2));
  cr_assert_eq(x, MN_NO_NODE);
  cr_assert_eq(mn_swiglu(g, 0, 999), MN_NO_NODE);
  cr_assert_eq(mn_scatter_add(g, 0, 0, -1), MN_NO_NODE);
  cr_assert_str_eq(mn_graph_error(g), first);
  cr_assert_eq(mn_graph_status(g), st);
  mn_graph_free(g);
}

static void expect_null_graph(mn_node got, const char *fn) {
  cr_assert_eq(got, MN_NO_NODE);
  char want[128];
  snprintf(want, sizeof want, "%s: graph is NULL", fn);
  cr_assert(strstr(mn_last_error(), want) != NULL, "message \"%s\" lacks \"%s\"", mn_last_error(),
            want);
}

Test(transformer_errors, null_graph) {
  expect_null_graph(mn_swiglu(NULL, 0, 1), "mn_swiglu");
  expect_null_graph(mn_rms_norm(NULL, 0, 1, 1e-5f), "mn_rms_norm");
  expect_null_graph(mn_layer_norm(NULL, 0, 1, 2, 1e-5f), "mn_layer_norm");
  expect_null_graph(mn_rope(NULL, 0, 1e4f, 4), "mn_rope");
  expect_null_graph(mn_rope_with_offset(NULL, 0, 1e4f, 1, 4), "mn_rope_with_offset");
  expect_null_graph(mn_rope_dynamic_offset(NULL, 0, 1e4f, 1, 4), "mn_rope_dynamic_offset");
  expect_null_graph(mn_embedding(NULL, 0, 1), "mn_embedding");
  expect_null_graph(mn_scatter_add(NULL, 0, 1, 4), "mn_scatter_add");
}

Test(transformer_errors, swiglu) {
  mn_graph *g = mn_graph_new();
  mn_node a = mn_input(g, "a", MN_SHAPE(3, 8)), b = mn_input(g, "b", MN_SHAPE(3, 7));
  expect_fail(g, mn_swiglu(g, a, b), MN_ERR_SHAPE,
              "mn_swiglu: node 0 [3,8] and node 1 [3,7]: shapes differ");

  g = mn_graph_new();
  a = mn_input(g, "a", MN_SHAPE(3, 8));
  b = mn_input_u32(g, "b", MN_SHAPE(3, 8));
  expect_fail(g, mn_swiglu(g, a, b), MN_ERR_INVALID_ARGUMENT,
              "mn_swiglu: up is node 1 [3,8] u32 with dtype u32, expected f32");

  g = mn_graph_new();
  a = mn_input_u32(g, "a", MN_SHAPE(3, 8));
  b = mn_input(g, "b", MN_SHAPE(3, 8));
  expect_fail(g, mn_swiglu(g, a, b), MN_ERR_INVALID_ARGUMENT, "mn_swiglu: gate is node 0");

  g = mn_graph_new();
  a = mn_input(g, "a", MN_SHAPE(3, 8));
  expect_fail(g, mn_swiglu(g, MN_NO_NODE, a), MN_ERR_INVALID_ARGUMENT,
              "mn_swiglu: input 0 is MN_NO_NODE");

  g = mn_graph_new();
  a = mn_input(g, "a", MN_SHAPE(3, 8));
  expect_fail(g, mn_swiglu(g, a, 42), MN_ERR_INVALID_ARGUMENT,
              "mn_swiglu: input 1 is node 42, but the graph has 1 nodes");
}

Test(transformer_errors, rms_norm) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(3, 8)), w = mn_parameter(g, "w", MN_SHAPE(7));
  expect_fail(g, mn_rms_norm(g, x, w, 1e-5f), MN_ERR_SHAPE,
              "mn_rms_norm: weight is node 1 [7], expected [8] (the last dim of x node 0 [3,8])");

  g = mn_graph_new();
  x = mn_input(g, "x", MN_SHAPE(3, 8));
  w = mn_parameter(g, "w", MN_SHAPE(1, 8));
  expect_fail(g, mn_rms_norm(g, x, w, 1e-5f), MN_ERR_SHAPE,
              "mn_rms_norm: weight is node 1 [1,8], expected [8]");

  g = mn_graph_new();
  x = mn_input_u32(g, "x", MN_SHAPE(3, 8));
  w = mn_parameter(g, "w", MN_SHAPE(8));
  expect_fail(g, mn_rms_norm(g, x, w, 1e-5f), MN_ERR_INVALID_ARGUMENT,
              "mn_rms_norm: x is node 0 [3,8] u32 with dtype u32, expected f32");

  g = mn_graph_new();
  x = mn_input(g, "x", MN_SHAPE(3, 8));
  w = mn_input_u32(g, "w", MN_SHAPE(8));
  expect_fail(g, mn_rms_norm(g, x, w, 1e-5f), MN_ERR_INVALID_ARGUMENT,
              "mn_rms_norm: weight is node 1 [8] u32 with dtype u32");

  const float bad_eps[] = {-1e-5f, NAN, INFINITY};
  const char *frags[] = {"mn_rms_norm: eps is -1e-05, must be finite and >= 0",
                         "mn_rms_norm: eps is nan", "mn_rms_norm: eps is inf"};
  for (int i = 0; i < 3; i++) {
    g = mn_graph_new();
    x = mn_input(g, "x", MN_SHAPE(3, 8));
    w = mn_parameter(g, "w", MN_SHAPE(8));
    expect_fail(g, mn_rms_norm(g, x, w, bad_eps[i]), MN_ERR_INVALID_ARGUMENT, frags[i]);
  }

  g = mn_graph_new();
  x = mn_input(g, "x", MN_SHAPE(3, 8));
  expect_fail(g, mn_rms_norm(g, x, MN_NO_NODE, 1e-5f), MN_ERR_INVALID_ARGUMENT,
              "mn_rms_norm: input 1 is MN_NO_NODE");
}

Test(transformer_errors, layer_norm) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(2, 3, 8)), w = mn_parameter(g, "w", MN_SHAPE(8));
  mn_node b = mn_parameter(g, "b", MN_SHAPE(7));
  expect_fail(g, mn_layer_norm(g, x, w, b, 1e-5f), MN_ERR_SHAPE,
              "mn_layer_norm: bias is node 2 [7], expected [8] (the last dim of x node 0 [2,3,8])");

  g = mn_graph_new();
  x = mn_input(g, "x", MN_SHAPE(2, 3, 8));
  w = mn_parameter(g, "w", MN_SHAPE(3));
  b = mn_parameter(g, "b", MN_SHAPE(8));
  expect_fail(g, mn_layer_norm(g, x, w, b, 1e-5f), MN_ERR_SHAPE,
              "mn_layer_norm: weight is node 1 [3], expected [8]");

  g = mn_graph_new();
  x = mn_input(g, "x", MN_SHAPE(2, 3, 8));
  w = mn_parameter(g, "w", MN_SHAPE(8));
  b = mn_input_u32(g, "b", MN_SHAPE(8));
  expect_fail(g, mn_layer_norm(g, x, w, b, 1e-5f), MN_ERR_INVALID_ARGUMENT,
              "mn_layer_norm: bias is node 2 [8] u32 with dtype u32");

  g = mn_graph_new();
  x = mn_input(g, "x", MN_SHAPE(2, 3, 8));
  w = mn_parameter(g, "w", MN_SHAPE(8));
  b = mn_parameter(g, "b", MN_SHAPE(8));
  expect_fail(g, mn_layer_norm(g, x, w, b, -0.5f), MN_ERR_INVALID_ARGUMENT,
              "mn_layer_norm: eps is -0.5, must be finite and >= 0");

  g = mn_graph_new();
  x = mn_input(g, "x", MN_SHAPE(2, 3, 8));
  w = mn_parameter(g, "w", MN_SHAPE(8));
  expect_fail(g, mn_layer_norm(g, x, w, MN_NO_NODE, 1e-5f), MN_ERR_INVALID_ARGUMENT,
              "mn_layer_norm: input 2 is MN_NO_NODE");
}

/* One RoPE call on a fresh graph holding x of the given shape (node 0). */
static void rope_fail(const int64_t *shape, int rank, float theta, int offset, int head_dim,
                      mn_status st, const char *frag) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", shape, rank);
  expect_fail(g, mn_rope_with_offset(g, x, theta, offset, head_dim), st, frag);
}

Test(transformer_errors, rope) {
  rope_fail(MN_SHAPE(8), 1e4f, 0, 4, MN_ERR_SHAPE,
            "mn_rope_with_offset: x is node 0 [8] of rank 1, expected rank 2 to 3");
  rope_fail(MN_SHAPE(1, 2, 3, 8), 1e4f, 0, 4, MN_ERR_SHAPE, "of rank 4, expected rank 2 to 3");
  rope_fail(MN_SHAPE(3, 8), 1e4f, 0, 0, MN_ERR_INVALID_ARGUMENT,
            "mn_rope_with_offset: head_dim is 0, must be positive");
  rope_fail(MN_SHAPE(3, 8), 1e4f, 0, -4, MN_ERR_INVALID_ARGUMENT, "head_dim is -4");
  rope_fail(MN_SHAPE(3, 9), 1e4f, 0, 3, MN_ERR_INVALID_ARGUMENT,
            "mn_rope_with_offset: head_dim is 3, must be even");
  rope_fail(MN_SHAPE(3, 12), 1e4f, 0, 8, MN_ERR_SHAPE,
            "mn_rope_with_offset: x is node 0 [3,12]: its last dim 12 is not a multiple of "
            "head_dim 8");
  rope_fail(MN_SHAPE(3, 8), 0.0f, 0, 4, MN_ERR_INVALID_ARGUMENT,
            "mn_rope_with_offset: theta is 0, must be finite and > 0");
  rope_fail(MN_SHAPE(3, 8), -2.0f, 0, 4, MN_ERR_INVALID_ARGUMENT, "theta is -2");
  rope_fail(MN_SHAPE(3, 8), INFINITY, 0, 4, MN_ERR_INVALID_ARGUMENT, "theta is inf");
  rope_fail(MN_SHAPE(3, 8), NAN, 0, 4, MN_ERR_INVALID_ARGUMENT, "theta is nan");
  rope_fail(MN_SHAPE(3, 8), 1e4f, -1, 4, MN_ERR_INVALID_ARGUMENT,
            "mn_rope_with_offset: pos_offset is -1, must be >= 0");

  mn_graph *g = mn_graph_new();
  mn_node x = mn_input_u32(g, "x", MN_SHAPE(3, 8));
  expect_fail(g, mn_rope(g, x, 1e4f, 4), MN_ERR_INVALID_ARGUMENT,
              "mn_rope: x is node 0 [3,8] u32 with dtype u32, expected f32");

  g = mn_graph_new();
  expect_fail(g, mn_rope(g, MN_NO_NODE, 1e4f, 4), MN_ERR_INVALID_ARGUMENT,
              "mn_rope: input 0 is MN_NO_NODE");

  g = mn_graph_new();
  x = mn_input(g, "x", MN_SHAPE(3, 10));
  expect_fail(g, mn_rope(g, x, 1e4f, 4), MN_ERR_SHAPE, "mn_rope: x is node 0 [3,10]");
}

Test(transformer_errors, rope_dynamic_offset) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(3, 8)), off = mn_input(g, "pos", MN_SHAPE(1));
  expect_fail(g, mn_rope_dynamic_offset(g, x, 1e4f, off, 4), MN_ERR_INVALID_ARGUMENT,
              "mn_rope_dynamic_offset: offset is node 1 [1] with dtype f32, expected u32");

  g = mn_graph_new();
  x = mn_input(g, "x", MN_SHAPE(3, 8));
  off = mn_input_u32(g, "pos", MN_SHAPE(2));
  expect_fail(g, mn_rope_dynamic_offset(g, x, 1e4f, off, 4), MN_ERR_SHAPE,
              "mn_rope_dynamic_offset: offset is node 1 [2] u32, expected [1] u32");

  g = mn_graph_new();
  x = mn_input(g, "x", MN_SHAPE(3, 8));
  off = mn_input_u32(g, "pos", MN_SHAPE(1, 1));
  expect_fail(g, mn_rope_dynamic_offset(g, x, 1e4f, off, 4), MN_ERR_SHAPE,
              "offset is node 1 [1,1] u32, expected [1] u32");

  g = mn_graph_new();
  x = mn_input(g, "x", MN_SHAPE(3, 8));
  expect_fail(g, mn_rope_dynamic_offset(g, x, 1e4f, MN_NO_NODE, 4), MN_ERR_INVALID_ARGUMENT,
              "mn_rope_dynamic_offset: input 1 is MN_NO_NODE");

  g = mn_graph_new();
  x = mn_input(g, "x", MN_SHAPE(3, 6));
  off = mn_input_u32(g, "pos", MN_SHAPE(1));
  expect_fail(g, mn_rope_dynamic_offset(g, x, 1e4f, off, 3), MN_ERR_INVALID_ARGUMENT,
              "mn_rope_dynamic_offset: head_dim is 3, must be even");

  g = mn_graph_new();
  x = mn_input(g, "x", MN_SHAPE(3, 8));
  off = mn_input_u32(g, "pos", MN_SHAPE(1));
  expect_fail(g, mn_rope_dynamic_offset(g, x, -1.0f, off, 4), MN_ERR_INVALID_ARGUMENT,
              "mn_rope_dynamic_offset: theta is -1");
}

Test(transformer_errors, embedding) {
  mn_graph *g = mn_graph_new();
  mn_node idx = mn_input(g, "idx", MN_SHAPE(4)), t = mn_parameter(g, "t", MN_SHAPE(10, 8));
  expect_fail(g, mn_embedding(g, idx, t), MN_ERR_INVALID_ARGUMENT,
              "mn_embedding: indices is node 0 [4] with dtype f32, expected u32");

  g = mn_graph_new();
  idx = mn_input_u32(g, "idx", MN_SHAPE(4));
  t = mn_input_u32(g, "t", MN_SHAPE(10, 8));
  expect_fail(g, mn_embedding(g, idx, t), MN_ERR_INVALID_ARGUMENT,
              "mn_embedding: table is node 1 [10,8] u32 with dtype u32, expected f32");

  g = mn_graph_new();
  idx = mn_input_u32(g, "idx", MN_SHAPE(4));
  t = mn_parameter(g, "t", MN_SHAPE(80));
  expect_fail(g, mn_embedding(g, idx, t), MN_ERR_SHAPE,
              "mn_embedding: table is node 1 [80] of rank 1, expected rank 2");

  g = mn_graph_new();
  idx = mn_input_u32(g, "idx", MN_SHAPE(1, 1, 1, 1, 1, 2));
  t = mn_parameter(g, "t", MN_SHAPE(10, 8));
  expect_fail(g, mn_embedding(g, idx, t), MN_ERR_SHAPE,
              "mn_embedding: indices is node 0 [1,1,1,1,1,2] u32 of rank 6, expected rank 1 to 5");

  g = mn_graph_new();
  t = mn_parameter(g, "t", MN_SHAPE(10, 8));
  expect_fail(g, mn_embedding(g, MN_NO_NODE, t), MN_ERR_INVALID_ARGUMENT,
              "mn_embedding: input 0 is MN_NO_NODE");
}

Test(transformer_errors, scatter_add) {
  mn_graph *g = mn_graph_new();
  mn_node idx = mn_input_u32(g, "idx", MN_SHAPE(2, 4)), src = mn_input(g, "s", MN_SHAPE(2, 3, 5));
  expect_fail(g, mn_scatter_add(g, idx, src, 7), MN_ERR_SHAPE,
              "mn_scatter_add: src is node 1 [2,3,5], expected the shape of indices node 0 "
              "[2,4] u32 plus a row dim");

  g = mn_graph_new();
  idx = mn_input_u32(g, "idx", MN_SHAPE(6));
  src = mn_input(g, "s", MN_SHAPE(6));
  expect_fail(g, mn_scatter_add(g, idx, src, 7), MN_ERR_SHAPE, "src is node 1 [6], expected");

  const int64_t bad_rows[] = {0, -3};
  const char *frags[] = {"mn_scatter_add: num_rows is 0, must be positive",
                         "mn_scatter_add: num_rows is -3, must be positive"};
  for (int i = 0; i < 2; i++) {
    g = mn_graph_new();
    idx = mn_input_u32(g, "idx", MN_SHAPE(6));
    src = mn_input(g, "s", MN_SHAPE(6, 5));
    expect_fail(g, mn_scatter_add(g, idx, src, bad_rows[i]), MN_ERR_INVALID_ARGUMENT, frags[i]);
  }

  g = mn_graph_new();
  idx = mn_input_u32(g, "idx", MN_SHAPE(6));
  src = mn_input(g, "s", MN_SHAPE(6, 5));
  expect_fail(g, mn_scatter_add(g, idx, src, INT64_MAX), MN_ERR_INVALID_ARGUMENT,
              "mn_scatter_add: num_rows 9223372036854775807 times the row width of src node 1 "
              "[6,5] overflows");

  g = mn_graph_new();
  idx = mn_input(g, "idx", MN_SHAPE(6));
  src = mn_input(g, "s", MN_SHAPE(6, 5));
  expect_fail(g, mn_scatter_add(g, idx, src, 3), MN_ERR_INVALID_ARGUMENT,
              "mn_scatter_add: indices is node 0 [6] with dtype f32, expected u32");

  g = mn_graph_new();
  idx = mn_input_u32(g, "idx", MN_SHAPE(6));
  src = mn_input_u32(g, "s", MN_SHAPE(6, 5));
  expect_fail(g, mn_scatter_add(g, idx, src, 3), MN_ERR_INVALID_ARGUMENT,
              "mn_scatter_add: src is node 1 [6,5] u32 with dtype u32, expected f32");

  g = mn_graph_new();
  idx = mn_input_u32(g, "idx", MN_SHAPE(6));
  expect_fail(g, mn_scatter_add(g, idx, MN_NO_NODE, 3), MN_ERR_INVALID_ARGUMENT,
              "mn_scatter_add: input 1 is MN_NO_NODE");
}

static mn_session *cpu_session(const mn_graph *g) {
  mn_session_options o = mn_session_options_default();
  o.backend = MN_BACKEND_CPU;
  mn_session *s = NULL;
  cr_assert_eq(mn_build_inference_session(g, &o, &s), MN_OK, "build: %s", mn_last_error());
  return s;
}

/* A bad index fails that step's wait with a message naming the position, the index and
 * the row count; the session then runs again once the indices are fixed. */
Test(transformer_errors, embedding_index_out_of_range) {
  mn_graph *g = mn_graph_new();
  mn_node idx = mn_input_u32(g, "idx", MN_SHAPE(2, 3));
  mn_node t = mn_parameter(g, "t", MN_SHAPE(4, 2));
  mn_node y = mn_embedding(g, idx, t);
  mn_set_outputs(g, &y, 1);
  mn_session *s = cpu_session(g);
  const float table[] = {0, 1, 10, 11, 20, 21, 30, 31};
  cr_assert_eq(mn_session_set_parameter(s, "t", table, 8), MN_OK);
  const uint32_t bad[] = {0, 1, 2, 3, 4, 0};
  cr_assert_eq(mn_session_set_input_u32(s, "idx", bad, 6), MN_OK);
  cr_assert_eq(mn_session_step(s), MN_OK, "%s", mn_last_error());
  mn_assert_error(mn_session_wait(s), MN_ERR_INVALID_ARGUMENT,
                  "index 4 at position 4 of the indices is out of range for a table of 4 rows");
  cr_assert(strstr(mn_last_error(), "embedding") != NULL, "%s", mn_last_error());

  const uint32_t good[] = {3, 3, 0, 2, 1, 0};
  cr_assert_eq(mn_session_set_input_u32(s, "idx", good, 6), MN_OK);
  cr_assert_eq(mn_session_step(s), MN_OK);
  cr_assert_eq(mn_session_wait(s), MN_OK, "%s", mn_last_error());
  float *out = mn_test_read_output(s, 0, 12);
  const float want[] = {30, 31, 30, 31, 0, 1, 20, 21, 10, 11, 0, 1};
  mn_assert_close(out, want, 12, 0);
  free(out);
  mn_session_free(s);
  mn_graph_free(g);
}

Test(transformer_errors, scatter_add_index_out_of_range) {
  mn_graph *g = mn_graph_new();
  mn_node idx = mn_input_u32(g, "idx", MN_SHAPE(3));
  mn_node src = mn_input(g, "src", MN_SHAPE(3, 2));
  mn_node y = mn_scatter_add(g, idx, src, 2);
  mn_set_outputs(g, &y, 1);
  mn_session *s = cpu_session(g);
  const float data[] = {1, 2, 3, 4, 5, 6};
  cr_assert_eq(mn_session_set_input(s, "src", data, 6), MN_OK);
  const uint32_t bad[] = {1, UINT32_MAX, 0};
  cr_assert_eq(mn_session_set_input_u32(s, "idx", bad, 3), MN_OK);
  cr_assert_eq(mn_session_step(s), MN_OK, "%s", mn_last_error());
  mn_assert_error(mn_session_wait(s), MN_ERR_INVALID_ARGUMENT,
                  "index 4294967295 at position 1 of the indices is out of range for an output "
                  "of 2 rows");
  cr_assert(strstr(mn_last_error(), "scatter_add") != NULL, "%s", mn_last_error());

  const uint32_t good[] = {1, 1, 0};
  cr_assert_eq(mn_session_set_input_u32(s, "idx", good, 3), MN_OK);
  cr_assert_eq(mn_session_step(s), MN_OK);
  cr_assert_eq(mn_session_wait(s), MN_OK, "%s", mn_last_error());
  float *out = mn_test_read_output(s, 0, 4);
  const float want[] = {5, 6, 4, 6};
  mn_assert_close(out, want, 4, 0);
  free(out);
  mn_session_free(s);
  mn_graph_free(g);
}
