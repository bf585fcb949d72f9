/* The graph builder core: leaves, outputs, inspection, sticky errors, toposort, types and
 * statuses. Every error path asserts the status, a fragment of the message, and that the
 * graph gained no node. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#endif
#include <stdlib.h>
#include <time.h>

#include "host/graph.h"
#include "tests/support/mn_test.h"

#define LEN(a) (sizeof(a) / sizeof((a)[0]))

/* Asserts that a builder failed with `want` and `fragment` and added no node. */
#define assert_build_fails(g, call, want, fragment)                                                \
  do {                                                                                             \
    size_t nodes_before_ = mn_graph_num_nodes(g);                                                  \
    mn_node got_ = (call);                                                                         \
    cr_assert_eq(got_, MN_NO_NODE, "%s returned node %u", #call, got_);                            \
    mn_assert_graph_error(g, want, fragment);                                                      \
    mn_assert_error(mn_graph_status(g), want, fragment);                                           \
    cr_assert_eq(mn_graph_num_nodes(g), nodes_before_, "%s added a node", #call);                  \
  } while (0)

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

Test(graph, mlp_forward_runs_on_cpu) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(2, 3));
  mn_node w = mn_parameter(g, "w", MN_SHAPE(3, 2));
  mn_node y = mn_matmul(g, x, w);
  mn_set_outputs(g, &y, 1);
  float xd[] = {1, 2, 3, 4, 5, 6}, wd[] = {1, 0, 0, 1, 1, 1};
  mn_test_feed feeds[] = {{"x", xd, NULL, 6, false}, {"w", wd, NULL, 6, true}};
  mn_session *s = mn_test_run(g, feeds, 2);
  float *out = mn_test_read_output(s, 0, 4);
  float want[] = {4, 5, 10, 11};
  mn_assert_close(out, want, 4, 0);
  free(out);
  mn_session_free(s);
  mn_graph_free(g);
}

/* ---------------------------------------------------------------- graph object */

Test(graph, new_graph_is_empty_and_ok) {
  mn_graph *g = mn_graph_new();
  cr_assert_not_null(g);
  cr_assert_eq(mn_graph_status(g), MN_OK);
  cr_assert_str_eq(mn_graph_error(g), "");
  cr_assert_eq(mn_graph_num_nodes(g), 0);
  const mn_node *outs = (const mn_node *)&outs;
  cr_assert_eq(mn_graph_outputs(g, &outs), 0);
  cr_assert_null(outs);
  mn_graph_free(g);
  mn_graph_free(NULL);
}

Test(graph, null_graph_queries) {
  cr_assert_eq(mn_graph_status(NULL), MN_ERR_INVALID_ARGUMENT);
  cr_assert(strstr(mn_graph_error(NULL), "NULL") != NULL);
  cr_assert_eq(mn_graph_num_nodes(NULL), 0);
  const mn_node *outs = (const mn_node *)&outs;
  cr_assert_eq(mn_graph_outputs(NULL, &outs), 0);
  cr_assert_null(outs);
  cr_assert_eq(mn_graph_outputs(NULL, NULL), 0);
}

/* ---------------------------------------------------------------- leaves */

typedef mn_node (*named_leaf_fn)(mn_graph *, const char *, const int64_t *, int);
static const named_leaf_fn leaf_fns[] = {mn_input, mn_input_u32, mn_parameter};
static const char *const leaf_names[] = {"mn_input", "mn_input_u32", "mn_parameter"};

Test(graph, leaves_null_graph) {
  for (size_t i = 0; i < LEN(leaf_fns); i++) {
    cr_assert_eq(leaf_fns[i](NULL, "x", MN_SHAPE(2)), MN_NO_NODE);
    mn_assert_error(MN_ERR_INVALID_ARGUMENT, MN_ERR_INVALID_ARGUMENT, leaf_names[i]);
    mn_assert_error(MN_ERR_INVALID_ARGUMENT, MN_ERR_INVALID_ARGUMENT, "graph is NULL");
  }
  float one = 1;
  cr_assert_eq(mn_constant(NULL, &one, MN_SHAPE(1)), MN_NO_NODE);
  mn_assert_error(MN_ERR_INVALID_ARGUMENT, MN_ERR_INVALID_ARGUMENT, "mn_constant: graph is NULL");
  cr_assert_eq(mn_scalar(NULL, 1.0f), MN_NO_NODE);
  mn_assert_error(MN_ERR_INVALID_ARGUMENT, MN_ERR_INVALID_ARGUMENT, "graph is NULL");
}

Test(graph, leaves_null_and_empty_names) {
  for (size_t i = 0; i < LEN(leaf_fns); i++) {
    mn_graph *g = mn_graph_new();
    assert_build_fails(g, leaf_fns[i](g, NULL, MN_SHAPE(2)), MN_ERR_INVALID_ARGUMENT,
                       "name is NULL");
    mn_assert_graph_error(g, MN_ERR_INVALID_ARGUMENT, leaf_names[i]);
    mn_graph_free(g);
    g = mn_graph_new();
    assert_build_fails(g, leaf_fns[i](g, "", MN_SHAPE(2)), MN_ERR_INVALID_ARGUMENT,
                       "name is empty");
    mn_graph_free(g);
  }
}

Test(graph, leaves_duplicate_names) {
  /* Inputs and parameters share one namespace: a session finds them by name. */
  for (size_t i = 0; i < LEN(leaf_fns); i++) {
    for (size_t j = 0; j < LEN(leaf_fns); j++) {
      mn_graph *g = mn_graph_new();
      mn_node first = leaf_fns[i](g, "layer.weight", MN_SHAPE(2, 2));
      cr_assert_eq(first, 0);
      assert_build_fails(g, leaf_fns[j](g, "layer.weight", MN_SHAPE(3)), MN_ERR_INVALID_ARGUMENT,
                         "name \"layer.weight\" is already used by node 0");
      mn_assert_graph_error(g, MN_ERR_INVALID_ARGUMENT, leaf_names[j]);
      mn_graph_free(g);
    }
  }
}

Test(graph, leaves_rank_errors) {
  int64_t dims[MN_MAX_RANK + 1] = {1, 1, 1, 1, 1, 1, 1};
  for (size_t i = 0; i < LEN(leaf_fns); i++) {
    mn_graph *g = mn_graph_new();
    assert_build_fails(g, leaf_fns[i](g, "x", dims, 0), MN_ERR_SHAPE,
                       "\"x\": rank 0, must be 1 to 6");
    mn_graph_free(g);
    g = mn_graph_new();
    assert_build_fails(g, leaf_fns[i](g, "x", dims, MN_MAX_RANK + 1), MN_ERR_SHAPE,
                       "\"x\": rank 7, must be 1 to 6");
    mn_graph_free(g);
    g = mn_graph_new();
    assert_build_fails(g, leaf_fns[i](g, "x", dims, -1), MN_ERR_SHAPE, "rank -1");
    mn_graph_free(g);
    g = mn_graph_new();
    cr_assert_neq(leaf_fns[i](g, "x", dims, MN_MAX_RANK), MN_NO_NODE, "%s", mn_last_error());
    mn_graph_free(g);
  }
}

Test(graph, leaves_null_shape_and_bad_dims) {
  for (size_t i = 0; i < LEN(leaf_fns); i++) {
    mn_graph *g = mn_graph_new();
    assert_build_fails(g, leaf_fns[i](g, "x", NULL, 2), MN_ERR_INVALID_ARGUMENT,
                       "\"x\": shape is NULL");
    mn_graph_free(g);
    g = mn_graph_new();
    assert_build_fails(g, leaf_fns[i](g, "x", MN_SHAPE(4, 0)), MN_ERR_SHAPE,
                       "\"x\": dimension 1 is 0, must be >= 1");
    mn_assert_graph_error(g, MN_ERR_SHAPE, leaf_names[i]);
    mn_graph_free(g);
    g = mn_graph_new();
    assert_build_fails(g, leaf_fns[i](g, "x", MN_SHAPE(-3)), MN_ERR_SHAPE,
                       "dimension 0 is -3, must be >= 1");
    mn_graph_free(g);
    g = mn_graph_new();
    assert_build_fails(g, leaf_fns[i](g, "x", MN_SHAPE(1 << 30, 1 << 30, 1 << 30)), MN_ERR_SHAPE,
                       "\"x\": more than");
    mn_graph_free(g);
  }
}

Test(graph, constant_errors) {
  float data[4] = {1, 2, 3, 4};
  mn_graph *g = mn_graph_new();
  assert_build_fails(g, mn_constant(g, NULL, MN_SHAPE(4)), MN_ERR_INVALID_ARGUMENT,
                     "mn_constant: data is NULL");
  mn_graph_free(g);
  g = mn_graph_new();
  assert_build_fails(g, mn_constant(g, data, NULL, 1), MN_ERR_INVALID_ARGUMENT,
                     "mn_constant: \"(constant)\": shape is NULL");
  mn_graph_free(g);
  g = mn_graph_new();
  assert_build_fails(g, mn_constant(g, data, MN_SHAPE(2, -2)), MN_ERR_SHAPE,
                     "mn_constant: \"(constant)\": dimension 1 is -2");
  mn_graph_free(g);
  g = mn_graph_new();
  const int64_t four[] = {4};
  assert_build_fails(g, mn_constant(g, data, four, 0), MN_ERR_SHAPE,
                     "mn_constant: \"(constant)\": rank 0");
  mn_graph_free(g);
}

Test(graph, constant_copies_data_and_scalar_is_one_element) {
  float data[3] = {1.5f, -2, 4};
  mn_graph *g = mn_graph_new();
  mn_node c = mn_constant(g, data, MN_SHAPE(3, 1));
  mn_node s = mn_scalar(g, 0.25f);
  data[0] = 100; /* the graph holds its own copy */
  mn_node y = mn_bias_add(g, c, s);
  mn_set_outputs(g, &y, 1);
  mn_node_info info;
  cr_assert_eq(mn_graph_node(g, s, &info), MN_OK);
  cr_assert_str_eq(info.op, "constant");
  cr_assert_null(info.name);
  cr_assert_eq(info.num_inputs, 0);
  cr_assert_eq(info.type.rank, 1);
  cr_assert_eq(info.type.shape[0], 1);
  cr_assert_eq(info.type.dtype, MN_F32);
  mn_session *sess = mn_test_run(g, NULL, 0);
  float *out = mn_test_read_output(sess, 0, 3);
  float want[] = {1.75f, -1.75f, 4.25f};
  mn_assert_close(out, want, 3, 0);
  free(out);
  mn_session_free(sess);
  mn_graph_free(g);
}

/* ---------------------------------------------------------------- sticky error */

Test(graph, sticky_error_keeps_the_first_message) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(2, 3));
  mn_node w = mn_parameter(g, "w", MN_SHAPE(4, 5));
  mn_node bad = mn_matmul(g, x, w);
  cr_assert_eq(bad, MN_NO_NODE);
  const char *first = "mn_matmul: node 0 [2,3] x node 1 [4,5]: inner dimensions 3 and 4 differ";
  cr_assert_str_eq(mn_graph_error(g), first);
  cr_assert_str_eq(mn_last_error(), first);

  /* Builders that get MN_NO_NODE, and builders on valid nodes, return MN_NO_NODE and
   * leave the message alone; the thread's last error is the graph's first failure. */
  cr_assert_eq(mn_relu(g, bad), MN_NO_NODE);
  cr_assert_eq(mn_add(g, bad, x), MN_NO_NODE);
  cr_assert_eq(mn_matmul(g, bad, bad), MN_NO_NODE);
  cr_assert_eq(mn_scale(g, x, 2.0f), MN_NO_NODE);
  cr_assert_eq(mn_input(g, "y", MN_SHAPE(3)), MN_NO_NODE);
  cr_assert_eq(mn_input(g, NULL, MN_SHAPE(3)), MN_NO_NODE);
  cr_assert_eq(mn_scalar(g, 1.0f), MN_NO_NODE);
  mn_set_outputs(g, &x, 1);
  cr_assert_eq(mn_graph_num_nodes(g), 2);
  cr_assert_eq(mn_graph_outputs(g, NULL), 0);
  cr_assert_eq(mn_graph_status(g), MN_ERR_SHAPE);
  cr_assert_str_eq(mn_graph_error(g), first);
  cr_assert_str_eq(mn_last_error(), first);

  mn_session *s = (mn_session *)&s;
  mn_assert_error(mn_build_inference_session(g, NULL, &s), MN_ERR_SHAPE,
                  "mn_build_inference_session: graph is in error: mn_matmul: node 0 [2,3] x "
                  "node 1 [4,5]: inner dimensions 3 and 4 differ");
  cr_assert_null(s);
  cr_assert_null(mn_graph_toposort(g));
  cr_assert_str_eq(mn_last_error(), first);
  mn_graph_free(g);
}

Test(graph, no_node_on_a_healthy_graph_records_an_error) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(3));
  assert_build_fails(g, mn_add(g, x, MN_NO_NODE), MN_ERR_INVALID_ARGUMENT,
                     "mn_add: input 1 is MN_NO_NODE");
  mn_graph_free(g);
  g = mn_graph_new();
  x = mn_input(g, "x", MN_SHAPE(3));
  assert_build_fails(g, mn_mul(g, x, 7), MN_ERR_INVALID_ARGUMENT,
                     "mn_mul: input 1 is node 7, but the graph has 1 nodes");
  mn_graph_free(g);
}

Test(graph, builders_on_a_null_graph) {
  cr_assert_eq(mn_relu(NULL, 0), MN_NO_NODE);
  mn_assert_error(MN_ERR_INVALID_ARGUMENT, MN_ERR_INVALID_ARGUMENT, "mn_relu: graph is NULL");
  cr_assert_eq(mn_matmul(NULL, 0, 1), MN_NO_NODE);
  mn_assert_error(MN_ERR_INVALID_ARGUMENT, MN_ERR_INVALID_ARGUMENT, "mn_matmul: graph is NULL");
  mn_set_outputs(NULL, NULL, 0);
  mn_assert_error(MN_ERR_INVALID_ARGUMENT, MN_ERR_INVALID_ARGUMENT,
                  "mn_set_outputs: graph is NULL");
}

/* ---------------------------------------------------------------- outputs, inspection */

Test(graph, set_outputs_errors) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(3));
  mn_node y = mn_relu(g, x);
  mn_set_outputs(g, &y, 1);
  mn_set_outputs(g, NULL, 2);
  mn_assert_graph_error(g, MN_ERR_INVALID_ARGUMENT, "mn_set_outputs: outputs is NULL with n = 2");
  const mn_node *outs = NULL;
  cr_assert_eq(mn_graph_outputs(g, &outs), 1);
  cr_assert_eq(outs[0], y);
  mn_graph_free(g);

  g = mn_graph_new();
  x = mn_input(g, "x", MN_SHAPE(3));
  y = mn_relu(g, x);
  mn_set_outputs(g, &y, 1);
  mn_node bad[] = {y, 2};
  mn_set_outputs(g, bad, 2);
  mn_assert_graph_error(g, MN_ERR_INVALID_ARGUMENT,
                        "mn_set_outputs: output 1 is node 2, but the graph has 2 nodes");
  mn_assert_error(mn_graph_status(g), MN_ERR_INVALID_ARGUMENT, "output 1 is node 2");
  cr_assert_eq(mn_graph_outputs(g, &outs), 1);
  cr_assert_eq(outs[0], y);
  mn_graph_free(g);

  g = mn_graph_new();
  x = mn_input(g, "x", MN_SHAPE(3));
  mn_node none = MN_NO_NODE;
  mn_set_outputs(g, &none, 1);
  mn_assert_graph_error(g, MN_ERR_INVALID_ARGUMENT, "output 0 is node 4294967295");
  cr_assert_eq(mn_graph_outputs(g, NULL), 0);
  mn_graph_free(g);
}

Test(graph, set_outputs_copies_and_replaces) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(3));
  mn_node outs[] = {mn_relu(g, x), mn_neg(g, x), x};
  mn_set_outputs(g, outs, 3);
  outs[0] = 0; /* the graph keeps its own copy */
  const mn_node *got = NULL;
  cr_assert_eq(mn_graph_outputs(g, &got), 3);
  cr_assert_eq(got[0], 1);
  cr_assert_eq(got[1], 2);
  cr_assert_eq(got[2], 0);
  cr_assert_eq(mn_graph_outputs(g, NULL), 3);
  mn_set_outputs(g, NULL, 0);
  cr_assert_eq(mn_graph_status(g), MN_OK);
  cr_assert_eq(mn_graph_outputs(g, &got), 0);
  mn_graph_free(g);
}

Test(graph, node_info_fields) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(2, 3));
  mn_node idx = mn_input_u32(g, "idx", MN_SHAPE(5));
  mn_node w = mn_parameter(g, "layer.weight", MN_SHAPE(4, 3));
  mn_node y = mn_matmul_bt(g, x, w);
  cr_assert_eq(mn_graph_num_nodes(g), 4);

  mn_node_info info;
  cr_assert_eq(mn_graph_node(g, x, &info), MN_OK);
  cr_assert_eq(info.id, x);
  cr_assert_str_eq(info.op, "input");
  cr_assert_str_eq(info.name, "x");
  cr_assert_eq(info.num_inputs, 0);
  cr_assert_eq(info.type.dtype, MN_F32);
  cr_assert_eq(info.type.rank, 2);
  cr_assert(info.type.shape[0] == 2 && info.type.shape[1] == 3);

  cr_assert_eq(mn_graph_node(g, idx, &info), MN_OK);
  cr_assert_str_eq(info.op, "input");
  cr_assert_eq(info.type.dtype, MN_U32);

  cr_assert_eq(mn_graph_node(g, w, &info), MN_OK);
  cr_assert_str_eq(info.op, "parameter");
  cr_assert_str_eq(info.name, "layer.weight");

  cr_assert_eq(mn_graph_node(g, y, &info), MN_OK);
  cr_assert_eq(info.id, y);
  cr_assert_str_eq(info.op, "matmul_bt");
  cr_assert_null(info.name);
  cr_assert_eq(info.num_inputs, 2);
  cr_assert_eq(info.inputs[0], x);
  cr_assert_eq(info.inputs[1], w);
  cr_assert_eq(info.type.rank, 2);
  cr_assert(info.type.shape[0] == 2 && info.type.shape[1] == 4);
  mn_graph_free(g);
}

Test(graph, node_errors) {
  mn_node_info info = {.id = 77};
  mn_assert_error(mn_graph_node(NULL, 0, &info), MN_ERR_INVALID_ARGUMENT,
                  "mn_graph_node: graph is NULL");
  mn_graph *g = mn_graph_new();
  mn_input(g, "x", MN_SHAPE(3));
  mn_assert_error(mn_graph_node(g, 0, NULL), MN_ERR_INVALID_ARGUMENT, "mn_graph_node: out is NULL");
  mn_assert_error(mn_graph_node(g, 1, &info), MN_ERR_NOT_FOUND,
                  "mn_graph_node: node 1 out of range (graph has 1 nodes)");
  mn_assert_error(mn_graph_node(g, MN_NO_NODE, &info), MN_ERR_NOT_FOUND, "node 4294967295");
  cr_assert_eq(info.id, 77, "a failed call wrote into out");
  /* Inspection errors are not builder errors: the graph stays healthy. */
  cr_assert_eq(mn_graph_status(g), MN_OK);
  mn_graph_free(g);
}

/* ---------------------------------------------------------------- toposort */

Test(graph, toposort_removes_dead_nodes_and_keeps_leaves) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(3));                 /* 0 */
  mn_node unused_in = mn_input(g, "unused", MN_SHAPE(2));    /* 1: kept, interface */
  mn_node w = mn_parameter(g, "w", MN_SHAPE(3));             /* 2 */
  mn_node unused_p = mn_parameter(g, "frozen", MN_SHAPE(4)); /* 3: kept, interface */
  mn_node dead_c = mn_scalar(g, 3.0f);                       /* 4: dead */
  mn_node dead = mn_exp(g, x);                               /* 5: dead */
  mn_node dead2 = mn_neg(g, dead);                           /* 6: dead */
  mn_node y = mn_mul(g, x, w);                               /* 7 */
  mn_node z = mn_relu(g, y);                                 /* 8 */
  (void)unused_in, (void)unused_p, (void)dead_c, (void)dead2;
  mn_node outs[] = {z, y};
  mn_set_outputs(g, outs, 2);

  mn_graph *s = mn_graph_toposort(g);
  cr_assert_not_null(s, "%s", mn_last_error());
  cr_assert_eq(mn_graph_status(s), MN_OK);
  cr_assert_eq(mn_graph_num_nodes(s), 6);
  bool seen_unused = false, seen_frozen = false;
  for (mn_node i = 0; i < 6; i++) {
    mn_node_info info;
    cr_assert_eq(mn_graph_node(s, i, &info), MN_OK);
    cr_assert_str_neq(info.op, "constant");
    cr_assert_str_neq(info.op, "exp");
    cr_assert_str_neq(info.op, "neg");
    for (int k = 0; k < info.num_inputs; k++)
      cr_assert_lt(info.inputs[k], i, "node %u reads node %u", i, info.inputs[k]);
    if (info.name && strcmp(info.name, "unused") == 0) seen_unused = true;
    if (info.name && strcmp(info.name, "frozen") == 0) seen_frozen = true;
  }
  cr_assert(seen_unused && seen_frozen, "unused named leaves were dropped");

  const mn_node *o = NULL;
  cr_assert_eq(mn_graph_outputs(s, &o), 2);
  mn_node_info oi;
  cr_assert_eq(mn_graph_node(s, o[0], &oi), MN_OK);
  cr_assert_str_eq(oi.op, "relu");
  cr_assert_eq(mn_graph_node(s, oi.inputs[0], &oi), MN_OK);
  cr_assert_str_eq(oi.op, "mul");
  cr_assert_eq(o[1], oi.id);
  /* The source graph is untouched. */
  cr_assert_eq(mn_graph_num_nodes(g), 9);
  mn_graph_free(s);
  mn_graph_free(g);
}

Test(graph, toposort_without_outputs_keeps_everything) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(3));
  mn_relu(g, x);
  mn_scalar(g, 1.0f);
  mn_graph *s = mn_graph_toposort(g);
  cr_assert_not_null(s);
  cr_assert_eq(mn_graph_num_nodes(s), 3);
  cr_assert_eq(mn_graph_outputs(s, NULL), 0);
  mn_graph_free(s);
  mn_graph_free(g);

  g = mn_graph_new();
  s = mn_graph_toposort(g);
  cr_assert_not_null(s);
  cr_assert_eq(mn_graph_num_nodes(s), 0);
  mn_graph_free(s);
  mn_graph_free(g);
}

Test(graph, toposort_null_graph) {
  cr_assert_null(mn_graph_toposort(NULL));
  mn_assert_error(MN_ERR_INVALID_ARGUMENT, MN_ERR_INVALID_ARGUMENT,
                  "mn_graph_toposort: graph is NULL");
}

/* An optimizer rewrite can make node 1 read a node appended after it. Built through the
 * internal API: relu (node 1) is rewired to read exp (node 2). */
Test(graph, toposort_orders_inputs_appended_later) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(3));
  mn_node r = mn_relu(g, x);
  mn_node e = mn_exp(g, x);
  mn_node n = mn_neg(g, r);
  cr_assert_eq(r, 1);
  cr_assert_eq(e, 2);
  g->nodes[r].inputs[0] = e;
  mn_set_outputs(g, &n, 1);

  mn_graph *s = mn_graph_toposort(g);
  cr_assert_not_null(s, "%s", mn_last_error());
  cr_assert_eq(mn_graph_num_nodes(s), 4);
  const char *want[] = {"input", "exp", "relu", "neg"};
  for (mn_node i = 0; i < 4; i++) {
    mn_node_info info;
    cr_assert_eq(mn_graph_node(s, i, &info), MN_OK);
    cr_assert_str_eq(info.op, want[i]);
    if (i) cr_assert_eq(info.inputs[0], i - 1);
  }
  mn_graph_free(s);

  /* The session sorts too: out = -relu(exp(x)). */
  float xd[] = {0, 1, -1};
  mn_test_feed feeds[] = {{"x", xd, NULL, 3, false}};
  mn_session *sess = mn_test_run(g, feeds, 1);
  float *out = mn_test_read_output(sess, 0, 3);
  float expect[] = {-1.0f, -2.718281828f, -0.367879441f};
  mn_assert_close(out, expect, 3, 1e-7);
  free(out);
  mn_session_free(sess);
  mn_graph_free(g);
}

Test(graph, toposort_reports_a_cycle) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(3));
  mn_node a = mn_relu(g, x);
  mn_node b = mn_neg(g, a);
  mn_node c = mn_exp(g, b);
  g->nodes[a].inputs[0] = c; /* a -> c -> b -> a */
  mn_set_outputs(g, &c, 1);
  cr_assert_null(mn_graph_toposort(g));
  mn_assert_error(MN_ERR_INVALID_ARGUMENT, MN_ERR_INVALID_ARGUMENT, "depends on itself");
  mn_assert_error(MN_ERR_INVALID_ARGUMENT, MN_ERR_INVALID_ARGUMENT, "mn_graph_toposort:");

  mn_session *s = (mn_session *)&s;
  mn_assert_error(mn_build_inference_session(g, NULL, &s), MN_ERR_INVALID_ARGUMENT,
                  "depends on itself");
  cr_assert_null(s);

  /* A self-loop. */
  g->nodes[a].inputs[0] = a;
  mn_set_outputs(g, &a, 1);
  cr_assert_null(mn_graph_toposort(g));
  mn_assert_error(MN_ERR_INVALID_ARGUMENT, MN_ERR_INVALID_ARGUMENT, "node 1 (relu) depends on");
  mn_graph_free(g);
}

#define CHAIN 200000

Test(graph, toposort_is_linear_on_a_long_chain) {
  mn_graph *g = mn_graph_new();
  mn_node cur = mn_input(g, "x", MN_SHAPE(1));
  for (int i = 0; i < CHAIN; i++)
    cur = (i & 1) ? mn_neg(g, cur) : mn_relu(g, cur);
  cr_assert_neq(cur, MN_NO_NODE, "%s", mn_graph_error(g));
  mn_set_outputs(g, &cur, 1);
  double t0 = now_seconds();
  mn_graph *s = mn_graph_toposort(g);
  double dt = now_seconds() - t0;
  cr_assert_not_null(s, "%s", mn_last_error());
  cr_assert_eq(mn_graph_num_nodes(s), CHAIN + 1);
  /* Quadratic work on 200,000 nodes takes minutes; linear takes milliseconds. */
  cr_assert_lt(dt, 1.0, "toposort of %d nodes took %.3f s", CHAIN + 1, dt);
  mn_graph_free(s);
  mn_graph_free(g);
}

Test(graph, toposort_is_linear_on_a_reversed_chain) {
  /* Ids in reverse dependency order: node i reads node i + 1, the input is last. Both a
   * deep DFS and a scan in id order that repeats until nothing moves would be slow or
   * overflow here. */
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(1));
  mn_tensor_type t = g->nodes[x].type;
  for (int i = 0; i < CHAIN; i++) {
    mn_node in = 0;
    cr_assert_neq(mn_graph_append(g, MN_OP_RELU, &in, 1, &t, NULL, NULL), MN_NO_NODE);
  }
  /* Rewire: node k (k >= 1) reads node k + 1; the last reads the input, node 0. */
  for (size_t k = 1; k < g->num_nodes; k++)
    g->nodes[k].inputs[0] = (k + 1 < g->num_nodes) ? (mn_node)(k + 1) : 0;
  mn_node out = 1;
  mn_set_outputs(g, &out, 1);
  double t0 = now_seconds();
  mn_graph *s = mn_graph_toposort(g);
  double dt = now_seconds() - t0;
  cr_assert_not_null(s, "%s", mn_last_error());
  cr_assert_eq(mn_graph_num_nodes(s), CHAIN + 1);
  for (mn_node i = 1; i <= CHAIN; i++)
    cr_assert_eq(s->nodes[i].inputs[0], i - 1);
  const mn_node *o = NULL;
  mn_graph_outputs(s, &o);
  cr_assert_eq(o[0], CHAIN);
  cr_assert_lt(dt, 1.0, "toposort of %d nodes took %.3f s", CHAIN + 1, dt);
  mn_graph_free(s);
  mn_graph_free(g);
}

/* ---------------------------------------------------------------- types and statuses */

Test(graph, dtype_sizes) {
  cr_assert_eq(mn_dtype_size(MN_F32), 4);
  cr_assert_eq(mn_dtype_size(MN_U32), 4);
  cr_assert_eq(mn_dtype_size(MN_BF16), 2);
  cr_assert_eq(mn_dtype_size(MN_F16), 2);
  cr_assert_eq(mn_dtype_size((mn_dtype)99), 0);
}

Test(graph, tensor_type_numel_and_bytes) {
  mn_tensor_type t = {.dtype = MN_F32, .rank = 3, .shape = {2, 3, 5}};
  cr_assert_eq(mn_tensor_type_numel(&t), 30);
  cr_assert_eq(mn_tensor_type_bytes(&t), 120);
  t.dtype = MN_BF16;
  cr_assert_eq(mn_tensor_type_bytes(&t), 60);
  t.dtype = MN_U32;
  t.rank = 1;
  cr_assert_eq(mn_tensor_type_numel(&t), 2);
  cr_assert_eq(mn_tensor_type_bytes(&t), 8);
  t.rank = 0; /* a scalar: the empty product */
  cr_assert_eq(mn_tensor_type_numel(&t), 1);
  t.rank = MN_MAX_RANK + 1;
  cr_assert_eq(mn_tensor_type_numel(&t), 0);
  t.rank = -1;
  cr_assert_eq(mn_tensor_type_numel(&t), 0);
  cr_assert_eq(mn_tensor_type_numel(NULL), 0);
  cr_assert_eq(mn_tensor_type_bytes(NULL), 0);
}

Test(graph, shape_macro) {
  const int64_t *shape;
  int rank;
#define CAPTURE_(s, r) (shape = (s), rank = (r))
#define CAPTURE(...)   CAPTURE_(__VA_ARGS__)
  CAPTURE(MN_SHAPE(32, 784));
  cr_assert_eq(rank, 2);
  cr_assert(shape[0] == 32 && shape[1] == 784);
  CAPTURE(MN_SHAPE(7));
  cr_assert_eq(rank, 1);
  cr_assert_eq(shape[0], 7);
  CAPTURE(MN_SHAPE(1, 2, 3, 4, 5, 6));
  cr_assert_eq(rank, 6);
  cr_assert_eq(shape[5], 6);
#undef CAPTURE
#undef CAPTURE_
}

Test(graph, status_strings) {
  struct {
    mn_status s;
    const char *text;
  } want[] = {
      {MN_OK, "ok"},
      {MN_ERR_INVALID_ARGUMENT, "invalid argument"},
      {MN_ERR_SHAPE, "shape mismatch"},
      {MN_ERR_NOT_FOUND, "not found"},
      {MN_ERR_IO, "i/o error"},
      {MN_ERR_FORMAT, "bad file format"},
      {MN_ERR_UNSUPPORTED, "unsupported"},
      {MN_ERR_OUT_OF_MEMORY, "out of memory"},
      {MN_ERR_DEVICE, "device error"},
      {MN_ERR_STATE, "invalid state"},
  };
  for (size_t i = 0; i < LEN(want); i++)
    cr_assert_str_eq(mn_status_string(want[i].s), want[i].text);
  cr_assert_str_eq(mn_status_string((mn_status)1234), "unknown status");
  cr_assert_str_eq(mn_status_string((mn_status)-1), "unknown status");
}

Test(graph, version_matches_the_header) { cr_assert_str_eq(mn_version(), MN_VERSION_STRING); }
