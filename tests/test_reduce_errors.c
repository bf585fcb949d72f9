/* Reductions and losses: builder errors (status, message, sticky first error) and the
 * runtime error of an out-of-range label. */
#include <stdio.h>
#include <stdlib.h>

#include "tests/fixtures/reduce_fixtures.h"
#include "tests/support/mn_test.h"

typedef mn_node (*unary_builder)(mn_graph *, mn_node);
typedef mn_node (*binary_builder)(mn_graph *, mn_node, mn_node);

static const struct {
  const char *name;
  unary_builder f;
} unary[] = {{"mn_sum_all", mn_sum_all},
             {"mn_mean_all", mn_mean_all},
             {"mn_softmax", mn_softmax},
             {"mn_log_softmax", mn_log_softmax}};

/* The same-shape F32 losses; `a`, `b` are how messages name their operands. */
static const struct {
  const char *name, *a, *b;
  binary_builder f;
} losses[] = {{"mn_cross_entropy_loss", "logits", "target_probs", mn_cross_entropy_loss},
              {"mn_bce_loss", "pred", "target", mn_bce_loss},
              {"mn_mse_loss", "pred", "target", mn_mse_loss},
              {"mn_l1_loss", "pred", "target", mn_l1_loss}};

#define NUM(a) (sizeof(a) / sizeof((a)[0]))

/* Asserts the graph's error, then that later failing and valid builder calls alike
 * return MN_NO_NODE, add no node and leave the first message in place. */
static void assert_first_error(mn_graph *g, mn_status want, const char *fragment) {
  mn_assert_graph_error(g, want, fragment);
  char first[512];
  snprintf(first, sizeof first, "%s", mn_graph_error(g));
  size_t nodes = mn_graph_num_nodes(g);
  cr_assert_eq(mn_mse_loss(g, MN_NO_NODE, 12345), MN_NO_NODE);
  cr_assert_eq(mn_sum_all(g, 0), MN_NO_NODE);
  cr_assert_eq(mn_sparse_cross_entropy_loss(g, 0, 0), MN_NO_NODE);
  cr_assert_eq(mn_graph_status(g), want);
  cr_assert_str_eq(mn_graph_error(g), first);
  cr_assert_eq(mn_graph_num_nodes(g), nodes);
}

Test(reduce_errors, null_graph) {
  for (size_t i = 0; i < NUM(unary); i++) {
    cr_assert_eq(unary[i].f(NULL, 0), MN_NO_NODE);
    cr_assert(strstr(mn_last_error(), unary[i].name) && strstr(mn_last_error(), "graph is NULL"),
              "%s", mn_last_error());
  }
  for (size_t i = 0; i < NUM(losses); i++) {
    cr_assert_eq(losses[i].f(NULL, 0, 1), MN_NO_NODE);
    cr_assert(strstr(mn_last_error(), losses[i].name) && strstr(mn_last_error(), "graph is NULL"),
              "%s", mn_last_error());
  }
  cr_assert_eq(mn_sparse_cross_entropy_loss(NULL, 0, 1), MN_NO_NODE);
  cr_assert(strstr(mn_last_error(), "mn_sparse_cross_entropy_loss: graph is NULL"), "%s",
            mn_last_error());
}

Test(reduce_errors, no_node_inputs) {
  char want[128];
  for (size_t i = 0; i < NUM(unary); i++) {
    mn_graph *g = mn_graph_new();
    cr_assert_eq(unary[i].f(g, MN_NO_NODE), MN_NO_NODE);
    snprintf(want, sizeof want, "%s: input 0 is MN_NO_NODE", unary[i].name);
    assert_first_error(g, MN_ERR_INVALID_ARGUMENT, want);
    mn_graph_free(g);
  }
  for (size_t i = 0; i < NUM(losses); i++) {
    mn_graph *g = mn_graph_new();
    mn_node x = mn_input(g, "x", MN_SHAPE(4, 5));
    cr_assert_eq(losses[i].f(g, x, MN_NO_NODE), MN_NO_NODE);
    snprintf(want, sizeof want, "%s: input 1 is MN_NO_NODE", losses[i].name);
    assert_first_error(g, MN_ERR_INVALID_ARGUMENT, want);
    mn_graph_free(g);
  }
  mn_graph *g = mn_graph_new();
  mn_node lab = mn_input_u32(g, "lab", MN_SHAPE(4));
  cr_assert_eq(mn_sparse_cross_entropy_loss(g, MN_NO_NODE, lab), MN_NO_NODE);
  assert_first_error(g, MN_ERR_INVALID_ARGUMENT,
                     "mn_sparse_cross_entropy_loss: input 0 is MN_NO_NODE");
  mn_graph_free(g);
}

Test(reduce_errors, ids_out_of_range) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(4, 5));
  cr_assert_eq(mn_log_softmax(g, 7), MN_NO_NODE);
  assert_first_error(g, MN_ERR_INVALID_ARGUMENT,
                     "mn_log_softmax: input 0 is node 7, but the graph has 1 nodes");
  mn_graph_free(g);

  g = mn_graph_new();
  x = mn_input(g, "x", MN_SHAPE(4, 5));
  cr_assert_eq(mn_sparse_cross_entropy_loss(g, x, 99), MN_NO_NODE);
  assert_first_error(g, MN_ERR_INVALID_ARGUMENT,
                     "mn_sparse_cross_entropy_loss: input 1 is node 99, but the graph has 1");
  mn_graph_free(g);
}

Test(reduce_errors, unary_wrong_dtype) {
  char want[160];
  for (size_t i = 0; i < NUM(unary); i++) {
    mn_graph *g = mn_graph_new();
    mn_node x = mn_input_u32(g, "ids", MN_SHAPE(3));
    cr_assert_eq(unary[i].f(g, x), MN_NO_NODE);
    snprintf(want, sizeof want, "%s: x is node 0 [3] u32 with dtype u32, expected f32",
             unary[i].name);
    assert_first_error(g, MN_ERR_INVALID_ARGUMENT, want);
    mn_graph_free(g);
  }
}

Test(reduce_errors, losses_wrong_dtype) {
  char want[160];
  for (size_t i = 0; i < NUM(losses); i++) {
    mn_graph *g = mn_graph_new();
    mn_node a = mn_input(g, "a", MN_SHAPE(4, 5));
    mn_node b = mn_input_u32(g, "b", MN_SHAPE(4, 5));
    cr_assert_eq(losses[i].f(g, a, b), MN_NO_NODE);
    snprintf(want, sizeof want, "%s: %s is node 1 [4,5] u32 with dtype u32, expected f32",
             losses[i].name, losses[i].b);
    assert_first_error(g, MN_ERR_INVALID_ARGUMENT, want);
    mn_graph_free(g);

    g = mn_graph_new();
    a = mn_input(g, "a", MN_SHAPE(4, 5));
    b = mn_input_u32(g, "b", MN_SHAPE(4, 5));
    cr_assert_eq(losses[i].f(g, b, a), MN_NO_NODE);
    snprintf(want, sizeof want, "%s: %s is node 1 [4,5] u32 with dtype u32", losses[i].name,
             losses[i].a);
    assert_first_error(g, MN_ERR_INVALID_ARGUMENT, want);
    mn_graph_free(g);
  }
}

Test(reduce_errors, losses_shape_mismatch) {
  char want[200];
  for (size_t i = 0; i < NUM(losses); i++) {
    mn_graph *g = mn_graph_new();
    mn_node a = mn_input(g, "a", MN_SHAPE(4, 5));
    mn_node b = mn_input(g, "b", MN_SHAPE(4, 6));
    cr_assert_eq(losses[i].f(g, a, b), MN_NO_NODE);
    snprintf(want, sizeof want,
             "%s: %s is node 1 [4,6], expected [4,5] (the shape of %s node 0 [4,5])",
             losses[i].name, losses[i].b, losses[i].a);
    assert_first_error(g, MN_ERR_SHAPE, want);
    mn_graph_free(g);

    /* Same element count, different rank: still a mismatch. */
    g = mn_graph_new();
    a = mn_input(g, "a", MN_SHAPE(2, 3, 5));
    b = mn_input(g, "b", MN_SHAPE(6, 5));
    cr_assert_eq(losses[i].f(g, a, b), MN_NO_NODE);
    snprintf(want, sizeof want, "%s is node 1 [6,5], expected [2,3,5]", losses[i].b);
    assert_first_error(g, MN_ERR_SHAPE, want);
    mn_graph_free(g);
  }
}

Test(reduce_errors, sparse_wrong_dtypes) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(4, 5));
  mn_node lab = mn_input(g, "lab", MN_SHAPE(4));
  cr_assert_eq(mn_sparse_cross_entropy_loss(g, x, lab), MN_NO_NODE);
  assert_first_error(g, MN_ERR_INVALID_ARGUMENT,
                     "mn_sparse_cross_entropy_loss: labels is node 1 [4] with dtype f32, "
                     "expected u32");
  mn_graph_free(g);

  g = mn_graph_new();
  x = mn_input_u32(g, "x", MN_SHAPE(4, 5));
  lab = mn_input_u32(g, "lab", MN_SHAPE(4));
  cr_assert_eq(mn_sparse_cross_entropy_loss(g, x, lab), MN_NO_NODE);
  assert_first_error(g, MN_ERR_INVALID_ARGUMENT,
                     "mn_sparse_cross_entropy_loss: logits is node 0 [4,5] u32 with dtype u32");
  mn_graph_free(g);
}

static void check_sparse_shape(const int64_t *xs, int xr, const int64_t *ls, int lr,
                               const char *fragment) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", xs, xr);
  mn_node lab = mn_input_u32(g, "lab", ls, lr);
  cr_assert_eq(mn_sparse_cross_entropy_loss(g, x, lab), MN_NO_NODE);
  assert_first_error(g, MN_ERR_SHAPE, fragment);
  mn_graph_free(g);
}

Test(reduce_errors, sparse_label_shapes) {
  check_sparse_shape(MN_SHAPE(4, 5), MN_SHAPE(4, 1),
                     "mn_sparse_cross_entropy_loss: labels is node 1 [4,1] u32, expected [4] u32 "
                     "(the shape of logits node 0 [4,5] without its last dim)");
  check_sparse_shape(MN_SHAPE(4, 5), MN_SHAPE(5), "labels is node 1 [5] u32, expected [4] u32");
  check_sparse_shape(MN_SHAPE(5), MN_SHAPE(2), "labels is node 1 [2] u32, expected [1] u32");
  check_sparse_shape(MN_SHAPE(2, 3, 5), MN_SHAPE(6),
                     "labels is node 1 [6] u32, expected [2,3] u32 (the shape of logits node 0 "
                     "[2,3,5]");
  check_sparse_shape(MN_SHAPE(2, 3, 5), MN_SHAPE(2, 3, 5),
                     "labels is node 1 [2,3,5] u32, expected [2,3] u32");
  check_sparse_shape(MN_SHAPE(2, 3, 5), MN_SHAPE(3, 2),
                     "labels is node 1 [3,2] u32, expected [2,3] u32");
}

/* A first error from a different builder stays even when a reduction fails later. */
Test(reduce_errors, earlier_error_is_kept) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(4, 5));
  cr_assert_eq(mn_matmul(g, x, x), MN_NO_NODE);
  char first[512];
  snprintf(first, sizeof first, "%s", mn_graph_error(g));
  cr_assert_eq(mn_softmax(g, x), MN_NO_NODE);
  cr_assert_eq(mn_cross_entropy_loss(g, x, 42), MN_NO_NODE);
  cr_assert_str_eq(mn_graph_error(g), first);
  cr_assert_eq(mn_graph_num_nodes(g), 1);
  mn_graph_free(g);
}

/* Builds logits [shape..., C] and labels [shape...] for a session, fails the test on
 * any error, and returns the session with the labels not yet fed. */
static mn_session *sparse_session(mn_graph **gp, const int64_t *xs, int xr, const int64_t *ls,
                                  int lr, const float *logits) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", xs, xr);
  mn_node lab = mn_input_u32(g, "lab", ls, lr);
  mn_node y = mn_sparse_cross_entropy_loss(g, x, lab);
  mn_set_outputs(g, &y, 1);
  cr_assert_eq(mn_graph_status(g), MN_OK, "%s", mn_graph_error(g));
  mn_session_options o = mn_session_options_default();
  o.backend = MN_BACKEND_CPU;
  mn_session *s = NULL;
  cr_assert_eq(mn_build_inference_session(g, &o, &s), MN_OK, "%s", mn_last_error());
  size_t n = 1;
  for (int i = 0; i < xr; i++)
    n *= (size_t)xs[i];
  cr_assert_eq(mn_session_set_input(s, "x", logits, n), MN_OK, "%s", mn_last_error());
  *gp = g;
  return s;
}

static void step_expecting_label_error(mn_session *s, const uint32_t *labels, size_t n,
                                       const char *fragment) {
  cr_assert_eq(mn_session_set_input_u32(s, "lab", labels, n), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_step(s), MN_OK, "%s", mn_last_error());
  mn_assert_error(mn_session_wait(s), MN_ERR_INVALID_ARGUMENT, fragment);
  cr_assert(strstr(mn_last_error(), "sparse_cross_entropy_loss"), "%s", mn_last_error());
}

Test(reduce_errors, label_out_of_range_rank3) {
  mn_graph *g;
  mn_session *s = sparse_session(&g, MN_SHAPE(2, 3, 37), MN_SHAPE(2, 3), rd_x_2x3x37);
  uint32_t bad[6];
  memcpy(bad, rd_lab_2x3, sizeof bad);
  bad[5] = 37;
  step_expecting_label_error(s, bad, 6,
                             "label 37 at [1,2] (position 5) of labels node 1 [2,3] u32 is out "
                             "of range: logits node 0 [2,3,37] has C = 37 classes");
  bad[5] = rd_lab_2x3[5];
  bad[0] = UINT32_MAX;
  step_expecting_label_error(s, bad, 6, "label 4294967295 at [0,0] (position 0)");

  /* The error does not stick: valid labels give the right loss on the next step. */
  cr_assert_eq(mn_session_set_input_u32(s, "lab", rd_lab_2x3, 6), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_step(s), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_wait(s), MN_OK, "%s", mn_last_error());
  float loss;
  cr_assert_eq(mn_session_read_output_by_index(s, 0, &loss, 1), MN_OK, "%s", mn_last_error());
  mn_assert_close(&loss, rd_sce_2x3x37, 1, 1e-6);
  mn_session_free(s);
  mn_graph_free(g);
}

Test(reduce_errors, label_out_of_range_single_class) {
  mn_graph *g;
  mn_session *s = sparse_session(&g, MN_SHAPE(5, 1), MN_SHAPE(5), rd_x_5x1);
  const uint32_t bad[5] = {0, 0, 1, 0, 0};
  step_expecting_label_error(s, bad, 5, "label 1 at [2] (position 2)");
  cr_assert(strstr(mn_last_error(), "C = 1 classes"), "%s", mn_last_error());
  mn_session_free(s);
  mn_graph_free(g);
}

Test(reduce_errors, label_out_of_range_rank1_logits) {
  mn_graph *g;
  mn_session *s = sparse_session(&g, MN_SHAPE(37), MN_SHAPE(1), rd_x_37);
  const uint32_t bad[1] = {100};
  step_expecting_label_error(s, bad, 1, "label 100 at [0] (position 0)");
  mn_session_free(s);
  mn_graph_free(g);
}
