/* CUDA kernels of the transformer ops (norms, RoPE, embedding, scatter_add, cache_write)
 * against the reference backend: every graph is compiled with NVRTC (no device needed),
 * then, on a GPU, run on both backends with the same random data. Backward ops are
 * reached through training graphs whose loss multiplies the op's output by an input, so
 * that the upstream gradient is not uniform. The runtime error paths (bad embedding or
 * scatter index, bad kv_pos) and the KV cache across steps need a GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "tests/support/cuda_check.h"
#include "tests/support/mn_test.h"
#include "tests/support/session_util.h"

#define TOL 1e-5

/* Each test body runs twice: first compiling every graph it builds (no device needed),
 * then comparing each with the reference on a GPU; without one the first comparison
 * skips the test, after every graph was compiled. */
static bool compare_pass;

#define CUDA_TEST(name)                                                                            \
  static void name##_body(void);                                                                   \
  Test(cuda_transformer, name, .timeout = 240) {                                                   \
    mn_test_require_cuda_build();                                                                  \
    compare_pass = false;                                                                          \
    name##_body();                                                                                 \
    compare_pass = true;                                                                           \
    name##_body();                                                                                 \
  }                                                                                                \
  static void name##_body(void)

static void check(const mn_graph *g, bool training, const mn_test_range *ranges, uint64_t seed) {
  if (!compare_pass)
    mn_test_assert_compiles(g, training);
  else
    mn_test_compare_cuda(g, training, TOL, ranges, seed);
}

static void finish_inference_graph(mn_graph *g, mn_node y) {
  mn_set_outputs(g, &y, 1);
  cr_assert_eq(mn_graph_status(g), MN_OK, "%s", mn_graph_error(g));
}

/* Makes y the subject of g (a training graph when `training`, else its only output), checks
 * g, and frees it. */
static void finish_and_check(mn_graph *g, mn_node y, bool training, const mn_test_range *ranges,
                             uint64_t seed) {
  if (training)
    mn_test_finish_training_graph(g, y);
  else
    finish_inference_graph(g, y);
  check(g, training, ranges, seed);
  mn_graph_free(g);
}

/* ------------------------------------------------------------------ norms */

/* rms_norm (layer_norm when `layer`) of a parameter x of the given shape, forward and
 * backward (x, weight and bias gradients). */
/* The norm of x over its last dimension, with parameters "w" (and "b" when `layer`). */
static mn_node norm_of(mn_graph *g, bool layer, mn_node x, const int64_t *shape, int rank,
                       float eps) {
  mn_node w = mn_parameter(g, "w", MN_SHAPE(shape[rank - 1]));
  if (!layer) return mn_rms_norm(g, x, w, eps);
  return mn_layer_norm(g, x, w, mn_parameter(g, "b", MN_SHAPE(shape[rank - 1])), eps);
}

static void check_norm(bool layer, const int64_t *shape, int rank, float eps, uint64_t seed) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_parameter(g, "x", shape, rank);
  /* An offset keeps layer_norm's rows from being centred already. */
  const mn_test_range ranges[] = {{"x", -1, 3}, {"w", 0.5, 1.5}, {NULL, 0, 0}};
  finish_and_check(g, norm_of(g, layer, x, shape, rank, eps), true, ranges, seed);
}

static void check_norm_inference(bool layer, const int64_t *shape, int rank, float eps,
                                 uint64_t seed) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", shape, rank);
  finish_and_check(g, norm_of(g, layer, x, shape, rank, eps), false, NULL, seed);
}

CUDA_TEST(rms_norm_llama_shapes) {
  check_norm(false, MN_SHAPE(64, 576), 1e-5f, 1);
  check_norm(false, MN_SHAPE(2, 16, 576), 1e-5f, 2);
  check_norm_inference(false, MN_SHAPE(1, 576), 1e-5f, 3);
}

CUDA_TEST(layer_norm_gpt2_shapes) {
  check_norm(true, MN_SHAPE(64, 768), 1e-5f, 4);
  check_norm(true, MN_SHAPE(2, 64, 768), 1e-5f, 5);
  check_norm_inference(true, MN_SHAPE(3, 64, 768), 1e-5f, 6);
}

/* Widths that are not multiples of 4 (float2 and scalar paths), of 32, or are 1. */
CUDA_TEST(norms_odd_widths) {
  const int64_t widths[] = {100, 33, 1, 2, 6, 4098, 1001};
  for (int i = 0; i < 7; i++) {
    check_norm(false, MN_SHAPE(3, 5, widths[i]), 1e-6f, 10 + (uint64_t)i);
    check_norm(true, MN_SHAPE(3, 5, widths[i]), 1e-6f, 20 + (uint64_t)i);
  }
}

/* Size-1 dims and ranks 1 and 4. */
CUDA_TEST(norms_degenerate_shapes) {
  check_norm(false, MN_SHAPE(7), 1e-5f, 30);
  check_norm(true, MN_SHAPE(7), 1e-5f, 31);
  check_norm(false, MN_SHAPE(1, 1, 40), 1e-5f, 32);
  check_norm(true, MN_SHAPE(2, 1, 3, 12), 1e-5f, 33);
  check_norm(true, MN_SHAPE(9, 1), 1e-5f, 34);
}

/* Rows kept in registers (4096, 16384) and rows re-read from memory (16385, 20000). */
CUDA_TEST(norms_wide_rows) {
  check_norm(false, MN_SHAPE(8, 4096), 1e-5f, 40);
  check_norm(true, MN_SHAPE(8, 4096), 1e-5f, 41);
  check_norm(false, MN_SHAPE(3, 16384), 1e-5f, 42);
  check_norm(true, MN_SHAPE(3, 16385), 1e-5f, 43);
  check_norm(false, MN_SHAPE(2, 20000), 1e-5f, 44);
  check_norm(true, MN_SHAPE(2, 20000), 1e-5f, 45);
}

/* A NaN in a row makes that row of the output NaN, as the reference does (the fp16 loss scaler
 * looks for NaN; a kernel that read the NaN variance as 0 gave rms_norm's other values finite),
 * and leaves the next row finite; rows of 768 are worked on in float, rows of 2 in double. The
 * reference is checked with no device too. */
CUDA_TEST(norm_row_with_a_nan_is_nan) {
  const int64_t widths[] = {768, 2};
  const mn_backend backends[] = {MN_BACKEND_CPU, MN_BACKEND_CUDA};
  for (int layer = 0; layer < 2; layer++)
    for (int i = 0; i < 2; i++) {
      const int64_t n = widths[i];
      mn_graph *g = mn_graph_new();
      finish_inference_graph(
          g, norm_of(g, layer, mn_input(g, "x", MN_SHAPE(2, n)), MN_SHAPE(2, n), 1e-5f));
      if (!compare_pass) {
        mn_test_assert_compiles(g, false);
        mn_graph_free(g);
        continue;
      }
      float *x = malloc((size_t)(2 * n) * sizeof *x);
      for (int64_t k = 0; k < 2 * n; k++)
        x[k] = (float)(k % 7) - 3.0f;
      x[n / 2] = NAN;
      for (int b = 0; b < (mn_test_cuda_device_present() ? 2 : 1); b++) {
        mn_session *s = mn_test_session(g, backends[b], false);
        mn_rng r = mn_rng_new(50 + (uint64_t)i);
        mn_test_init_uniform(g, s, &r, 0.5f, 1.5f, false);
        cr_assert_eq(mn_session_set_input(s, "x", x, (size_t)(2 * n)), MN_OK, "%s",
                     mn_last_error());
        cr_assert_eq(mn_session_step(s), MN_OK, "%s", mn_last_error());
        cr_assert_eq(mn_session_wait(s), MN_OK, "%s", mn_last_error());
        float *y = mn_test_read_output(s, 0, (size_t)(2 * n));
        const char *what = layer ? "layer_norm" : "rms_norm", *on = b ? "cuda" : "cpu";
        for (int64_t k = 0; k < n; k++) {
          cr_assert(isnan(y[k]), "%s %s of width %lld: row 0 element %lld is %g, not NaN", on, what,
                    (long long)n, (long long)k, (double)y[k]);
          cr_assert(isfinite(y[n + k]), "%s %s of width %lld: row 1 element %lld is %g", on, what,
                    (long long)n, (long long)k, (double)y[n + k]);
        }
        free(y);
        mn_session_free(s);
      }
      free(x);
      mn_graph_free(g);
    }
  if (compare_pass) mn_test_require_cuda_device();
}

/* Many rows: the weight gradients take a warp a row, 8 warps a block, in chunks of 64 rows
 * (16384 rows: 256 chunks) or of 8 (1000 rows: 125; 2048 rows: 256). */
CUDA_TEST(norms_many_rows) {
  check_norm(false, MN_SHAPE(16 * 1024, 64), 1e-5f, 50);
  check_norm(true, MN_SHAPE(16, 1024, 72), 1e-5f, 51);
  check_norm(true, MN_SHAPE(1000, 33), 1e-5f, 52);
  check_norm(false, MN_SHAPE(2, 1024, 576), 1e-5f, 53);
}

/* The weight gradient of a parameter shared by two norms: the two gradients add. */
CUDA_TEST(norm_weight_shared) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_parameter(g, "x", MN_SHAPE(2, 9, 48));
  mn_node w = mn_parameter(g, "w", MN_SHAPE(48)), b = mn_parameter(g, "b", MN_SHAPE(48));
  mn_node y = mn_add(g, mn_rms_norm(g, x, w, 1e-5f), mn_layer_norm(g, x, w, b, 1e-5f));
  finish_and_check(g, y, true, NULL, 55);
}

/* ------------------------------------------------------------------ RoPE */

/* RoPE of a parameter x with a static offset (dynamic when offset_lo >= 0: the offset
 * input is drawn from [offset_lo, offset_lo + 1)), forward and backward. */
static void check_rope(const int64_t *shape, int rank, float theta, int head_dim, int static_offset,
                       int64_t dyn_offset, bool training, uint64_t seed) {
  mn_graph *g = mn_graph_new();
  mn_node x = training ? mn_parameter(g, "x", shape, rank) : mn_input(g, "x", shape, rank);
  mn_node y;
  if (dyn_offset >= 0)
    y = mn_rope_dynamic_offset(g, x, theta, mn_input_u32(g, "offset", MN_SHAPE(1)), head_dim);
  else
    y = mn_rope_with_offset(g, x, theta, static_offset, head_dim);
  const mn_test_range ranges[] = {
      {"offset", (double)(dyn_offset < 0 ? 0 : dyn_offset), (double)(dyn_offset + 1)},
      {NULL, 0, 0}};
  finish_and_check(g, y, training, ranges, seed);
}

/* SmolLM-style: 9 heads of 64, offset 5, static and dynamic. */
CUDA_TEST(rope_llama_shapes) {
  check_rope(MN_SHAPE(64, 576), 10000.0f, 64, 5, -1, true, 60);
  check_rope(MN_SHAPE(64, 576), 10000.0f, 64, 0, 5, true, 61);
  check_rope(MN_SHAPE(2, 16, 576), 10000.0f, 64, 5, -1, true, 62);
  check_rope(MN_SHAPE(2, 16, 576), 10000.0f, 64, 0, 5, true, 63);
  check_rope(MN_SHAPE(1, 576), 10000.0f, 64, 0, 5, false, 64);
  check_rope(MN_SHAPE(3, 64, 576), 10000.0f, 64, 0, -1, false, 65);
}

/* Positions beyond a thousand, where float angles would lose digits. */
CUDA_TEST(rope_large_positions) {
  check_rope(MN_SHAPE(100, 128), 500000.0f, 64, 1000, -1, true, 70);
  check_rope(MN_SHAPE(2, 100, 128), 500000.0f, 64, 0, 4000, true, 71);
  check_rope(MN_SHAPE(2048, 64), 10000.0f, 64, 0, -1, true, 72);
}

/* Small and odd head sizes (half of 2, of 17), one row, one head. */
CUDA_TEST(rope_odd_shapes) {
  check_rope(MN_SHAPE(3, 7, 6), 10000.0f, 2, 0, -1, true, 80);
  check_rope(MN_SHAPE(5, 68), 100.0f, 34, 3, -1, true, 81);
  check_rope(MN_SHAPE(5, 68), 100.0f, 34, 0, 2, true, 82);
  check_rope(MN_SHAPE(1, 8), 10000.0f, 8, 0, -1, true, 83);
  check_rope(MN_SHAPE(4, 1, 32), 10000.0f, 32, 7, -1, true, 84);
}

/* A GPT-NeoX-like layout: [B, T, 12 heads of 64]. */
CUDA_TEST(rope_gpt2_sized) {
  check_rope(MN_SHAPE(2, 64, 768), 10000.0f, 64, 0, -1, true, 85);
  check_rope(MN_SHAPE(2, 64, 768), 10000.0f, 64, 0, 17, true, 86);
}

/* ------------------------------------------------------------------ embedding */

/* y = table[idx] with idx uniform in [0, rows), forward and the table's gradient
 * (scatter_add, with repeated indices whenever idx has more entries than rows). */
static void check_embedding(const int64_t *ishape, int irank, int64_t rows, int64_t d,
                            bool training, uint64_t seed) {
  mn_graph *g = mn_graph_new();
  mn_node idx = mn_input_u32(g, "idx", ishape, irank);
  mn_node table = mn_parameter(g, "table", MN_SHAPE(rows, d));
  const mn_test_range ranges[] = {{"idx", 0, (double)rows}, {NULL, 0, 0}};
  finish_and_check(g, mn_embedding(g, idx, table), training, ranges, seed);
}

CUDA_TEST(embedding_gpt2_vocab) {
  check_embedding(MN_SHAPE(2, 64), 50257, 768, false, 90);
  check_embedding(MN_SHAPE(2, 64), 50257, 768, true, 91);
  check_embedding(MN_SHAPE(64), 50257, 64, true, 92);
}

CUDA_TEST(embedding_odd_widths_and_repeats) {
  check_embedding(MN_SHAPE(3, 7), 10, 33, true, 93);
  check_embedding(MN_SHAPE(50), 4, 2, true, 94);
  check_embedding(MN_SHAPE(2, 3, 5), 3, 1, true, 95);
  check_embedding(MN_SHAPE(1), 1, 6, true, 96);
  check_embedding(MN_SHAPE(300), 7, 100, true, 97);
}

/* ------------------------------------------------------------------ scatter_add */

/* out[idx[i]] += src[i] with idx uniform in [0, idx_hi) into `rows` rows: rows past
 * idx_hi stay zero. Backward: src's gradient is a gather of dy. */
static void check_scatter_add(const int64_t *sshape, int srank, int64_t rows, int64_t idx_hi,
                              bool training, uint64_t seed) {
  mn_graph *g = mn_graph_new();
  mn_node idx = mn_input_u32(g, "idx", sshape, srank - 1);
  mn_node src =
      training ? mn_parameter(g, "src", sshape, srank) : mn_input(g, "src", sshape, srank);
  const mn_test_range ranges[] = {{"idx", 0, (double)idx_hi}, {NULL, 0, 0}};
  finish_and_check(g, mn_scatter_add(g, idx, src, rows), training, ranges, seed);
}

CUDA_TEST(scatter_add_repeated_indices) {
  check_scatter_add(MN_SHAPE(200, 33), 7, 5, true, 100);
  check_scatter_add(MN_SHAPE(2, 50, 16), 9, 9, true, 101);
  check_scatter_add(MN_SHAPE(4096, 64), 3, 3, false, 102);
  check_scatter_add(MN_SHAPE(1, 1), 1, 1, true, 103);
  check_scatter_add(MN_SHAPE(128, 768), 50257, 50257, false, 104);
}

/* ------------------------------------------------------------------ runtime errors */

static void assert_message_has(const char *fragment) {
  cr_assert(strstr(mn_last_error(), fragment) != NULL, "message \"%s\" lacks \"%s\"",
            mn_last_error(), fragment);
}

/* One index past a 50257-row table: wait fails naming the op and the index, and the
 * session runs again once the index is fixed. */
Test(cuda_transformer, embedding_index_out_of_range) {
  mn_test_require_cuda_build();
  mn_graph *g = mn_graph_new();
  mn_node idx = mn_input_u32(g, "idx", MN_SHAPE(2, 8));
  mn_node table = mn_parameter(g, "table", MN_SHAPE(50257, 64));
  finish_inference_graph(g, mn_embedding(g, idx, table));
  mn_test_assert_compiles(g, false);
  mn_test_require_cuda_device();
  mn_session *s = mn_test_session(g, MN_BACKEND_CUDA, false);
  size_t nt = (size_t)50257 * 64;
  float *t = malloc(nt * sizeof *t);
  mn_rng rng = mn_rng_new(110);
  mn_rng_fill(&rng, t, nt, -1, 1);
  cr_assert_eq(mn_session_set_parameter(s, "table", t, nt), MN_OK, "%s", mn_last_error());
  uint32_t ids[16];
  for (int i = 0; i < 16; i++)
    ids[i] = (uint32_t)(i * 3000);
  ids[7] = 50300;
  cr_assert_eq(mn_session_set_input_u32(s, "idx", ids, 16), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_step(s), MN_OK, "%s", mn_last_error());
  mn_assert_error(mn_session_wait(s), MN_ERR_INVALID_ARGUMENT, "50300");
  assert_message_has("embedding");

  ids[7] = 50256;
  cr_assert_eq(mn_session_set_input_u32(s, "idx", ids, 16), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_step(s), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_wait(s), MN_OK, "%s", mn_last_error());
  float *out = mn_test_read_output(s, 0, 16 * 64);
  for (int i = 0; i < 16; i++)
    for (int j = 0; j < 64; j++)
      cr_assert_eq(out[i * 64 + j], t[(size_t)ids[i] * 64 + (size_t)j], "row %d col %d", i, j);
  free(out);
  free(t);
  mn_session_free(s);
  mn_graph_free(g);
}

Test(cuda_transformer, scatter_add_index_out_of_range) {
  mn_test_require_cuda_build();
  mn_graph *g = mn_graph_new();
  mn_node idx = mn_input_u32(g, "idx", MN_SHAPE(3));
  mn_node src = mn_input(g, "src", MN_SHAPE(3, 2));
  finish_inference_graph(g, mn_scatter_add(g, idx, src, 2));
  mn_test_assert_compiles(g, false);
  mn_test_require_cuda_device();
  mn_session *s = mn_test_session(g, MN_BACKEND_CUDA, false);
  const float data[] = {1, 2, 3, 4, 5, 6};
  cr_assert_eq(mn_session_set_input(s, "src", data, 6), MN_OK, "%s", mn_last_error());
  const uint32_t bad[] = {1, 4000000000u, 0};
  cr_assert_eq(mn_session_set_input_u32(s, "idx", bad, 3), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_step(s), MN_OK, "%s", mn_last_error());
  mn_assert_error(mn_session_wait(s), MN_ERR_INVALID_ARGUMENT, "4000000000");
  assert_message_has("scatter_add");

  const uint32_t good[] = {1, 1, 0};
  cr_assert_eq(mn_session_set_input_u32(s, "idx", good, 3), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_step(s), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_wait(s), MN_OK, "%s", mn_last_error());
  float *out = mn_test_read_output(s, 0, 4);
  const float want[] = {5, 6, 4, 6};
  mn_assert_close(out, want, 4, 0);
  free(out);
  mn_session_free(s);
  mn_graph_free(g);
}

/* ------------------------------------------------------------------ KV cache */

#define CACHE_ROWS 8
#define KV_DIM     33

/* cache_write into an [8, 33] cache over several steps, kv_pos set between steps, on
 * both backends: after every step the whole cache agrees (rows written by earlier
 * steps persist), and a kv_pos past the cache fails wait and writes nothing. */
Test(cuda_transformer, cache_write_steps) {
  mn_test_require_cuda_build();
  mn_graph *g = mn_graph_new();
  mn_node kv = mn_input(g, "kv", MN_SHAPE(1, KV_DIM));
  mn_node cache = mn_input(g, "cache", MN_SHAPE(CACHE_ROWS, KV_DIM));
  mn_node pos = mn_input_u32(g, "pos", MN_SHAPE(1));
  finish_inference_graph(g, mn_cache_write(g, kv, cache, pos));
  mn_test_assert_compiles(g, false);
  mn_test_require_cuda_device();

  mn_session *cpu = mn_test_session(g, MN_BACKEND_CPU, false);
  mn_session *gpu = mn_test_session(g, MN_BACKEND_CUDA, false);
  mn_session *both[2] = {cpu, gpu};
  mn_rng rng = mn_rng_new(120);
  float init[CACHE_ROWS * KV_DIM], row[KV_DIM];
  mn_rng_fill(&rng, init, CACHE_ROWS * KV_DIM, -1, 1);
  for (int b = 0; b < 2; b++)
    cr_assert_eq(mn_session_set_input(both[b], "cache", init, CACHE_ROWS * KV_DIM), MN_OK, "%s",
                 mn_last_error());

  const uint32_t positions[] = {5, 0, 7, 5};
  for (int step = 0; step < 4; step++) {
    mn_rng_fill(&rng, row, KV_DIM, -1, 1);
    for (int b = 0; b < 2; b++) {
      cr_assert_eq(mn_session_set_input(both[b], "kv", row, KV_DIM), MN_OK, "%s", mn_last_error());
      cr_assert_eq(mn_session_set_input_u32(both[b], "pos", &positions[step], 1), MN_OK, "%s",
                   mn_last_error());
      cr_assert_eq(mn_session_step(both[b]), MN_OK, "%s", mn_last_error());
      cr_assert_eq(mn_session_wait(both[b]), MN_OK, "%s", mn_last_error());
    }
    float *want = mn_test_read_output(cpu, 0, CACHE_ROWS * KV_DIM);
    float *got = mn_test_read_output(gpu, 0, CACHE_ROWS * KV_DIM);
    for (int i = 0; i < CACHE_ROWS * KV_DIM; i++)
      cr_assert_eq(got[i], want[i], "step %d element %d: cuda %g, cpu %g", step, i, (double)got[i],
                   (double)want[i]);
    for (int j = 0; j < KV_DIM; j++)
      cr_assert_eq(got[(int)positions[step] * KV_DIM + j], row[j]);
    free(want);
    free(got);
  }

  float *before = mn_test_read_output(gpu, 0, CACHE_ROWS * KV_DIM);
  const uint32_t bad = 1000;
  cr_assert_eq(mn_session_set_input_u32(gpu, "pos", &bad, 1), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_step(gpu), MN_OK, "%s", mn_last_error());
  mn_assert_error(mn_session_wait(gpu), MN_ERR_INVALID_ARGUMENT, "1000");
  assert_message_has("cache_write");
  const uint32_t good = 2;
  cr_assert_eq(mn_session_set_input_u32(gpu, "pos", &good, 1), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_step(gpu), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_wait(gpu), MN_OK, "%s", mn_last_error());
  float *after = mn_test_read_output(gpu, 0, CACHE_ROWS * KV_DIM);
  /* The failed step wrote nothing; the good one wrote only row 2 (with the last kv). */
  for (int i = 0; i < CACHE_ROWS * KV_DIM; i++)
    cr_assert_eq(after[i], i / KV_DIM == 2 ? row[i % KV_DIM] : before[i], "element %d", i);
  free(before);
  free(after);
  mn_session_free(cpu);
  mn_session_free(gpu);
  mn_graph_free(g);
}

/* Two writes chained in one step (a K and a V row, as a decoder layer does), compared
 * with the reference. */
CUDA_TEST(cache_write_chained) {
  mn_graph *g = mn_graph_new();
  mn_node k1 = mn_input(g, "k1", MN_SHAPE(1, 64)), k2 = mn_input(g, "k2", MN_SHAPE(1, 64));
  mn_node cache = mn_input(g, "cache", MN_SHAPE(16, 64));
  mn_node p1 = mn_input_u32(g, "p1", MN_SHAPE(1)), p2 = mn_input_u32(g, "p2", MN_SHAPE(1));
  mn_node c1 = mn_cache_write(g, k1, cache, p1);
  finish_inference_graph(g, mn_cache_write(g, k2, c1, p2));
  const mn_test_range ranges[] = {{"p1", 3, 4}, {"p2", 9, 10}, {NULL, 0, 0}};
  check(g, false, ranges, 121);
  mn_graph_free(g);
}

/* ------------------------------------------------------------------ a decoder block */

/* Embedding, rms_norm, static and dynamic RoPE and a residual in one training graph:
 * the table's gradient sums the residual and the norm paths. */
CUDA_TEST(llama_block_training) {
  mn_graph *g = mn_graph_new();
  mn_node idx = mn_input_u32(g, "idx", MN_SHAPE(2, 16));
  mn_node table = mn_parameter(g, "table", MN_SHAPE(97, 576));
  mn_node w = mn_parameter(g, "norm.weight", MN_SHAPE(576));
  mn_node h = mn_embedding(g, idx, table);
  mn_node n = mn_rms_norm(g, h, w, 1e-5f);
  mn_node q = mn_rope_with_offset(g, n, 10000.0f, 5, 64);
  mn_node k = mn_rope_dynamic_offset(g, n, 10000.0f, mn_input_u32(g, "offset", MN_SHAPE(1)), 64);
  mn_test_finish_training_graph(g, mn_add(g, h, mn_mul(g, q, k)));
  const mn_test_range ranges[] = {{"idx", 0, 97}, {"offset", 5, 6}, {NULL, 0, 0}};
  check(g, true, ranges, 130);
  mn_graph_free(g);
}
