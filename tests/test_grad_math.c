/* Gradient checks of the matrix products, element-wise ops, sum_all and mean_all. */
#include "tests/support/gradcheck.h"

typedef mn_node (*binary_builder)(mn_graph *, mn_node, mn_node);
typedef mn_node (*unary_builder)(mn_graph *, mn_node);

static mn_node apply_binary(mn_graph *g, const mn_node *x, void *u) {
  return (*(binary_builder *)u)(g, x[0], x[1]);
}
static mn_node apply_unary(mn_graph *g, const mn_node *x, void *u) {
  return (*(unary_builder *)u)(g, x[0]);
}

static void check_binary(const char *what, binary_builder f, mn_gc_leaf a, mn_gc_leaf b) {
  mn_gc_leaf l[] = {a, b};
  mn_gradcheck(what, l, 2, apply_binary, &f, NULL);
}

Test(grad_math, matmul_family) {
  check_binary("matmul 2-D", mn_matmul, (mn_gc_leaf)MN_GC_LEAF("a", -1, 1, 3, 5),
               (mn_gc_leaf)MN_GC_LEAF("b", -1, 1, 5, 4));
  check_binary("matmul rank 3", mn_matmul, (mn_gc_leaf)MN_GC_LEAF("a", -1, 1, 2, 3, 5),
               (mn_gc_leaf)MN_GC_LEAF("b", -1, 1, 5, 1));
  check_binary("matmul_bt", mn_matmul_bt, (mn_gc_leaf)MN_GC_LEAF("a", -1, 1, 2, 3, 5),
               (mn_gc_leaf)MN_GC_LEAF("b", -1, 1, 4, 5));
  check_binary("matmul_at", mn_matmul_at, (mn_gc_leaf)MN_GC_LEAF("a", -1, 1, 6, 3),
               (mn_gc_leaf)MN_GC_LEAF("b", -1, 1, 6, 4));
  /* Leading dims laid out differently on the two sides: gradients need a reshape. */
  check_binary("matmul_at mixed", mn_matmul_at, (mn_gc_leaf)MN_GC_LEAF("a", -1, 1, 2, 3, 3),
               (mn_gc_leaf)MN_GC_LEAF("b", -1, 1, 6, 4));
}

Test(grad_math, element_wise_binary) {
  check_binary("add", mn_add, (mn_gc_leaf)MN_GC_LEAF("a", -1, 1, 2, 3, 5),
               (mn_gc_leaf)MN_GC_LEAF("b", -1, 1, 2, 3, 5));
  check_binary("mul", mn_mul, (mn_gc_leaf)MN_GC_LEAF("a", -1, 1, 33),
               (mn_gc_leaf)MN_GC_LEAF("b", -1, 1, 33));
  check_binary("div", mn_div, (mn_gc_leaf)MN_GC_LEAF("a", -1, 1, 4, 3),
               (mn_gc_leaf)MN_GC_LEAF("b", 0.5f, 2, 4, 3));
  check_binary("bias_add", mn_bias_add, (mn_gc_leaf)MN_GC_LEAF("x", -1, 1, 2, 3, 5),
               (mn_gc_leaf)MN_GC_LEAF("bias", -1, 1, 5));
  check_binary("broadcast_add", mn_broadcast_add, (mn_gc_leaf)MN_GC_LEAF("x", -1, 1, 7, 5),
               (mn_gc_leaf)MN_GC_LEAF("row", -1, 1, 1, 5));
}

static void check_unary(const char *what, unary_builder f, mn_gc_leaf x) {
  mn_gradcheck(what, &x, 1, apply_unary, &f, NULL);
}

static mn_node scale_by_m3(mn_graph *g, mn_node x) { return mn_scale(g, x, -3.0f); }

Test(grad_math, element_wise_unary) {
  mn_gc_leaf relu = MN_GC_LEAF("x", -2, 2, 5, 7), absx = MN_GC_LEAF("x", -2, 2, 35);
  relu.min_abs = absx.min_abs = 0.05f; /* keep finite differences off the kink */
  check_unary("relu", mn_relu, relu);
  check_unary("abs", mn_abs, absx);
  check_unary("scale", scale_by_m3, (mn_gc_leaf)MN_GC_LEAF("x", -1, 1, 2, 3, 4));
  check_unary("sigmoid", mn_sigmoid, (mn_gc_leaf)MN_GC_LEAF("x", -4, 4, 2, 17));
  check_unary("tanh", mn_tanh, (mn_gc_leaf)MN_GC_LEAF("x", -2, 2, 33));
  check_unary("neg", mn_neg, (mn_gc_leaf)MN_GC_LEAF("x", -1, 1, 1, 1));
  check_unary("log", mn_log, (mn_gc_leaf)MN_GC_LEAF("x", 0.5f, 3, 12));
  check_unary("exp", mn_exp, (mn_gc_leaf)MN_GC_LEAF("x", -2, 1, 12));
  check_unary("recip", mn_recip, (mn_gc_leaf)MN_GC_LEAF("x", 0.5f, 2, 12));
  check_unary("silu", mn_silu, (mn_gc_leaf)MN_GC_LEAF("x", -4, 4, 3, 11));
  check_unary("gelu", mn_gelu, (mn_gc_leaf)MN_GC_LEAF("x", -4, 4, 3, 11));
  check_unary("sum_all", mn_sum_all, (mn_gc_leaf)MN_GC_LEAF("x", -1, 1, 2, 3, 5));
  check_unary("mean_all", mn_mean_all, (mn_gc_leaf)MN_GC_LEAF("x", -1, 1, 2, 3, 5));
}

/* A value read by several users gets the sum of their gradients. */
static mn_node fan_out(mn_graph *g, const mn_node *x, void *u) {
  (void)u;
  mn_node a = mn_mul(g, x[0], x[0]);
  return mn_add(g, mn_tanh(g, a), mn_matmul(g, x[0], x[1]));
}
Test(grad_math, accumulates_over_users) {
  mn_gc_leaf l[] = {MN_GC_LEAF("x", -1, 1, 4, 4), MN_GC_LEAF("w", -1, 1, 4, 4)};
  mn_gradcheck("fan-out", l, 2, fan_out, NULL, NULL);
}
