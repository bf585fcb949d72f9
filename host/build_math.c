/* Builders for matrix products and element-wise ops. */
#include "host/build_util.h"
#include "host/error.h"

static int64_t last_dim(const mn_tensor_type *t) { return t->shape[t->rank - 1]; }

/* Common checks of the matmul family: both F32, a of rank >= 2, b of rank 2 (or, for
 * matmul_at, b of rank >= 2 whose leading dims are flattened like a's). */
static bool matmul_operands(mn_graph *g, const char *fn, mn_node a, mn_node b, int b_max_rank) {
  mn_node ins[2] = {a, b};
  return mn_graph_check_inputs(g, fn, ins, 2) && mn_require_dtype(g, fn, "a", a, MN_F32) &&
         mn_require_dtype(g, fn, "b", b, MN_F32) &&
         mn_require_rank(g, fn, "a", a, 2, MN_MAX_RANK) &&
         mn_require_rank(g, fn, "b", b, 2, b_max_rank);
}

static mn_node inner_mismatch(mn_graph *g, const char *fn, mn_node a, mn_node b, int64_t ka,
                              int64_t kb) {
  char da[128], db[128];
  return mn_graph_fail(g, MN_ERR_SHAPE, "%s: %s x %s: inner dimensions %lld and %lld differ", fn,
                       MN_DESC(g, a, da), MN_DESC(g, b, db), (long long)ka, (long long)kb);
}

/* Result [.., M, N]: a's leading dims kept, last dim replaced by n. */
static mn_node append_rows_by_n(mn_graph *g, mn_op op, mn_node a, mn_node b, int64_t n) {
  mn_tensor_type t = *mn_type_of(g, a);
  t.shape[t.rank - 1] = n;
  mn_node ins[2] = {a, b};
  return mn_graph_append(g, op, ins, 2, &t, NULL, NULL);
}

mn_node mn_matmul(mn_graph *g, mn_node a, mn_node b) {
  const char *fn = "mn_matmul";
  if (!matmul_operands(g, fn, a, b, 2)) return MN_NO_NODE;
  const mn_tensor_type *ta = mn_type_of(g, a), *tb = mn_type_of(g, b);
  if (last_dim(ta) != tb->shape[0]) return inner_mismatch(g, fn, a, b, last_dim(ta), tb->shape[0]);
  return append_rows_by_n(g, MN_OP_MATMUL, a, b, tb->shape[1]);
}

mn_node mn_matmul_bt(mn_graph *g, mn_node a, mn_node b) {
  const char *fn = "mn_matmul_bt";
  if (!matmul_operands(g, fn, a, b, 2)) return MN_NO_NODE;
  const mn_tensor_type *ta = mn_type_of(g, a), *tb = mn_type_of(g, b);
  if (last_dim(ta) != tb->shape[1]) return inner_mismatch(g, fn, a, b, last_dim(ta), tb->shape[1]);
  return append_rows_by_n(g, MN_OP_MATMUL_BT, a, b, tb->shape[0]);
}

/* A[K, M]^T x B[K, N]: leading dims of both are flattened into K, which is how weight
 * gradients of [B, T, D] activations are formed. */
mn_node mn_matmul_at(mn_graph *g, mn_node a, mn_node b) {
  const char *fn = "mn_matmul_at";
  if (!matmul_operands(g, fn, a, b, MN_MAX_RANK)) return MN_NO_NODE;
  const mn_tensor_type *ta = mn_type_of(g, a), *tb = mn_type_of(g, b);
  int64_t m = last_dim(ta), n = last_dim(tb);
  int64_t ka = mn_tensor_type_numel(ta) / m, kb = mn_tensor_type_numel(tb) / n;
  if (ka != kb) return inner_mismatch(g, fn, a, b, ka, kb);
  mn_tensor_type t = mn_type_make(MN_F32, (int64_t[]){m, n}, 2);
  mn_node ins[2] = {a, b};
  return mn_graph_append(g, MN_OP_MATMUL_AT, ins, 2, &t, NULL, NULL);
}

mn_node mn_add(mn_graph *g, mn_node a, mn_node b) {
  return mn_build_binary_same(g, "mn_add", MN_OP_ADD, a, b);
}
mn_node mn_mul(mn_graph *g, mn_node a, mn_node b) {
  return mn_build_binary_same(g, "mn_mul", MN_OP_MUL, a, b);
}
mn_node mn_div(mn_graph *g, mn_node a, mn_node b) {
  return mn_build_binary_same(g, "mn_div", MN_OP_DIV, a, b);
}
mn_node mn_greater(mn_graph *g, mn_node a, mn_node b) {
  return mn_build_binary_same(g, "mn_greater", MN_OP_GREATER, a, b);
}

/* x [.., N] with a row vector whose last dim must equal N; `row_rank` is 1 for
 * bias_add ([N]) and 2 for broadcast_add ([1, N]). */
static mn_node add_row(mn_graph *g, const char *fn, mn_op op, mn_node x, mn_node row,
                       int row_rank) {
  mn_node ins[2] = {x, row};
  if (!mn_graph_check_inputs(g, fn, ins, 2) || !mn_require_dtype(g, fn, "x", x, MN_F32) ||
      !mn_require_dtype(g, fn, row_rank == 1 ? "bias" : "row", row, MN_F32) ||
      !mn_require_rank(g, fn, "x", x, row_rank, MN_MAX_RANK) ||
      !mn_require_rank(g, fn, row_rank == 1 ? "bias" : "row", row, row_rank, row_rank))
    return MN_NO_NODE;
  const mn_tensor_type *tx = mn_type_of(g, x), *tr = mn_type_of(g, row);
  if ((row_rank == 2 && tr->shape[0] != 1) || last_dim(tr) != last_dim(tx)) {
    char dx[128], dr[128];
    return mn_graph_fail(g, MN_ERR_SHAPE, "%s: %s + %s: expected %s[%lld]", fn, MN_DESC(g, x, dx),
                         MN_DESC(g, row, dr),
                         row_rank == 2 ? "[1,N] = " : "[N] = ", (long long)last_dim(tx));
  }
  return mn_graph_append(g, op, ins, 2, tx, NULL, NULL);
}

mn_node mn_bias_add(mn_graph *g, mn_node x, mn_node bias) {
  return add_row(g, "mn_bias_add", MN_OP_BIAS_ADD, x, bias, 1);
}
mn_node mn_broadcast_add(mn_graph *g, mn_node x, mn_node row) {
  return add_row(g, "mn_broadcast_add", MN_OP_BROADCAST_ADD, x, row, 2);
}

mn_node mn_scale(mn_graph *g, mn_node x, float s) {
  mn_op_attrs attrs = {.scale = s};
  return mn_build_unary(g, "mn_scale", MN_OP_SCALE, x, &attrs);
}

#define MN_UNARY_BUILDER(fname, OP)                                                                \
  mn_node fname(mn_graph *g, mn_node x) { return mn_build_unary(g, #fname, OP, x, NULL); }
MN_UNARY_BUILDER(mn_relu, MN_OP_RELU)
MN_UNARY_BUILDER(mn_sigmoid, MN_OP_SIGMOID)
MN_UNARY_BUILDER(mn_tanh, MN_OP_TANH)
MN_UNARY_BUILDER(mn_neg, MN_OP_NEG)
MN_UNARY_BUILDER(mn_abs, MN_OP_ABS)
MN_UNARY_BUILDER(mn_log, MN_OP_LOG)
MN_UNARY_BUILDER(mn_exp, MN_OP_EXP)
MN_UNARY_BUILDER(mn_recip, MN_OP_RECIP)
MN_UNARY_BUILDER(mn_silu, MN_OP_SILU)
MN_UNARY_BUILDER(mn_gelu, MN_OP_GELU)
#undef MN_UNARY_BUILDER

/* The node's id at creation seeds its mask: two dropouts of one graph draw independent masks,
 * and a graph built the same way draws the same ones. NaN fails the range check too. */
mn_node mn_dropout(mn_graph *g, mn_node x, float p) {
  const char *fn = "mn_dropout";
  if (!mn_graph_check_inputs(g, fn, &x, 1) || !mn_require_dtype(g, fn, "x", x, MN_F32))
    return MN_NO_NODE;
  if (!(p >= 0.0f && p < 1.0f))
    return mn_graph_fail(g, MN_ERR_INVALID_ARGUMENT, "%s: p is %g, expected 0 <= p < 1", fn,
                         (double)p);
  if (p == 0.0f) return x;
  mn_op_attrs attrs = {.scale = p, .seed = (int64_t)g->num_nodes};
  return mn_graph_append(g, MN_OP_DROPOUT, &x, 1, mn_type_of(g, x), &attrs, NULL);
}
