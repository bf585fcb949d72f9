/* Reference kernels of slice_last and its gradient. Rows are the leading dims flattened:
 * x is [rows, n], the slice [rows, len] starts at column `start` (attrs.pos_offset). */
#include <string.h>

#include "host/reference/ref_shared.h"

mn_status mn_ref_SLICE_LAST(const mn_ref_ctx *c) {
  size_t n = mn_ref_last_dim(mn_ref_in_type(c, 0)), len = mn_ref_last_dim(&c->node->type);
  size_t start = (size_t)c->node->attrs.pos_offset, rows = mn_ref_numel(c) / len;
  const float *x = mn_ref_in_f32(c, 0);
  float *y = mn_ref_out_f32(c);
  for (size_t r = 0; r < rows; r++)
    memcpy(y + r * len, x + r * n + start, len * sizeof *y);
  return MN_OK;
}

/* dx is zero outside the slice: those columns did not reach the output. */
mn_status mn_ref_SLICE_LAST_GRAD(const mn_ref_ctx *c) {
  size_t len = mn_ref_last_dim(mn_ref_in_type(c, 0)), n = mn_ref_last_dim(&c->node->type);
  size_t start = (size_t)c->node->attrs.pos_offset, rows = mn_ref_numel(c) / n;
  const float *dy = mn_ref_in_f32(c, 0);
  float *dx = mn_ref_out_f32(c);
  memset(dx, 0, rows * n * sizeof *dx);
  for (size_t r = 0; r < rows; r++)
    memcpy(dx + r * n + start, dy + r * len, len * sizeof *dx);
  return MN_OK;
}
