/* Reference kernels of the generic and element-wise backward ops. */
#include <math.h>
#include <string.h>

#include "host/reference/ref_shared.h"

mn_status mn_ref_RESHAPE(const mn_ref_ctx *c) {
  memcpy(c->out, c->in[0], mn_tensor_type_bytes(&c->node->type));
  return MN_OK;
}

mn_status mn_ref_ZEROS(const mn_ref_ctx *c) {
  memset(c->out, 0, mn_tensor_type_bytes(&c->node->type));
  return MN_OK;
}

/* dy [.., N] summed over every leading index into N values. */
mn_status mn_ref_SUM_ROWS(const mn_ref_ctx *c) {
  const mn_tensor_type *t = mn_ref_in_type(c, 0);
  size_t n = (size_t)t->shape[t->rank - 1], rows = (size_t)mn_tensor_type_numel(t) / n;
  mn_ref_column_sums(mn_ref_in_f32(c, 0), rows, n, mn_ref_out_f32(c));
  return MN_OK;
}
