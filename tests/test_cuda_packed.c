/* CUDA kernels of packed sequences against the reference backend: mn_causal_attention_packed
 * forward (inference graphs) and backward (training graphs whose parameters are q, k and v) in
 * fp32, the backward in bf16 (whose plan takes the _saved packed gradients), and
 * mn_rope_positions forward and backward. Segments cross the 16- to 64-row tiles of the
 * kernels, rows of a batch pack differently, and one row holds a single example. Every case
 * also checks, with no device, that its kernels compile for sm_90. */
#include <stdlib.h>

#include "tests/support/cuda_check.h"
#include "tests/support/mn_test.h"

#define TOL 1e-5

/* batches 0 means rank-2 inputs; segs lists each row's example lengths (summing to t), 0-ended,
 * rows one after the other. */
typedef struct packed_case {
  int64_t batches, t;
  int heads, kv_heads, head_dim;
  const int *segs;
} packed_case;

static const mn_test_range qkv_ranges[] = {
    {"q", -1.5, 1.5}, {"k", -1.5, 1.5}, {"v", -1.5, 1.5}, {NULL, 0, 0}};

static int64_t rows_of(const packed_case *a) { return a->batches ? a->batches : 1; }

/* The positions of a case: t minus its example's first token, per row. malloc'd. */
static uint32_t *positions_of(const packed_case *a) {
  uint32_t *p = malloc((size_t)(rows_of(a) * a->t) * sizeof *p);
  const int *seg = a->segs;
  for (int64_t b = 0; b < rows_of(a); b++, seg++) {
    int64_t t = 0;
    for (; *seg; seg++)
      for (int i = 0; i < *seg; i++)
        p[b * a->t + t++] = (uint32_t)i;
    cr_assert_eq(t, a->t, "row %lld of the case packs %lld tokens", (long long)b, (long long)t);
  }
  return p;
}

static mn_node leaf(mn_graph *g, bool parameter, const char *name, const packed_case *a,
                    int heads) {
  int64_t shape[3] = {a->batches, a->t, (int64_t)heads * a->head_dim};
  const int64_t *sh = a->batches ? shape : shape + 1;
  int rank = a->batches ? 3 : 2;
  return parameter ? mn_parameter(g, name, sh, rank) : mn_input(g, name, sh, rank);
}

static mn_node positions_leaf(mn_graph *g, const packed_case *a) {
  int64_t shape[2] = {a->batches, a->t};
  return a->batches ? mn_input_u32(g, "positions", shape, 2)
                    : mn_input_u32(g, "positions", shape + 1, 1);
}

/* Inference: q, k, v inputs -> packed attention as the output. Training: q, k, v parameters
 * (through a scale when `computed`, so that a bf16 session stores them in bf16) -> attention ->
 * scaled by 1.7 -> MSE against an input. rope: q alone, through mn_rope_positions. */
static mn_graph *build(const packed_case *a, bool training, bool computed, bool rope) {
  mn_graph *g = mn_graph_new();
  mn_node p = positions_leaf(g, a);
  mn_node q = leaf(g, training, "q", a, a->heads), y;
  if (computed) q = mn_scale(g, q, 1.0f);
  if (rope) {
    y = mn_rope_positions(g, q, 10000.0f, p, a->head_dim);
  } else {
    mn_node k = leaf(g, training, "k", a, a->kv_heads);
    mn_node v = leaf(g, training, "v", a, a->kv_heads);
    if (computed) {
      k = mn_scale(g, k, 1.0f);
      v = mn_scale(g, v, 1.0f);
    }
    y = mn_causal_attention_packed(g, q, k, v, p, a->heads, a->kv_heads, a->head_dim);
  }
  if (training) {
    mn_node target = leaf(g, false, "target", a, a->heads);
    y = mn_mse_loss(g, mn_scale(g, y, 1.7f), target);
  }
  mn_set_outputs(g, &y, 1);
  cr_assert_eq(mn_graph_status(g), MN_OK, "%s", mn_graph_error(g));
  return g;
}

static void check_compiles(const packed_case *a, bool training, bool rope) {
  mn_test_require_cuda_build();
  mn_graph *g = build(a, training, false, rope);
  mn_test_assert_compiles(g, training);
  mn_graph_free(g);
  if (!training) return;
  g = build(a, true, true, rope);
  mn_test_assert_compiles_precision(g, true, MN_PRECISION_BF16);
  mn_graph_free(g);
}

/* bf16: the 16-bit tensor-core kernels round P and dS for their products and take delta from
 * the stored output (the _saved gradients), as test_cuda_attention's bf16 cases do: 4u. */
static void check_matches(const packed_case *a, bool training, mn_precision precision, bool rope,
                          uint64_t seed) {
  mn_test_require_cuda_build();
  mn_test_require_cuda_device();
  bool low = precision != MN_PRECISION_F32;
  mn_graph *g = build(a, training, low, rope);
  uint32_t *pos = positions_of(a);
  const mn_test_u32_values fixed[] = {{"positions", pos}, {NULL, NULL}};
  double err = mn_test_compare_cuda_fixed(g, training, precision, low ? 2 * MN_TEST_BF16_TOL : TOL,
                                          qkv_ranges, fixed, seed);
  cr_log_info("%s %s: largest relative error %.3g", mn_test_precision_name(precision),
              training ? "backward" : "forward", err);
  free(pos);
  mn_graph_free(g);
}

#define PACKED_CASE(name, seed, ...)                                                               \
  static const packed_case name = {__VA_ARGS__};                                                   \
  Test(cuda_packed, name##_forward_compiles) { check_compiles(&name, false, false); }              \
  Test(cuda_packed, name##_backward_compiles) { check_compiles(&name, true, false); }              \
  Test(cuda_packed, name##_forward_matches_cpu) {                                                  \
    check_matches(&name, false, MN_PRECISION_F32, false, seed);                                    \
  }                                                                                                \
  Test(cuda_packed, name##_backward_matches_cpu) {                                                 \
    check_matches(&name, true, MN_PRECISION_F32, false, seed + 100);                               \
  }                                                                                                \
  Test(cuda_packed, name##_bf16_backward_matches_cpu) {                                            \
    check_matches(&name, true, MN_PRECISION_BF16, false, seed + 200);                              \
  }

/* Row 0: 50, 30 and 48 tokens (every boundary inside a tile); row 1: 100, a one-token example,
 * then 27. */
static const int t128[] = {50, 30, 48, 0, 100, 1, 27, 0};
PACKED_CASE(gqa_t128_hd64, 1, 2, 128, 8, 2, 64, t128)
/* One row of 1024: examples of 300, 77, 500 and 147 tokens. */
static const int t1024[] = {300, 77, 500, 147, 0};
PACKED_CASE(gqa_t1024_hd64, 2, 0, 1024, 4, 2, 64, t1024)
/* A whole row as one example (causal attention) beside a row of 1-token examples. */
static const int t70[] = {70, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 60, 0};
PACKED_CASE(mha_t70_hd128, 3, 2, 70, 4, 4, 128, t70)
/* head_dim 6: the fp32 SIMT kernels (no tensor cores), MQA. */
static const int t37[] = {10, 20, 7, 0};
PACKED_CASE(mqa_t37_hd6, 4, 0, 37, 4, 1, 6, t37)

/* ---- mn_rope_positions */

Test(cuda_packed, rope_positions_compiles) {
  static const packed_case a = {2, 128, 8, 2, 64, t128};
  check_compiles(&a, false, true);
  check_compiles(&a, true, true);
}

Test(cuda_packed, rope_positions_matches_cpu) {
  static const packed_case a = {2, 128, 8, 2, 64, t128};
  check_matches(&a, false, MN_PRECISION_F32, true, 31);
  check_matches(&a, true, MN_PRECISION_F32, true, 32);
}
