/* Error paths of the attention and KV-cache builders: each asserts the status, a
 * fragment of the message, that no node was added and that the graph keeps its first
 * error when a later builder call fails too. */
#include <stdio.h>

#include "tests/support/mn_test.h"

/* The graph must be in error `want` with `fragment`, hold `num_nodes` nodes, and keep
 * exactly that message after another failing call. */
static void assert_first_error(mn_graph *g, mn_node got, size_t num_nodes, mn_status want,
                               const char *fragment) {
  cr_assert_eq(got, MN_NO_NODE, "builder returned node %u", got);
  mn_assert_graph_error(g, want, fragment);
  cr_assert(strstr(mn_last_error(), fragment) != NULL, "last error \"%s\" lacks \"%s\"",
            mn_last_error(), fragment);
  cr_assert_eq(mn_graph_num_nodes(g), num_nodes);
  char first[512];
  snprintf(first, sizeof first, "%s", mn_graph_error(g));
  cr_assert_eq(mn_causal_attention(g, 0, 0, 0, 0, 0, 0), MN_NO_NODE);
  cr_assert_eq(mn_cache_write(g, 0, 0, 0), MN_NO_NODE);
  cr_assert_eq(mn_graph_status(g), want);
  cr_assert_str_eq(mn_graph_error(g), first);
  cr_assert_eq(mn_graph_num_nodes(g), num_nodes);
}

/* Inputs of a valid GQA call: q [5, 36] (9 heads of 4), k and v [5, 12] (3 kv heads). */
typedef struct att_graph {
  mn_graph *g;
  mn_node q, k, v;
} att_graph;

static att_graph att_graph_new(void) {
  att_graph a = {.g = mn_graph_new()};
  a.q = mn_input(a.g, "q", MN_SHAPE(5, 36));
  a.k = mn_input(a.g, "k", MN_SHAPE(5, 12));
  a.v = mn_input(a.g, "v", MN_SHAPE(5, 12));
  return a;
}

#define EXPECT_ATT_ERROR(call, want, fragment)                                                     \
  do {                                                                                             \
    att_graph a = att_graph_new();                                                                 \
    mn_graph *g = a.g;                                                                             \
    (void)g;                                                                                       \
    size_t n0 = mn_graph_num_nodes(a.g);                                                           \
    mn_node r = (call);                                                                            \
    assert_first_error(a.g, r, n0, (want), (fragment));                                            \
    mn_graph_free(a.g);                                                                            \
  } while (0)

/* With no graph to hold it, the message goes only to mn_last_error(). */
static void expect_null_graph(mn_node got, const char *fragment) {
  cr_assert_eq(got, MN_NO_NODE);
  cr_assert(strstr(mn_last_error(), fragment) != NULL, "last error \"%s\" lacks \"%s\"",
            mn_last_error(), fragment);
}

Test(attention_errors, null_graph) {
  expect_null_graph(mn_causal_attention(NULL, 0, 1, 2, 1, 1, 1),
                    "mn_causal_attention: graph is NULL");
  expect_null_graph(mn_full_attention(NULL, 0, 1, 2, 1, 1, 1), "mn_full_attention: graph is NULL");
  expect_null_graph(mn_cross_attention(NULL, 0, 1, 2, 1, 1, 1),
                    "mn_cross_attention: graph is NULL");
  expect_null_graph(mn_multi_head_attn(NULL, 0, 1, 2, 1, 1, 1, true),
                    "mn_multi_head_attn: graph is NULL");
  expect_null_graph(mn_cache_write(NULL, 0, 1, 2), "mn_cache_write: graph is NULL");
  expect_null_graph(mn_cached_attention(NULL, 0, 1, 2, 3, 1, 1, 1),
                    "mn_cached_attention: graph is NULL");
}

Test(attention_errors, missing_and_unknown_inputs) {
  EXPECT_ATT_ERROR(mn_causal_attention(g, MN_NO_NODE, a.k, a.v, 9, 3, 4), MN_ERR_INVALID_ARGUMENT,
                   "mn_causal_attention: input 0 is MN_NO_NODE");
  EXPECT_ATT_ERROR(mn_full_attention(g, a.q, a.k, MN_NO_NODE, 9, 3, 4), MN_ERR_INVALID_ARGUMENT,
                   "mn_full_attention: input 2 is MN_NO_NODE");
  EXPECT_ATT_ERROR(mn_cross_attention(g, a.q, 99, a.v, 9, 3, 4), MN_ERR_INVALID_ARGUMENT,
                   "mn_cross_attention: input 1 is node 99, but the graph has 3 nodes");
}

Test(attention_errors, head_counts) {
  EXPECT_ATT_ERROR(mn_causal_attention(g, a.q, a.k, a.v, 0, 3, 4), MN_ERR_INVALID_ARGUMENT,
                   "mn_causal_attention: num_heads is 0, must be positive");
  EXPECT_ATT_ERROR(mn_full_attention(g, a.q, a.k, a.v, 9, -3, 4), MN_ERR_INVALID_ARGUMENT,
                   "mn_full_attention: num_kv_heads is -3, must be positive");
  EXPECT_ATT_ERROR(mn_cross_attention(g, a.q, a.k, a.v, 9, 3, 0), MN_ERR_INVALID_ARGUMENT,
                   "mn_cross_attention: head_dim is 0, must be positive");
  EXPECT_ATT_ERROR(mn_multi_head_attn(g, a.q, a.k, a.v, 9, 2, 4, false), MN_ERR_INVALID_ARGUMENT,
                   "mn_multi_head_attn: num_heads 9 is not a multiple of num_kv_heads 2");
}

Test(attention_errors, dtypes) {
  att_graph a = att_graph_new();
  mn_node qu = mn_input_u32(a.g, "qu", MN_SHAPE(5, 36));
  size_t n0 = mn_graph_num_nodes(a.g);
  assert_first_error(a.g, mn_causal_attention(a.g, qu, a.k, a.v, 9, 3, 4), n0,
                     MN_ERR_INVALID_ARGUMENT,
                     "mn_causal_attention: q is node 3 [5,36] u32 with dtype u32, expected f32");
  mn_graph_free(a.g);

  a = att_graph_new();
  mn_node vu = mn_input_u32(a.g, "vu", MN_SHAPE(5, 12));
  n0 = mn_graph_num_nodes(a.g);
  assert_first_error(a.g, mn_full_attention(a.g, a.q, a.k, vu, 9, 3, 4), n0,
                     MN_ERR_INVALID_ARGUMENT, "mn_full_attention: v is node 3 [5,12] u32");
  mn_graph_free(a.g);
}

Test(attention_errors, ranks) {
  att_graph a = att_graph_new();
  mn_node q1 = mn_input(a.g, "q1", MN_SHAPE(36));
  size_t n0 = mn_graph_num_nodes(a.g);
  assert_first_error(a.g, mn_causal_attention(a.g, q1, a.k, a.v, 9, 3, 4), n0, MN_ERR_SHAPE,
                     "mn_causal_attention: q is node 3 [36] of rank 1, expected rank 2 to 3");
  mn_graph_free(a.g);

  a = att_graph_new();
  mn_node q4 = mn_input(a.g, "q4", MN_SHAPE(1, 1, 5, 36));
  n0 = mn_graph_num_nodes(a.g);
  assert_first_error(a.g, mn_full_attention(a.g, q4, a.k, a.v, 9, 3, 4), n0, MN_ERR_SHAPE,
                     "q is node 3 [1,1,5,36] of rank 4, expected rank 2 to 3");
  mn_graph_free(a.g);

  a = att_graph_new();
  mn_node k3 = mn_input(a.g, "k3", MN_SHAPE(1, 5, 12));
  n0 = mn_graph_num_nodes(a.g);
  assert_first_error(a.g, mn_cross_attention(a.g, a.q, k3, a.v, 9, 3, 4), n0, MN_ERR_SHAPE,
                     "mn_cross_attention: k is node 3 [1,5,12] of rank 3, expected rank 2");
  mn_graph_free(a.g);
}

Test(attention_errors, widths_and_kv_shapes) {
  att_graph a = att_graph_new();
  mn_node q35 = mn_input(a.g, "q35", MN_SHAPE(5, 35));
  size_t n0 = mn_graph_num_nodes(a.g);
  assert_first_error(
      a.g, mn_causal_attention(a.g, q35, a.k, a.v, 9, 3, 4), n0, MN_ERR_SHAPE,
      "mn_causal_attention: q is node 3 [5,35]: last dim 35, expected num_heads*head_dim = 9*4 "
      "= 36");
  mn_graph_free(a.g);

  a = att_graph_new();
  mn_node k10 = mn_input(a.g, "k10", MN_SHAPE(5, 10));
  mn_node v10 = mn_input(a.g, "v10", MN_SHAPE(5, 10));
  n0 = mn_graph_num_nodes(a.g);
  assert_first_error(a.g, mn_full_attention(a.g, a.q, k10, v10, 9, 3, 4), n0, MN_ERR_SHAPE,
                     "k is node 3 [5,10]: last dim 10, expected num_kv_heads*head_dim = 3*4 = 12");
  mn_graph_free(a.g);

  a = att_graph_new();
  mn_node v6 = mn_input(a.g, "v6", MN_SHAPE(6, 12));
  n0 = mn_graph_num_nodes(a.g);
  assert_first_error(a.g, mn_cross_attention(a.g, a.q, a.k, v6, 9, 3, 4), n0, MN_ERR_SHAPE,
                     "mn_cross_attention: node 1 [5,12] and node 3 [6,12]: shapes differ");
  mn_graph_free(a.g);
}

Test(attention_errors, batch_sizes_differ) {
  mn_graph *g = mn_graph_new();
  mn_node q = mn_input(g, "q", MN_SHAPE(2, 5, 36));
  mn_node k = mn_input(g, "k", MN_SHAPE(3, 5, 12));
  mn_node v = mn_input(g, "v", MN_SHAPE(3, 5, 12));
  size_t n0 = mn_graph_num_nodes(g);
  assert_first_error(g, mn_multi_head_attn(g, q, k, v, 9, 3, 4, true), n0, MN_ERR_SHAPE,
                     "mn_multi_head_attn: q is node 0 [2,5,36] and k is node 1 [3,5,12]: batch "
                     "sizes 2 and 3 differ");
  mn_graph_free(g);
}

/* Causal, full and multi_head_attn(!is_cross) need S == T; cross variants accept it. */
Test(attention_errors, lengths_differ_only_for_cross) {
  mn_graph *g = mn_graph_new();
  mn_node q = mn_input(g, "q", MN_SHAPE(3, 36));
  mn_node k = mn_input(g, "k", MN_SHAPE(7, 12));
  mn_node v = mn_input(g, "v", MN_SHAPE(7, 12));
  mn_node c = mn_cross_attention(g, q, k, v, 9, 3, 4);
  mn_node m = mn_multi_head_attn(g, q, k, v, 9, 3, 4, true);
  cr_assert_neq(c, MN_NO_NODE, "%s", mn_graph_error(g));
  cr_assert_neq(m, MN_NO_NODE, "%s", mn_graph_error(g));
  mn_node_info info;
  cr_assert_eq(mn_graph_node(g, m, &info), MN_OK);
  cr_assert_str_eq(info.op, "cross_attention");
  cr_assert_eq(info.type.shape[0], 3);
  cr_assert_eq(info.type.shape[1], 36);
  size_t n0 = mn_graph_num_nodes(g);
  assert_first_error(g, mn_causal_attention(g, q, k, v, 9, 3, 4), n0, MN_ERR_SHAPE,
                     "mn_causal_attention: q is node 0 [3,36] and k is node 1 [7,12]: query "
                     "length 3 and key length 7 differ");
  mn_graph_free(g);

  const char *names[2] = {"mn_full_attention: ", "mn_multi_head_attn: "};
  for (int i = 0; i < 2; i++) {
    g = mn_graph_new();
    q = mn_input(g, "q", MN_SHAPE(2, 3, 36));
    k = mn_input(g, "k", MN_SHAPE(2, 7, 12));
    v = mn_input(g, "v", MN_SHAPE(2, 7, 12));
    mn_node r = i == 0 ? mn_full_attention(g, q, k, v, 9, 3, 4)
                       : mn_multi_head_attn(g, q, k, v, 9, 3, 4, false);
    assert_first_error(g, r, 3, MN_ERR_SHAPE, names[i]);
    mn_assert_graph_error(g, MN_ERR_SHAPE, "query length 3 and key length 7 differ");
    mn_graph_free(g);
  }
}

/* Inputs of a valid cache write: new_kv [1, 12], cache [8, 12], kv_pos [1] u32. */
typedef struct kv_inputs {
  mn_graph *g;
  mn_node row, cache, pos;
} kv_inputs;

static kv_inputs kv_inputs_new(void) {
  kv_inputs k = {.g = mn_graph_new()};
  k.row = mn_input(k.g, "row", MN_SHAPE(1, 12));
  k.cache = mn_input(k.g, "cache", MN_SHAPE(8, 12));
  k.pos = mn_input_u32(k.g, "pos", MN_SHAPE(1));
  return k;
}

/* `extra` adds one more node (id 3) before the failing call. */
#define EXPECT_KV_ERROR(extra, call, want, fragment)                                               \
  do {                                                                                             \
    kv_inputs k = kv_inputs_new();                                                                 \
    mn_graph *g = k.g;                                                                             \
    mn_node x = (extra);                                                                           \
    (void)x;                                                                                       \
    size_t n0 = mn_graph_num_nodes(g);                                                             \
    mn_node r = (call);                                                                            \
    assert_first_error(g, r, n0, (want), (fragment));                                              \
    mn_graph_free(g);                                                                              \
  } while (0)

Test(attention_errors, cache_write_valid_node) {
  kv_inputs k = kv_inputs_new();
  mn_node w = mn_cache_write(k.g, k.row, k.cache, k.pos);
  cr_assert_neq(w, MN_NO_NODE, "%s", mn_graph_error(k.g));
  mn_node w2 = mn_cache_write(k.g, k.row, w, k.pos);
  cr_assert_neq(w2, MN_NO_NODE, "%s", mn_graph_error(k.g));
  mn_node_info info;
  cr_assert_eq(mn_graph_node(k.g, w2, &info), MN_OK);
  cr_assert_str_eq(info.op, "cache_write");
  cr_assert_eq(info.num_inputs, 3);
  cr_assert_eq(info.inputs[1], w);
  cr_assert_eq(info.type.dtype, MN_F32);
  cr_assert_eq(info.type.rank, 2);
  cr_assert_eq(info.type.shape[0], 8);
  cr_assert_eq(info.type.shape[1], 12);
  mn_graph_free(k.g);
}

Test(attention_errors, cache_write_inputs) {
  EXPECT_KV_ERROR(0, mn_cache_write(g, k.row, MN_NO_NODE, k.pos), MN_ERR_INVALID_ARGUMENT,
                  "mn_cache_write: input 1 is MN_NO_NODE");
  EXPECT_KV_ERROR(0, mn_cache_write(g, k.row, k.cache, 50), MN_ERR_INVALID_ARGUMENT,
                  "mn_cache_write: input 2 is node 50");
}

Test(attention_errors, cache_must_be_an_input) {
  EXPECT_KV_ERROR(mn_parameter(g, "w", MN_SHAPE(8, 12)), mn_cache_write(g, k.row, x, k.pos),
                  MN_ERR_INVALID_ARGUMENT,
                  "mn_cache_write: cache is node 3 [8,12] (op parameter); the cache must be an "
                  "mn_input");
  EXPECT_KV_ERROR(mn_scale(g, k.cache, 2.0f), mn_cache_write(g, k.row, x, k.pos),
                  MN_ERR_INVALID_ARGUMENT, "cache is node 3 [8,12] (op scale); the cache must be");
}

Test(attention_errors, cache_write_shapes_and_dtypes) {
  EXPECT_KV_ERROR(mn_input(g, "r2", MN_SHAPE(2, 12)), mn_cache_write(g, x, k.cache, k.pos),
                  MN_ERR_SHAPE,
                  "mn_cache_write: new_kv is node 3 [2,12], expected [1,12] (a row of cache node "
                  "1 [8,12] per sequence)");
  EXPECT_KV_ERROR(mn_input(g, "r10", MN_SHAPE(1, 10)), mn_cache_write(g, x, k.cache, k.pos),
                  MN_ERR_SHAPE, "new_kv is node 3 [1,10], expected [1,12]");
  EXPECT_KV_ERROR(mn_input(g, "r1", MN_SHAPE(12)), mn_cache_write(g, x, k.cache, k.pos),
                  MN_ERR_SHAPE, "new_kv is node 3 [12] of rank 1, expected rank 2");
  EXPECT_KV_ERROR(mn_input_u32(g, "ru", MN_SHAPE(1, 12)), mn_cache_write(g, x, k.cache, k.pos),
                  MN_ERR_INVALID_ARGUMENT, "new_kv is node 3 [1,12] u32 with dtype u32");
  EXPECT_KV_ERROR(mn_input_u32(g, "cu", MN_SHAPE(8, 12)), mn_cache_write(g, k.row, x, k.pos),
                  MN_ERR_INVALID_ARGUMENT,
                  "mn_cache_write: cache is node 3 [8,12] u32 with dtype u32, expected f32");
  EXPECT_KV_ERROR(mn_input(g, "c3", MN_SHAPE(2, 8, 12)), mn_cache_write(g, k.row, x, k.pos),
                  MN_ERR_SHAPE,
                  "new_kv is node 0 [1,12], expected [2,12] (a row of cache node 3 [2,8,12] per "
                  "sequence)");
  EXPECT_KV_ERROR(mn_input(g, "pf", MN_SHAPE(1)), mn_cache_write(g, k.row, k.cache, x),
                  MN_ERR_INVALID_ARGUMENT,
                  "mn_cache_write: kv_pos is node 3 [1] with dtype f32, expected u32");
  EXPECT_KV_ERROR(mn_input_u32(g, "p2", MN_SHAPE(2)), mn_cache_write(g, k.row, k.cache, x),
                  MN_ERR_SHAPE, "mn_cache_write: kv_pos is node 3 [2] u32, expected [1] u32");
  EXPECT_KV_ERROR(mn_input_u32(g, "p11", MN_SHAPE(1, 1)), mn_cache_write(g, k.row, k.cache, x),
                  MN_ERR_SHAPE, "kv_pos is node 3 [1,1] u32 of rank 2, expected rank 1");
}

/* Inputs of a valid cached attention: q [1, 24] (4 heads of 6), caches [8, 12]. */
typedef struct cached_inputs {
  mn_graph *g;
  mn_node q, kc, vc, len;
} cached_inputs;

static cached_inputs cached_inputs_new(void) {
  cached_inputs c = {.g = mn_graph_new()};
  c.q = mn_input(c.g, "q", MN_SHAPE(1, 24));
  c.kc = mn_input(c.g, "k_cache", MN_SHAPE(8, 12));
  c.vc = mn_input(c.g, "v_cache", MN_SHAPE(8, 12));
  c.len = mn_input_u32(c.g, "kv_len", MN_SHAPE(1));
  return c;
}

/* `extra` adds one more node (id 4) before the failing call. */
#define EXPECT_CACHED_ERROR(extra, call, want, fragment)                                           \
  do {                                                                                             \
    cached_inputs c = cached_inputs_new();                                                         \
    mn_graph *g = c.g;                                                                             \
    mn_node x = (extra);                                                                           \
    (void)x;                                                                                       \
    size_t n0 = mn_graph_num_nodes(g);                                                             \
    mn_node r = (call);                                                                            \
    assert_first_error(g, r, n0, (want), (fragment));                                              \
    mn_graph_free(g);                                                                              \
  } while (0)

Test(attention_errors, cached_attention_valid_node) {
  cached_inputs c = cached_inputs_new();
  mn_node y = mn_cached_attention(c.g, c.q, c.kc, c.vc, c.len, 4, 2, 6);
  cr_assert_neq(y, MN_NO_NODE, "%s", mn_graph_error(c.g));
  mn_node_info info;
  cr_assert_eq(mn_graph_node(c.g, y, &info), MN_OK);
  cr_assert_str_eq(info.op, "cached_attention");
  cr_assert_eq(info.num_inputs, 4);
  cr_assert_eq(info.type.rank, 2);
  cr_assert_eq(info.type.shape[0], 1);
  cr_assert_eq(info.type.shape[1], 24);
  mn_graph_free(c.g);
}

Test(attention_errors, cached_attention_inputs_and_counts) {
  EXPECT_CACHED_ERROR(0, mn_cached_attention(g, c.q, c.kc, c.vc, MN_NO_NODE, 4, 2, 6),
                      MN_ERR_INVALID_ARGUMENT, "mn_cached_attention: input 3 is MN_NO_NODE");
  EXPECT_CACHED_ERROR(0, mn_cached_attention(g, c.q, 77, c.vc, c.len, 4, 2, 6),
                      MN_ERR_INVALID_ARGUMENT, "mn_cached_attention: input 1 is node 77");
  EXPECT_CACHED_ERROR(0, mn_cached_attention(g, c.q, c.kc, c.vc, c.len, 4, 2, 0),
                      MN_ERR_INVALID_ARGUMENT,
                      "mn_cached_attention: head_dim is 0, must be positive");
  EXPECT_CACHED_ERROR(0, mn_cached_attention(g, c.q, c.kc, c.vc, c.len, 4, 3, 6),
                      MN_ERR_INVALID_ARGUMENT,
                      "mn_cached_attention: num_heads 4 is not a multiple of num_kv_heads 3");
}

Test(attention_errors, cached_attention_shapes_and_dtypes) {
  EXPECT_CACHED_ERROR(
      mn_input(g, "q2", MN_SHAPE(2, 24)), mn_cached_attention(g, x, c.kc, c.vc, c.len, 4, 2, 6),
      MN_ERR_SHAPE,
      "mn_cached_attention: q is node 4 [2,24], expected one row per sequence [1,24]");
  EXPECT_CACHED_ERROR(mn_input(g, "q20", MN_SHAPE(1, 20)),
                      mn_cached_attention(g, x, c.kc, c.vc, c.len, 4, 2, 6), MN_ERR_SHAPE,
                      "q is node 4 [1,20]: last dim 20, expected num_heads*head_dim = 4*6 = 24");
  EXPECT_CACHED_ERROR(mn_input(g, "q3", MN_SHAPE(2, 1, 24)),
                      mn_cached_attention(g, x, c.kc, c.vc, c.len, 4, 2, 6), MN_ERR_SHAPE,
                      "q is node 4 [2,1,24], expected one row per sequence [1,24]");
  EXPECT_CACHED_ERROR(mn_input(g, "v7", MN_SHAPE(7, 12)),
                      mn_cached_attention(g, c.q, c.kc, x, c.len, 4, 2, 6), MN_ERR_SHAPE,
                      "mn_cached_attention: node 1 [8,12] and node 4 [7,12]: shapes differ");
  EXPECT_CACHED_ERROR(
      mn_input(g, "k10", MN_SHAPE(8, 10)), mn_cached_attention(g, c.q, x, x, c.len, 4, 2, 6),
      MN_ERR_SHAPE, "k_cache is node 4 [8,10]: last dim 10, expected num_kv_heads*head_dim = 2*6");
  EXPECT_CACHED_ERROR(mn_input_u32(g, "ku", MN_SHAPE(8, 12)),
                      mn_cached_attention(g, c.q, x, c.vc, c.len, 4, 2, 6), MN_ERR_INVALID_ARGUMENT,
                      "k_cache is node 4 [8,12] u32 with dtype u32");
  EXPECT_CACHED_ERROR(mn_input(g, "lf", MN_SHAPE(1)),
                      mn_cached_attention(g, c.q, c.kc, c.vc, x, 4, 2, 6), MN_ERR_INVALID_ARGUMENT,
                      "mn_cached_attention: kv_len is node 4 [1] with dtype f32, expected u32");
  EXPECT_CACHED_ERROR(mn_input_u32(g, "l3", MN_SHAPE(3)),
                      mn_cached_attention(g, c.q, c.kc, c.vc, x, 4, 2, 6), MN_ERR_SHAPE,
                      "kv_len is node 4 [3] u32, expected [1] u32");
}
