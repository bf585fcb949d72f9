/* Shared checks for graph builders. Each check records the sticky graph error with a
 * message that names the builder, the node ids and their shapes, and returns false. */
#ifndef MN_HOST_BUILD_UTIL_H
#define MN_HOST_BUILD_UTIL_H

#include "host/graph.h"

/* Formats "node 7 [32,784]" into buf. */
const char *mn_node_desc(const mn_graph *g, mn_node id, char *buf, size_t size);
#define MN_DESC(g, id, buf) mn_node_desc((g), (id), (buf), sizeof(buf))

bool mn_require_dtype(mn_graph *g, const char *fn, const char *what, mn_node x, mn_dtype dt);
bool mn_require_rank(mn_graph *g, const char *fn, const char *what, mn_node x, int min_rank,
                     int max_rank);
bool mn_require_same_shape(mn_graph *g, const char *fn, mn_node a, mn_node b);
/* Per-token positions of packed sequences for activations x ([T, D] or [B, T, D]): U32 of x's
 * shape without its last dim ([T] or [B, T]). */
bool mn_require_positions(mn_graph *g, const char *fn, mn_node positions, mn_node x);
/* A strictly positive integer attribute, e.g. head_dim. */
bool mn_require_positive(mn_graph *g, const char *fn, const char *what, long long value);

/* Element-wise builders: checks inputs, F32 dtype and (for binary) identical shapes;
 * the result has the type of the first input. */
mn_node mn_build_unary(mn_graph *g, const char *fn, mn_op op, mn_node x, const mn_op_attrs *attrs);
mn_node mn_build_binary_same(mn_graph *g, const char *fn, mn_op op, mn_node a, mn_node b);

static inline const mn_tensor_type *mn_type_of(const mn_graph *g, mn_node id) {
  return &g->nodes[id].type;
}

#endif
