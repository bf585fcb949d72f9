/* The multi-row forms of mn_cache_write and mn_cached_attention (a prefill) on the CPU: a
 * sequence written into the caches in chunks of P rows, the last padded, each chunk attending
 * causally over the cache, equals causal attention over the whole sequence at once, and the
 * caches hold the sequence's rows; GQA, batch 2, P from 1 to more than T. Then the shapes the
 * builders refuse and the positions a step refuses. */
#include <stdlib.h>
#include <string.h>

#include "tests/support/cache_rows.h"
#include "tests/support/mn_test.h"

static void chunked_equals_full(int64_t t, int64_t p) {
  mn_test_rows_case c = {
      .batch = 2, .max_seq = 24, .t = t, .p = p, .heads = 4, .kv_heads = 2, .head_dim = 8};
  mn_test_rows_data d = mn_test_rows_data_new(&c, 100 + (uint64_t)(t * 31 + p));
  size_t qn = (size_t)(c.batch * c.t * c.heads * c.head_dim);
  size_t kvd = (size_t)(c.kv_heads * c.head_dim), cn = (size_t)c.batch * (size_t)c.max_seq * kvd;
  float *got = malloc(qn * sizeof *got), *want = malloc(qn * sizeof *want);
  float *kc = malloc(cn * sizeof *kc), *vc = malloc(cn * sizeof *vc);
  cr_assert(got && want && kc && vc);
  mn_session_options o = mn_session_options_default();
  o.backend = MN_BACKEND_CPU;
  mn_test_rows_chunked(&c, &d, &o, got, kc, vc);
  mn_test_rows_full(&c, &d, want);
  double err = mn_test_max_abs_diff(got, want, qn);
  cr_assert(err < 1e-6, "T %lld, P %lld: max error %g against causal attention", (long long)t,
            (long long)p, err);
  for (int64_t b = 0; b < c.batch; b++) {
    size_t at = (size_t)b * (size_t)c.max_seq * kvd, from = (size_t)(b * c.t) * kvd;
    cr_assert_arr_eq(kc + at, d.k + from, (size_t)c.t * kvd * sizeof(float), "k cache, seq %lld",
                     (long long)b);
    cr_assert_arr_eq(vc + at, d.v + from, (size_t)c.t * kvd * sizeof(float), "v cache, seq %lld",
                     (long long)b);
  }
  free(got);
  free(want);
  free(kc);
  free(vc);
  mn_test_rows_data_free(&d);
}

Test(cache_rows, one_row_per_chunk) { chunked_equals_full(7, 1); }
Test(cache_rows, chunks_that_divide) { chunked_equals_full(12, 4); }
Test(cache_rows, chunks_that_do_not_divide) {
  chunked_equals_full(11, 3);
  chunked_equals_full(11, 5);
}
Test(cache_rows, one_padded_chunk) { chunked_equals_full(5, 8); }

Test(cache_rows, builders_refuse_more_rows_than_the_cache) {
  mn_graph *g = mn_graph_new();
  mn_node kc = mn_input(g, "kc", MN_SHAPE(2, 4, 8));
  mn_node pos = mn_input_u32(g, "pos", MN_SHAPE(1));
  mn_node rows = mn_input(g, "rows", MN_SHAPE(2, 5, 8));
  cr_assert_eq(mn_cache_write(g, rows, kc, pos), MN_NO_NODE);
  cr_assert_eq(mn_graph_status(g), MN_ERR_SHAPE);
  cr_assert(strstr(mn_graph_error(g), "(P rows, P at most the cache's)"), "%s", mn_graph_error(g));
  mn_graph_free(g);
  g = mn_graph_new();
  kc = mn_input(g, "kc", MN_SHAPE(2, 4, 8));
  mn_node len = mn_input_u32(g, "len", MN_SHAPE(1));
  mn_node q = mn_input(g, "q", MN_SHAPE(2, 5, 16));
  cr_assert_eq(mn_cached_attention(g, q, kc, kc, len, 4, 2, 4), MN_NO_NODE);
  cr_assert(strstr(mn_graph_error(g), "or P rows [2,P,16]"), "%s", mn_graph_error(g));
  mn_graph_free(g);
}

/* Three rows at kv_pos 6 of an 8-row cache, and kv_len 2 for three query rows: refused by
 * the step's wait, naming the values. */
Test(cache_rows, steps_refuse_rows_past_the_cache) {
  mn_graph *g = mn_graph_new();
  mn_node kc = mn_input(g, "kc", MN_SHAPE(1, 8, 8));
  mn_node pos = mn_input_u32(g, "pos", MN_SHAPE(1));
  mn_node len = mn_input_u32(g, "len", MN_SHAPE(1));
  mn_node q = mn_input(g, "q", MN_SHAPE(1, 3, 16));
  mn_node kw = mn_cache_write(g, mn_input(g, "nk", MN_SHAPE(1, 3, 8)), kc, pos);
  mn_node y = mn_cached_attention(g, q, kw, kw, len, 4, 2, 4);
  mn_set_outputs(g, &y, 1);
  cr_assert_eq(mn_graph_status(g), MN_OK, "%s", mn_graph_error(g));
  mn_session_options o = mn_session_options_default();
  o.backend = MN_BACKEND_CPU;
  mn_session *s = NULL;
  cr_assert_eq(mn_build_inference_session(g, &o, &s), MN_OK, "%s", mn_last_error());
  uint32_t p = 6, l = 8;
  cr_assert_eq(mn_session_set_input_u32(s, "pos", &p, 1), MN_OK);
  cr_assert_eq(mn_session_set_input_u32(s, "len", &l, 1), MN_OK);
  cr_assert_eq(mn_session_step(s), MN_OK, "%s", mn_last_error());
  mn_assert_error(mn_session_wait(s), MN_ERR_INVALID_ARGUMENT,
                  "kv_pos 6 is out of range for a cache of 8 rows");
  cr_assert(strstr(mn_last_error(), "and 3 new rows"), "%s", mn_last_error());
  p = 0;
  l = 2;
  cr_assert_eq(mn_session_set_input_u32(s, "pos", &p, 1), MN_OK);
  cr_assert_eq(mn_session_set_input_u32(s, "len", &l, 1), MN_OK);
  cr_assert_eq(mn_session_step(s), MN_OK, "%s", mn_last_error());
  mn_assert_error(mn_session_wait(s), MN_ERR_INVALID_ARGUMENT, "kv_len 2 is out of range 3..8");
  mn_session_free(s);
  mn_graph_free(g);
}
