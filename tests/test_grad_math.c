/* Gradient checks of the matrix products and element-wise ops. */
#include "support/gradcheck.h"

#define LEAF(nm, lo_, hi_, ...)                                                                    \
  {                                                                                                \
    .name = nm, .rank = (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)),                 \
    .shape = {__VA_ARGS__}, .lo = lo_, .hi = hi_                                                   \
  }

static mn_node build_matmul(mn_graph *g, const mn_node *x, void *u) {
  (void)u;
  return mn_matmul(g, x[0], x[1]);
}
Test(grad_math, matmul) {
  mn_gc_leaf l[] = {LEAF("a", -1, 1, 2, 3, 5), LEAF("b", -1, 1, 5, 4)};
  mn_gradcheck("matmul", l, 2, build_matmul, NULL, NULL);
}
