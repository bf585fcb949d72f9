/* The byte-level BPE tokenizer from a GGUF file's tokenizer.ggml.* keys, as llama.cpp's
 * converter writes them from a tokenizer.json: model "gpt2" (byte-level BPE), the token list
 * (ids are positions), token_type (CONTROL and USER_DEFINED tokens are the added tokens,
 * UNUSED ones are placeholders for ids the vocabulary lacks), merges "a b" in rank order, and
 * the pre-tokenizer by name. Each name maps to the steps its tokenizer.json has, so that ids
 * agree with HF tokenizers: "gpt2" is ByteLevel's own regex, "smollm" individual digits before
 * it, "llama-bpe" (and llama3, llama-v3) the Llama-3 split regex. Messages:
 * "mn_tokenizer_load: PATH: KEY: problem". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/error.h"
#include "io/gguf.h"
#include "io/tokenizer_internal.h"

#define FN "mn_tokenizer_load"

enum { TOKEN_UNUSED = 5, TOKEN_CONTROL = 3, TOKEN_USER_DEFINED = 4 };

static bool str_is(const mn_gguf_kv *kv, const char *s) {
  return kv->v.str.len == strlen(s) && memcmp(kv->v.str.ptr, s, kv->v.str.len) == 0;
}

static const mn_gguf_kv *string_key(const mn_gguf *g, const char *key, mn_status *st) {
  const mn_gguf_kv *kv = mn_gguf_find(g, key);
  *st = MN_OK;
  if (!kv || kv->type != MN_GGUF_STRING)
    *st = mn_fail(kv ? MN_ERR_FORMAT : MN_ERR_UNSUPPORTED, "%s: %s: %s is %s", FN, mn_gguf_label(g),
                  key, kv ? "not a string" : "missing (no byte-level BPE tokenizer in the file)");
  return kv;
}

static mn_status pre_tokenizer(mn_tokenizer *t, const mn_gguf *g) {
  mn_status st;
  const mn_gguf_kv *pre = string_key(g, "tokenizer.ggml.pre", &st);
  if (st != MN_OK) return st;
  t->use_regex = true;
  if (str_is(pre, "gpt2")) return MN_OK;
  if (str_is(pre, "smollm"))
    return mn_tok_add_splitter(
        t, (mn_tok_splitter){.pattern = MN_TOK_PAT_NUMERIC, .behavior = MN_TOK_ISOLATED});
  if (str_is(pre, "llama-bpe") || str_is(pre, "llama3") || str_is(pre, "llama-v3")) {
    t->use_regex = false;
    return mn_tok_add_splitter(t, (mn_tok_splitter){.pattern = MN_TOK_PAT_CL100K,
                                                    .behavior = MN_TOK_ISOLATED,
                                                    .max_digits = 3});
  }
  return mn_fail(MN_ERR_UNSUPPORTED,
                 "%s: %s: tokenizer.ggml.pre \"%.*s\" is not supported (supported: gpt2, smollm, "
                 "llama-bpe)",
                 FN, mn_gguf_label(g), (int)(pre->v.str.len > 64 ? 64 : pre->v.str.len),
                 pre->v.str.ptr);
}

static const mn_gguf_kv *array_key(const mn_gguf *g, const char *key, bool strings, mn_status *st) {
  const mn_gguf_kv *kv = mn_gguf_find(g, key);
  *st = MN_OK;
  if (!kv) return NULL;
  bool ok = kv->type == MN_GGUF_ARRAY &&
            (strings ? kv->v.arr.type == MN_GGUF_STRING : kv->v.arr.type != MN_GGUF_STRING);
  if (!ok)
    *st = mn_fail(MN_ERR_FORMAT, "%s: %s: %s is not an array of %s", FN, mn_gguf_label(g), key,
                  strings ? "strings" : "integers");
  return kv;
}

static mn_status vocabulary(mn_tokenizer *t, const mn_gguf *g) {
  mn_status st;
  const mn_gguf_kv *tokens = array_key(g, "tokenizer.ggml.tokens", true, &st);
  if (st == MN_OK && !tokens)
    st = mn_fail(MN_ERR_FORMAT, "%s: %s: tokenizer.ggml.tokens is missing", FN, mn_gguf_label(g));
  const mn_gguf_kv *types =
      st == MN_OK ? array_key(g, "tokenizer.ggml.token_type", false, &st) : NULL;
  if (st != MN_OK) return st;
  uint64_t n = tokens->v.arr.count;
  if (n > MN_TOK_MAX_ID)
    return mn_fail(MN_ERR_UNSUPPORTED, "%s: %s: tokenizer.ggml.tokens has %llu tokens (at most %u)",
                   FN, mn_gguf_label(g), (unsigned long long)n, MN_TOK_MAX_ID);
  if (types && types->v.arr.count != n)
    return mn_fail(MN_ERR_FORMAT,
                   "%s: %s: tokenizer.ggml.token_type has %llu entries for %llu tokens", FN,
                   mn_gguf_label(g), (unsigned long long)types->v.arr.count, (unsigned long long)n);
  size_t added = 0;
  for (uint64_t i = 0; i < n && types; i++) {
    int64_t ty = 0;
    mn_gguf_array_int(g, types, i, &ty);
    added += ty == TOKEN_CONTROL || ty == TOKEN_USER_DEFINED;
  }
  for (uint64_t i = 0; i < n; i++) {
    const char *s;
    uint64_t len;
    int64_t ty = 1;
    mn_gguf_array_string(g, tokens, i, &s, &len);
    if (types) mn_gguf_array_int(g, types, i, &ty);
    if (ty == TOKEN_UNUSED) continue;
    if (!mn_tok_add_token(t, s, len, (uint32_t)i)) goto oom;
    if (ty != TOKEN_CONTROL && ty != TOKEN_USER_DEFINED) continue;
    /* HF's AddedToken default: special tokens match the raw text, others the normalized */
    mn_tok_added a = {
        .id = (uint32_t)i, .special = ty == TOKEN_CONTROL, .normalized = ty != TOKEN_CONTROL};
    if (!mn_tok_add_added(t, &a, s, len, added)) goto oom;
  }
  mn_tok_set_byte_tokens(t);
  return MN_OK;
oom:
  return mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: %s: out of memory", FN, mn_gguf_label(g));
}

static mn_status merges(mn_tokenizer *t, const mn_gguf *g) {
  mn_status st;
  const mn_gguf_kv *m = array_key(g, "tokenizer.ggml.merges", true, &st);
  if (st != MN_OK || !m) return st;
  mn_tok_pool scratch = {0};
  for (uint64_t i = 0; i < m->v.arr.count && st == MN_OK; i++) {
    const char *s;
    uint64_t len;
    mn_gguf_array_string(g, m, i, &s, &len);
    const char *sp = memchr(s, ' ', len);
    if (!sp || memchr(sp + 1, ' ', len - (uint64_t)(sp - s) - 1)) {
      st = mn_fail(MN_ERR_FORMAT,
                   "%s: %s: tokenizer.ggml.merges[%llu]: '%.*s' is not two tokens "
                   "split by a space",
                   FN, mn_gguf_label(g), (unsigned long long)i, (int)(len > 64 ? 64 : len), s);
      break;
    }
    size_t an = (size_t)(sp - s);
    st = mn_tok_add_merge(t, &scratch, "tokenizer.ggml.merges", "tokenizer.ggml.tokens", i, s, an,
                          sp + 1, len - an - 1);
  }
  free(scratch.data);
  return st;
}

static mn_status build(mn_tokenizer *t, const mn_gguf *g) {
  mn_status st;
  const mn_gguf_kv *model = string_key(g, "tokenizer.ggml.model", &st);
  if (st != MN_OK) return st;
  if (!str_is(model, "gpt2"))
    return mn_fail(MN_ERR_UNSUPPORTED,
                   "%s: %s: tokenizer.ggml.model \"%.*s\" is not supported (only \"gpt2\", "
                   "byte-level BPE)",
                   FN, mn_gguf_label(g), (int)(model->v.str.len > 64 ? 64 : model->v.str.len),
                   model->v.str.ptr);
  if ((st = pre_tokenizer(t, g)) != MN_OK || (st = vocabulary(t, g)) != MN_OK ||
      (st = merges(t, g)) != MN_OK)
    return st;
  return mn_tok_finish(t);
}

mn_status mn_tok_load_gguf(const char *path, mn_tokenizer **out) {
  mn_gguf *g = NULL;
  mn_status st = mn_gguf_open(path, &g);
  if (st != MN_OK) {
    char inner[1024];
    snprintf(inner, sizeof inner, "%s", mn_last_error());
    return mn_fail(st, "%s: %s", FN, inner);
  }
  mn_tokenizer *t = mn_tok_new(path);
  st = t ? build(t, g) : MN_ERR_OUT_OF_MEMORY;
  mn_gguf_close(g);
  if (st != MN_OK) {
    mn_tokenizer_free(t);
    return st;
  }
  *out = t;
  return MN_OK;
}
