/* The decode-state ops (cuda/kernels/decode_state.cuh): a few threads each, writing into the
 * buffer of input 1, which the plan makes the node's. */
#include "cuda/emit.h"

mn_status mn_cu_lower_STORE_ROW_U32(const mn_cu_op_ctx *c) {
  int64_t w = mn_tensor_type_numel(mn_cu_in_type(c, 0));
  int64_t rows = mn_tensor_type_numel(&c->node->type) / w;
  int k = mn_cu_kernel(c, 256, "mn_state_store_row<%lldLL, %lldLL>", (long long)rows, (long long)w);
  if (k < 0) return mn_cu_oom(c);
  mn_cu_arg args[3] = {mn_cu_in(c, 0), mn_cu_out(c), mn_cu_in(c, 2)};
  return mn_cu_launch(c, k, (unsigned)((w + 255) / 256), 1, 1, 0, 3, args);
}

mn_status mn_cu_lower_INCREMENT_U32(const mn_cu_op_ctx *c) {
  int64_t n = mn_tensor_type_numel(&c->node->type), first = c->node->attrs.pos_offset;
  int k =
      mn_cu_kernel(c, 256, "mn_state_increment<%lldLL, %lldLL>", (long long)n, (long long)first);
  if (k < 0) return mn_cu_oom(c);
  mn_cu_arg args[1] = {mn_cu_out(c)};
  return mn_cu_launch(c, k, (unsigned)((n - first + 255) / 256), 1, 1, 0, 1, args);
}
