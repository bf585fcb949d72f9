/* Builder of mn_slice_last: a contiguous range of the last axis, e.g. the q, k and v parts
 * of GPT-2's fused c_attn output [B, T, 3D]. */
#include <limits.h>

#include "host/build_util.h"

mn_node mn_slice_last(mn_graph *g, mn_node x, int64_t start, int64_t len) {
  const char *fn = "mn_slice_last";
  if (!mn_graph_check_inputs(g, fn, &x, 1) || !mn_require_dtype(g, fn, "x", x, MN_F32) ||
      !mn_require_rank(g, fn, "x", x, 1, MN_MAX_RANK))
    return MN_NO_NODE;
  const mn_tensor_type *tx = mn_type_of(g, x);
  int64_t n = tx->shape[tx->rank - 1];
  char dx[128];
  if (len < 1)
    return mn_graph_fail(g, MN_ERR_INVALID_ARGUMENT, "%s: len is %lld, must be positive", fn,
                         (long long)len);
  /* Written as start > n - len so that a huge start + len cannot overflow. */
  if (start < 0 || len > n || start > n - len)
    return mn_graph_fail(g, MN_ERR_INVALID_ARGUMENT,
                         "%s: start %lld and len %lld do not fit the last dimension %lld of x %s "
                         "(need 0 <= start and start + len <= %lld)",
                         fn, (long long)start, (long long)len, (long long)n, MN_DESC(g, x, dx),
                         (long long)n);
  /* The start is kept in an int attribute; a last axis that long would not fit the
   * kernels' index types either. */
  if (start > INT_MAX)
    return mn_graph_fail(g, MN_ERR_INVALID_ARGUMENT, "%s: start %lld of x %s is above %d", fn,
                         (long long)start, MN_DESC(g, x, dx), INT_MAX);
  mn_tensor_type t = *tx;
  t.shape[t.rank - 1] = len;
  mn_op_attrs attrs = {.pos_offset = (int)start};
  return mn_graph_append(g, MN_OP_SLICE_LAST, &x, 1, &t, &attrs, NULL);
}
