/* Reference kernels: matrix products and element-wise ops. */
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>

#include "host/pointwise.h"
#include "host/reference/ref_shared.h"

/* Output elements [from, to) of a product, row-major: every element is the same double sum
 * in the same order whichever thread computes it, so the result does not depend on how the
 * work is split. */
typedef struct gemm_part {
  const float *a, *b;
  float *c;
  size_t a_row, a_col, b_row, b_col, n, k, from, to;
  size_t ldc; /* c's row pitch */
} gemm_part;

/* Tiles of outputs: rows i0 .. i0 + RN - 1 (RN 4 or 1) by columns j0 .. j0 + 3, independent
 * double sums, each over p = 0 .. k - 1 in order (the same sum as one element alone), so that
 * the chains of dependent adds overlap and each operand value is loaded once a tile. A row's four
 * sums are one vector (GCC/Clang vector extensions: two SSE2 registers, or one AVX2 register in
 * the clone picked at load time on x86-64 CPUs that have it); there is no fused multiply-add
 * either way, so the sums are the same. */
typedef double gemm_v4d __attribute__((vector_size(32)));
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define GEMM_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define GEMM_CLONES
#endif
#define GEMM_TILE(RN)                                                                              \
  GEMM_CLONES static void gemm_tile_##RN##x4(const gemm_part *g, size_t i0, size_t j0) {           \
    gemm_v4d acc[RN] = {{0}};                                                                      \
    for (size_t p = 0; p < g->k; p++) {                                                            \
      const float *bp = g->b + p * g->b_row + j0 * g->b_col;                                       \
      gemm_v4d bv = {bp[0], bp[g->b_col], bp[2 * g->b_col], bp[3 * g->b_col]};                     \
      for (size_t r = 0; r < RN; r++) {                                                            \
        double av = g->a[(i0 + r) * g->a_row + p * g->a_col];                                      \
        acc[r] += (gemm_v4d){av, av, av, av} * bv;                                                 \
      }                                                                                            \
    }                                                                                              \
    for (size_t r = 0; r < RN; r++)                                                                \
      for (size_t u = 0; u < 4; u++)                                                               \
        g->c[(i0 + r) * g->ldc + j0 + u] = (float)acc[r][u];                                       \
  }
GEMM_TILE(4)
GEMM_TILE(1)
#undef GEMM_TILE

/* One output element alone (a row's last columns). */
static void gemm_one(const gemm_part *g, size_t i, size_t j) {
  double acc = 0;
  for (size_t p = 0; p < g->k; p++)
    acc += (double)g->a[i * g->a_row + p * g->a_col] * g->b[p * g->b_row + j * g->b_col];
  g->c[i * g->ldc + j] = (float)acc;
}

/* The elements [from, to) row by row: four whole rows at a time where the part has them, in
 * tiles of 4 columns, the last columns of a row one by one. */
static void gemm_elements(const gemm_part *g) {
  size_t e = g->from;
  while (e < g->to) {
    size_t i = e / g->n, j = e % g->n;
    size_t row_end = (i + 1) * g->n < g->to ? (i + 1) * g->n : g->to;
    bool four_rows = j == 0 && (i + 4) * g->n <= g->to;
    size_t j_end = row_end - i * g->n;
    for (; j + 4 <= j_end; j += 4) {
      if (four_rows)
        gemm_tile_4x4(g, i, j);
      else
        gemm_tile_1x4(g, i, j);
    }
    for (; j < j_end; j++) {
      gemm_one(g, i, j);
      if (four_rows)
        for (size_t r = 1; r < 4; r++)
          gemm_one(g, i + r, j);
    }
    e = four_rows ? (i + 4) * g->n : row_end;
  }
}

/* The product's operands as mn_ref_gemm takes them, elements [from, to) to compute. */
static gemm_part gemm_span(const float *a, size_t a_row, size_t a_col, const float *b, size_t b_row,
                           size_t b_col, float *c, size_t ldc, size_t n, size_t k, size_t from,
                           size_t to) {
  return (gemm_part){.a = a,
                     .b = b,
                     .c = c,
                     .a_row = a_row,
                     .a_col = a_col,
                     .b_row = b_row,
                     .b_col = b_col,
                     .n = n,
                     .k = k,
                     .from = from,
                     .to = to,
                     .ldc = ldc};
}

void mn_ref_gemm_serial(const float *a, size_t a_row, size_t a_col, const float *b, size_t b_row,
                        size_t b_col, float *c, size_t ldc, size_t m, size_t n, size_t k) {
  gemm_part g = gemm_span(a, a_row, a_col, b, b_row, b_col, c, ldc, n, k, 0, m * n);
  gemm_elements(&g);
}

static void gemm_run(const void *part) { gemm_elements(part); }

void mn_ref_gemm(const float *a, size_t a_row, size_t a_col, const float *b, size_t b_row,
                 size_t b_col, float *c, size_t m, size_t n, size_t k) {
  size_t total = m * n, threads = mn_ref_threads((double)m * (double)n * (double)k, total);
  gemm_part parts[MN_REF_MAX_THREADS];
  for (size_t t = 0; t < threads; t++)
    parts[t] = gemm_span(a, a_row, a_col, b, b_row, b_col, c, n, n, k, total * t / threads,
                         total * (t + 1) / threads);
  mn_ref_run_parts(gemm_run, parts, sizeof *parts, threads);
}

/* A product the optimizer gave a scale (scale_fold.h) multiplies its rounded result, as the
 * scale op it replaced did. */
static void apply_alpha(const mn_ref_ctx *c) {
  float s = c->node->attrs.scale;
  if (s == 0.0f) return;
  float *o = mn_ref_out_f32(c);
  for (size_t i = 0, total = mn_ref_numel(c); i < total; i++)
    o[i] *= s;
}

mn_status mn_ref_MATMUL(const mn_ref_ctx *c) {
  const mn_tensor_type *ta = mn_ref_in_type(c, 0), *tb = mn_ref_in_type(c, 1);
  size_t k = (size_t)mn_ref_last_dim(ta), n = (size_t)tb->shape[1],
         m = (size_t)mn_tensor_type_numel(ta) / k;
  mn_ref_gemm(mn_ref_in_f32(c, 0), k, 1, mn_ref_in_f32(c, 1), n, 1, mn_ref_out_f32(c), m, n, k);
  apply_alpha(c);
  return MN_OK;
}

mn_status mn_ref_MATMUL_BT(const mn_ref_ctx *c) {
  const mn_tensor_type *ta = mn_ref_in_type(c, 0), *tb = mn_ref_in_type(c, 1);
  size_t k = (size_t)mn_ref_last_dim(ta), n = (size_t)tb->shape[0],
         m = (size_t)mn_tensor_type_numel(ta) / k;
  mn_ref_gemm(mn_ref_in_f32(c, 0), k, 1, mn_ref_in_f32(c, 1), 1, k, mn_ref_out_f32(c), m, n, k);
  apply_alpha(c);
  return MN_OK;
}

mn_status mn_ref_MATMUL_AT(const mn_ref_ctx *c) {
  const mn_tensor_type *ta = mn_ref_in_type(c, 0), *tb = mn_ref_in_type(c, 1);
  size_t m = (size_t)mn_ref_last_dim(ta), n = (size_t)mn_ref_last_dim(tb),
         k = (size_t)mn_tensor_type_numel(ta) / m;
  mn_ref_gemm(mn_ref_in_f32(c, 0), 1, m, mn_ref_in_f32(c, 1), n, 1, mn_ref_out_f32(c), m, n, k);
  apply_alpha(c);
  return MN_OK;
}

/* x [.., N] + row [N] or [1, N]: the row repeats over every leading index. */
static mn_status add_row(const mn_ref_ctx *c) {
  const float *x = mn_ref_in_f32(c, 0), *row = mn_ref_in_f32(c, 1);
  float *o = mn_ref_out_f32(c);
  size_t n = (size_t)mn_ref_last_dim(&c->node->type), total = mn_ref_numel(c);
  for (size_t i = 0; i < total; i++)
    o[i] = x[i] + row[i % n];
  return MN_OK;
}
mn_status mn_ref_BIAS_ADD(const mn_ref_ctx *c) { return add_row(c); }
mn_status mn_ref_BROADCAST_ADD(const mn_ref_ctx *c) { return add_row(c); }

/* Dropout and its gradient apply one mask, drawn from the node's seed and the step
 * (host/pointwise.h): the gradient node carries its forward's seed and p. */
static mn_status dropout(const mn_ref_ctx *c) {
  const float *x = mn_ref_in_f32(c, 0);
  float *o = mn_ref_out_f32(c);
  float p = c->node->attrs.scale;
  unsigned threshold = mn_pw_dropout_threshold(p);
  unsigned long long key =
      mn_pw_dropout_key((unsigned long long)c->node->attrs.seed, c->micro_step);
  for (size_t i = 0, n = mn_ref_numel(c); i < n; i++)
    o[i] = mn_pw_dropout(x[i], key, i, threshold, p);
  return MN_OK;
}
mn_status mn_ref_DROPOUT(const mn_ref_ctx *c) { return dropout(c); }
mn_status mn_ref_DROPOUT_GRAD(const mn_ref_ctx *c) { return dropout(c); }
