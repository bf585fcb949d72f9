/* The tokenizer's public functions (include/meganeura.h): loading a tokenizer.json or a GGUF,
 * encoding, lookups and freeing. The parts are described in io/tokenizer_internal.h. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/error.h"
#include "io/gguf.h"
#include "io/tokenizer_internal.h"

void mn_tokenizer_free(mn_tokenizer *t) {
  if (!t) return;
  free(t->label);
  free(t->pool.data);
  free(t->decoded.data);
  mn_tok_strmap_free(&t->vocab);
  mn_tok_strmap_free(&t->added_by_content);
  mn_tok_pairmap_free(&t->merges);
  free(t->added);
  free(t->passes[0].order);
  free(t->passes[1].order);
  free(t->splitters);
  free(t->id_token);
  free(t->id_bytes);
  free(t);
}

/* The whole file, NUL-terminated. */
static mn_status read_file(const char *path, char **data, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return mn_fail(MN_ERR_IO, "mn_tokenizer_load: %s: cannot open: %s", path, strerror(errno));
  char *buf = NULL;
  size_t n = 0, cap = 0;
  for (;;) {
    if (n + 65536 + 1 > cap) {
      cap = cap ? 2 * cap : 1 << 20;
      char *b = realloc(buf, cap);
      if (!b) {
        free(buf);
        fclose(f);
        return mn_fail(MN_ERR_OUT_OF_MEMORY, "mn_tokenizer_load: %s: out of memory", path);
      }
      buf = b;
    }
    size_t got = fread(buf + n, 1, cap - n - 1, f);
    n += got;
    if (got == 0) break;
  }
  int err = ferror(f) ? errno : 0;
  fclose(f);
  if (err) {
    free(buf);
    return mn_fail(MN_ERR_IO, "mn_tokenizer_load: %s: read failed: %s", path, strerror(err));
  }
  buf[n] = '\0';
  *data = buf;
  *len = n;
  return MN_OK;
}

mn_status mn_tok_parse(const char *json, size_t len, const char *label, mn_tokenizer **out) {
  *out = NULL;
  mn_tokenizer *t = mn_tok_new(label);
  if (!t) return MN_ERR_OUT_OF_MEMORY;
  mn_status st = mn_tok_load_json(t, json, len);
  if (st == MN_OK) st = mn_tok_finish(t);
  if (st != MN_OK) {
    mn_tokenizer_free(t);
    return st;
  }
  *out = t;
  return MN_OK;
}

mn_status mn_tokenizer_load(const char *path, mn_tokenizer **out) {
  if (!path || !out)
    return mn_fail(MN_ERR_INVALID_ARGUMENT, "mn_tokenizer_load: path %s, out %s: NULL",
                   path ? "set" : "NULL", out ? "set" : "NULL");
  *out = NULL;
  if (mn_gguf_is_gguf(path)) return mn_tok_load_gguf(path, out);
  char *json = NULL;
  size_t len = 0;
  mn_status st = read_file(path, &json, &len);
  if (st != MN_OK) return st;
  st = mn_tok_parse(json, len, path, out);
  free(json);
  return st;
}

size_t mn_tokenizer_vocab_size(const mn_tokenizer *t) { return t ? t->num_ids : 0; }

mn_status mn_tokenizer_encode(const mn_tokenizer *t, const char *text, size_t len, uint32_t *ids,
                              size_t cap, size_t *n_out) {
  if (!t || !n_out || (len && !text) || (cap && !ids))
    return mn_fail(MN_ERR_INVALID_ARGUMENT,
                   "mn_tokenizer_encode: tokenizer %s, text %s (len %zu), ids %s (cap %zu), n_out "
                   "%s: NULL where a pointer is needed",
                   t ? "set" : "NULL", text ? "set" : "NULL", len, ids ? "set" : "NULL", cap,
                   n_out ? "set" : "NULL");
  *n_out = 0;
  mn_tok_ids got = {0};
  mn_status st = mn_tok_encode_text(t, (const unsigned char *)text, len, &got);
  if (st == MN_ERR_OUT_OF_MEMORY)
    mn_fail(st, "mn_tokenizer_encode: %s: out of memory (text of %zu bytes)", t->label, len);
  if (st == MN_OK) {
    *n_out = got.n;
    if (ids && cap && got.n) memcpy(ids, got.v, (got.n < cap ? got.n : cap) * sizeof *ids);
    if (got.n > cap && ids)
      st = mn_fail(MN_ERR_INVALID_ARGUMENT,
                   "mn_tokenizer_encode: %s: the text has %zu tokens, cap is %zu", t->label, got.n,
                   cap);
  }
  free(got.v);
  return st;
}

int64_t mn_tokenizer_token_id(const mn_tokenizer *t, const char *token) {
  if (!t || !token) return -1;
  uint32_t id;
  size_t n = strlen(token);
  if (mn_tok_strmap_get(&t->added_by_content, token, n, &id) ||
      mn_tok_strmap_get(&t->vocab, token, n, &id))
    return id;
  return -1;
}

const char *mn_tokenizer_token(const mn_tokenizer *t, uint32_t id) {
  if (!t || id >= t->num_ids || t->id_token[id].off == MN_TOK_NONE) return NULL;
  return t->pool.data + t->id_token[id].off;
}
