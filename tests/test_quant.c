/* Quantized weights on the CPU: each format's round trip within its error bound, GGML blocks
 * identical to those gguf-py wrote for the same values, the product against a float64 product
 * of the dequantized weights, thread counts, the quantized generator against the plain one
 * (next-token agreement, weight bytes, GGUF blocks kept as they are) and the refused inputs. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/quant.h"
#include "io/gguf.h"
#include "models/prefill_mode.h"
#include "tests/support/generator_check.h"
#include "tests/support/mn_test.h"
#include "tests/support/quant_check.h"
#include "tests/support/tmp_dir.h"

static const char *fixture(const char *name) {
  static char buf[2][1024];
  static int turn;
  const char *me = __FILE__, *tail = strstr(me, "tests/test_quant.c");
  cr_assert_not_null(tail);
  char *b = buf[turn++ % 2];
  snprintf(b, sizeof buf[0], "%.*stests/fixtures/gguf/%s", (int)(tail - me), me, name);
  return b;
}

/* The largest error a format allows for a weight of a block with the given extremes: half a
 * step (a whole one for Q4_0, whose +|max| side clips), plus the f16 rounding of the scale and
 * the bias. */
static double bound(mn_quant q, float lo, float hi) {
  double amax = fmax(fabs(lo), fabs(hi)), range = (double)hi - lo;
  double f16 = 2e-3 * amax;
  switch (q) {
  case MN_QUANT_Q8_0: return amax / 127 / 2 + f16;
  case MN_QUANT_Q4_0: return amax / 8 + f16;
  case MN_QUANT_Q4_1:
  case MN_QUANT_AFFINE_INT4: return range / 15 / 2 + f16;
  default: return range / 255 / 2 + f16;
  }
}

Test(quant, round_trip_within_each_formats_bound) {
  enum { ROWS = 5, COLS = 256 };
  mn_rng r = mn_rng_new(3);
  float w[ROWS * COLS], back[COLS];
  for (int i = 0; i < ROWS * COLS; i++)
    w[i] = (float)(mn_rng_normal(&r) * (1 + i % 7));
  w[7] = 0; /* a block with an exact zero, and one block all zeros below */
  for (int i = 64; i < 96; i++)
    w[i] = 0;
  for (int c = 0; c < mn_test_num_qcases; c++) {
    mn_quant q = mn_test_qcases[c].format;
    int gs = mn_test_qcases[c].group;
    size_t block = 0, bytes = 0, rw = mn_quant_row_words(q, gs, COLS);
    cr_assert(mn_quant_block(q, gs, &block, &bytes));
    uint32_t *packed = calloc(ROWS * rw, 4);
    mn_quantize(q, gs, w, ROWS, COLS, packed);
    double worst = 0;
    for (int i = 0; i < ROWS; i++) {
      mn_dequantize_row(q, gs, packed + i * rw, back, COLS);
      for (size_t b0 = 0; b0 < COLS; b0 += block) {
        const float *x = w + i * COLS + b0;
        float lo = x[0], hi = x[0];
        for (size_t j = 1; j < block; j++)
          lo = fminf(lo, x[j]), hi = fmaxf(hi, x[j]);
        double lim = bound(q, lo, hi);
        for (size_t j = 0; j < block; j++) {
          double e = fabs((double)back[b0 + j] - x[j]);
          worst = fmax(worst, e / (lim > 0 ? lim : 1));
          cr_assert_leq(e, lim, "%s group %d: row %d weight %zu: %g back as %g (bound %g)",
                        mn_quant_name(q), gs, i, b0 + j, (double)x[j], (double)back[b0 + j], lim);
        }
      }
    }
    cr_assert(worst > 0.2, "%s: errors far below the bound: is it the right bound?",
              mn_quant_name(q));
    mn_dequantize_row(q, gs, packed, back, COLS);
    for (int j = 64; block == 32 && j < 96; j++)
      cr_assert_eq(back[j], 0.0f, "%s: an all-zero block comes back zero", mn_quant_name(q));
    free(packed);
  }
}

/* Every Q8_0/Q4_0/Q4_1 tensor of the fixtures (written by gguf-py's quantize) against our
 * quantization of the same tensor from the F32 file. */
static void blocks_match_gguf_py(const char *arch, const char *type, mn_quant q, uint32_t gtype) {
  char f32name[64], qname[64];
  snprintf(f32name, sizeof f32name, "%s_f32.gguf", arch);
  snprintf(qname, sizeof qname, "%s_%s.gguf", arch, type);
  mn_gguf *ff = NULL, *fq = NULL;
  cr_assert_eq(mn_gguf_open(fixture(f32name), &ff), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_gguf_open(fixture(qname), &fq), MN_OK, "%s", mn_last_error());
  size_t compared = 0;
  for (size_t i = 0; i < mn_gguf_tensor_count(fq); i++) {
    const mn_gguf_tensor *t = mn_gguf_tensor_at(fq, i);
    if (t->type != gtype) continue;
    const mn_gguf_tensor *tf = mn_gguf_tensor_find(ff, t->name);
    cr_assert(tf && tf->type == MN_GGML_F32 && tf->numel == t->numel, "%s", t->name);
    size_t cols = (size_t)t->ne[0], rows = (size_t)(t->numel / cols);
    size_t rb = mn_quant_row_bytes(q, 0, (int64_t)cols),
           rw = mn_quant_row_words(q, 0, (int64_t)cols);
    uint32_t *mine = calloc(rows * rw, 4);
    mn_quantize(q, 0, tf->data, rows, cols, mine);
    for (size_t r = 0; r < rows; r++)
      cr_assert(memcmp((const unsigned char *)mine + r * rw * 4,
                       (const unsigned char *)t->data + r * rb, rb) == 0,
                "%s %s: row %zu differs from gguf-py's blocks", qname, t->name, r);
    free(mine);
    compared++;
  }
  cr_assert_gt(compared, 3, "%s: too few %s tensors compared", qname, type);
  mn_gguf_close(ff);
  mn_gguf_close(fq);
}

Test(quant, ggml_blocks_equal_gguf_py) {
  const char *archs[2] = {"llama", "gpt2"};
  for (int a = 0; a < 2; a++) {
    blocks_match_gguf_py(archs[a], "q8_0", MN_QUANT_Q8_0, MN_GGML_Q8_0);
    blocks_match_gguf_py(archs[a], "q4_0", MN_QUANT_Q4_0, MN_GGML_Q4_0);
    blocks_match_gguf_py(archs[a], "q4_1", MN_QUANT_Q4_1, MN_GGML_Q4_1);
  }
}

Test(quant, product_equals_float64_of_dequantized_weights) {
  const int64_t IN = 256, OUT = 40, rows[3] = {1, 3, 17};
  float deq[256];
  for (int c = 0; c < mn_test_num_qcases; c++)
    for (int ri = 0; ri < 3; ri++) {
      mn_quant q = mn_test_qcases[c].format;
      int gs = mn_test_qcases[c].group;
      size_t rw = 0;
      uint32_t *wq = mn_test_qweights(q, gs, OUT, IN, 5 + (uint64_t)c, &rw);
      float *x = NULL;
      float *y =
          mn_test_qproduct(MN_BACKEND_CPU, MN_PRECISION_F32, q, gs, wq, rows[ri], IN, OUT, 9, &x);
      cr_assert_not_null(y, "%s", mn_last_error());
      double worst = 0;
      for (int64_t o = 0; o < OUT; o++) {
        mn_dequantize_row(q, gs, wq + o * (int64_t)rw, deq, (size_t)IN);
        for (int64_t i = 0; i < rows[ri]; i++) {
          double want = 0, mag = 0;
          for (int64_t k = 0; k < IN; k++) {
            want += (double)x[i * IN + k] * deq[k];
            mag += fabs((double)x[i * IN + k] * deq[k]);
          }
          double e = fabs(y[i * OUT + o] - want) / (mag + 1e-30);
          worst = fmax(worst, e);
        }
      }
      cr_assert_leq(worst, 1e-7, "%s group %d rows %lld: relative error %g", mn_quant_name(q), gs,
                    (long long)rows[ri], worst);
      free(wq);
      free(x);
      free(y);
    }
}

Test(quant, thread_count_does_not_change_the_product) {
  const int64_t IN = 512, OUT = 96, ROWS = 16;
  size_t rw = 0;
  uint32_t *wq = mn_test_qweights(MN_QUANT_Q4_1, 0, OUT, IN, 21, &rw);
  float *ref = NULL;
  const char *counts[4] = {"1", "2", "3", "7"};
  for (int t = 0; t < 4; t++) {
    setenv("MN_CPU_THREADS", counts[t], 1);
    float *y = mn_test_qproduct(MN_BACKEND_CPU, MN_PRECISION_F32, MN_QUANT_Q4_1, 0, wq, ROWS, IN,
                                OUT, 4, NULL);
    cr_assert_not_null(y);
    if (!ref)
      ref = y;
    else {
      cr_assert(memcmp(ref, y, (size_t)(ROWS * OUT) * 4) == 0, "%s threads differ from 1",
                counts[t]);
      free(y);
    }
  }
  unsetenv("MN_CPU_THREADS");
  free(ref);
  free(wq);
}

/* ---------------------------------------------------------------- the generator */

static mn_tmp_dir dir;
static char weights[2][512];

/* The generator suites' tiny models, widened so that in_features (128 and 256; Llama's
 * down_proj 192, which groups of 128 do not divide) suit the blocks and groups. */
static mn_model_config config(mn_model_family f) {
  mn_model_config c = mn_test_gen_config(f);
  c.hidden_size = 128;
  c.num_heads = 8;
  c.num_kv_heads = f == MN_MODEL_GPT2 ? 8 : 2;
  c.head_dim = 16;
  c.intermediate_size = f == MN_MODEL_GPT2 ? 256 : 192;
  c.max_positions = 32;
  return c;
}

static void gen_setup(void) {
  dir = mn_tmp_dir_make("mn_quant");
  mn_model_family f[2] = {MN_MODEL_GPT2, MN_MODEL_LLAMA};
  for (int i = 0; i < 2; i++) {
    mn_model_config c = config(f[i]);
    snprintf(weights[i], sizeof weights[i], "%s", mn_tmp_path(&dir, i ? "llama.st" : "gpt2.st"));
    mn_test_gen_write_weights(&c, weights[i], 31 + (uint64_t)i);
  }
}
static void gen_teardown(void) { mn_tmp_dir_remove(&dir); }

static mn_generator *make(const mn_model_config *c, const char *path, mn_quant q, int gs) {
  mn_generator_options o = mn_generator_options_default();
  o.session.backend = MN_BACKEND_CPU;
  o.quant = q;
  o.group_size = gs;
  o.max_seq = c->max_positions;
  mn_generator *g = NULL;
  cr_assert_eq(mn_generator_new(c, path, &o, &g), MN_OK, "%s", mn_last_error());
  return g;
}

/* Teacher-forced next tokens: the greedy token after each prefix of ctx. */
static void next_tokens(mn_generator *g, const uint32_t *ctx, size_t n, uint32_t *out) {
  for (size_t t = 1; t <= n; t++) {
    cr_assert_eq(mn_generator_reset(g), MN_OK);
    cr_assert_eq(mn_generator_generate(g, ctx, t, NULL, out + t - 1, 1), MN_OK, "%s",
                 mn_last_error());
  }
}

/* Bytes of the linear weights, plain (f32) and packed. */
static void linear_bytes(const mn_model_config *c, mn_quant q, int gs, size_t *plain,
                         size_t *packed) {
  int64_t d = c->hidden_size, ff = c->intermediate_size;
  int64_t kv = c->num_kv_heads * c->head_dim, qd = c->num_heads * c->head_dim;
  int64_t gpt2[4][2] = {{3 * d, d}, {d, d}, {ff, d}, {d, ff}};
  int64_t llama[7][2] = {{qd, d}, {kv, d}, {kv, d}, {d, qd}, {ff, d}, {ff, d}, {d, ff}};
  bool is_gpt2 = c->family == MN_MODEL_GPT2;
  *plain = *packed = 0;
  for (int i = 0; i < (is_gpt2 ? 4 : 7); i++) {
    int64_t *oi = is_gpt2 ? gpt2[i] : llama[i];
    *plain += (size_t)(oi[0] * oi[1]) * 4 * (size_t)c->num_layers;
    *packed += (size_t)oi[0] * mn_quant_row_words(q, gs, oi[1]) * 4 * (size_t)c->num_layers;
  }
}

static void agreement(mn_model_family f, mn_quant q, int gs, double min_fraction) {
  mn_model_config c = config(f);
  const char *path = weights[f == MN_MODEL_LLAMA];
  enum { N = 24 };
  uint32_t ctx[N], plain[N], quant[N];
  mn_rng r = mn_rng_new(77);
  mn_rng_fill_u32(&r, ctx, N, (uint32_t)c.vocab_size);
  mn_generator *g0 = make(&c, path, MN_QUANT_NONE, 0), *g1 = make(&c, path, q, gs);
  next_tokens(g0, ctx, N, plain);
  next_tokens(g1, ctx, N, quant);
  size_t same = 0;
  for (int i = 0; i < N; i++)
    same += plain[i] == quant[i];
  double frac = (double)same / N;
  printf("%s %s group %d: %zu of %d next tokens agree\n", f == MN_MODEL_GPT2 ? "gpt2" : "llama",
         mn_quant_name(q), gs, same, N);
  cr_assert_geq(frac, min_fraction, "%s group %d: %zu of %d next tokens agree", mn_quant_name(q),
                gs, same, N);
  mn_generator_stats s0, s1;
  cr_assert_eq(mn_generator_get_stats(g0, &s0), MN_OK);
  cr_assert_eq(mn_generator_get_stats(g1, &s1), MN_OK);
  size_t lin, packed;
  linear_bytes(&c, q, gs, &lin, &packed);
  cr_assert_eq(s1.weight_bytes, s0.weight_bytes - lin + packed,
               "%s: weight_bytes %zu, expected %zu - %zu + %zu", mn_quant_name(q), s1.weight_bytes,
               s0.weight_bytes, lin, packed);
  mn_generator_free(g0);
  mn_generator_free(g1);
}

/* Random weights of std 0.3 make a chaotic model (a trained one is the real measure:
 * docs/generation.md's table); chance agreement is 1/vocab. */
Test(quant, generator_agrees_with_unquantized, .init = gen_setup, .fini = gen_teardown) {
  mn_model_family f[2] = {MN_MODEL_GPT2, MN_MODEL_LLAMA};
  for (int i = 0; i < 2; i++) {
    agreement(f[i], MN_QUANT_Q8_0, 0, 0.8);
    agreement(f[i], MN_QUANT_AFFINE_INT8, 64, 0.8);
    agreement(f[i], MN_QUANT_Q4_0, 0, 0.4);
    agreement(f[i], MN_QUANT_Q4_1, 0, 0.4);
    agreement(f[i], MN_QUANT_AFFINE_INT4, 32, 0.4);
    if (f[i] == MN_MODEL_GPT2) agreement(f[i], MN_QUANT_AFFINE_INT4, 128, 0.4);
  }
}

/* The prefill session shares the quantized weights with the decode session: a prompt fed in a
 * chunk gives the tokens of the same prompt fed one token per launch. */
static void prefill_tokens(mn_model_family f, mn_quant q, int gs, mn_prefill_mode mode,
                           uint32_t *out) {
  mn_model_config c = config(f);
  mn_generator *g = make(&c, weights[f == MN_MODEL_LLAMA], q, gs);
  cr_assert(mn_generator_set_prefill_mode(g, mode), "%s: the generator has no prefill graph",
            mn_quant_name(q));
  uint32_t prompt[25];
  for (size_t i = 0; i < 25; i++)
    prompt[i] = (uint32_t)((i * 29 + 3) % (size_t)c.vocab_size);
  cr_assert_eq(mn_generator_generate(g, prompt, 25, NULL, out, 4), MN_OK, "%s", mn_last_error());
  mn_generator_free(g);
}

Test(quant, prefill_chunks_share_the_packed_weights, .init = gen_setup, .fini = gen_teardown) {
  mn_model_family f[2] = {MN_MODEL_GPT2, MN_MODEL_LLAMA};
  const mn_quant qs[3] = {MN_QUANT_Q8_0, MN_QUANT_Q4_1, MN_QUANT_AFFINE_INT4};
  for (int i = 0; i < 2; i++)
    for (int k = 0; k < 3; k++) {
      uint32_t chunks[4], tokens[4];
      prefill_tokens(f[i], qs[k], 32, MN_PREFILL_CHUNKS, chunks);
      prefill_tokens(f[i], qs[k], 32, MN_PREFILL_TOKENS, tokens);
      for (int t = 0; t < 4; t++)
        cr_assert_eq(chunks[t], tokens[t], "family %d %s: token %d is %u in a chunk, %u by tokens",
                     (int)f[i], mn_quant_name(qs[k]), t, chunks[t], tokens[t]);
    }
}

/* Writes a copy of a Q4_0 GGUF whose linear layers' blocks hold only codes 8..15 (values
 * 0..7 d): blocks that ggml's quantizer would never write, so requantizing their values gives
 * other blocks and other values. Returns how many blocks changed when requantized. */
static size_t write_odd_q4_0(const char *src, const char *dst) {
  FILE *f = fopen(src, "rb");
  cr_assert_not_null(f);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *img = malloc((size_t)n);
  cr_assert_eq(fread(img, 1, (size_t)n, f), (size_t)n);
  fclose(f);
  mn_gguf *g = NULL;
  cr_assert_eq(mn_gguf_open(src, &g), MN_OK, "%s", mn_last_error());
  size_t changed = 0;
  for (size_t i = 0; i < mn_gguf_tensor_count(g); i++) {
    const mn_gguf_tensor *t = mn_gguf_tensor_at(g, i);
    if (t->type != MN_GGML_Q4_0 || !strstr(t->name, "blk.")) continue;
    for (uint64_t b = 0; b < t->numel / 32; b++) {
      unsigned char *blk = img + t->offset + b * 18;
      for (int j = 2; j < 18; j++)
        blk[j] = (unsigned char)(0x88 | (blk[j] & 0x77));
      float v[32];
      uint32_t again[5];
      mn_ggml_to_f32(MN_GGML_Q4_0, blk, v, 32);
      mn_quantize(MN_QUANT_Q4_0, 0, v, 1, 32, again);
      changed += memcmp(again, blk, 18) != 0;
    }
  }
  mn_gguf_close(g);
  f = fopen(dst, "wb");
  cr_assert_not_null(f);
  cr_assert_eq(fwrite(img, 1, (size_t)n, f), (size_t)n);
  fclose(f);
  free(img);
  return changed;
}

/* Blocks in the requested format are used as they are: the Q4_0 generator of a file with
 * blocks that requantization would change computes with exactly the values the file holds,
 * as the unquantized generator of the same file does (the same double sums, the same bits);
 * the Q8_0 generator of a Q4_0 file converts, and runs. */
Test(quant, gguf_blocks_kept_as_they_are, .init = gen_setup, .fini = gen_teardown) {
  const char *archs[2] = {"llama", "gpt2"};
  for (int a = 0; a < 2; a++) {
    char name[64], cfg[64];
    snprintf(name, sizeof name, "%s_q4_0.gguf", archs[a]);
    snprintf(cfg, sizeof cfg, "%s_f32.gguf", archs[a]);
    const char *odd = mn_tmp_path(&dir, a ? "gpt2_odd.gguf" : "llama_odd.gguf");
    cr_assert_gt(write_odd_q4_0(fixture(name), odd), 100u,
                 "the odd blocks would survive a requantization");
    mn_model_config c;
    cr_assert_eq(mn_model_config_load(fixture(cfg), &c), MN_OK, "%s", mn_last_error());
    uint32_t prompt[3] = {1, 7, 3}, want[8], got[8];
    mn_generator *plain = make(&c, odd, MN_QUANT_NONE, 0);
    cr_assert_eq(mn_generator_generate(plain, prompt, 3, NULL, want, 8), MN_OK, "%s",
                 mn_last_error());
    mn_generator *kept = make(&c, odd, MN_QUANT_Q4_0, 0);
    cr_assert_eq(mn_generator_generate(kept, prompt, 3, NULL, got, 8), MN_OK, "%s",
                 mn_last_error());
    cr_assert(memcmp(want, got, sizeof want) == 0, "%s: the kept blocks give other tokens", name);
    mn_generator *conv = make(&c, odd, MN_QUANT_Q8_0, 0);
    cr_assert_eq(mn_generator_generate(conv, prompt, 3, NULL, got, 8), MN_OK, "%s",
                 mn_last_error());
    mn_generator_free(plain);
    mn_generator_free(kept);
    mn_generator_free(conv);
  }
}

static mn_status try_new(mn_model_family f, int quant, int gs) {
  mn_model_config c = config(f);
  mn_generator_options o = mn_generator_options_default();
  o.session.backend = MN_BACKEND_CPU;
  o.quant = (mn_quant)quant;
  o.group_size = gs;
  mn_generator *g = (mn_generator *)&o; /* must come back NULL */
  mn_status st = mn_generator_new(&c, weights[f == MN_MODEL_LLAMA], &o, &g);
  cr_assert_null(g);
  return st;
}

Test(quant, refused_options, .init = gen_setup, .fini = gen_teardown) {
  mn_assert_error(try_new(MN_MODEL_LLAMA, 99, 64), MN_ERR_INVALID_ARGUMENT, "quant 99");
  mn_assert_error(try_new(MN_MODEL_LLAMA, -1, 64), MN_ERR_INVALID_ARGUMENT, "is not an mn_quant");
  mn_assert_error(try_new(MN_MODEL_LLAMA, MN_QUANT_AFFINE_INT4, 48), MN_ERR_INVALID_ARGUMENT,
                  "group_size 48");
  /* 128 does not divide the 192 inputs of down_proj. */
  mn_assert_error(try_new(MN_MODEL_LLAMA, MN_QUANT_AFFINE_INT8, 128), MN_ERR_INVALID_ARGUMENT,
                  "multiple of the int8 block of 128");
}

Test(quant, builder_refusals_and_no_gradient) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(2, 64));
  mn_node w = mn_input_u32(g, "w", MN_SHAPE(8, 17));
  mn_matmul_quant(g, x, w, MN_QUANT_NONE, 0, 8, 64);
  mn_assert_graph_error(g, MN_ERR_INVALID_ARGUMENT, "not a quantized format");
  mn_graph_free(g);
  g = mn_graph_new();
  x = mn_input(g, "x", MN_SHAPE(2, 64));
  w = mn_input_u32(g, "w", MN_SHAPE(8, 16));
  mn_matmul_quant(g, x, w, MN_QUANT_Q8_0, 0, 8, 64);
  mn_assert_graph_error(g, MN_ERR_SHAPE, "expected [8,17]");
  mn_graph_free(g);
  /* Forward only: a loss that reaches a parameter through it cannot be differentiated. */
  g = mn_graph_new();
  mn_node p = mn_parameter(g, "p", MN_SHAPE(2, 64));
  w = mn_input_u32(g, "w", MN_SHAPE(8, 17));
  mn_node y = mn_matmul_quant(g, p, w, MN_QUANT_Q8_0, 0, 8, 64);
  mn_node loss = mn_mean_all(g, y);
  mn_set_outputs(g, &loss, 1);
  mn_session_options o = mn_session_options_default();
  o.backend = MN_BACKEND_CPU;
  mn_session *s = NULL;
  mn_assert_error(mn_build_session(g, &o, &s), MN_ERR_UNSUPPORTED, "matmul_quant");
  mn_graph_free(g);
}
