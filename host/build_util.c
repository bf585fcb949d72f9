#include "host/build_util.h"

#include <stdio.h>

#include "host/error.h"

const char *mn_node_desc(const mn_graph *g, mn_node id, char *buf, size_t size) {
  char shape[96];
  snprintf(buf, size, "node %u %s", id, mn_shape_str(mn_type_of(g, id), shape, sizeof shape));
  return buf;
}

bool mn_require_dtype(mn_graph *g, const char *fn, const char *what, mn_node x, mn_dtype dt) {
  mn_dtype have = mn_type_of(g, x)->dtype;
  if (have == dt) return true;
  char d[128];
  mn_graph_fail(g, MN_ERR_INVALID_ARGUMENT, "%s: %s is %s with dtype %s, expected %s", fn, what,
                MN_DESC(g, x, d), mn_dtype_name(have), mn_dtype_name(dt));
  return false;
}

bool mn_require_positions(mn_graph *g, const char *fn, mn_node positions, mn_node x) {
  if (!mn_require_dtype(g, fn, "positions", positions, MN_U32)) return false;
  const mn_tensor_type *tp = mn_type_of(g, positions), *tx = mn_type_of(g, x);
  bool ok = tp->rank == tx->rank - 1;
  for (int i = 0; ok && i < tp->rank; i++)
    ok = tp->shape[i] == tx->shape[i];
  if (ok) return true;
  char dp[128], dx[128];
  mn_graph_fail(g, MN_ERR_SHAPE,
                "%s: positions is %s, expected u32 of the shape of %s without its last dim (one "
                "position per token)",
                fn, MN_DESC(g, positions, dp), MN_DESC(g, x, dx));
  return false;
}

bool mn_require_rank(mn_graph *g, const char *fn, const char *what, mn_node x, int min_rank,
                     int max_rank) {
  int r = mn_type_of(g, x)->rank;
  if (r >= min_rank && r <= max_rank) return true;
  char d[128];
  if (min_rank == max_rank)
    mn_graph_fail(g, MN_ERR_SHAPE, "%s: %s is %s of rank %d, expected rank %d", fn, what,
                  MN_DESC(g, x, d), r, min_rank);
  else
    mn_graph_fail(g, MN_ERR_SHAPE, "%s: %s is %s of rank %d, expected rank %d to %d", fn, what,
                  MN_DESC(g, x, d), r, min_rank, max_rank);
  return false;
}

bool mn_require_same_shape(mn_graph *g, const char *fn, mn_node a, mn_node b) {
  if (mn_type_same_shape(mn_type_of(g, a), mn_type_of(g, b))) return true;
  char da[128], db[128];
  mn_graph_fail(g, MN_ERR_SHAPE, "%s: %s and %s: shapes differ", fn, MN_DESC(g, a, da),
                MN_DESC(g, b, db));
  return false;
}

bool mn_require_positive(mn_graph *g, const char *fn, const char *what, long long value) {
  if (value > 0) return true;
  mn_graph_fail(g, MN_ERR_INVALID_ARGUMENT, "%s: %s is %lld, must be positive", fn, what, value);
  return false;
}

mn_node mn_build_unary(mn_graph *g, const char *fn, mn_op op, mn_node x, const mn_op_attrs *attrs) {
  if (!mn_graph_check_inputs(g, fn, &x, 1)) return MN_NO_NODE;
  if (!mn_require_dtype(g, fn, "x", x, MN_F32)) return MN_NO_NODE;
  return mn_graph_append(g, op, &x, 1, mn_type_of(g, x), attrs, NULL);
}

mn_node mn_build_binary_same(mn_graph *g, const char *fn, mn_op op, mn_node a, mn_node b) {
  mn_node ins[2] = {a, b};
  if (!mn_graph_check_inputs(g, fn, ins, 2)) return MN_NO_NODE;
  if (!mn_require_dtype(g, fn, "a", a, MN_F32) || !mn_require_dtype(g, fn, "b", b, MN_F32))
    return MN_NO_NODE;
  if (!mn_require_same_shape(g, fn, a, b)) return MN_NO_NODE;
  return mn_graph_append(g, op, ins, 2, mn_type_of(g, a), NULL, NULL);
}
