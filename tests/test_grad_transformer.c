/* Gradient checks of SwiGLU, the norms, RoPE, embedding and scatter_add, and the
 * structure of their backward graphs (which inputs get backward nodes). */
#include "tests/support/gradcheck.h"

#include <stdio.h>

#include "autodiff/autodiff.h"

/* ---------------------------------------------------------------- swiglu */

static mn_node build_swiglu(mn_graph *g, const mn_node *x, void *u) {
  (void)u;
  return mn_swiglu(g, x[0], x[1]);
}
Test(grad_transformer, swiglu) {
  mn_gc_leaf l3[] = {MN_GC_LEAF("gate", -3, 3, 2, 3, 5), MN_GC_LEAF("up", -1, 1, 2, 3, 5)};
  mn_gradcheck("swiglu [2,3,5]", l3, 2, build_swiglu, NULL, NULL);
  mn_gc_leaf l1[] = {MN_GC_LEAF("gate", -3, 3, 1, 33), MN_GC_LEAF("up", -1, 1, 1, 33)};
  mn_gradcheck("swiglu [1,33]", l1, 2, build_swiglu, NULL, NULL);
}

/* ---------------------------------------------------------------- norms */

static mn_node build_rms_norm(mn_graph *g, const mn_node *x, void *u) {
  return mn_rms_norm(g, x[0], x[1], *(const float *)u);
}
static mn_node build_layer_norm(mn_graph *g, const mn_node *x, void *u) {
  return mn_layer_norm(g, x[0], x[1], x[2], *(const float *)u);
}

Test(grad_transformer, rms_norm) {
  float eps = 1e-5f;
  mn_gc_leaf a[] = {MN_GC_LEAF("x", -2, 2, 3, 8), MN_GC_LEAF("w", -1.5f, 1.5f, 8)};
  mn_gradcheck("rms_norm [3,8]", a, 2, build_rms_norm, &eps, NULL);
  mn_gc_leaf b[] = {MN_GC_LEAF("x", -2, 2, 2, 3, 5), MN_GC_LEAF("w", -1.5f, 1.5f, 5)};
  mn_gradcheck("rms_norm [2,3,5]", b, 2, build_rms_norm, &eps, NULL);
  mn_gc_leaf d[] = {MN_GC_LEAF("x", -2, 2, 2, 37), MN_GC_LEAF("w", -1.5f, 1.5f, 37)};
  mn_gradcheck("rms_norm [2,37]", d, 2, build_rms_norm, &eps, NULL);
  /* One feature: y = x w / sqrt(x^2 + eps), whose x-derivative w eps / (x^2 + eps)^1.5 is
   * ~eps; with eps 1e-5 it would drown in the finite differences' float rounding, so a
   * large eps keeps the x gradient of the order of 1. */
  float big = 0.5f;
  mn_gc_leaf e[] = {MN_GC_LEAF("x", -2, 2, 4, 1), MN_GC_LEAF("w", -1.5f, 1.5f, 1)};
  mn_gradcheck("rms_norm [4,1]", e, 2, build_rms_norm, &big, NULL);
}

Test(grad_transformer, layer_norm) {
  float eps = 1e-5f;
  mn_gc_leaf a[] = {MN_GC_LEAF("x", -2, 2, 3, 8), MN_GC_LEAF("w", -1.5f, 1.5f, 8),
                    MN_GC_LEAF("b", -1, 1, 8)};
  mn_gradcheck("layer_norm [3,8]", a, 3, build_layer_norm, &eps, NULL);
  mn_gc_leaf b[] = {MN_GC_LEAF("x", -2, 2, 2, 3, 5), MN_GC_LEAF("w", -1.5f, 1.5f, 5),
                    MN_GC_LEAF("b", -1, 1, 5)};
  mn_gradcheck("layer_norm [2,3,5]", b, 3, build_layer_norm, &eps, NULL);
  mn_gc_leaf d[] = {MN_GC_LEAF("x", -2, 2, 2, 37), MN_GC_LEAF("w", -1.5f, 1.5f, 37),
                    MN_GC_LEAF("b", -1, 1, 37)};
  mn_gradcheck("layer_norm [2,37]", d, 3, build_layer_norm, &eps, NULL);
  /* One feature: x_hat is exactly 0, so y = b and the x and w gradients are exactly 0
   * (the check then compares absolute errors). */
  mn_gc_leaf e[] = {MN_GC_LEAF("x", -2, 2, 4, 1), MN_GC_LEAF("w", -1.5f, 1.5f, 1),
                    MN_GC_LEAF("b", -1, 1, 1)};
  mn_gradcheck("layer_norm [4,1]", e, 3, build_layer_norm, &eps, NULL);
}

/* ---------------------------------------------------------------- rope */

typedef struct rope_case {
  int head_dim, offset;
} rope_case;

static mn_node build_rope(mn_graph *g, const mn_node *x, void *u) {
  const rope_case *rc = u;
  return mn_rope_with_offset(g, x[0], 10000.0f, rc->offset, rc->head_dim);
}
static mn_node build_rope_dynamic(mn_graph *g, const mn_node *x, void *u) {
  return mn_rope_dynamic_offset(g, x[0], 10000.0f, x[1], *(const int *)u);
}

Test(grad_transformer, rope) {
  const int head_dims[] = {2, 8}, offsets[] = {0, 5};
  for (int h = 0; h < 2; h++)
    for (int o = 0; o < 2; o++) {
      rope_case rc = {head_dims[h], offsets[o]};
      int64_t d = 3 * rc.head_dim; /* three heads */
      char what[64];
      mn_gc_leaf r2[] = {MN_GC_LEAF("x", -1, 1, 5, d)};
      snprintf(what, sizeof what, "rope [5,%lld] hd %d offset %d", (long long)d, rc.head_dim,
               rc.offset);
      mn_gradcheck(what, r2, 1, build_rope, &rc, NULL);
      mn_gc_leaf r3[] = {MN_GC_LEAF("x", -1, 1, 2, 3, d)};
      snprintf(what, sizeof what, "rope [2,3,%lld] hd %d offset %d", (long long)d, rc.head_dim,
               rc.offset);
      mn_gradcheck(what, r3, 1, build_rope, &rc, NULL);
    }
  rope_case one = {4, 3};
  mn_gc_leaf t1[] = {MN_GC_LEAF("x", -1, 1, 1, 4)};
  mn_gradcheck("rope [1,4] offset 3", t1, 1, build_rope, &one, NULL);
}

Test(grad_transformer, rope_dynamic_offset) {
  static const uint32_t seven[] = {7};
  const int head_dims[] = {2, 8};
  for (int h = 0; h < 2; h++) {
    int hd = head_dims[h];
    int64_t d = 3 * hd;
    mn_gc_leaf r2[] = {MN_GC_LEAF("x", -1, 1, 5, d), MN_GC_U32_LEAF("offset", seven, 1)};
    mn_gradcheck("rope_dynamic rank 2", r2, 2, build_rope_dynamic, &hd, NULL);
    mn_gc_leaf r3[] = {MN_GC_LEAF("x", -1, 1, 2, 3, d), MN_GC_U32_LEAF("offset", seven, 1)};
    mn_gradcheck("rope_dynamic rank 3", r3, 2, build_rope_dynamic, &hd, NULL);
  }
}

/* ---------------------------------------------------------------- embedding, scatter_add */

static mn_node build_embedding(mn_graph *g, const mn_node *x, void *u) {
  (void)u;
  return mn_embedding(g, x[0], x[1]);
}
static mn_node build_scatter_add(mn_graph *g, const mn_node *x, void *u) {
  return mn_scatter_add(g, x[0], x[1], *(const int64_t *)u);
}

/* Index 1 repeats, so its row's gradient is a sum; rows 2 and 4 are never read and
 * must get exactly zero. */
static const uint32_t repeated[] = {1, 3, 1, 0};

Test(grad_transformer, embedding) {
  mn_gc_leaf a[] = {MN_GC_U32_LEAF("idx", repeated, 4), MN_GC_LEAF("table", -1, 1, 5, 3)};
  mn_gradcheck("embedding [4] of [5,3]", a, 2, build_embedding, NULL, NULL);
  mn_gc_leaf b[] = {MN_GC_U32_LEAF("idx", repeated, 2, 2), MN_GC_LEAF("table", -1, 1, 5, 33)};
  mn_gradcheck("embedding [2,2] of [5,33]", b, 2, build_embedding, NULL, NULL);
  mn_gc_leaf e[] = {MN_GC_U32_LEAF("idx", repeated, 4), MN_GC_LEAF("table", -1, 1, 4, 1)};
  mn_gradcheck("embedding [4] of [4,1]", e, 2, build_embedding, NULL, NULL);
}

Test(grad_transformer, scatter_add) {
  int64_t rows = 5;
  mn_gc_leaf a[] = {MN_GC_U32_LEAF("idx", repeated, 4), MN_GC_LEAF("src", -1, 1, 4, 3)};
  mn_gradcheck("scatter_add [4,3] -> [5,3]", a, 2, build_scatter_add, &rows, NULL);
  mn_gc_leaf b[] = {MN_GC_U32_LEAF("idx", repeated, 2, 2), MN_GC_LEAF("src", -1, 1, 2, 2, 33)};
  mn_gradcheck("scatter_add [2,2,33] -> [5,33]", b, 2, build_scatter_add, &rows, NULL);
  mn_gc_leaf e[] = {MN_GC_U32_LEAF("idx", repeated, 4), MN_GC_LEAF("src", -1, 1, 4, 1)};
  mn_gradcheck("scatter_add [4,1] -> [5,1]", e, 2, build_scatter_add, &rows, NULL);
}

/* ---------------------------------------------------------------- structure */

/* Differentiates g (its output y is summed into the loss) and returns the full graph;
 * grads[i] says which output holds node i's gradient. */
static mn_graph *differentiate(mn_graph *g, mn_node y, int32_t *grads) {
  mn_node loss = mn_sum_all(g, y);
  mn_set_outputs(g, &loss, 1);
  cr_assert_eq(mn_graph_status(g), MN_OK, "%s", mn_graph_error(g));
  mn_graph *full = NULL;
  cr_assert_eq(mn_autodiff("test", g, &full, grads), MN_OK, "%s", mn_last_error());
  return full;
}

static int count_op(const mn_graph *g, mn_op op) {
  int n = 0;
  for (size_t i = 0; i < g->num_nodes; i++)
    n += g->nodes[i].op == op;
  return n;
}

/* The single node of op `op`, which must exist. */
static const mn_node_rec *only_op(const mn_graph *g, mn_op op) {
  cr_assert_eq(count_op(g, op), 1, "%d %s nodes, expected 1", count_op(g, op), mn_op_name(op));
  for (size_t i = 0; i < g->num_nodes; i++)
    if (g->nodes[i].op == op) return &g->nodes[i];
  return NULL;
}

static float ones[32] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
                         1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};

Test(grad_transformer, swiglu_structure) {
  /* A constant up: only the gate gradient is built, no silu for d up. */
  mn_graph *g = mn_graph_new();
  mn_node gate = mn_parameter(g, "gate", MN_SHAPE(2, 4));
  mn_node up = mn_constant(g, ones, MN_SHAPE(2, 4));
  int32_t grads[8];
  mn_graph *full = differentiate(g, mn_swiglu(g, gate, up), grads);
  only_op(full, MN_OP_SWIGLU_GRAD_GATE);
  cr_assert_eq(count_op(full, MN_OP_SILU), 0);
  cr_assert_geq(grads[gate], 1);
  mn_graph_free(full);
  mn_graph_free(g);

  /* A constant gate: d up = dy * silu(gate), no gate kernel. */
  g = mn_graph_new();
  gate = mn_constant(g, ones, MN_SHAPE(2, 4));
  up = mn_parameter(g, "up", MN_SHAPE(2, 4));
  full = differentiate(g, mn_swiglu(g, gate, up), grads);
  cr_assert_eq(count_op(full, MN_OP_SWIGLU_GRAD_GATE), 0);
  only_op(full, MN_OP_SILU);
  mn_graph_free(full);
  mn_graph_free(g);
}

Test(grad_transformer, rms_norm_structure) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_parameter(g, "x", MN_SHAPE(3, 8));
  mn_node w = mn_constant(g, ones, MN_SHAPE(8));
  int32_t grads[8];
  mn_graph *full = differentiate(g, mn_rms_norm(g, x, w, 1e-3f), grads);
  cr_assert_float_eq(only_op(full, MN_OP_RMS_NORM_GRAD_X)->attrs.eps, 1e-3f, 0);
  cr_assert_eq(count_op(full, MN_OP_RMS_NORM_GRAD_W), 0);
  mn_graph_free(full);
  mn_graph_free(g);

  g = mn_graph_new();
  x = mn_constant(g, ones, MN_SHAPE(3, 8));
  w = mn_parameter(g, "w", MN_SHAPE(8));
  full = differentiate(g, mn_rms_norm(g, x, w, 1e-3f), grads);
  const mn_node_rec *gw = only_op(full, MN_OP_RMS_NORM_GRAD_W);
  cr_assert_float_eq(gw->attrs.eps, 1e-3f, 0);
  cr_assert(gw->type.rank == 1 && gw->type.shape[0] == 8);
  cr_assert_eq(count_op(full, MN_OP_RMS_NORM_GRAD_X), 0);
  mn_graph_free(full);
  mn_graph_free(g);
}

Test(grad_transformer, layer_norm_structure) {
  /* Only the bias is trained: its gradient is dy summed over rows, nothing else. */
  mn_graph *g = mn_graph_new();
  mn_node x = mn_constant(g, ones, MN_SHAPE(2, 3, 5));
  mn_node w = mn_constant(g, ones, MN_SHAPE(5));
  mn_node b = mn_parameter(g, "b", MN_SHAPE(5));
  int32_t grads[8];
  mn_graph *full = differentiate(g, mn_layer_norm(g, x, w, b, 1e-5f), grads);
  const mn_node_rec *sr = only_op(full, MN_OP_SUM_ROWS);
  cr_assert(sr->type.rank == 1 && sr->type.shape[0] == 5);
  cr_assert_eq(count_op(full, MN_OP_LAYER_NORM_GRAD_X), 0);
  cr_assert_eq(count_op(full, MN_OP_LAYER_NORM_GRAD_W), 0);
  mn_graph_free(full);
  mn_graph_free(g);

  /* Only x: no weight or bias reductions. */
  g = mn_graph_new();
  x = mn_parameter(g, "x", MN_SHAPE(2, 3, 5));
  w = mn_constant(g, ones, MN_SHAPE(5));
  b = mn_constant(g, ones, MN_SHAPE(5));
  full = differentiate(g, mn_layer_norm(g, x, w, b, 1e-5f), grads);
  only_op(full, MN_OP_LAYER_NORM_GRAD_X);
  cr_assert_eq(count_op(full, MN_OP_LAYER_NORM_GRAD_W), 0);
  cr_assert_eq(count_op(full, MN_OP_SUM_ROWS), 0);
  mn_graph_free(full);
  mn_graph_free(g);
}

Test(grad_transformer, rope_structure) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_parameter(g, "x", MN_SHAPE(2, 3, 8));
  int32_t grads[8];
  mn_graph *full = differentiate(g, mn_rope_with_offset(g, x, 500.0f, 5, 4), grads);
  const mn_node_rec *r = only_op(full, MN_OP_ROPE_GRAD);
  cr_assert(r->attrs.head_dim == 4 && r->attrs.pos_offset == 5 && r->attrs.theta == 500.0f);
  mn_graph_free(full);
  mn_graph_free(g);

  /* The U32 offset is read by the backward node but gets no gradient. */
  g = mn_graph_new();
  x = mn_parameter(g, "x", MN_SHAPE(3, 8));
  mn_node off = mn_input_u32(g, "off", MN_SHAPE(1));
  full = differentiate(g, mn_rope_dynamic_offset(g, x, 500.0f, off, 8), grads);
  r = only_op(full, MN_OP_ROPE_DYNAMIC_GRAD);
  cr_assert(r->attrs.head_dim == 8 && r->attrs.theta == 500.0f && r->inputs[1] == off);
  cr_assert_eq(grads[off], -1);
  cr_assert_geq(grads[x], 1);
  mn_graph_free(full);
  mn_graph_free(g);
}

Test(grad_transformer, embedding_structure) {
  mn_graph *g = mn_graph_new();
  mn_node idx = mn_input_u32(g, "idx", MN_SHAPE(2, 3));
  mn_node table = mn_parameter(g, "table", MN_SHAPE(7, 4));
  int32_t grads[8];
  mn_graph *full = differentiate(g, mn_embedding(g, idx, table), grads);
  const mn_node_rec *s = only_op(full, MN_OP_SCATTER_ADD);
  cr_assert(s->attrs.num_rows == 7 && s->inputs[0] == idx);
  cr_assert(s->type.rank == 2 && s->type.shape[0] == 7 && s->type.shape[1] == 4);
  cr_assert_eq(grads[idx], -1);
  mn_graph_free(full);
  mn_graph_free(g);

  g = mn_graph_new();
  idx = mn_input_u32(g, "idx", MN_SHAPE(2, 3));
  mn_node src = mn_parameter(g, "src", MN_SHAPE(2, 3, 4));
  full = differentiate(g, mn_scatter_add(g, idx, src, 7), grads);
  const mn_node_rec *e = only_op(full, MN_OP_EMBEDDING);
  cr_assert(e->inputs[0] == idx && e->type.rank == 3 && e->type.shape[2] == 4);
  cr_assert_eq(grads[idx], -1);
  mn_graph_free(full);
  mn_graph_free(g);
}
