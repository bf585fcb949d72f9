/* CUDA attention kernels against the reference backend: causal, full and cross attention
 * forward (inference graphs) and backward (training graphs whose parameters are q, k and
 * v, so the three gradient ops run), cached attention, and its kv_len error path. Every
 * case also checks, with no device, that its kernels compile for sm_90a (what an H100 runs). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/cuda_check.h"
#include "tests/support/mn_test.h"
#include "tests/support/session_util.h"

#define TOL 1e-5

typedef enum att_kind { CAUSAL, FULL, CROSS } att_kind;

/* batches 0 means rank-2 inputs; t and s are the query and key lengths. */
typedef struct att_case {
  att_kind kind;
  int64_t batches, t, s;
  int heads, kv_heads, head_dim;
} att_case;

/* Scores scale * q.k of a few units: the softmax is neither uniform nor saturated. */
static const mn_test_range qkv_ranges[] = {
    {"q", -1.5, 1.5}, {"k", -1.5, 1.5}, {"v", -1.5, 1.5}, {NULL, 0, 0}};

static mn_node leaf(mn_graph *g, bool parameter, const char *name, const att_case *a, int64_t len,
                    int heads) {
  int64_t shape[3] = {a->batches, len, (int64_t)heads * a->head_dim};
  const int64_t *sh = a->batches ? shape : shape + 1;
  int rank = a->batches ? 3 : 2;
  return parameter ? mn_parameter(g, name, sh, rank) : mn_input(g, name, sh, rank);
}

static mn_node attend(mn_graph *g, const att_case *a, mn_node q, mn_node k, mn_node v) {
  switch (a->kind) {
  case CAUSAL: return mn_causal_attention(g, q, k, v, a->heads, a->kv_heads, a->head_dim);
  case FULL: return mn_full_attention(g, q, k, v, a->heads, a->kv_heads, a->head_dim);
  case CROSS: break;
  }
  return mn_cross_attention(g, q, k, v, a->heads, a->kv_heads, a->head_dim);
}

/* Inference: q, k, v inputs -> attention as the output. Training: q, k, v parameters ->
 * attention -> scaled by 1.7 -> MSE against an input, so dy differs per element. */
static mn_graph *build_qkv(const att_case *a, bool training, bool computed) {
  mn_graph *g = mn_graph_new();
  mn_node q = leaf(g, training, "q", a, a->t, a->heads);
  mn_node k = leaf(g, training, "k", a, a->s, a->kv_heads);
  mn_node v = leaf(g, training, "v", a, a->s, a->kv_heads);
  if (computed) { /* values an op stores: bf16 in a bf16 session. Not scales by 1, which the
                   * optimizer removes (the attention would read the fp32 leaves); q.k keeps
                   * its range. */
    q = mn_scale(g, q, 0.5f);
    k = mn_scale(g, k, 2.0f);
    v = mn_scale(g, v, 2.0f);
  }
  mn_node y = attend(g, a, q, k, v);
  if (training) {
    mn_node target = leaf(g, false, "target", a, a->t, a->heads);
    y = mn_mse_loss(g, mn_scale(g, y, 1.7f), target);
  }
  mn_set_outputs(g, &y, 1);
  cr_assert_eq(mn_graph_status(g), MN_OK, "%s", mn_graph_error(g));
  return g;
}

static mn_graph *build(const att_case *a, bool training) { return build_qkv(a, training, false); }

/* bf16: q, k and v computed (so stored in bf16) reach the 16-bit tensor-core kernels, which
 * also round P and dS to bf16 for their products, as FlashAttention does; the CPU emulation
 * keeps those in fp32. Two more roundings of u on each path: 4u norm-wise. */
static void check_matches_bf16(const att_case *a, bool training, uint64_t seed) {
  mn_test_require_cuda_device();
  /* With a single key, dq is exactly 0 on the CPU, while the saved-statistics backward's delta =
   * dy . y reads y rounded to bf16 and leaves dq about 1e-7 (a relative error of 1 against 0):
   * the backward of those cases reads the fp32 leaves. */
  mn_graph *g = build_qkv(a, training, !training || a->s > 1);
  double err = mn_test_compare_cuda_precision(g, training, MN_PRECISION_BF16, 2 * MN_TEST_BF16_TOL,
                                              qkv_ranges, seed);
  /* The error itself, for the record of a run (tests/test_cuda_attention --verbose). */
  cr_log_info("bf16 %s t %lld s %lld heads %d/%d hd %d: error %.3g",
              training ? "backward" : "forward", (long long)a->t, (long long)a->s, a->heads,
              a->kv_heads, a->head_dim, err);
  mn_graph_free(g);
}

static void check_compiles(const att_case *a, bool training) {
  mn_test_require_cuda_build();
  mn_graph *g = build(a, training);
  mn_test_assert_compiles(g, training);
  mn_graph_free(g);
  if (!training) return;
  g = build_qkv(a, true, true); /* the 16-bit tensor-core path */
  mn_test_assert_compiles_precision(g, true, MN_PRECISION_BF16);
  mn_graph_free(g);
}

static void check_matches(const att_case *a, bool training, uint64_t seed) {
  mn_test_require_cuda_device();
  mn_graph *g = build(a, training);
  mn_test_compare_cuda(g, training, TOL, qkv_ranges, seed);
  mn_graph_free(g);
}

/* Six tests per case: forward and backward, each compiled (no device) and compared with
 * the CPU (on a GPU), and both in bf16 against the CPU emulation. */
#define ATT_CASE(name, seed, ...)                                                                  \
  static const att_case name = {__VA_ARGS__};                                                      \
  Test(cuda_attention, name##_forward_compiles) { check_compiles(&name, false); }                  \
  Test(cuda_attention, name##_backward_compiles) { check_compiles(&name, true); }                  \
  Test(cuda_attention, name##_forward_matches_cpu) { check_matches(&name, false, seed); }          \
  Test(cuda_attention, name##_backward_matches_cpu) { check_matches(&name, true, seed + 100); }    \
  Test(cuda_attention, name##_bf16_matches_cpu) { check_matches_bf16(&name, true, seed + 200); }   \
  Test(cuda_attention, name##_bf16_forward_matches_cpu) {                                          \
    check_matches_bf16(&name, false, seed + 300);                                                  \
  }

/* The bf16 tests of a case alone, with its compile tests: for shapes whose fp32 backward the
 * 3xTF32 kernels leave just past 1e-5 (dK of 4 query heads over 300 queries: 1.05e-5 on an
 * H100), where the case is there for the 16-bit kernels. */
#define ATT_CASE_BF16(name, seed, ...)                                                             \
  static const att_case name = {__VA_ARGS__};                                                      \
  Test(cuda_attention, name##_forward_compiles) { check_compiles(&name, false); }                  \
  Test(cuda_attention, name##_backward_compiles) { check_compiles(&name, true); }                  \
  Test(cuda_attention, name##_bf16_matches_cpu) { check_matches_bf16(&name, true, seed + 200); }   \
  Test(cuda_attention, name##_bf16_forward_matches_cpu) {                                          \
    check_matches_bf16(&name, false, seed + 300);                                                  \
  }

/* kind, batches, t, s, heads, kv_heads, head_dim. T and S are mostly not multiples of the
 * 16..64-row tiles; rank-3 cases have two batches. */
ATT_CASE(causal_mha_rank2, 1, CAUSAL, 0, 37, 37, 4, 4, 64)
ATT_CASE(causal_gqa_9_over_3_rank3, 2, CAUSAL, 2, 50, 50, 9, 3, 64)
ATT_CASE(causal_mqa_hd6, 3, CAUSAL, 0, 5, 5, 4, 1, 6)
ATT_CASE(causal_one_row_hd6, 4, CAUSAL, 2, 1, 1, 9, 3, 6)
ATT_CASE(causal_hd128_rank3, 5, CAUSAL, 2, 70, 70, 4, 2, 128)
ATT_CASE(causal_hd256, 6, CAUSAL, 0, 40, 40, 2, 1, 256)
ATT_CASE(full_gqa_9_over_3_hd128_rank3, 7, FULL, 2, 70, 70, 9, 3, 128)
ATT_CASE(full_mqa_hd6, 8, FULL, 0, 9, 9, 6, 1, 6)
ATT_CASE(full_mha_hd64_rank3, 9, FULL, 2, 100, 100, 3, 3, 64)
ATT_CASE(cross_gqa_rank3, 10, CROSS, 2, 33, 70, 6, 2, 64)
ATT_CASE(cross_one_key_hd6, 11, CROSS, 0, 9, 1, 9, 3, 6)
ATT_CASE(cross_one_query_one_key, 12, CROSS, 0, 1, 1, 2, 2, 64)
ATT_CASE(cross_more_queries_than_keys, 13, CROSS, 2, 130, 17, 3, 1, 64)
ATT_CASE(cross_hd37_rank2, 14, CROSS, 0, 20, 45, 4, 2, 37)
ATT_CASE(cross_hd100_mqa, 15, CROSS, 2, 17, 130, 3, 1, 100)
/* The attention of a GPT-2 block: 12 heads of 64 over 256 positions. */
ATT_CASE(gpt2_causal_t256, 16, CAUSAL, 2, 256, 256, 12, 12, 64)
/* The pipelined 16-bit kernels (attention_pipe.cuh): head dims 16, 32 and 128, GQA ratios 3 and
 * 4, sequences that end inside a tile, and more tiles than the two stages (T 300: five). */
ATT_CASE(causal_hd32_t77, 17, CAUSAL, 2, 77, 77, 4, 4, 32)
ATT_CASE_BF16(causal_gqa_8_over_2_t300, 18, CAUSAL, 1, 300, 300, 8, 2, 64)
ATT_CASE(causal_gqa_9_over_3_t193_hd128, 19, CAUSAL, 1, 193, 193, 9, 3, 128)
ATT_CASE(full_hd16_t131, 20, FULL, 2, 131, 131, 3, 1, 16)
ATT_CASE(cross_gqa_4_t70_s200, 21, CROSS, 1, 70, 200, 4, 1, 64)

/* The instance line of the first kernel whose template starts with `call` (its
 * __launch_bounds__ and name), or NULL. */
static const char *instance_of(const char *src, const char *call) {
  for (const char *at = strstr(src, call); at; at = strstr(at + 1, call)) {
    const char *line = at;
    while (line > src && line[-1] != '\n')
      line--;
    if (strncmp(line, "extern \"C\"", 10) == 0) return line;
  }
  return NULL;
}

/* In a bf16 training plan at head dim 64, the dQ kernel asks for 3 blocks an SM (168
 * registers; left free it took 204 and an SM held 2) and the dK / dV kernel sets no bound. */
Test(cuda_attention, dq_kernel_is_bounded_to_three_blocks_an_sm) {
  mn_test_require_cuda_build();
  mn_graph *g = build_qkv(&gpt2_causal_t256, true, true);
  char *src = mn_test_plan_source(g, true, MN_PRECISION_BF16);
  const char *dq = instance_of(src, "mn_attn_pipe_dq<"),
             *dkv = instance_of(src, "mn_attn_pipe_dkv<");
  cr_assert_not_null(dq, "no dQ instance in the plan");
  cr_assert_not_null(dkv, "no dK / dV instance in the plan");
  cr_expect(strncmp(strstr(dq, "__launch_bounds__("), "__launch_bounds__(128, 3)", 25) == 0,
            "dQ instance: %.120s", dq);
  cr_expect(strncmp(strstr(dkv, "__launch_bounds__("), "__launch_bounds__(128)", 22) == 0,
            "dK / dV instance: %.120s", dkv);
  free(src);
  mn_graph_free(g);
}

/* ---- cached attention: q [1, H*hd] against rows 0..kv_len-1 of [max_seq, KVH*hd] ---- */

typedef struct cached_case {
  int64_t max_seq;
  int heads, kv_heads, head_dim;
} cached_case;

static mn_graph *build_cached(const cached_case *a) {
  mn_graph *g = mn_graph_new();
  int64_t kv_dim = (int64_t)a->kv_heads * a->head_dim;
  mn_node q = mn_input(g, "q", MN_SHAPE(1, (int64_t)a->heads * a->head_dim));
  mn_node kc = mn_input(g, "k_cache", MN_SHAPE(a->max_seq, kv_dim));
  mn_node vc = mn_input(g, "v_cache", MN_SHAPE(a->max_seq, kv_dim));
  mn_node len = mn_input_u32(g, "kv_len", MN_SHAPE(1));
  mn_node y = mn_cached_attention(g, q, kc, vc, len, a->heads, a->kv_heads, a->head_dim);
  mn_set_outputs(g, &y, 1);
  cr_assert_eq(mn_graph_status(g), MN_OK, "%s", mn_graph_error(g));
  return g;
}

static void check_cached(const cached_case *a, uint32_t kv_len, uint64_t seed) {
  mn_test_require_cuda_build();
  mn_graph *g = build_cached(a);
  mn_test_assert_compiles(g, false);
  mn_test_require_cuda_device();
  const mn_test_range ranges[] = {{"q", -2.0, 2.0},
                                  {"k_cache", -2.0, 2.0},
                                  {"kv_len", (double)kv_len, (double)kv_len + 1.0},
                                  {NULL, 0, 0}};
  mn_test_compare_cuda(g, false, TOL, ranges, seed);
  mn_graph_free(g);
}

/* SmolLM2-like heads; 300 rows span three 128-key splits, the last one partial. */
static const cached_case smol = {.max_seq = 300, .heads = 9, .kv_heads = 3, .head_dim = 64};

Test(cuda_attention, cached_kv_len_1) { check_cached(&smol, 1, 21); }
Test(cuda_attention, cached_kv_len_5) { check_cached(&smol, 5, 22); }
Test(cuda_attention, cached_kv_len_129) { check_cached(&smol, 129, 23); }
Test(cuda_attention, cached_kv_len_max) { check_cached(&smol, 300, 24); }
Test(cuda_attention, cached_mqa_hd6_full_cache) {
  check_cached(&(cached_case){.max_seq = 5, .heads = 4, .kv_heads = 1, .head_dim = 6}, 5, 25);
}
Test(cuda_attention, cached_gpt2_heads_long_cache) {
  check_cached(&(cached_case){.max_seq = 1024, .heads = 12, .kv_heads = 12, .head_dim = 64}, 700,
               26);
}
/* 16 query heads per kv head: two blocks of 8 heads share each kv head. */
Test(cuda_attention, cached_wide_group_hd128) {
  check_cached(&(cached_case){.max_seq = 200, .heads = 32, .kv_heads = 2, .head_dim = 128}, 150,
               27);
}
Test(cuda_attention, cached_hd37) {
  check_cached(&(cached_case){.max_seq = 64, .heads = 6, .kv_heads = 2, .head_dim = 37}, 63, 28);
}

/* A kv_len of 0 or past the cache fails the step's wait, naming the node and the value. */
static void check_kv_len_error(uint32_t kv_len) {
  mn_test_require_cuda_build();
  mn_graph *g = build_cached(&smol);
  mn_test_assert_compiles(g, false);
  mn_test_require_cuda_device();
  mn_session *s = mn_test_session(g, MN_BACKEND_CUDA, false);
  size_t nq = (size_t)smol.heads * smol.head_dim;
  size_t nkv = (size_t)smol.max_seq * smol.kv_heads * smol.head_dim;
  float *data = malloc(nkv * sizeof *data);
  mn_rng rng = mn_rng_new(31);
  mn_rng_fill(&rng, data, nkv, -1.0f, 1.0f);
  cr_assert_eq(mn_session_set_input(s, "q", data, nq), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_set_input(s, "k_cache", data, nkv), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_set_input(s, "v_cache", data, nkv), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_set_input_u32(s, "kv_len", &kv_len, 1), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_step(s), MN_OK, "%s", mn_last_error());
  char want[96];
  snprintf(want, sizeof want, "kv_len %u is out of range 1..%lld", kv_len, (long long)smol.max_seq);
  mn_assert_error(mn_session_wait(s), MN_ERR_INVALID_ARGUMENT, want);
  /* The plan numbers nodes after sorting and optimizing, so only the op is checked. */
  const char *msg = mn_last_error();
  cr_assert(strstr(msg, "node ") && strstr(msg, "(cached_attention)"),
            "message \"%s\" does not name the cached_attention node", msg);
  free(data);
  mn_session_free(s);
  mn_graph_free(g);
}

Test(cuda_attention, cached_kv_len_zero_fails_the_step) { check_kv_len_error(0); }
Test(cuda_attention, cached_kv_len_past_the_cache_fails_the_step) { check_kv_len_error(301); }
