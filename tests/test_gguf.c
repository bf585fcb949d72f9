/* GGUF files (llama.cpp's format): the reader, the tensor types, the config, the tokenizer and
 * the session loader, against tests/fixtures/gguf/ (scripts/gen_gguf_fixtures.py writes them
 * with the gguf package from random weights, beside the same weights as transformers-named
 * safetensors and gguf-py's own dequantization of every tensor), and bad input of every kind. */
#include <stdio.h>
#include <stdlib.h>

#include "io/gguf.h"
#include "tests/support/mn_test.h"
#include "tests/support/session_util.h"
#include "tests/support/tmp_dir.h"

#define LEN(a) (sizeof(a) / sizeof((a)[0]))

static const char *const TYPES[] = {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_1"};

/* <root>/tests/fixtures/gguf/<name> */
static const char *fixture(const char *name) {
  static char buf[4][1024];
  static int turn;
  const char *me = __FILE__;
  const char *tail = strstr(me, "tests/test_gguf.c");
  cr_assert_not_null(tail);
  char *out = buf[turn++ % 4];
  snprintf(out, sizeof buf[0], "%.*stests/fixtures/gguf/%s", (int)(tail - me), me, name);
  return out;
}

static const char *model_file(const char *arch, const char *type, const char *ext) {
  char name[64];
  snprintf(name, sizeof name, "%s_%s.%s", arch, type, ext);
  return fixture(name);
}

static mn_gguf *open_ok(const char *path) {
  mn_gguf *g = NULL;
  cr_assert_eq(mn_gguf_open(path, &g), MN_OK, "%s", mn_last_error());
  return g;
}

static uint64_t fnv1a(const void *data, size_t n) {
  const unsigned char *p = data;
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; i++)
    h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

/* ---------------------------------------------------------------- the reader */

Test(gguf, header_metadata_and_tensor_infos) {
  mn_gguf *g = open_ok(model_file("llama", "q4_0", "gguf"));
  cr_assert_eq(mn_gguf_version(g), 3);
  cr_assert_eq(mn_gguf_alignment(g), 32);
  cr_assert_eq(mn_gguf_data_offset(g) % 32, 0);
  const mn_gguf_kv *arch = mn_gguf_find(g, "general.architecture");
  cr_assert(arch && arch->type == MN_GGUF_STRING && arch->v.str.len == 5 &&
            memcmp(arch->v.str.ptr, "llama", 5) == 0);
  int64_t v = 0;
  cr_assert(mn_gguf_kv_int(mn_gguf_find(g, "llama.attention.head_count_kv"), &v) && v == 2);
  const mn_gguf_kv *tokens = mn_gguf_find(g, "tokenizer.ggml.tokens");
  const char *s;
  uint64_t len;
  cr_assert(mn_gguf_array_string(g, tokens, 43, &s, &len));
  cr_assert(len == 3 && memcmp(s, "\xc4\xa0t", 3) == 0, "token 43 is '%.*s'", (int)len, s);
  cr_assert(mn_gguf_array_int(g, mn_gguf_find(g, "tokenizer.ggml.token_type"), 62, &v) && v == 3);
  cr_assert_not(mn_gguf_array_string(g, tokens, tokens->v.arr.count, &s, &len));

  const mn_gguf_tensor *q = mn_gguf_tensor_find(g, "blk.1.attn_k.weight");
  cr_assert_not_null(q);
  cr_assert_eq(q->type, MN_GGML_Q4_0);
  cr_assert(q->rank == 2 && q->ne[0] == 32 && q->ne[1] == 16 && q->shape[0] == 16 &&
            q->shape[1] == 32);
  cr_assert_eq(q->bytes, 16 * sizeof(mn_block_q4_0));
  cr_assert_eq(q->offset % 32, 0);
  cr_assert_null(mn_gguf_tensor_find(g, "blk.9.attn_k.weight"));
  mn_gguf_close(g);
}

/* Every tensor of every model file dequantizes to the bits gguf-py's dequantize gives (the
 * .ref files hold an FNV-1a hash of its f32 bytes per tensor). */
Test(gguf, every_tensor_matches_gguf_py_dequantize) {
  const char *archs[] = {"llama", "gpt2"};
  size_t checked = 0;
  for (size_t a = 0; a < LEN(archs); a++)
    for (size_t t = 0; t < LEN(TYPES); t++) {
      mn_gguf *g = open_ok(model_file(archs[a], TYPES[t], "gguf"));
      FILE *f = fopen(model_file(archs[a], TYPES[t], "ref"), "r");
      cr_assert_not_null(f);
      char name[128];
      unsigned long long want;
      size_t lines = 0;
      while (fscanf(f, "%127s %llx", name, &want) == 2) {
        const mn_gguf_tensor *x = mn_gguf_tensor_find(g, name);
        cr_assert_not_null(x, "%s_%s: no tensor %s", archs[a], TYPES[t], name);
        float *v = malloc(x->numel * sizeof *v);
        cr_assert_eq(mn_gguf_read_f32(g, x, v, x->numel), MN_OK, "%s", mn_last_error());
        uint64_t got = fnv1a(v, x->numel * sizeof *v);
        cr_assert_eq(
            got, want, "%s_%s: %s (%s) differs from gguf-py: hash %016llx, expected %016llx",
            archs[a], TYPES[t], name, mn_ggml_type_name(x->type), (unsigned long long)got, want);
        free(v);
        lines++;
      }
      fclose(f);
      cr_assert_eq(lines, mn_gguf_tensor_count(g));
      checked += lines;
      mn_gguf_close(g);
    }
  cr_assert_gt(checked, 200);
}

/* One tensor per type with edge values (signed zeros, f16/bf16 subnormals, the largest f16),
 * against gguf-py's values element by element. */
Test(gguf, types_match_gguf_py_values) {
  mn_gguf *g = open_ok(fixture("types.gguf"));
  mn_safetensors *ref = NULL;
  cr_assert_eq(mn_safetensors_open(fixture("types_ref.safetensors"), &ref), MN_OK);
  for (size_t t = 0; t < LEN(TYPES); t++) {
    const mn_gguf_tensor *x = mn_gguf_tensor_find(g, TYPES[t]);
    cr_assert_not_null(x);
    cr_assert_str_eq(mn_ggml_type_name(x->type), TYPES[t][0] == 'b' ? "BF16"
                                                 : TYPES[t][0] == 'f'
                                                     ? (TYPES[t][1] == '1' ? "F16" : "F32")
                                                 : TYPES[t][1] == '8' ? "Q8_0"
                                                 : TYPES[t][3] == '0' ? "Q4_0"
                                                                      : "Q4_1");
    float got[128], want[128];
    cr_assert_eq(mn_gguf_read_f32(g, x, got, 128), MN_OK, "%s", mn_last_error());
    cr_assert_eq(mn_safetensors_read_f32(ref, TYPES[t], want, 128), MN_OK);
    for (size_t k = 0; k < 128; k++)
      cr_assert(memcmp(&got[k], &want[k], 4) == 0, "%s[%zu] = %a, gguf-py %a", TYPES[t], k,
                (double)got[k], (double)want[k]);
    cr_assert_neq(mn_gguf_read_f32(g, x, got, 127), MN_OK);
  }
  mn_safetensors_close(ref);
  mn_gguf_close(g);
}

/* Q/K rows: un-permuting what the converter's permute did gives back the original rows. */
Test(gguf, unpermute_inverts_the_converters_permute) {
  enum { HEADS = 2, HD = 8, ROWS = HEADS * HD };
  int orig[ROWS], perm[ROWS], back[ROWS];
  for (int r = 0; r < ROWS; r++)
    orig[r] = r;
  /* reshape(heads, 2, hd/2).swapaxes(1, 2): new (h, j, p) = old (h, p, j) */
  for (int h = 0; h < HEADS; h++)
    for (int j = 0; j < HD / 2; j++)
      for (int p = 0; p < 2; p++)
        perm[h * HD + 2 * j + p] = orig[h * HD + p * (HD / 2) + j];
  cr_assert(mn_gguf_unpermute_rows(perm, back, ROWS, sizeof(int), HEADS));
  cr_assert_eq(memcmp(orig, back, sizeof orig), 0);
  cr_assert_not(mn_gguf_unpermute_rows(perm, back, ROWS, sizeof(int), 3));
}

/* ---------------------------------------------------------------- config and tokenizer */

static void assert_same_config(const mn_model_config *a, const mn_model_config *b) {
  cr_assert_eq(a->family, b->family);
  cr_assert_eq(a->vocab_size, b->vocab_size);
  cr_assert_eq(a->hidden_size, b->hidden_size);
  cr_assert_eq(a->num_layers, b->num_layers);
  cr_assert_eq(a->num_heads, b->num_heads);
  cr_assert_eq(a->num_kv_heads, b->num_kv_heads);
  cr_assert_eq(a->head_dim, b->head_dim);
  cr_assert_eq(a->intermediate_size, b->intermediate_size);
  cr_assert_eq(a->max_positions, b->max_positions);
  cr_assert_eq(a->norm_eps, b->norm_eps);
  cr_assert_eq(a->rope_theta, b->rope_theta);
  cr_assert_eq(a->initializer_range, b->initializer_range);
  cr_assert_eq(a->tie_word_embeddings, b->tie_word_embeddings);
}

Test(gguf, config_equals_config_json) {
  const char *archs[] = {"llama", "gpt2"};
  for (size_t a = 0; a < LEN(archs); a++) {
    mn_model_config want, got;
    char name[64];
    snprintf(name, sizeof name, "%s_config.json", archs[a]);
    cr_assert_eq(mn_model_config_load(fixture(name), &want), MN_OK, "%s", mn_last_error());
    for (size_t t = 0; t < LEN(TYPES); t++) {
      memset(&got, 0x5a, sizeof got);
      cr_assert_eq(mn_model_config_load(model_file(archs[a], TYPES[t], "gguf"), &got), MN_OK, "%s",
                   mn_last_error());
      assert_same_config(&got, &want);
    }
  }
}

/* A GGUF is recognised by its magic, whatever its name. */
Test(gguf, recognised_by_magic_not_name) {
  mn_tmp_dir dir = mn_tmp_dir_make("mn_gguf");
  size_t len = 0;
  char *data = mn_test_read_file(model_file("gpt2", "q8_0", "gguf"), &len);
  const char *path = mn_tmp_path(&dir, "model.bin");
  mn_test_write_file(path, data, len);
  free(data);
  mn_model_config c;
  cr_assert_eq(mn_model_config_load(path, &c), MN_OK, "%s", mn_last_error());
  cr_assert_eq(c.family, MN_MODEL_GPT2);
  mn_tmp_dir_remove(&dir);
}

static void assert_same_ids(const char *json, const char *gguf) {
  mn_tokenizer *a = NULL, *b = NULL;
  cr_assert_eq(mn_tokenizer_load(json, &a), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_tokenizer_load(gguf, &b), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_tokenizer_vocab_size(a), mn_tokenizer_vocab_size(b));
  const char *texts[] = {"hello world", "the cat sat, the cat sat!",
                         "hello<|endoftext|>world<sep> at", "12345 and 6, x's   spaced  ",
                         "ing er in the hello"};
  for (size_t i = 0; i < LEN(texts); i++) {
    uint32_t ia[64], ib[64];
    size_t na = 0, nb = 0;
    cr_assert_eq(mn_tokenizer_encode(a, texts[i], strlen(texts[i]), ia, 64, &na), MN_OK, "%s",
                 mn_last_error());
    cr_assert_eq(mn_tokenizer_encode(b, texts[i], strlen(texts[i]), ib, 64, &nb), MN_OK, "%s",
                 mn_last_error());
    cr_assert_eq(na, nb, "'%s': %zu ids from tokenizer.json, %zu from the GGUF", texts[i], na, nb);
    cr_assert_eq(memcmp(ia, ib, na * sizeof *ia), 0, "'%s': different ids", texts[i]);
    cr_assert_lt(na, strlen(texts[i]), "'%s': no merge applied", texts[i]);
  }
  cr_assert_eq(mn_tokenizer_token_id(b, "<|endoftext|>"), 62);
  cr_assert_str_eq(mn_tokenizer_token(b, 60), "Ġa");
  mn_tokenizer_free(a);
  mn_tokenizer_free(b);
}

Test(gguf, tokenizer_equals_tokenizer_json) {
  assert_same_ids(fixture("gpt2_tokenizer.json"), model_file("gpt2", "f32", "gguf")); /* gpt2 */
  assert_same_ids(fixture("llama_tokenizer.json"),
                  model_file("llama", "q4_1", "gguf"));                              /* smollm */
  assert_same_ids(fixture("bpe_llama3_tokenizer.json"), fixture("bpe_llama3.gguf")); /* llama-bpe */
}

/* ---------------------------------------------------------------- the session loader */

enum { B = 2, T = 8 };

static mn_graph *model_graph(const char *arch, mn_model_config *c) {
  char name[64];
  snprintf(name, sizeof name, "%s_config.json", arch);
  cr_assert_eq(mn_model_config_load(fixture(name), c), MN_OK, "%s", mn_last_error());
  mn_graph *g = NULL;
  cr_assert_eq(mn_model_build(c, B, T, NULL, &g), MN_OK, "%s", mn_last_error());
  return g;
}

/* The logits [B, T, V] of the session's parameters on a fixed batch. */
static float *logits_of(const mn_graph *g, mn_session *s, const mn_model_config *c) {
  uint32_t ids[B * T];
  for (size_t i = 0; i < B * T; i++)
    ids[i] = (uint32_t)((i * 7 + 3) % (size_t)c->vocab_size);
  cr_assert_eq(mn_model_prepare_session(g, s), MN_OK);
  cr_assert_eq(mn_session_set_input_u32(s, "input_ids", ids, B * T), MN_OK);
  cr_assert_eq(mn_session_set_input_u32(s, "labels", ids, B * T), MN_OK);
  mn_test_step_loss(s);
  size_t n = (size_t)(B * T * c->vocab_size);
  float *out = malloc(n * sizeof *out);
  cr_assert_eq(mn_session_read_output_by_index(s, 1, out, n), MN_OK);
  return out;
}

static double max_abs(const float *x, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; i++)
    m = fmax(m, fabs((double)x[i]));
  return m;
}

/* Logits of the GGUF against those of the safetensors: bitwise for F32 (which also proves the
 * Q/K permutation and GPT-2's transposes undone), within each format's rounding otherwise. The
 * bounds are about twice the relative RMS errors measured on these models: a weight's rounding
 * error (RMS, relative to the weights' spread) is ~0.03% for F16, ~0.2% for BF16, ~0.5% for
 * Q8_0 and ~8% for the 4-bit types (a step of max/8 over Gaussian blocks), and two random
 * layers amplify it about 4x. The errors must also rank as the formats' precisions do. */
static void compare_logits(const char *arch) {
  static const double tol[] = {0, 5e-3, 2e-2, 5e-2, 1.0, 0.8};
  mn_model_config c;
  mn_graph *g = model_graph(arch, &c);
  char name[64];
  snprintf(name, sizeof name, "%s.safetensors", arch);
  mn_session *ref = mn_test_session(g, MN_BACKEND_CPU, false);
  cr_assert_eq(mn_session_load_safetensors(ref, fixture(name), true), MN_OK, "%s", mn_last_error());
  float *want = logits_of(g, ref, &c);
  size_t n = (size_t)(B * T * c.vocab_size);
  cr_assert_gt(max_abs(want, n), 1.0, "flat logits would prove nothing");
  double errs[LEN(TYPES)];
  for (size_t t = 0; t < LEN(TYPES); t++) {
    mn_session *s = mn_test_session(g, MN_BACKEND_CPU, false);
    const char *path = model_file(arch, TYPES[t], "gguf");
    cr_assert_eq(mn_session_load_gguf(s, path, MN_LOAD_STRICT), MN_OK, "%s", mn_last_error());
    float *got = logits_of(g, s, &c);
    double err = errs[t] = mn_test_rel_err(got, want, n);
    cr_log_info("%s %s: relative RMS logit error %.3g", arch, TYPES[t], err);
    if (t == 0)
      cr_assert_eq(memcmp(got, want, n * sizeof *got), 0, "%s: F32 logits differ (rel %.3g)", path,
                   err);
    else
      cr_assert_leq(err, tol[t], "%s: relative logit error %.3g above %.3g", path, err, tol[t]);
    free(got);
    mn_session_free(s);
  }
  /* f16 < bf16 < q8_0 < q4_1 and q4_0: coarser formats, larger errors */
  cr_assert(0 < errs[1] && errs[1] < errs[2] && errs[2] < errs[3] && errs[3] < errs[5] &&
                errs[3] < errs[4],
            "%s: errors do not rank as the formats' precisions", arch);
  free(want);
  mn_session_free(ref);
  mn_graph_free(g);
}

Test(gguf, llama_logits_equal_safetensors) { compare_logits("llama"); }
Test(gguf, gpt2_logits_equal_safetensors) { compare_logits("gpt2"); }

/* GPT-2's tied head (output.weight, a copy of token_embd) is skipped, and said so. */
Test(gguf, gpt2_tied_output_is_skipped) {
  mn_model_config c;
  mn_graph *g = model_graph("gpt2", &c);
  mn_session *s = mn_test_session(g, MN_BACKEND_CPU, false);
  cr_assert_eq(mn_session_load_gguf(s, model_file("gpt2", "f16", "gguf"), 0), MN_OK);
  cr_assert(strstr(mn_last_error(), "skipped 1 tensor not in the graph: output.weight"), "%s",
            mn_last_error());
  mn_session_free(s);
  mn_graph_free(g);
}

/* A graph built without the base prefix loads the same values. */
Test(gguf, loads_into_a_graph_without_prefix) {
  mn_model_config c;
  cr_assert_eq(mn_model_config_load(fixture("llama_config.json"), &c), MN_OK);
  mn_graph *g = NULL;
  cr_assert_eq(mn_model_build(&c, 1, 4, "", &g), MN_OK);
  mn_session *s = mn_test_session(g, MN_BACKEND_CPU, false);
  cr_assert_eq(mn_session_load_gguf(s, model_file("llama", "f32", "gguf"), MN_LOAD_STRICT), MN_OK,
               "%s", mn_last_error());
  float w[32];
  cr_assert_eq(mn_session_read_param(s, "norm.weight", w, 32), MN_OK);
  cr_assert_gt(max_abs(w, 32), 0.5);
  mn_session_free(s);
  mn_graph_free(g);
}

/* ---------------------------------------------------------------- bad input */

/* A Llama session whose parameters hold a known pattern, to prove a refused load changed
 * nothing. */
typedef struct guarded {
  mn_graph *g;
  mn_session *s;
  float *before;
} guarded;

static guarded guarded_session(void) {
  guarded x;
  mn_model_config c;
  x.g = model_graph("llama", &c);
  x.s = mn_test_session(x.g, MN_BACKEND_CPU, false);
  mn_rng r = mn_rng_new(7);
  mn_test_init_uniform(x.g, x.s, &r, -1, 1, false);
  x.before = mn_test_read_params(x.g, x.s);
  return x;
}

static void assert_unchanged(guarded *x) {
  float *now = mn_test_read_params(x->g, x->s);
  cr_assert_eq(memcmp(now, x->before, mn_test_param_count(x->g) * sizeof *now), 0,
               "a refused load changed the session");
  free(now);
  free(x->before);
  mn_session_free(x->s);
  mn_graph_free(x->g);
}

static void refused(const char *path, mn_status want, const char *fragment) {
  guarded x = guarded_session();
  mn_assert_error(mn_session_load_gguf(x.s, path, 0), want, fragment);
  assert_unchanged(&x);
  mn_gguf *g = NULL;
  mn_status st = mn_gguf_open(path, &g);
  if (st == MN_OK)
    mn_gguf_close(g);
  else
    cr_assert_null(g);
}

Test(gguf, every_truncation_is_refused_naming_an_offset) {
  mn_tmp_dir dir = mn_tmp_dir_make("mn_gguf");
  size_t len = 0;
  char *data = mn_test_read_file(model_file("llama", "q4_0", "gguf"), &len);
  const char *path = mn_tmp_path(&dir, "cut.gguf");
  size_t tried = 0;
  for (size_t n = 0; n < len; n += n < 4096 ? 1 : 997) {
    mn_gguf *g = NULL;
    mn_status st = mn_gguf_open_memory(data, n, "cut", &g);
    cr_assert_eq(st, MN_ERR_FORMAT, "a file cut at %zu of %zu bytes: %s (%s)", n, len,
                 mn_status_string(st), mn_last_error());
    cr_assert(strstr(mn_last_error(), "at byte "), "%s", mn_last_error());
    cr_assert_null(g);
    tried++;
  }
  cr_assert_gt(tried, 4000);
  mn_test_write_file(path, data, len - 1);
  refused(path, MN_ERR_FORMAT, "ends past the end of the file");
  free(data);
  mn_tmp_dir_remove(&dir);
}

/* A minimal file: the header, general.architecture "llama", one F32 tensor [32] named
 * output_norm.weight at `offset`, then `data_bytes` of data. */
static size_t write_minimal(unsigned char *buf, const char *magic, uint32_t version,
                            uint64_t offset, uint32_t type, size_t data_bytes) {
  size_t n = 0;
#define PUT(p, k)                                                                                  \
  do {                                                                                             \
    memcpy(buf + n, (p), (k));                                                                     \
    n += (k);                                                                                      \
  } while (0)
#define PUT_U32(v)                                                                                 \
  do {                                                                                             \
    uint32_t v_ = (v);                                                                             \
    PUT(&v_, 4);                                                                                   \
  } while (0)
#define PUT_U64(v)                                                                                 \
  do {                                                                                             \
    uint64_t v_ = (v);                                                                             \
    PUT(&v_, 8);                                                                                   \
  } while (0)
#define PUT_STR(s)                                                                                 \
  do {                                                                                             \
    PUT_U64(strlen(s));                                                                            \
    PUT((s), strlen(s));                                                                           \
  } while (0)
  PUT(magic, 4);
  PUT_U32(version);
  PUT_U64(1); /* tensors */
  PUT_U64(1); /* metadata */
  PUT_STR("general.architecture");
  PUT_U32(MN_GGUF_STRING);
  PUT_STR("llama");
  PUT_STR("output_norm.weight");
  PUT_U32(1);
  PUT_U64(32);
  PUT_U32(type);
  PUT_U64(offset);
  while (n % 32)
    buf[n++] = 0;
  memset(buf + n, 0, data_bytes);
  return n + data_bytes;
#undef PUT
#undef PUT_U32
#undef PUT_U64
#undef PUT_STR
}

static void refuse_minimal(const char *magic, uint32_t version, uint64_t offset, mn_status want,
                           const char *fragment) {
  mn_tmp_dir dir = mn_tmp_dir_make("mn_gguf");
  unsigned char buf[512];
  size_t n = write_minimal(buf, magic, version, offset, MN_GGML_F32, 128);
  const char *path = mn_tmp_path(&dir, "bad.gguf");
  mn_test_write_file(path, buf, n);
  refused(path, want, fragment);
  mn_tmp_dir_remove(&dir);
}

Test(gguf, bad_magic_version_and_offset) {
  /* the valid form first, so that each refusal below is for its one change */
  unsigned char buf[512];
  size_t n = write_minimal(buf, "GGUF", 3, 0, MN_GGML_F32, 128);
  mn_gguf *g = NULL;
  cr_assert_eq(mn_gguf_open_memory(buf, n, "minimal", &g), MN_OK, "%s", mn_last_error());
  mn_gguf_close(g);
  refuse_minimal("GGUG", 3, 0, MN_ERR_FORMAT, "at byte 0: not a GGUF file");
  refuse_minimal("GGUF", 7, 0, MN_ERR_FORMAT, "at byte 4: unknown GGUF version 7");
  refuse_minimal("GGUF", 1, 0, MN_ERR_UNSUPPORTED, "at byte 4: GGUF version 1");
  refuse_minimal("GGUF", 2, 1ull << 40, MN_ERR_FORMAT,
                 "tensor \"output_norm.weight\" (128 bytes at data offset 1099511627776) ends "
                 "past the end of the file");
  refuse_minimal("GGUF", 3, 32, MN_ERR_FORMAT, "ends past the end of the file");
  refuse_minimal("GGUF", 3, 8, MN_ERR_FORMAT, "offset 8 is not a multiple of the alignment 32");
  n = write_minimal(buf, "GGUF", 3, 0, 4, 128); /* 4: Q4_2, removed from ggml */
  cr_assert_eq(mn_gguf_open_memory(buf, n, "minimal", &g), MN_ERR_FORMAT);
  cr_assert(strstr(mn_last_error(), "which is no ggml type"), "%s", mn_last_error());
}

Test(gguf, unsupported_tensor_type_is_named) {
  refused(fixture("bad_type.gguf"), MN_ERR_UNSUPPORTED,
          "tensor \"token_embd.weight\" has type Q6_K");
  mn_gguf *g = open_ok(fixture("bad_type.gguf"));
  const mn_gguf_tensor *t = mn_gguf_tensor_find(g, "token_embd.weight");
  float v[256];
  mn_assert_error(mn_gguf_read_f32(g, t, v, 256), MN_ERR_UNSUPPORTED, "has type Q6_K");
  mn_gguf_close(g);
}

Test(gguf, another_architecture_is_named) {
  refused(fixture("bad_arch.gguf"), MN_ERR_UNSUPPORTED, "general.architecture \"qwen2\"");
  mn_model_config c;
  memset(&c, 0x11, sizeof c);
  mn_model_config before = c;
  mn_assert_error(mn_model_config_load(fixture("bad_arch.gguf"), &c), MN_ERR_UNSUPPORTED,
                  "\"qwen2\" is not supported");
  cr_assert_eq(memcmp(&c, &before, sizeof c), 0);
}

Test(gguf, shape_mismatch_changes_nothing) {
  mn_model_config c;
  cr_assert_eq(mn_model_config_load(fixture("llama_config.json"), &c), MN_OK);
  c.intermediate_size = 64;
  guarded x;
  cr_assert_eq(mn_model_build(&c, 1, 4, NULL, &x.g), MN_OK);
  x.s = mn_test_session(x.g, MN_BACKEND_CPU, false);
  mn_rng r = mn_rng_new(7);
  mn_test_init_uniform(x.g, x.s, &r, -1, 1, false);
  x.before = mn_test_read_params(x.g, x.s);
  mn_assert_error(mn_session_load_gguf(x.s, model_file("llama", "q8_0", "gguf"), 0), MN_ERR_SHAPE,
                  "tensor \"blk.0.ffn_gate.weight\" (\"model.layers.0.mlp.gate_proj.weight\") is "
                  "[32,32]");
  assert_unchanged(&x);
}

Test(gguf, strict_and_flags) {
  guarded x = guarded_session();
  mn_assert_error(mn_session_load_gguf(x.s, fixture("bpe_llama3.gguf"), MN_LOAD_STRICT),
                  MN_ERR_NOT_FOUND, "strict load, but 21 parameters are not in the file");
  mn_assert_error(mn_session_load_gguf(x.s, fixture("bpe_llama3.gguf"), 64),
                  MN_ERR_INVALID_ARGUMENT, "unknown flags 0x40");
  assert_unchanged(&x);
}

Test(gguf, tokenizer_refusals) {
  mn_tokenizer *t = NULL;
  mn_assert_error(mn_tokenizer_load(fixture("bad_arch.gguf"), &t), MN_ERR_UNSUPPORTED,
                  "tokenizer.ggml.model is missing");
  cr_assert_null(t);
}
