/* mn_sample: one block of MN_SAMPLE_BLOCK threads per row (cuda/kernels/sample.cuh). */
#include "cuda/emit.h"

#define MN_SAMPLE_BLOCK 1024

mn_status mn_cu_lower_SAMPLE(const mn_cu_op_ctx *c) {
  const mn_tensor_type *tl = mn_cu_in_type(c, 0);
  int64_t v = tl->shape[tl->rank - 1], rows = tl->shape[0];
  int k =
      mn_cu_kernel(c, MN_SAMPLE_BLOCK, "mn_sample_rows<%lldLL, %d>", (long long)v, MN_SAMPLE_BLOCK);
  if (k < 0) return mn_cu_oom(c);
  mn_cu_arg args[4] = {mn_cu_in(c, 0), mn_cu_in(c, 1), mn_cu_in(c, 2), mn_cu_out(c)};
  return mn_cu_launch(c, k, (unsigned)rows, 1, 1, 0, 4, args);
}
