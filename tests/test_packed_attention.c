/* Packed sequences on the reference backend: mn_causal_attention_packed and mn_rope_positions.
 * Gradient checks over rows packed with segments of different lengths (grouped-query heads
 * included); examples packed into one row give, token for token, the output and the gradients
 * of each example run alone through mn_causal_attention and mn_rope; positions 0 .. T-1 give
 * exactly the unpacked ops; the builders' errors; and the bf16 plan's _saved packed gradients
 * computing the same function in fp32. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "host/backend.h"
#include "host/plan.h"
#include "session/session.h"
#include "tests/support/gradcheck.h"
#include "tests/support/mn_test.h"
#include "tests/support/session_util.h"

/* ---------------------------------------------------------------- gradient checks */

typedef struct heads {
  int heads, kv_heads, head_dim;
} heads;

static mn_node build_packed(mn_graph *g, const mn_node *x, void *u) {
  const heads *h = u;
  return mn_causal_attention_packed(g, x[0], x[1], x[2], x[3], h->heads, h->kv_heads, h->head_dim);
}

/* Row 0: segments of 3, 1 and 5 tokens; row 1: 6 then 3. */
static const uint32_t two_rows[] = {0, 1, 2, 0, 0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 0, 1, 2};

Test(packed_attention, gradients_gqa_rank3) {
  heads h = {6, 2, 4};
  mn_gc_leaf l[] = {MN_GC_LEAF("q", -1.5f, 1.5f, 2, 9, 24), MN_GC_LEAF("k", -1.5f, 1.5f, 2, 9, 8),
                    MN_GC_LEAF("v", -1.5f, 1.5f, 2, 9, 8),
                    MN_GC_U32_LEAF("positions", two_rows, 2, 9)};
  mn_gradcheck("packed gqa [2,9]", l, 4, build_packed, &h, NULL);
}

Test(packed_attention, gradients_mha_rank2) {
  /* Segments of 2, 4, 1 and 3; head_dim 6 (not a multiple of 4). */
  static const uint32_t pos[] = {0, 1, 0, 1, 2, 3, 0, 0, 1, 2};
  heads h = {2, 2, 6};
  mn_gc_leaf l[] = {MN_GC_LEAF("q", -1.5f, 1.5f, 10, 12), MN_GC_LEAF("k", -1.5f, 1.5f, 10, 12),
                    MN_GC_LEAF("v", -1.5f, 1.5f, 10, 12), MN_GC_U32_LEAF("positions", pos, 10)};
  mn_gradcheck("packed mha [10]", l, 4, build_packed, &h, NULL);
}

static mn_node build_self(mn_graph *g, const mn_node *x, void *u) {
  const heads *h = u;
  return mn_causal_attention_packed(g, x[0], x[0], x[0], x[1], h->heads, h->kv_heads, h->head_dim);
}

/* One node as q, k and v: the three roles' terms (dQ and the dK | dV pass) add up. */
Test(packed_attention, gradients_self_attention) {
  heads h = {2, 2, 4};
  mn_gc_leaf l[] = {MN_GC_LEAF("x", -1.5f, 1.5f, 2, 9, 8),
                    MN_GC_U32_LEAF("positions", two_rows, 2, 9)};
  mn_gradcheck("packed self [2,9]", l, 2, build_self, &h, NULL);
}

static mn_node build_rope_positions(mn_graph *g, const mn_node *x, void *u) {
  return mn_rope_positions(g, x[0], 10000.0f, x[1], *(const int *)u);
}

Test(packed_attention, rope_positions_gradients) {
  static const uint32_t pos[] = {0, 1, 2, 0, 1, 0, 1, 2, 3, 4, 9, 3};
  const int head_dims[] = {2, 8};
  for (int i = 0; i < 2; i++) {
    int hd = head_dims[i];
    mn_gc_leaf r3[] = {MN_GC_LEAF("x", -1, 1, 2, 6, 3 * hd),
                       MN_GC_U32_LEAF("positions", pos, 2, 6)};
    mn_gradcheck("rope_positions [2,6]", r3, 2, build_rope_positions, &hd, NULL);
    mn_gc_leaf r2[] = {MN_GC_LEAF("x", -1, 1, 12, 2 * hd), MN_GC_U32_LEAF("positions", pos, 12)};
    mn_gradcheck("rope_positions [12]", r2, 2, build_rope_positions, &hd, NULL);
  }
}

/* ---------------------------------------------------------------- packed equals unpacked */

enum { HEADS = 4, KV_HEADS = 2, HD = 8, WQ = HEADS * HD, WKV = KV_HEADS * HD, T = 16 };

typedef enum subject { ATT_PACKED, ATT_CAUSAL, ROPE_PACKED, ROPE_PLAIN } subject;

typedef struct outputs {
  float y[T * WQ], dq[T * WQ], dk[T * WKV], dv[T * WKV];
} outputs;

/* One training step of loss = sum(subject(q, k, v) * r) over a [1, len] row, q, k and v
 * parameters (the RoPE subjects rotate q alone): y and the parameters' gradients into o. */
static void run(subject what, int len, const uint32_t *pos, const float *q, const float *k,
                const float *v, const float *r, outputs *o) {
  mn_graph *g = mn_graph_new();
  bool att = what == ATT_PACKED || what == ATT_CAUSAL;
  mn_node pq = mn_parameter(g, "q", MN_SHAPE(1, len, WQ)), y = MN_NO_NODE;
  mn_node pk = att ? mn_parameter(g, "k", MN_SHAPE(1, len, WKV)) : MN_NO_NODE;
  mn_node pv = att ? mn_parameter(g, "v", MN_SHAPE(1, len, WKV)) : MN_NO_NODE;
  mn_node positions = mn_input_u32(g, "positions", MN_SHAPE(1, len));
  switch (what) {
  case ATT_PACKED:
    y = mn_causal_attention_packed(g, pq, pk, pv, positions, HEADS, KV_HEADS, HD);
    break;
  case ATT_CAUSAL: y = mn_causal_attention(g, pq, pk, pv, HEADS, KV_HEADS, HD); break;
  case ROPE_PACKED: y = mn_rope_positions(g, pq, 10000.0f, positions, HD); break;
  case ROPE_PLAIN: y = mn_rope(g, pq, 10000.0f, HD); break;
  }
  mn_node weights = mn_input(g, "r", MN_SHAPE(1, len, WQ));
  mn_set_outputs(g, (mn_node[]){mn_sum_all(g, mn_mul(g, y, weights)), y}, 2);
  cr_assert_eq(mn_graph_status(g), MN_OK, "%s", mn_graph_error(g));
  mn_session *s = mn_test_session(g, MN_BACKEND_CPU, true);
  size_t nq = (size_t)len * WQ, nkv = (size_t)len * WKV;
  cr_assert_eq(mn_session_set_parameter(s, "q", q, nq), MN_OK, "%s", mn_last_error());
  if (att) {
    cr_assert_eq(mn_session_set_parameter(s, "k", k, nkv), MN_OK, "%s", mn_last_error());
    cr_assert_eq(mn_session_set_parameter(s, "v", v, nkv), MN_OK, "%s", mn_last_error());
  }
  cr_assert_eq(mn_session_set_input(s, "r", r, nq), MN_OK, "%s", mn_last_error());
  /* The unpacked subjects leave positions unread: no plan buffer may back it then. */
  if (what == ATT_PACKED || what == ROPE_PACKED)
    cr_assert_eq(mn_session_set_input_u32(s, "positions", pos, (size_t)len), MN_OK, "%s",
                 mn_last_error());
  mn_test_step_loss(s);
  cr_assert_eq(mn_session_read_output_by_index(s, 1, o->y, nq), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_read_grad(s, "q", o->dq, nq), MN_OK, "%s", mn_last_error());
  if (att) {
    cr_assert_eq(mn_session_read_grad(s, "k", o->dk, nkv), MN_OK, "%s", mn_last_error());
    cr_assert_eq(mn_session_read_grad(s, "v", o->dv, nkv), MN_OK, "%s", mn_last_error());
  }
  mn_session_free(s);
  mn_graph_free(g);
}

typedef struct data {
  float q[T * WQ], k[T * WKV], v[T * WKV], r[T * WQ];
} data;

static void draw(data *d, uint64_t seed) {
  mn_rng rng = mn_rng_new(seed);
  mn_rng_fill(&rng, d->q, T * WQ, -1.5f, 1.5f);
  mn_rng_fill(&rng, d->k, T * WKV, -1.5f, 1.5f);
  mn_rng_fill(&rng, d->v, T * WKV, -1.5f, 1.5f);
  mn_rng_fill(&rng, d->r, T * WQ, -1.0f, 1.0f);
}

/* Rows [0, len) of `alone` against rows [first, first + len) of `packed`, width floats each. */
static void assert_rows(const char *what, const float *packed, const float *alone, int first,
                        int len, int width) {
  double worst = 0;
  for (int i = 0; i < len * width; i++) {
    double e = fabs((double)packed[first * width + i] - alone[i]);
    worst = e > worst ? e : worst;
  }
  cr_assert_leq(worst, 1e-6, "%s of the example at token %d (%d tokens): max error %.3g", what,
                first, len, worst);
}

static const int lengths[] = {5, 3, 8};

static void check_packed_equals_unpacked(bool attention) {
  data d;
  draw(&d, 7);
  uint32_t pos[T];
  for (int e = 0, t = 0; e < 3; e++)
    for (int i = 0; i < lengths[e]; i++)
      pos[t++] = (uint32_t)i;
  outputs *packed = malloc(sizeof *packed), *alone = malloc(sizeof *alone);
  run(attention ? ATT_PACKED : ROPE_PACKED, T, pos, d.q, d.k, d.v, d.r, packed);
  for (int e = 0, first = 0; e < 3; first += lengths[e++]) {
    int len = lengths[e];
    run(attention ? ATT_CAUSAL : ROPE_PLAIN, len, NULL, d.q + first * WQ, d.k + first * WKV,
        d.v + first * WKV, d.r + first * WQ, alone);
    assert_rows("output", packed->y, alone->y, first, len, WQ);
    assert_rows("dq", packed->dq, alone->dq, first, len, WQ);
    if (!attention) continue;
    assert_rows("dk", packed->dk, alone->dk, first, len, WKV);
    assert_rows("dv", packed->dv, alone->dv, first, len, WKV);
  }
  free(packed);
  free(alone);
}

Test(packed_attention, packed_examples_equal_each_example_alone) {
  check_packed_equals_unpacked(true);
}

Test(packed_attention, rope_of_packed_examples_equals_each_example_alone) {
  check_packed_equals_unpacked(false);
}

/* Positions 0 .. T-1 (one example per row) are the unpacked ops, bit for bit. */
static void check_one_example_is_unpacked(bool attention) {
  data d;
  draw(&d, 11);
  uint32_t pos[T];
  for (int t = 0; t < T; t++)
    pos[t] = (uint32_t)t;
  outputs *a = malloc(sizeof *a), *b = malloc(sizeof *b);
  memset(a, 0, sizeof *a);
  memset(b, 0, sizeof *b);
  run(attention ? ATT_PACKED : ROPE_PACKED, T, pos, d.q, d.k, d.v, d.r, a);
  run(attention ? ATT_CAUSAL : ROPE_PLAIN, T, NULL, d.q, d.k, d.v, d.r, b);
  cr_assert(memcmp(a->y, b->y, sizeof a->y) == 0, "outputs differ");
  cr_assert(memcmp(a->dq, b->dq, sizeof a->dq) == 0, "dq differs");
  cr_assert(memcmp(a->dk, b->dk, sizeof a->dk) == 0, "dk differs");
  cr_assert(memcmp(a->dv, b->dv, sizeof a->dv) == 0, "dv differs");
  free(a);
  free(b);
}

Test(packed_attention, one_example_per_row_is_causal_attention_bitwise) {
  check_one_example_is_unpacked(true);
}

Test(packed_attention, rope_at_positions_0_to_t_is_rope_bitwise) {
  check_one_example_is_unpacked(false);
}

/* ---------------------------------------------------------------- builders */

static void expect_error(mn_graph *g, mn_status want, const char *fn, const char *needle) {
  cr_assert_eq(mn_graph_status(g), want, "status %d: %s", mn_graph_status(g), mn_graph_error(g));
  cr_assert(strstr(mn_graph_error(g), fn) != NULL, "%s", mn_graph_error(g));
  cr_assert(strstr(mn_graph_error(g), needle) != NULL, "%s", mn_graph_error(g));
}

Test(packed_attention, builders_check_the_positions) {
  struct {
    bool u32, rope;
    int64_t shape[2];
    int rank;
    mn_status want;
    const char *needle;
  } cases[] = {
      {false, false, {2, 5}, 2, MN_ERR_INVALID_ARGUMENT, "dtype f32, expected u32"},
      {true, false, {2, 4}, 2, MN_ERR_SHAPE, "positions is"},
      {true, false, {10, 1}, 1, MN_ERR_SHAPE, "positions is"},
      {true, false, {2, 5}, 1, MN_ERR_SHAPE, "positions is"},
      {false, true, {2, 5}, 2, MN_ERR_INVALID_ARGUMENT, "dtype f32, expected u32"},
      {true, true, {5, 2}, 2, MN_ERR_SHAPE, "positions is"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    mn_graph *g = mn_graph_new();
    mn_node q = mn_input(g, "q", MN_SHAPE(2, 5, 8)), kv = mn_input(g, "kv", MN_SHAPE(2, 5, 4));
    mn_node p = cases[i].u32 ? mn_input_u32(g, "p", cases[i].shape, cases[i].rank)
                             : mn_input(g, "p", cases[i].shape, cases[i].rank);
    mn_node y = cases[i].rope ? mn_rope_positions(g, q, 10000.0f, p, 4)
                              : mn_causal_attention_packed(g, q, kv, kv, p, 2, 1, 4);
    cr_assert_eq(y, MN_NO_NODE, "case %zu", i);
    expect_error(g, cases[i].want,
                 cases[i].rope ? "mn_rope_positions" : "mn_causal_attention_packed",
                 cases[i].needle);
    mn_graph_free(g);
  }
  /* The other checks are mn_causal_attention's and mn_rope's: heads, widths, lengths. */
  mn_graph *g = mn_graph_new();
  mn_node q = mn_input(g, "q", MN_SHAPE(2, 5, 8)), kv = mn_input(g, "kv", MN_SHAPE(2, 5, 4));
  mn_node p = mn_input_u32(g, "p", MN_SHAPE(2, 5));
  cr_assert_neq(mn_causal_attention_packed(g, q, kv, kv, p, 2, 1, 4), MN_NO_NODE);
  cr_assert_neq(mn_rope_positions(g, q, 10000.0f, p, 4), MN_NO_NODE);
  cr_assert_eq(mn_causal_attention_packed(g, q, kv, kv, p, 2, 3, 4), MN_NO_NODE);
  expect_error(g, MN_ERR_INVALID_ARGUMENT, "mn_causal_attention_packed", "num_heads");
  mn_graph_free(g);
  g = mn_graph_new();
  q = mn_input(g, "q", MN_SHAPE(2, 5, 8));
  p = mn_input_u32(g, "p", MN_SHAPE(2, 5));
  cr_assert_eq(mn_rope_positions(g, q, 10000.0f, p, 3), MN_NO_NODE);
  expect_error(g, MN_ERR_INVALID_ARGUMENT, "mn_rope_positions", "even");
  mn_graph_free(g);
}

/* ---------------------------------------------------------------- saved statistics */

enum { B = 2, TB = 9, D = 16 };

/* x -> q, k, v projections -> packed attention over two_rows -> an output projection. */
static mn_graph *packed_block(void) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(B, TB, D)), t = mn_input(g, "t", MN_SHAPE(B, TB, D));
  mn_node p = mn_input_u32(g, "positions", MN_SHAPE(B, TB));
  mn_node q = mn_matmul(g, x, mn_parameter(g, "wq", MN_SHAPE(D, HEADS * HD)));
  mn_node k = mn_matmul(g, x, mn_parameter(g, "wk", MN_SHAPE(D, KV_HEADS * HD)));
  mn_node v = mn_matmul(g, x, mn_parameter(g, "wv", MN_SHAPE(D, KV_HEADS * HD)));
  mn_node a = mn_causal_attention_packed(g, q, k, v, p, HEADS, KV_HEADS, HD);
  mn_node y = mn_matmul(g, a, mn_parameter(g, "wo", MN_SHAPE(HEADS * HD, D)));
  mn_set_outputs(g, (mn_node[]){mn_mse_loss(g, y, t)}, 1);
  cr_assert_eq(mn_graph_status(g), MN_OK, "%s", mn_graph_error(g));
  return g;
}

static size_t count_op(const mn_plan *p, mn_op op) {
  size_t n = 0;
  for (size_t i = 0; i < p->graph->num_nodes; i++)
    n += p->graph->nodes[i].op == op;
  return n;
}

/* The bf16 plan (dQ and dK | dV in their _saved packed forms, reading the forward's statistics)
 * computing in fp32 gives the plain fp32 session's loss and gradients within 1e-6. */
Test(packed_attention, saved_packed_gradients_compute_the_same_function_in_fp32) {
  mn_graph *g = packed_block();
  mn_session_options o = mn_session_options_default();
  o.backend = MN_BACKEND_CPU;
  o.precision = MN_PRECISION_BF16;
  mn_plan *plan = NULL;
  cr_assert_eq(mn_lower_training("test", g, &o, &plan), MN_OK, "%s", mn_last_error());
  o.precision = MN_PRECISION_F32;
  mn_session *s[2] = {NULL, mn_test_session(g, MN_BACKEND_CPU, true)};
  cr_assert_eq(mn_session_create("test", plan, &o, true, &s[0]), MN_OK, "%s", mn_last_error());
  cr_assert_eq(count_op(s[0]->plan, MN_OP_PACKED_ATTENTION_GRAD_Q_SAVED), 1);
  cr_assert_eq(count_op(s[0]->plan, MN_OP_PACKED_ATTENTION_GRAD_KV_SAVED), 1);
  cr_assert_eq(count_op(s[1]->plan, MN_OP_PACKED_ATTENTION_GRAD_KV), 1);
  mn_rng r = mn_rng_new(5);
  mn_test_init_normal(g, s, 2, &r, 0.4f, false);
  float x[B * TB * D], t[B * TB * D];
  mn_rng_fill(&r, x, B * TB * D, -1.0f, 1.0f);
  mn_rng_fill(&r, t, B * TB * D, -1.0f, 1.0f);
  for (int i = 0; i < 2; i++) {
    cr_assert_eq(mn_session_set_input(s[i], "x", x, B * TB * D), MN_OK, "%s", mn_last_error());
    cr_assert_eq(mn_session_set_input(s[i], "t", t, B * TB * D), MN_OK, "%s", mn_last_error());
    cr_assert_eq(mn_session_set_input_u32(s[i], "positions", two_rows, B * TB), MN_OK, "%s",
                 mn_last_error());
  }
  float l0 = mn_test_step_loss(s[0]), l1 = mn_test_step_loss(s[1]);
  cr_assert_leq(fabs((double)l0 - l1), 1e-6 * fabs((double)l1), "loss %.9g vs %.9g", (double)l0,
                (double)l1);
  const char *names[] = {"wq", "wk", "wv", "wo"};
  const size_t sizes[] = {D * HEADS * HD, D * KV_HEADS * HD, D * KV_HEADS * HD, HEADS * HD * D};
  for (int i = 0; i < 4; i++) {
    float *a = malloc(sizes[i] * sizeof *a), *b = malloc(sizes[i] * sizeof *b);
    cr_assert_eq(mn_session_read_grad(s[0], names[i], a, sizes[i]), MN_OK, "%s", mn_last_error());
    cr_assert_eq(mn_session_read_grad(s[1], names[i], b, sizes[i]), MN_OK, "%s", mn_last_error());
    double e = mn_test_rel_err(a, b, sizes[i]);
    cr_assert_leq(e, 1e-6, "gradient of %s: relative error %.3g", names[i], e);
    free(a);
    free(b);
  }
  mn_session_free(s[0]);
  mn_session_free(s[1]);
  mn_graph_free(g);
}
