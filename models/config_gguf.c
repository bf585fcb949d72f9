/* mn_model_config from a GGUF file's metadata ({arch}.* keys, as llama.cpp's converter writes
 * them), for the architectures "llama" and "gpt2". Sizes llama.cpp requires are required here;
 * the others take transformers' defaults, as config.json's do. The vocabulary size is the
 * embedding's row count (what the model is built with), else {arch}.vocab_size, else the
 * token list's length. Options that change the computation (scaled RoPE, partial rotary
 * dimensions) are refused rather than ignored. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "host/error.h"
#include "io/gguf.h"
#include "models/model_internal.h"

typedef struct reader {
  const char *fn, *path, *arch;
  const mn_gguf *g;
} reader;

static const mn_gguf_kv *find(const reader *r, const char *suffix, char *key, size_t size) {
  snprintf(key, size, "%s.%s", r->arch, suffix);
  return mn_gguf_find(r->g, key);
}

/* {arch}.suffix, an integer in [1, INT32_MAX]; def when absent unless required (def < 0). */
static mn_status int_key(const reader *r, const char *suffix, int64_t def, int64_t *out) {
  char key[128];
  const mn_gguf_kv *kv = find(r, suffix, key, sizeof key);
  if (!kv && def >= 0) return (*out = def), MN_OK;
  if (!kv) return mn_fail(MN_ERR_FORMAT, "%s: %s: key \"%s\" is missing", r->fn, r->path, key);
  int64_t v = 0;
  if (!mn_gguf_kv_int(kv, &v) || v < 1 || v > INT32_MAX)
    return mn_fail(MN_ERR_FORMAT, "%s: %s: \"%s\" is not an integer in 1..%d", r->fn, r->path, key,
                   INT32_MAX);
  *out = v;
  return MN_OK;
}

/* {arch}.suffix, a finite number > 0; def when absent unless required (def < 0). */
static mn_status float_key(const reader *r, const char *suffix, double def, float *out) {
  char key[128];
  const mn_gguf_kv *kv = find(r, suffix, key, sizeof key);
  if (!kv && def >= 0) return (*out = (float)def), MN_OK;
  if (!kv) return mn_fail(MN_ERR_FORMAT, "%s: %s: key \"%s\" is missing", r->fn, r->path, key);
  double v = 0;
  if (!mn_gguf_kv_float(kv, &v) || !isfinite((float)v) || !((float)v > 0))
    return mn_fail(MN_ERR_FORMAT, "%s: %s: \"%s\" is not a finite number > 0", r->fn, r->path, key);
  *out = (float)v;
  return MN_OK;
}

static mn_status vocab_size(const reader *r, int64_t *out) {
  const mn_gguf_tensor *emb = mn_gguf_tensor_find(r->g, "token_embd.weight");
  if (emb && emb->rank == 2 && emb->shape[0] >= 1 && emb->shape[0] <= INT32_MAX)
    return (*out = emb->shape[0]), MN_OK;
  char key[128];
  if (find(r, "vocab_size", key, sizeof key)) return int_key(r, "vocab_size", -1, out);
  const mn_gguf_kv *tokens = mn_gguf_find(r->g, "tokenizer.ggml.tokens");
  if (tokens && tokens->type == MN_GGUF_ARRAY && tokens->v.arr.count >= 1 &&
      tokens->v.arr.count <= INT32_MAX)
    return (*out = (int64_t)tokens->v.arr.count), MN_OK;
  return mn_fail(MN_ERR_FORMAT,
                 "%s: %s: no vocabulary size (no token_embd.weight, %s.vocab_size or "
                 "tokenizer.ggml.tokens)",
                 r->fn, r->path, r->arch);
}

#define TRY(call)                                                                                  \
  do {                                                                                             \
    mn_status st_ = (call);                                                                        \
    if (st_ != MN_OK) return st_;                                                                  \
  } while (0)

static mn_status plain_rope(const reader *r, const mn_model_config *c) {
  char key[128];
  const mn_gguf_kv *kv = find(r, "rope.scaling.type", key, sizeof key);
  if (kv &&
      !(kv->type == MN_GGUF_STRING && kv->v.str.len == 4 && !memcmp(kv->v.str.ptr, "none", 4)))
    return mn_fail(MN_ERR_UNSUPPORTED, "%s: %s: \"%s\" is set; only plain RoPE is supported", r->fn,
                   r->path, key);
  int64_t dims = c->head_dim;
  TRY(int_key(r, "rope.dimension_count", c->head_dim, &dims));
  if (dims != c->head_dim)
    return mn_fail(MN_ERR_UNSUPPORTED,
                   "%s: %s: %s.rope.dimension_count %lld differs from head_dim %lld (partial "
                   "rotary embeddings are not supported)",
                   r->fn, r->path, r->arch, (long long)dims, (long long)c->head_dim);
  return MN_OK;
}

static mn_status read_llama(const reader *r, mn_model_config *c) {
  c->family = MN_MODEL_LLAMA;
  TRY(int_key(r, "embedding_length", -1, &c->hidden_size));
  TRY(int_key(r, "block_count", -1, &c->num_layers));
  TRY(int_key(r, "attention.head_count", -1, &c->num_heads));
  TRY(int_key(r, "attention.head_count_kv", c->num_heads, &c->num_kv_heads));
  TRY(int_key(r, "feed_forward_length", -1, &c->intermediate_size));
  TRY(int_key(r, "context_length", 2048, &c->max_positions));
  if (c->hidden_size % c->num_heads && !mn_gguf_find(r->g, "llama.attention.key_length"))
    return mn_fail(MN_ERR_FORMAT,
                   "%s: %s: embedding_length %lld is not a multiple of head_count %lld (and no "
                   "llama.attention.key_length is given)",
                   r->fn, r->path, (long long)c->hidden_size, (long long)c->num_heads);
  TRY(int_key(r, "attention.key_length", c->hidden_size / c->num_heads, &c->head_dim));
  int64_t value_dim = c->head_dim;
  TRY(int_key(r, "attention.value_length", c->head_dim, &value_dim));
  if (value_dim != c->head_dim)
    return mn_fail(MN_ERR_UNSUPPORTED, "%s: %s: value_length %lld differs from key_length %lld",
                   r->fn, r->path, (long long)value_dim, (long long)c->head_dim);
  TRY(float_key(r, "attention.layer_norm_rms_epsilon", -1, &c->norm_eps));
  TRY(float_key(r, "rope.freq_base", 10000.0, &c->rope_theta));
  return plain_rope(r, c);
}

static mn_status read_gpt2(const reader *r, mn_model_config *c) {
  c->family = MN_MODEL_GPT2;
  TRY(int_key(r, "embedding_length", -1, &c->hidden_size));
  TRY(int_key(r, "block_count", -1, &c->num_layers));
  TRY(int_key(r, "attention.head_count", -1, &c->num_heads));
  TRY(int_key(r, "context_length", -1, &c->max_positions));
  TRY(int_key(r, "feed_forward_length", 4 * c->hidden_size, &c->intermediate_size));
  TRY(float_key(r, "attention.layer_norm_epsilon", 1e-5, &c->norm_eps));
  if (c->hidden_size % c->num_heads)
    return mn_fail(MN_ERR_FORMAT,
                   "%s: %s: embedding_length %lld is not a multiple of head_count %lld", r->fn,
                   r->path, (long long)c->hidden_size, (long long)c->num_heads);
  c->num_kv_heads = c->num_heads;
  c->head_dim = c->hidden_size / c->num_heads;
  return MN_OK;
}

static mn_status read_config(const char *fn, const char *path, const mn_gguf *g,
                             mn_model_config *out) {
  mn_gguf_arch arch;
  TRY(mn_gguf_arch_of(fn, g, &arch));
  reader r = {fn, path, arch == MN_GGUF_ARCH_LLAMA ? "llama" : "gpt2", g};
  mn_model_config c;
  memset(&c, 0, sizeof c);
  c.initializer_range = 0.02f;
  TRY(arch == MN_GGUF_ARCH_LLAMA ? read_llama(&r, &c) : read_gpt2(&r, &c));
  TRY(vocab_size(&r, &c.vocab_size));
  c.tie_word_embeddings = mn_gguf_output_tied(g);
  if (mn_model_config_check(fn, &c) != MN_OK) {
    char inner[1024];
    snprintf(inner, sizeof inner, "%s", mn_last_error());
    return mn_fail(MN_ERR_FORMAT, "%s: %s: the metadata describe no valid model: %s", fn, path,
                   inner);
  }
  *out = c;
  return MN_OK;
}

mn_status mn_model_config_load_gguf(const char *fn, const char *path, mn_model_config *out) {
  mn_gguf *g = NULL;
  mn_status st = mn_gguf_open(path, &g);
  if (st != MN_OK) {
    char inner[1024];
    snprintf(inner, sizeof inner, "%s", mn_last_error());
    return mn_fail(st, "%s: %s", fn, inner);
  }
  st = read_config(fn, path, g, out);
  mn_gguf_close(g);
  return st;
}
