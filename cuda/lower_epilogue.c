/* Matrix products with a cuBLASLt epilogue. Placeholder until the lowering lands. */
#include "emit.h"
#include "error.h"

mn_status mn_cu_lower_MATMUL_BIAS_ACT(const mn_cu_op_ctx *c) {
  return mn_fail(MN_ERR_STATE, "node %u: matmul_bias_act has no CUDA lowering", c->id);
}
mn_status mn_cu_lower_MATMUL_DGELU(const mn_cu_op_ctx *c) {
  return mn_fail(MN_ERR_STATE, "node %u: matmul_dgelu has no CUDA lowering", c->id);
}
mn_status mn_cu_lower_MATMUL_AT_BGRAD(const mn_cu_op_ctx *c) {
  return mn_fail(MN_ERR_STATE, "node %u: matmul_at_bgrad has no CUDA lowering", c->id);
}
mn_status mn_cu_lower_EXTRA_OUTPUT(const mn_cu_op_ctx *c) {
  return mn_fail(MN_ERR_STATE, "node %u: extra_output is written by its input's dispatch", c->id);
}
