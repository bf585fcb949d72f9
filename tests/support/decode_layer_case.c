#include "tests/support/decode_layer_case.h"

#include <stdio.h>
#include <stdlib.h>

#include "host/decode_layer.h"
#include "host/quant.h"
#include "tests/support/mn_test.h"

#define EPS   1e-5f
#define THETA 10000.0f

static mn_node linear_weight(const mn_test_dl_case *c, mn_graph *g, const char *name, int64_t out,
                             int64_t in) {
  if (c->quant == MN_QUANT_NONE) return mn_parameter(g, name, MN_SHAPE(out, in));
  int64_t words = (int64_t)mn_quant_row_words(c->quant, c->group_size, in);
  return mn_input_u32(g, name, MN_SHAPE(out, words));
}

/* x w^T through the product the weight's kind takes. */
static mn_node product(const mn_test_dl_case *c, mn_graph *g, mn_node x, mn_node w) {
  if (c->quant == MN_QUANT_NONE) return mn_matmul_bt(g, x, w);
  mn_node_info wi, xi;
  cr_assert_eq(mn_graph_node(g, w, &wi), MN_OK);
  cr_assert_eq(mn_graph_node(g, x, &xi), MN_OK);
  return mn_matmul_quant(g, x, w, c->quant, c->group_size, wi.type.shape[0],
                         xi.type.shape[xi.type.rank - 1]);
}

mn_graph *mn_test_dl_graph(const mn_test_dl_case *c, bool fused) {
  mn_graph *g = mn_graph_new();
  int64_t q_dim = c->heads * c->head_dim, kv_dim = c->kv_heads * c->head_dim;
  int hd = (int)c->head_dim;
  mn_node x = mn_input(g, "x", MN_SHAPE(c->batch, 1, c->dim));
  mn_node ln1 = mn_parameter(g, "ln1", MN_SHAPE(c->dim));
  mn_node wq = linear_weight(c, g, "wq", q_dim, c->dim);
  mn_node wk = linear_weight(c, g, "wk", kv_dim, c->dim);
  mn_node wv = linear_weight(c, g, "wv", kv_dim, c->dim);
  mn_node wo = linear_weight(c, g, "wo", c->dim, q_dim);
  mn_node ln2 = mn_parameter(g, "ln2", MN_SHAPE(c->dim));
  mn_node wg = linear_weight(c, g, "wgate", c->ff, c->dim);
  mn_node wu = linear_weight(c, g, "wup", c->ff, c->dim);
  mn_node wd = linear_weight(c, g, "wdown", c->dim, c->ff);
  mn_node kc = mn_input(g, "k_cache", MN_SHAPE(c->batch, c->max_seq, kv_dim));
  mn_node vc = mn_input(g, "v_cache", MN_SHAPE(c->batch, c->max_seq, kv_dim));
  mn_node pos = mn_input_u32(g, "pos", MN_SHAPE(1));
  mn_node len = mn_input_u32(g, "kv_len", MN_SHAPE(1));
  mn_node y;
  if (fused) {
    mn_node w[9] = {ln1, wq, wk, wv, wo, ln2, wg, wu, wd};
    y = mn_llama_decode_layer(g, x, w, kc, vc, pos, len, (int)c->heads, (int)c->kv_heads, hd, EPS,
                              THETA, c->quant, c->group_size);
  } else {
    mn_node a = mn_rms_norm(g, x, ln1, EPS);
    mn_node q = mn_rope_dynamic_offset(g, product(c, g, a, wq), THETA, pos, hd);
    mn_node k = mn_rope_dynamic_offset(g, product(c, g, a, wk), THETA, pos, hd);
    mn_node v = product(c, g, a, wv);
    kc = mn_cache_write(g, k, kc, pos);
    vc = mn_cache_write(g, v, vc, pos);
    mn_node att = mn_cached_attention(g, q, kc, vc, len, (int)c->heads, (int)c->kv_heads, hd);
    mn_node h = mn_add(g, x, product(c, g, att, wo));
    mn_node m = mn_rms_norm(g, h, ln2, EPS);
    mn_node f = mn_swiglu(g, product(c, g, m, wg), product(c, g, m, wu));
    y = mn_add(g, h, product(c, g, f, wd));
  }
  mn_set_outputs(g, &y, 1);
  return g;
}

static void set_param(mn_session *s, mn_rng *r, const char *name, size_t n, float lo, float hi) {
  float *v = malloc(n * sizeof *v);
  cr_assert(v);
  mn_rng_fill(r, v, n, lo, hi);
  cr_assert_eq(mn_session_set_parameter(s, name, v, n), MN_OK, "%s: %s", name, mn_last_error());
  free(v);
}

/* A Linear weight [out, in] of random values in [-lim, lim): the parameter, or its packed rows. */
static void set_linear(const mn_test_dl_case *c, mn_session *s, mn_rng *r, const char *name,
                       size_t out, size_t in, float lim) {
  if (c->quant == MN_QUANT_NONE) {
    set_param(s, r, name, out * in, -lim, lim);
    return;
  }
  float *v = malloc(out * in * sizeof *v);
  size_t words = out * mn_quant_row_words(c->quant, c->group_size, (int64_t)in);
  uint32_t *packed = malloc(words * sizeof *packed);
  cr_assert(v && packed);
  mn_rng_fill(r, v, out * in, -lim, lim);
  mn_quantize(c->quant, c->group_size, v, out, in, packed);
  cr_assert_eq(mn_session_set_input_u32(s, name, packed, words), MN_OK, "%s: %s", name,
               mn_last_error());
  free(v);
  free(packed);
}

void mn_test_dl_run(const mn_test_dl_case *c, const mn_graph *g, const mn_session_options *o,
                    int steps, uint64_t seed, float *out) {
  cr_assert_eq(mn_graph_status(g), MN_OK, "%s", mn_graph_error(g));
  mn_session *s = NULL;
  cr_assert_eq(mn_build_inference_session(g, o, &s), MN_OK, "%s", mn_last_error());
  mn_rng r = mn_rng_new(seed);
  size_t d = (size_t)c->dim, q_dim = (size_t)(c->heads * c->head_dim),
         kv_dim = (size_t)(c->kv_heads * c->head_dim), ff = (size_t)c->ff;
  /* Weights scaled by 1 / sqrt(fan-in), so that the values stay of order one. */
  float sd = 1.7f / sqrtf((float)d), sq = 1.7f / sqrtf((float)q_dim), sf = 1.7f / sqrtf((float)ff);
  set_param(s, &r, "ln1", d, 0.5f, 1.5f);
  set_linear(c, s, &r, "wq", q_dim, d, sd);
  set_linear(c, s, &r, "wk", kv_dim, d, sd);
  set_linear(c, s, &r, "wv", kv_dim, d, sd);
  set_linear(c, s, &r, "wo", d, q_dim, sq);
  set_param(s, &r, "ln2", d, 0.5f, 1.5f);
  set_linear(c, s, &r, "wgate", ff, d, sd);
  set_linear(c, s, &r, "wup", ff, d, sd);
  set_linear(c, s, &r, "wdown", d, ff, sf);
  size_t cache_n = (size_t)(c->batch * c->max_seq) * kv_dim, xn = (size_t)c->batch * d;
  float *cache = malloc(cache_n * sizeof *cache), *x = malloc(xn * sizeof *x);
  cr_assert(cache && x);
  for (int kv = 0; kv < 2; kv++) {
    mn_rng_fill(&r, cache, cache_n, -1.5f, 1.5f);
    cr_assert_eq(mn_session_set_input(s, kv ? "v_cache" : "k_cache", cache, cache_n), MN_OK, "%s",
                 mn_last_error());
  }
  for (int step = 0; step < steps; step++) {
    uint32_t pos = (uint32_t)(c->pos + step), len = pos + 1;
    mn_rng_fill(&r, x, xn, -2.0f, 2.0f);
    cr_assert_eq(mn_session_set_input(s, "x", x, xn), MN_OK, "%s", mn_last_error());
    cr_assert_eq(mn_session_set_input_u32(s, "pos", &pos, 1), MN_OK, "%s", mn_last_error());
    cr_assert_eq(mn_session_set_input_u32(s, "kv_len", &len, 1), MN_OK, "%s", mn_last_error());
    cr_assert_eq(mn_session_step(s), MN_OK, "step %d: %s", step, mn_last_error());
    cr_assert_eq(mn_session_wait(s), MN_OK, "step %d: %s", step, mn_last_error());
    cr_assert_eq(mn_session_read_output_by_index(s, 0, out + (size_t)step * xn, xn), MN_OK, "%s",
                 mn_last_error());
  }
  free(cache);
  free(x);
  mn_session_free(s);
}

mn_status mn_test_dl_step_at(const mn_test_dl_case *c, mn_backend backend, uint32_t pos,
                             uint32_t kv_len) {
  mn_graph *g = mn_test_dl_graph(c, true);
  mn_session *s = NULL;
  mn_session_options o = mn_session_options_default();
  o.backend = backend;
  cr_assert_eq(mn_build_inference_session(g, &o, &s), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_set_input_u32(s, "pos", &pos, 1), MN_OK);
  cr_assert_eq(mn_session_set_input_u32(s, "kv_len", &kv_len, 1), MN_OK);
  mn_status st = mn_session_step(s);
  if (st == MN_OK) st = mn_session_wait(s);
  mn_session_free(s);
  mn_graph_free(g);
  return st;
}
