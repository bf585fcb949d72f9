/* mn_matmul_quant: a product with a weight held in a quantized format (host/quant.h). */
#include "host/build_util.h"
#include "host/error.h"
#include "host/quant.h"

mn_node mn_matmul_quant(mn_graph *g, mn_node x, mn_node wq, mn_quant format, int group_size,
                        int64_t out_features, int64_t in_features) {
  const char *fn = "mn_matmul_quant";
  mn_node ins[2] = {x, wq};
  if (!mn_graph_check_inputs(g, fn, ins, 2)) return MN_NO_NODE;
  if (!mn_require_dtype(g, fn, "x", x, MN_F32) || !mn_require_dtype(g, fn, "wq", wq, MN_U32) ||
      !mn_require_rank(g, fn, "x", x, 1, MN_MAX_RANK))
    return MN_NO_NODE;
  size_t block = 0, bytes = 0;
  if (format == MN_QUANT_NONE || !mn_quant_block(format, group_size, &block, &bytes))
    return mn_graph_fail(g, MN_ERR_INVALID_ARGUMENT,
                         "%s: format %d with group_size %d is not a quantized format (q8_0, q4_0, "
                         "q4_1, or int8/int4 with group 32, 64 or 128)",
                         fn, (int)format, group_size);
  if (out_features < 1 || in_features < 1 || in_features % (int64_t)block != 0)
    return mn_graph_fail(g, MN_ERR_INVALID_ARGUMENT,
                         "%s: %lld x %lld weights: in_features must be a positive multiple of the "
                         "%s block of %zu",
                         fn, (long long)out_features, (long long)in_features, mn_quant_name(format),
                         block);
  const mn_tensor_type *tx = mn_type_of(g, x), *tw = mn_type_of(g, wq);
  char d[128];
  if (tx->shape[tx->rank - 1] != in_features)
    return mn_graph_fail(g, MN_ERR_SHAPE, "%s: x is %s, expected last axis in_features %lld", fn,
                         MN_DESC(g, x, d), (long long)in_features);
  size_t words = mn_quant_row_words(format, group_size, in_features);
  if (tw->rank != 2 || tw->shape[0] != out_features || (size_t)tw->shape[1] != words)
    return mn_graph_fail(g, MN_ERR_SHAPE,
                         "%s: wq is %s, expected [%lld,%zu] (U32 words of %lld rows of %lld %s "
                         "weights)",
                         fn, MN_DESC(g, wq, d), (long long)out_features, words,
                         (long long)out_features, (long long)in_features, mn_quant_name(format));
  mn_tensor_type t = *tx;
  t.shape[t.rank - 1] = out_features;
  mn_op_attrs attrs = {.variant = (int)format, .groups = group_size};
  return mn_graph_append(g, MN_OP_MATMUL_QUANT, ins, 2, &t, &attrs, NULL);
}
