#include "tests/support/cache_rows.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/mn_test.h"

static float *random_floats(size_t n, uint64_t *state) {
  float *x = malloc(n * sizeof *x);
  cr_assert_not_null(x);
  for (size_t i = 0; i < n; i++) {
    *state = *state * 6364136223846793005ull + 1442695040888963407ull;
    x[i] = (float)((double)(*state >> 40) / (double)(1ull << 24) * 3.0 - 1.5);
  }
  return x;
}

mn_test_rows_data mn_test_rows_data_new(const mn_test_rows_case *c, uint64_t seed) {
  size_t rows = (size_t)(c->batch * c->t);
  uint64_t st = seed;
  mn_test_rows_data d = {
      .q = random_floats(rows * (size_t)(c->heads * c->head_dim), &st),
      .k = random_floats(rows * (size_t)(c->kv_heads * c->head_dim), &st),
      .v = random_floats(rows * (size_t)(c->kv_heads * c->head_dim), &st),
  };
  return d;
}

void mn_test_rows_data_free(mn_test_rows_data *d) {
  free(d->q);
  free(d->k);
  free(d->v);
}

/* Rows r0 .. r0+n-1 of every sequence of x [B, T, w] into dst [B, p, w], zeros past n. */
static void chunk_of(const mn_test_rows_case *c, const float *x, int64_t w, int64_t r0, int64_t n,
                     float *dst) {
  memset(dst, 0, (size_t)(c->batch * c->p * w) * sizeof *dst);
  for (int64_t b = 0; b < c->batch; b++)
    memcpy(dst + b * c->p * w, x + (b * c->t + r0) * w, (size_t)(n * w) * sizeof *dst);
}

void mn_test_rows_chunked(const mn_test_rows_case *c, const mn_test_rows_data *d,
                          const mn_session_options *opts, float *out, float *k_cache,
                          float *v_cache) {
  int64_t qd = c->heads * c->head_dim, kvd = c->kv_heads * c->head_dim;
  mn_graph *g = mn_graph_new();
  mn_node q = mn_input(g, "q", MN_SHAPE(c->batch, c->p, qd));
  mn_node nk = mn_input(g, "new_k", MN_SHAPE(c->batch, c->p, kvd));
  mn_node nv = mn_input(g, "new_v", MN_SHAPE(c->batch, c->p, kvd));
  mn_node kc = mn_input(g, "k_cache", MN_SHAPE(c->batch, c->max_seq, kvd));
  mn_node vc = mn_input(g, "v_cache", MN_SHAPE(c->batch, c->max_seq, kvd));
  mn_node pos = mn_input_u32(g, "pos", MN_SHAPE(1));
  mn_node len = mn_input_u32(g, "kv_len", MN_SHAPE(1));
  /* Computed values, so that a bf16 session stores what attention reads in bf16. */
  q = mn_scale(g, q, 1.0f);
  mn_node kw = mn_cache_write(g, mn_scale(g, nk, 1.0f), kc, pos);
  mn_node vw = mn_cache_write(g, mn_scale(g, nv, 1.0f), vc, pos);
  mn_node y = mn_cached_attention(g, q, kw, vw, len, c->heads, c->kv_heads, c->head_dim);
  mn_node outs[3] = {y, kw, vw};
  mn_set_outputs(g, outs, 3);
  cr_assert_eq(mn_graph_status(g), MN_OK, "%s", mn_graph_error(g));
  mn_session *s = NULL;
  cr_assert_eq(mn_build_inference_session(g, opts, &s), MN_OK, "%s", mn_last_error());
  size_t cache_n = (size_t)(c->batch * c->max_seq * kvd);
  /* NaN past every row written: a read of one would show. */
  float *fill = malloc(cache_n * sizeof *fill);
  float *cq = malloc((size_t)(c->batch * c->p * qd) * sizeof *cq);
  float *ck = malloc((size_t)(c->batch * c->p * kvd) * sizeof *ck);
  float *cv = malloc((size_t)(c->batch * c->p * kvd) * sizeof *cv);
  cr_assert(fill && cq && ck && cv);
  for (size_t i = 0; i < cache_n; i++)
    fill[i] = NAN;
  cr_assert_eq(mn_session_set_input(s, "k_cache", fill, cache_n), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_set_input(s, "v_cache", fill, cache_n), MN_OK, "%s", mn_last_error());
  for (int64_t r0 = 0; r0 < c->t; r0 += c->p) {
    int64_t n = c->t - r0 < c->p ? c->t - r0 : c->p;
    uint32_t p0 = (uint32_t)r0, l = (uint32_t)(r0 + c->p);
    chunk_of(c, d->q, qd, r0, n, cq);
    chunk_of(c, d->k, kvd, r0, n, ck);
    chunk_of(c, d->v, kvd, r0, n, cv);
    cr_assert_eq(mn_session_set_input(s, "q", cq, (size_t)(c->batch * c->p * qd)), MN_OK);
    cr_assert_eq(mn_session_set_input(s, "new_k", ck, (size_t)(c->batch * c->p * kvd)), MN_OK);
    cr_assert_eq(mn_session_set_input(s, "new_v", cv, (size_t)(c->batch * c->p * kvd)), MN_OK);
    cr_assert_eq(mn_session_set_input_u32(s, "pos", &p0, 1), MN_OK);
    cr_assert_eq(mn_session_set_input_u32(s, "kv_len", &l, 1), MN_OK);
    cr_assert_eq(mn_session_step(s), MN_OK, "chunk at %lld: %s", (long long)r0, mn_last_error());
    cr_assert_eq(mn_session_wait(s), MN_OK, "chunk at %lld: %s", (long long)r0, mn_last_error());
    float *y_c = mn_test_read_output(s, 0, (size_t)(c->batch * c->p * qd));
    for (int64_t b = 0; b < c->batch; b++)
      memcpy(out + (b * c->t + r0) * qd, y_c + b * c->p * qd, (size_t)(n * qd) * sizeof *out);
    free(y_c);
  }
  float *kk = mn_test_read_output(s, 1, cache_n), *vv = mn_test_read_output(s, 2, cache_n);
  memcpy(k_cache, kk, cache_n * sizeof *k_cache);
  memcpy(v_cache, vv, cache_n * sizeof *v_cache);
  free(kk);
  free(vv);
  free(fill);
  free(cq);
  free(ck);
  free(cv);
  mn_session_free(s);
  mn_graph_free(g);
}

void mn_test_rows_full(const mn_test_rows_case *c, const mn_test_rows_data *d, float *out) {
  int64_t qd = c->heads * c->head_dim, kvd = c->kv_heads * c->head_dim;
  mn_graph *g = mn_graph_new();
  mn_node q = mn_input(g, "q", MN_SHAPE(c->batch, c->t, qd));
  mn_node k = mn_input(g, "k", MN_SHAPE(c->batch, c->t, kvd));
  mn_node v = mn_input(g, "v", MN_SHAPE(c->batch, c->t, kvd));
  mn_node y = mn_causal_attention(g, q, k, v, c->heads, c->kv_heads, c->head_dim);
  mn_set_outputs(g, &y, 1);
  mn_session_options o = mn_session_options_default();
  o.backend = MN_BACKEND_CPU;
  mn_session *s = NULL;
  cr_assert_eq(mn_build_inference_session(g, &o, &s), MN_OK, "%s", mn_last_error());
  size_t rows = (size_t)(c->batch * c->t);
  cr_assert_eq(mn_session_set_input(s, "q", d->q, rows * (size_t)qd), MN_OK);
  cr_assert_eq(mn_session_set_input(s, "k", d->k, rows * (size_t)kvd), MN_OK);
  cr_assert_eq(mn_session_set_input(s, "v", d->v, rows * (size_t)kvd), MN_OK);
  cr_assert_eq(mn_session_step(s), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_wait(s), MN_OK, "%s", mn_last_error());
  float *y_all = mn_test_read_output(s, 0, rows * (size_t)qd);
  memcpy(out, y_all, rows * (size_t)qd * sizeof *out);
  free(y_all);
  mn_session_free(s);
  mn_graph_free(g);
}
