/* The decode-state ops: out is the buffer of input 1 (the plan makes them in place), so the
 * values written stay for the next step. */
#include <string.h>

#include "host/reference/ref_kernels.h"

mn_status mn_ref_STORE_ROW_U32(const mn_ref_ctx *c) {
  size_t w = (size_t)mn_tensor_type_numel(mn_ref_in_type(c, 0)), rows = mn_ref_numel(c) / w;
  size_t row = mn_ref_in_u32(c, 2)[0] % rows;
  memmove((uint32_t *)c->out + row * w, mn_ref_in_u32(c, 0), w * sizeof(uint32_t));
  return MN_OK;
}

mn_status mn_ref_INCREMENT_U32(const mn_ref_ctx *c) {
  uint32_t *counter = (uint32_t *)c->out;
  for (size_t i = (size_t)c->node->attrs.pos_offset; i < mn_ref_numel(c); i++)
    counter[i]++;
  return MN_OK;
}
