/* Builders of the decode-state ops (mn_store_row_u32, mn_increment_u32): in-place writes to U32
 * inputs that a graph launched once per token advances on the device. */
#include "host/build_util.h"
#include "host/error.h"

/* An in-place write needs a buffer that persists across steps: an input, or an earlier
 * in-place write to one (whose buffer is the input's). */
static bool check_state(mn_graph *g, const char *fn, const char *what, mn_node x) {
  if (!mn_require_dtype(g, fn, what, x, MN_U32)) return false;
  mn_op op = mn_graph_at(g, x)->op;
  if (op == MN_OP_INPUT || op == MN_OP_STORE_ROW_U32 || op == MN_OP_INCREMENT_U32 ||
      op == MN_OP_CACHE_WRITE)
    return true;
  char d[128];
  mn_graph_fail(g, MN_ERR_INVALID_ARGUMENT,
                "%s: %s is %s (op %s); it must be an mn_input or the result of an in-place write "
                "to one",
                fn, what, MN_DESC(g, x, d), mn_op_name(op));
  return false;
}

mn_node mn_store_row_u32(mn_graph *g, mn_node src, mn_node dst, mn_node row_u32) {
  const char *fn = "mn_store_row_u32";
  mn_node ins[3] = {src, dst, row_u32};
  if (!mn_graph_check_inputs(g, fn, ins, 3)) return MN_NO_NODE;
  if (!check_state(g, fn, "dst", dst) || !mn_require_dtype(g, fn, "src", src, MN_U32) ||
      !mn_require_dtype(g, fn, "row", row_u32, MN_U32) ||
      !mn_require_rank(g, fn, "row", row_u32, 1, 1))
    return MN_NO_NODE;
  char ds[128], dd[128];
  if (mn_type_of(g, row_u32)->shape[0] != 1)
    return mn_graph_fail(g, MN_ERR_SHAPE, "%s: row is %s, expected [1] u32", fn,
                         MN_DESC(g, row_u32, ds));
  int64_t w = mn_tensor_type_numel(mn_type_of(g, src)),
          n = mn_tensor_type_numel(mn_type_of(g, dst));
  if (n % w != 0)
    return mn_graph_fail(g, MN_ERR_SHAPE, "%s: dst %s is not a whole number of rows of src %s", fn,
                         MN_DESC(g, dst, dd), MN_DESC(g, src, ds));
  const mn_tensor_type *td = mn_type_of(g, dst);
  return mn_graph_append(g, MN_OP_STORE_ROW_U32, ins, 3, td, NULL, NULL);
}

mn_node mn_increment_u32(mn_graph *g, mn_node after, mn_node counter, int64_t first) {
  const char *fn = "mn_increment_u32";
  mn_node ins[2] = {after, counter};
  if (!mn_graph_check_inputs(g, fn, ins, 2)) return MN_NO_NODE;
  if (!check_state(g, fn, "counter", counter)) return MN_NO_NODE;
  int64_t n = mn_tensor_type_numel(mn_type_of(g, counter));
  if (first < 0 || first >= n)
    return mn_graph_fail(g, MN_ERR_INVALID_ARGUMENT,
                         "%s: first %lld must be below the %lld elements of counter", fn,
                         (long long)first, (long long)n);
  mn_op_attrs a = {.pos_offset = (int)first};
  return mn_graph_append(g, MN_OP_INCREMENT_U32, ins, 2, mn_type_of(g, counter), &a, NULL);
}
