/* mn_matmul_quant on the CPU: each weight row is dequantized once (host/quant.h) and dotted in
 * double with every row of x, QUANT_ROWS rows at a time through the tiled product of
 * ref_math.c. Threads take contiguous runs of output features, and every
 * output element is the same sum in the same order whichever thread computes it, so the
 * result does not depend on MN_CPU_THREADS. */
#include <stdbool.h>
#include <stdlib.h>

#include "host/quant.h"
#include "host/reference/ref_shared.h"

/* Weight rows dequantized at a time: the tiled product's width. */
#define QUANT_ROWS 4

typedef struct quant_part {
  const float *x;
  const unsigned char *w;
  float *y, *row; /* row: this part's dequantized weight rows [QUANT_ROWS, in] */
  mn_quant format;
  int group;
  size_t rows, in, out, row_bytes, from, to;
} quant_part;

static void quant_features(const quant_part *p) {
  for (size_t o = p->from; o < p->to; o += QUANT_ROWS) {
    size_t n = p->to - o < QUANT_ROWS ? p->to - o : QUANT_ROWS;
    for (size_t f = 0; f < n; f++)
      mn_dequantize_row(p->format, p->group, p->w + (o + f) * p->row_bytes, p->row + f * p->in,
                        p->in);
    mn_ref_gemm_serial(p->x, p->in, 1, p->row, 1, p->in, p->y + o, p->out, p->rows, n, p->in);
  }
}

static void quant_run(const void *part) { quant_features(part); }

bool mn_ref_quant_product(const float *x, size_t rows, const void *w, mn_quant format, int group,
                          size_t in, size_t out, float *y) {
  size_t threads = mn_ref_threads((double)rows * (double)in * (double)out, out);
  float *scratch = malloc(threads * QUANT_ROWS * in * sizeof *scratch);
  if (!scratch) return false;
  quant_part parts[MN_REF_MAX_THREADS];
  for (size_t t = 0; t < threads; t++)
    parts[t] = (quant_part){.x = x,
                            .w = w,
                            .y = y,
                            .row = scratch + t * QUANT_ROWS * in,
                            .format = format,
                            .group = group,
                            .rows = rows,
                            .in = in,
                            .out = out,
                            .row_bytes = mn_quant_row_words(format, group, (int64_t)in) * 4,
                            .from = out * t / threads,
                            .to = out * (t + 1) / threads};
  mn_ref_run_parts(quant_run, parts, sizeof *parts, threads);
  free(scratch);
  return true;
}

mn_status mn_ref_MATMUL_QUANT(const mn_ref_ctx *c) {
  const mn_tensor_type *tx = mn_ref_in_type(c, 0);
  size_t in = mn_ref_last_dim(tx), out = mn_ref_last_dim(&c->node->type);
  size_t rows = (size_t)mn_tensor_type_numel(tx) / in;
  if (!mn_ref_quant_product(mn_ref_in_f32(c, 0), rows, mn_ref_in_u32(c, 1),
                            (mn_quant)c->node->attrs.variant, c->node->attrs.groups, in, out,
                            mn_ref_out_f32(c)))
    return mn_ref_fail(c, MN_ERR_OUT_OF_MEMORY, "out of memory for a weight row");
  return MN_OK;
}
