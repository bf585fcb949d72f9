/* Reference kernels: SwiGLU, norms, RoPE, embedding and scatter_add. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "host/reference/ref_shared.h"

mn_status mn_ref_RMS_NORM(const mn_ref_ctx *c) {
  size_t n = mn_ref_last_dim(&c->node->type), rows = mn_ref_numel(c) / n;
  for (size_t r = 0; r < rows; r++)
    mn_ref_rms_norm_row(mn_ref_in_f32(c, 0) + r * n, mn_ref_in_f32(c, 1), n, c->node->attrs.eps,
                        mn_ref_out_f32(c) + r * n);
  return MN_OK;
}

mn_status mn_ref_LAYER_NORM(const mn_ref_ctx *c) {
  const float *x = mn_ref_in_f32(c, 0), *w = mn_ref_in_f32(c, 1), *b = mn_ref_in_f32(c, 2);
  float *o = mn_ref_out_f32(c);
  size_t n = mn_ref_last_dim(&c->node->type), rows = mn_ref_numel(c) / n;
  double eps = c->node->attrs.eps;
  for (size_t r = 0; r < rows; r++) {
    const float *xr = x + r * n;
    double sum = 0;
    for (size_t i = 0; i < n; i++)
      sum += xr[i];
    double mean = sum / (double)n, var = 0;
    for (size_t i = 0; i < n; i++)
      var += (xr[i] - mean) * (xr[i] - mean);
    double inv = 1.0 / sqrt(var / (double)n + eps);
    for (size_t i = 0; i < n; i++)
      o[r * n + i] = (float)((xr[i] - mean) * inv * w[i] + b[i]);
  }
  return MN_OK;
}

mn_status mn_ref_ROPE(const mn_ref_ctx *c) {
  mn_ref_rope_rotate(c, (double)c->node->attrs.pos_offset, NULL, 1);
  return MN_OK;
}

mn_status mn_ref_ROPE_DYNAMIC(const mn_ref_ctx *c) {
  mn_ref_rope_rotate(c, (double)mn_ref_in_u32(c, 1)[0], NULL, 1);
  return MN_OK;
}

mn_status mn_ref_ROPE_POSITIONS(const mn_ref_ctx *c) {
  mn_ref_rope_rotate(c, 0, mn_ref_in_u32(c, 1), 1);
  return MN_OK;
}

/* Every index below `rows`, checked before anything is written; false after recording
 * the first offender. */
static bool indices_in_range(const mn_ref_ctx *c, const uint32_t *idx, size_t n, size_t rows,
                             const char *what) {
  for (size_t i = 0; i < n; i++)
    if (idx[i] >= rows) {
      mn_ref_fail(c, MN_ERR_INVALID_ARGUMENT,
                  "index %u at position %zu of the indices is out of range for %s of %zu rows",
                  idx[i], i, what, rows);
      return false;
    }
  return true;
}

mn_status mn_ref_EMBEDDING(const mn_ref_ctx *c) {
  const uint32_t *idx = mn_ref_in_u32(c, 0);
  const float *table = mn_ref_in_f32(c, 1);
  const mn_tensor_type *tt = mn_ref_in_type(c, 1);
  size_t rows = (size_t)tt->shape[0], d = (size_t)tt->shape[1];
  size_t n = (size_t)mn_tensor_type_numel(mn_ref_in_type(c, 0));
  if (!indices_in_range(c, idx, n, rows, "a table")) return MN_ERR_INVALID_ARGUMENT;
  float *o = mn_ref_out_f32(c);
  for (size_t i = 0; i < n; i++)
    memcpy(o + i * d, table + (size_t)idx[i] * d, d * sizeof *o);
  return MN_OK;
}

/* Positions are grouped by destination row (a stable counting sort) so that each row
 * is summed in double in position order with only a row-sized accumulator. */
mn_status mn_ref_SCATTER_ADD(const mn_ref_ctx *c) {
  const uint32_t *idx = mn_ref_in_u32(c, 0);
  const float *src = mn_ref_in_f32(c, 1);
  size_t rows = (size_t)c->node->attrs.num_rows, d = mn_ref_last_dim(&c->node->type);
  size_t n = (size_t)mn_tensor_type_numel(mn_ref_in_type(c, 0));
  if (!indices_in_range(c, idx, n, rows, "an output")) return MN_ERR_INVALID_ARGUMENT;
  size_t *start = calloc(rows + 1, sizeof *start);
  size_t *order = malloc((n ? n : 1) * sizeof *order);
  double *acc = malloc((d ? d : 1) * sizeof *acc);
  if (!start || !order || !acc) {
    free(start);
    free(order);
    free(acc);
    return mn_ref_fail(c, MN_ERR_OUT_OF_MEMORY, "cannot allocate scratch for %zu rows", rows);
  }
  for (size_t i = 0; i < n; i++)
    start[idx[i] + 1]++;
  for (size_t r = 0; r < rows; r++)
    start[r + 1] += start[r];
  for (size_t i = 0; i < n; i++)
    order[start[idx[i]]++] = i;
  /* The fill loop advanced each start to the next row's start; shift back. */
  for (size_t r = rows; r > 0; r--)
    start[r] = start[r - 1];
  start[0] = 0;
  float *o = mn_ref_out_f32(c);
  for (size_t r = 0; r < rows; r++) {
    for (size_t j = 0; j < d; j++)
      acc[j] = 0;
    for (size_t k = start[r]; k < start[r + 1]; k++) {
      const float *s = src + order[k] * d;
      for (size_t j = 0; j < d; j++)
        acc[j] += s[j];
    }
    for (size_t j = 0; j < d; j++)
      o[r * d + j] = (float)acc[j];
  }
  free(start);
  free(order);
  free(acc);
  return MN_OK;
}
