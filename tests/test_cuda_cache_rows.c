/* The multi-row KV-cache ops (a prefill in chunks, tests/support/cache_rows.h) on CUDA against
 * the CPU: the attention outputs and the caches in fp32 and bf16, GQA, batch 2, chunks that
 * divide the sequence and chunks that do not, with head dims of the FP32 kernel's tiles; and
 * their kernels compile without a device. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "tests/support/cache_rows.h"
#include "tests/support/cuda_check.h"
#include "tests/support/mn_test.h"

/* ||a - b|| / ||b||. */
static double rel_err(const float *a, const float *b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; i++) {
    double d = (double)a[i] - (double)b[i];
    num += d * d;
    den += (double)b[i] * b[i];
  }
  return den > 0 ? sqrt(num / den) : sqrt(num);
}

static double case_error(const mn_test_rows_case *c, mn_precision prec) {
  mn_test_rows_data d = mn_test_rows_data_new(c, 300 + (uint64_t)(c->t * 7 + c->p));
  size_t qn = (size_t)(c->batch * c->t * c->heads * c->head_dim);
  size_t cn = (size_t)(c->batch * c->max_seq * c->kv_heads * c->head_dim);
  float *y[2], *k[2], *v[2];
  for (int i = 0; i < 2; i++) {
    y[i] = malloc(qn * sizeof(float));
    k[i] = malloc(cn * sizeof(float));
    v[i] = malloc(cn * sizeof(float));
    cr_assert(y[i] && k[i] && v[i]);
    mn_session_options o = mn_session_options_default();
    o.backend = i ? MN_BACKEND_CUDA : MN_BACKEND_CPU;
    o.precision = prec;
    mn_test_rows_chunked(c, &d, &o, y[i], k[i], v[i]);
  }
  /* The caches past the rows written hold the NaN both sessions started with: compare the rows
   * of the sequence only. */
  size_t kvd = (size_t)(c->kv_heads * c->head_dim), seq = (size_t)c->max_seq * kvd;
  double err = rel_err(y[1], y[0], qn);
  for (int64_t b = 0; b < c->batch; b++) {
    double ek = rel_err(k[1] + (size_t)b * seq, k[0] + (size_t)b * seq, (size_t)c->t * kvd);
    double ev = rel_err(v[1] + (size_t)b * seq, v[0] + (size_t)b * seq, (size_t)c->t * kvd);
    err = fmax(err, fmax(ek, ev));
  }
  for (size_t i = 0; i < qn; i++)
    cr_assert(isfinite(y[1][i]), "output %zu is %g", i, (double)y[1][i]);
  for (int i = 0; i < 2; i++) {
    free(y[i]);
    free(k[i]);
    free(v[i]);
  }
  mn_test_rows_data_free(&d);
  return err;
}

static void cases(mn_precision prec, double tol) {
  mn_test_require_cuda_device();
  const mn_test_rows_case all[] = {
      {.batch = 2, .max_seq = 24, .t = 11, .p = 3, .heads = 4, .kv_heads = 2, .head_dim = 8},
      {.batch = 2, .max_seq = 24, .t = 12, .p = 4, .heads = 4, .kv_heads = 2, .head_dim = 8},
      {.batch = 2, .max_seq = 200, .t = 150, .p = 32, .heads = 9, .kv_heads = 3, .head_dim = 64},
      {.batch = 1, .max_seq = 300, .t = 130, .p = 128, .heads = 6, .kv_heads = 2, .head_dim = 32},
      {.batch = 2, .max_seq = 40, .t = 5, .p = 8, .heads = 2, .kv_heads = 1, .head_dim = 128},
  };
  double worst = 0;
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) {
    double e = case_error(&all[i], prec);
    cr_assert(e <= tol, "%s case %zu: relative error %g above %g", mn_test_precision_name(prec), i,
              e, tol);
    worst = fmax(worst, e);
  }
  printf("cuda_cache_rows %s: largest relative error %.3g (tolerance %.3g)\n",
         mn_test_precision_name(prec), worst, tol);
}

Test(cuda_cache_rows, f32_equals_cpu) { cases(MN_PRECISION_F32, 1e-5); }
Test(cuda_cache_rows, bf16_equals_cpu) { cases(MN_PRECISION_BF16, MN_TEST_BF16_TOL); }

/* A chunk's ops compile in fp32 and bf16 (no device needed). */
Test(cuda_cache_rows, kernels_compile) {
  mn_test_require_cuda_build();
  mn_graph *g = mn_graph_new();
  mn_node pos = mn_input_u32(g, "pos", MN_SHAPE(1)), len = mn_input_u32(g, "kv_len", MN_SHAPE(1));
  mn_node q = mn_input(g, "q", MN_SHAPE(2, 32, 576)), k = mn_input(g, "k", MN_SHAPE(2, 32, 192));
  mn_node kc = mn_cache_write(g, k, mn_input(g, "kc", MN_SHAPE(2, 300, 192)), pos);
  mn_node vc = mn_cache_write(g, k, mn_input(g, "vc", MN_SHAPE(2, 300, 192)), pos);
  mn_node att = mn_cached_attention(g, q, kc, vc, len, 9, 3, 64);
  cr_assert_eq(mn_graph_status(g), MN_OK, "%s", mn_graph_error(g));
  mn_set_outputs(g, &att, 1);
  mn_test_assert_compiles_precision(g, false, MN_PRECISION_F32);
  mn_test_assert_compiles_precision(g, false, MN_PRECISION_BF16);
  mn_graph_free(g);
}
