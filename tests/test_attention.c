/* Attention (causal, full, cross, multi_head_attn) and the KV cache: forward values
 * against float64 numpy fixtures, and the runtime errors of the cache ops. Builder
 * error paths are in test_attention_errors.c. */
#include <stdio.h>
#include <stdlib.h>

#include "tests/fixtures/attention_fixtures.h"
#include "tests/support/mn_test.h"

/* Outputs are rounded once from double, so fp32 vs float64 differs by ~1e-7. */
#define ATT_TOL 1e-6

typedef mn_node (*attn_builder)(mn_graph *g, mn_node q, mn_node k, mn_node v, int num_heads,
                                int num_kv_heads, int head_dim);

static mn_node mha_self(mn_graph *g, mn_node q, mn_node k, mn_node v, int h, int kvh, int hd) {
  return mn_multi_head_attn(g, q, k, v, h, kvh, hd, false);
}
static mn_node mha_cross(mn_graph *g, mn_node q, mn_node k, mn_node v, int h, int kvh, int hd) {
  return mn_multi_head_attn(g, q, k, v, h, kvh, hd, true);
}

typedef struct att_case {
  int batch; /* 0: rank-2 [T, D] tensors */
  int t, s, h, kvh, hd;
  const float *q, *k, *v, *out;
  size_t nq, nk, nout;
} att_case;

#define ATT_CASE(name, b, t_, s_, h_, kvh_, hd_)                                                   \
  ((att_case){.batch = (b),                                                                        \
              .t = (t_),                                                                           \
              .s = (s_),                                                                           \
              .h = (h_),                                                                           \
              .kvh = (kvh_),                                                                       \
              .hd = (hd_),                                                                         \
              .q = att_##name##_q,                                                                 \
              .k = att_##name##_k,                                                                 \
              .v = att_##name##_v,                                                                 \
              .out = att_##name##_out,                                                             \
              .nq = sizeof att_##name##_q / sizeof(float),                                         \
              .nk = sizeof att_##name##_k / sizeof(float),                                         \
              .nout = sizeof att_##name##_out / sizeof(float)})

static mn_node att_input(mn_graph *g, const char *name, int batch, int rows, int width) {
  if (batch) return mn_input(g, name, MN_SHAPE(batch, rows, width));
  return mn_input(g, name, MN_SHAPE(rows, width));
}

/* Builds fn(q, k, v) for the case, checks the node's op and type, runs it and compares
 * with the fixture's output. */
static void check_case(attn_builder fn, const char *op, att_case c) {
  size_t b = c.batch ? (size_t)c.batch : 1;
  cr_assert_eq(c.nq, b * c.t * c.h * c.hd, "fixture q has %zu floats", c.nq);
  cr_assert_eq(c.nk, b * c.s * c.kvh * c.hd, "fixture k has %zu floats", c.nk);
  cr_assert_eq(c.nout, c.nq);
  mn_graph *g = mn_graph_new();
  mn_node q = att_input(g, "q", c.batch, c.t, c.h * c.hd);
  mn_node k = att_input(g, "k", c.batch, c.s, c.kvh * c.hd);
  mn_node v = att_input(g, "v", c.batch, c.s, c.kvh * c.hd);
  mn_node y = fn(g, q, k, v, c.h, c.kvh, c.hd);
  cr_assert_neq(y, MN_NO_NODE, "builder failed: %s", mn_graph_error(g));
  mn_node_info info;
  cr_assert_eq(mn_graph_node(g, y, &info), MN_OK);
  cr_assert_str_eq(info.op, op);
  cr_assert_eq(info.type.dtype, MN_F32);
  cr_assert_eq(info.type.rank, c.batch ? 3 : 2);
  cr_assert_eq(mn_tensor_type_numel(&info.type), (int64_t)c.nq);
  cr_assert_eq(info.type.shape[info.type.rank - 1], c.h * c.hd);
  mn_set_outputs(g, &y, 1);
  mn_test_feed feeds[] = {
      {"q", c.q, NULL, c.nq, false}, {"k", c.k, NULL, c.nk, false}, {"v", c.v, NULL, c.nk, false}};
  mn_session *s = mn_test_run(g, feeds, 3);
  float *out = mn_test_read_output(s, 0, c.nq);
  mn_assert_close(out, c.out, c.nq, ATT_TOL);
  free(out);
  mn_session_free(s);
  mn_graph_free(g);
}

Test(attention, causal_gqa_9_heads_over_3) {
  check_case(mn_causal_attention, "causal_attention", ATT_CASE(gqa_causal, 0, 5, 5, 9, 3, 4));
}
Test(attention, full_gqa_9_heads_over_3) {
  check_case(mn_full_attention, "full_attention", ATT_CASE(gqa_full, 0, 5, 5, 9, 3, 4));
}
Test(attention, full_mha_head_dim_6) {
  check_case(mn_full_attention, "full_attention", ATT_CASE(mha_full_hd6, 0, 7, 7, 2, 2, 6));
}
Test(attention, causal_mha_head_dim_6) {
  check_case(mn_causal_attention, "causal_attention", ATT_CASE(mha_causal_hd6, 0, 7, 7, 2, 2, 6));
}
Test(attention, causal_mqa_t33) {
  check_case(mn_causal_attention, "causal_attention", ATT_CASE(mqa_causal_t33, 0, 33, 33, 4, 1, 6));
}
Test(attention, causal_single_row) {
  check_case(mn_causal_attention, "causal_attention", ATT_CASE(t1_causal, 0, 1, 1, 3, 3, 5));
}
Test(attention, full_single_row) {
  check_case(mn_full_attention, "full_attention", ATT_CASE(t1_full, 0, 1, 1, 2, 1, 3));
}

/* With one key the softmax weight is exactly 1, so each head returns its kv head's v. */
Test(attention, single_key_returns_v) {
  att_case c = ATT_CASE(t1_full, 0, 1, 1, 2, 1, 3);
  float want[6] = {c.v[0], c.v[1], c.v[2], c.v[0], c.v[1], c.v[2]};
  mn_assert_close(c.out, want, 6, 0);
  check_case(mn_cross_attention, "cross_attention", c);
}

Test(attention, causal_batched_rank3) {
  check_case(mn_causal_attention, "causal_attention", ATT_CASE(batch_causal, 2, 6, 6, 4, 2, 3));
}
Test(attention, full_batched_rank3) {
  check_case(mn_full_attention, "full_attention", ATT_CASE(batch_full, 2, 5, 5, 3, 1, 4));
}
Test(attention, cross_s_differs_from_t) {
  check_case(mn_cross_attention, "cross_attention", ATT_CASE(cross, 0, 3, 7, 6, 2, 5));
}
Test(attention, cross_batched_single_key) {
  check_case(mn_cross_attention, "cross_attention", ATT_CASE(cross_batch_s1, 2, 4, 1, 2, 1, 6));
}
Test(attention, cross_batched_33_keys) {
  check_case(mn_cross_attention, "cross_attention", ATT_CASE(cross_batch_long, 2, 2, 33, 3, 3, 2));
}
Test(attention, cross_with_equal_lengths_is_full) {
  check_case(mn_cross_attention, "cross_attention", ATT_CASE(gqa_full, 0, 5, 5, 9, 3, 4));
}
Test(attention, multi_head_attn_self_is_full) {
  check_case(mha_self, "full_attention", ATT_CASE(batch_full, 2, 5, 5, 3, 1, 4));
}
Test(attention, multi_head_attn_cross) {
  check_case(mha_cross, "cross_attention", ATT_CASE(cross, 0, 3, 7, 6, 2, 5));
}

/* A value far outside the fixtures' [-3, 3], so a stray write or read shows. */
#define SENTINEL 123.0f

static mn_session *build_cpu(const mn_graph *g) {
  cr_assert_eq(mn_graph_status(g), MN_OK, "graph in error: %s", mn_graph_error(g));
  mn_session_options o = mn_session_options_default();
  o.backend = MN_BACKEND_CPU;
  mn_session *s = NULL;
  cr_assert_eq(mn_build_inference_session(g, &o, &s), MN_OK, "build: %s", mn_last_error());
  return s;
}

static void set_f32(mn_session *s, const char *name, const float *data, size_t n) {
  cr_assert_eq(mn_session_set_input(s, name, data, n), MN_OK, "%s: %s", name, mn_last_error());
}
static void set_u32(mn_session *s, const char *name, uint32_t value) {
  cr_assert_eq(mn_session_set_input_u32(s, name, &value, 1), MN_OK, "%s: %s", name,
               mn_last_error());
}

/* Asserts rows 0..written-1 of cache [rows, width] equal `want` and the others still
 * hold the sentinel. */
static void check_cache(mn_session *s, size_t index, const float *want, int written, int rows,
                        int width) {
  size_t n = (size_t)rows * width;
  float *got = mn_test_read_output(s, index, n);
  mn_assert_close(got, want, (size_t)written * width, 0);
  for (size_t i = (size_t)written * width; i < n; i++)
    cr_assert_eq(got[i], SENTINEL, "cache output %zu: row %zu was touched: %g", index, i / width,
                 (double)got[i]);
  free(got);
}

/* The decode graph of one layer: write k and v at pos, attend q to rows 0..kv_len-1.
 * Outputs: attention, the k cache, the v cache. */
typedef struct kv_graph {
  mn_graph *g;
  mn_node y, kw, vw;
} kv_graph;

static kv_graph kv_graph_new(int max_seq, int h, int kvh, int hd) {
  kv_graph k = {.g = mn_graph_new()};
  mn_graph *g = k.g;
  mn_node q = mn_input(g, "q", MN_SHAPE(1, h * hd));
  mn_node nk = mn_input(g, "new_k", MN_SHAPE(1, kvh * hd));
  mn_node nv = mn_input(g, "new_v", MN_SHAPE(1, kvh * hd));
  mn_node kc = mn_input(g, "k_cache", MN_SHAPE(max_seq, kvh * hd));
  mn_node vc = mn_input(g, "v_cache", MN_SHAPE(max_seq, kvh * hd));
  mn_node pos = mn_input_u32(g, "pos", MN_SHAPE(1));
  mn_node len = mn_input_u32(g, "kv_len", MN_SHAPE(1));
  k.kw = mn_cache_write(g, nk, kc, pos);
  k.vw = mn_cache_write(g, nv, vc, pos);
  k.y = mn_cached_attention(g, q, k.kw, k.vw, len, h, kvh, hd);
  mn_node outs[3] = {k.y, k.kw, k.vw};
  mn_set_outputs(g, outs, 3);
  cr_assert_eq(mn_graph_status(g), MN_OK, "%s", mn_graph_error(g));
  return k;
}

static void fill_sentinel(mn_session *s, int max_seq, int kv_dim) {
  size_t n = (size_t)max_seq * kv_dim;
  float *fill = malloc(n * sizeof *fill);
  cr_assert_not_null(fill);
  for (size_t i = 0; i < n; i++)
    fill[i] = SENTINEL;
  set_f32(s, "k_cache", fill, n);
  set_f32(s, "v_cache", fill, n);
  free(fill);
}

Test(attention, kv_cache_five_decode_steps_match_causal) {
  enum { STEPS = 5, MAX_SEQ = 8, H = 4, KVH = 2, HD = 6, QD = H * HD, KVD = KVH * HD };
  cr_assert_eq(sizeof att_kv_q / sizeof(float), (size_t)STEPS * QD);
  cr_assert_eq(sizeof att_kv_k / sizeof(float), (size_t)STEPS * KVD);
  kv_graph k = kv_graph_new(MAX_SEQ, H, KVH, HD);
  mn_node_info info;
  cr_assert_eq(mn_graph_node(k.g, k.kw, &info), MN_OK);
  cr_assert_str_eq(info.op, "cache_write");
  cr_assert_eq(info.type.shape[0], MAX_SEQ);
  cr_assert_eq(mn_graph_node(k.g, k.y, &info), MN_OK);
  cr_assert_str_eq(info.op, "cached_attention");
  cr_assert_eq(info.type.shape[1], QD);
  mn_session *s = build_cpu(k.g);
  fill_sentinel(s, MAX_SEQ, KVD);
  for (int i = 0; i < STEPS; i++) {
    set_f32(s, "q", att_kv_q + i * QD, QD);
    set_f32(s, "new_k", att_kv_k + i * KVD, KVD);
    set_f32(s, "new_v", att_kv_v + i * KVD, KVD);
    set_u32(s, "pos", (uint32_t)i);
    set_u32(s, "kv_len", (uint32_t)i + 1);
    cr_assert_eq(mn_session_step(s), MN_OK, "step %d: %s", i, mn_last_error());
    cr_assert_eq(mn_session_wait(s), MN_OK, "wait %d: %s", i, mn_last_error());
    float *y = mn_test_read_output(s, 0, QD);
    mn_assert_close(y, att_kv_out + i * QD, QD, ATT_TOL);
    free(y);
    check_cache(s, 1, att_kv_k, i + 1, MAX_SEQ, KVD);
    check_cache(s, 2, att_kv_v, i + 1, MAX_SEQ, KVD);
  }
  mn_session_free(s);
  mn_graph_free(k.g);
}

/* Rows at and past kv_len hold NaN: reading any of them would make the output NaN. */
Test(attention, cached_attention_reads_only_kv_len_rows) {
  enum { LEN = 3, MAX_SEQ = 6, H = 3, KVH = 3, HD = 4, QD = H * HD, KVD = KVH * HD };
  mn_graph *g = mn_graph_new();
  mn_node q = mn_input(g, "q", MN_SHAPE(1, QD));
  mn_node kc = mn_input(g, "k_cache", MN_SHAPE(MAX_SEQ, KVD));
  mn_node vc = mn_input(g, "v_cache", MN_SHAPE(MAX_SEQ, KVD));
  mn_node len = mn_input_u32(g, "kv_len", MN_SHAPE(1));
  mn_node y = mn_cached_attention(g, q, kc, vc, len, H, KVH, HD);
  mn_set_outputs(g, &y, 1);
  float kd[MAX_SEQ * KVD], vd[MAX_SEQ * KVD];
  for (int i = 0; i < MAX_SEQ * KVD; i++)
    kd[i] = vd[i] = i < LEN * KVD ? 0.0f : NAN;
  memcpy(kd, att_cached_k, sizeof att_cached_k);
  memcpy(vd, att_cached_v, sizeof att_cached_v);
  uint32_t len_v = LEN;
  mn_test_feed feeds[] = {{"q", att_cached_q, NULL, QD, false},
                          {"k_cache", kd, NULL, MAX_SEQ * KVD, false},
                          {"v_cache", vd, NULL, MAX_SEQ * KVD, false},
                          {"kv_len", NULL, &len_v, 1, false}};
  mn_session *s = mn_test_run(g, feeds, 4);
  float *out = mn_test_read_output(s, 0, QD);
  mn_assert_close(out, att_cached_out, QD, ATT_TOL);
  free(out);
  mn_session_free(s);
  mn_graph_free(g);
}

/* Runs one step of the decode graph and asserts that wait reports `fragment`. */
static void expect_step_error(mn_session *s, uint32_t pos, uint32_t kv_len, const char *fragment) {
  set_u32(s, "pos", pos);
  set_u32(s, "kv_len", kv_len);
  cr_assert_eq(mn_session_step(s), MN_OK, "step: %s", mn_last_error());
  mn_assert_error(mn_session_wait(s), MN_ERR_INVALID_ARGUMENT, fragment);
}

Test(attention, kv_runtime_errors_are_reported_by_wait) {
  enum { MAX_SEQ = 8, H = 4, KVH = 2, HD = 6, QD = H * HD, KVD = KVH * HD };
  kv_graph k = kv_graph_new(MAX_SEQ, H, KVH, HD);
  mn_session *s = build_cpu(k.g);
  fill_sentinel(s, MAX_SEQ, KVD);
  set_f32(s, "q", att_kv_q, QD);
  set_f32(s, "new_k", att_kv_k, KVD);
  set_f32(s, "new_v", att_kv_v, KVD);

  expect_step_error(s, MAX_SEQ, 1, "mn_cache_write: kv_pos 8 is out of range for a cache of 8");
  cr_assert(strstr(mn_last_error(), "cache_write") != NULL);
  check_cache(s, 1, att_kv_k, 0, MAX_SEQ, KVD);
  expect_step_error(s, 1000000, 1, "kv_pos 1000000 is out of range");
  check_cache(s, 1, att_kv_k, 0, MAX_SEQ, KVD);

  expect_step_error(s, 0, 0, "mn_cached_attention: kv_len 0 is out of range 1..8");
  expect_step_error(s, 0, MAX_SEQ + 1, "mn_cached_attention: kv_len 9 is out of range 1..8");

  /* The session recovers: a valid step afterwards succeeds and matches step 0. */
  set_u32(s, "pos", 0);
  set_u32(s, "kv_len", 1);
  cr_assert_eq(mn_session_step(s), MN_OK);
  cr_assert_eq(mn_session_wait(s), MN_OK, "%s", mn_last_error());
  float *y = mn_test_read_output(s, 0, QD);
  mn_assert_close(y, att_kv_out, QD, ATT_TOL);
  free(y);
  check_cache(s, 1, att_kv_k, 1, MAX_SEQ, KVD);
  mn_session_free(s);
  mn_graph_free(k.g);
}

/* Two writes chained on one cache both land, and attention sees the second. */
Test(attention, chained_cache_writes) {
  enum { MAX_SEQ = 4, KVD = 6 };
  mn_graph *g = mn_graph_new();
  mn_node a = mn_input(g, "a", MN_SHAPE(1, KVD));
  mn_node b = mn_input(g, "b", MN_SHAPE(1, KVD));
  mn_node c = mn_input(g, "cache", MN_SHAPE(MAX_SEQ, KVD));
  mn_node p0 = mn_input_u32(g, "p0", MN_SHAPE(1));
  mn_node p1 = mn_input_u32(g, "p1", MN_SHAPE(1));
  mn_node w1 = mn_cache_write(g, a, c, p0);
  mn_node w2 = mn_cache_write(g, b, w1, p1);
  mn_set_outputs(g, &w2, 1);
  float ad[KVD] = {1, 2, 3, 4, 5, 6}, bd[KVD] = {-1, -2, -3, -4, -5, -6}, cd[MAX_SEQ * KVD];
  for (int i = 0; i < MAX_SEQ * KVD; i++)
    cd[i] = SENTINEL;
  uint32_t p0v = 3, p1v = 1;
  mn_test_feed feeds[] = {{"a", ad, NULL, KVD, false},
                          {"b", bd, NULL, KVD, false},
                          {"cache", cd, NULL, MAX_SEQ * KVD, false},
                          {"p0", NULL, &p0v, 1, false},
                          {"p1", NULL, &p1v, 1, false}};
  mn_session *s = mn_test_run(g, feeds, 5);
  float *out = mn_test_read_output(s, 0, MAX_SEQ * KVD);
  for (int i = 0; i < MAX_SEQ * KVD; i++) {
    int row = i / KVD;
    float want = row == 3 ? ad[i % KVD] : row == 1 ? bd[i % KVD] : SENTINEL;
    cr_assert_eq(out[i], want, "element %d: got %g, want %g", i, (double)out[i], (double)want);
  }
  free(out);
  mn_session_free(s);
  mn_graph_free(g);
}
