/* The steps that fill a struct mn_tokenizer, whatever file it comes from: tokenizer.json
 * (tokenizer_load.c) and a GGUF's tokenizer.ggml.* keys (tokenizer_gguf.c) both build through
 * these, so the two give the same tokenizer for the same vocabulary. */
#include <stdlib.h>
#include <string.h>

#include "host/error.h"
#include "io/tokenizer_internal.h"
#include "io/tokenizer_unicode.h"

static void note_id(mn_tokenizer *t, uint32_t id) {
  if (id >= t->num_ids) t->num_ids = id + 1;
}

bool mn_tok_add_token(mn_tokenizer *t, const char *s, size_t n, uint32_t id) {
  t->vocab.pool = &t->pool;
  mn_tok_span k = mn_tok_pool_add(&t->pool, s, n);
  if (k.off == MN_TOK_NONE || !mn_tok_strmap_put(&t->vocab, k, id)) return false;
  note_id(t, id);
  return true;
}

static mn_status merge_part(const mn_tokenizer *t, const char *what, const char *vocab, size_t i,
                            const char *s, size_t n, uint32_t *id) {
  if (mn_tok_strmap_get(&t->vocab, s, n, id)) return MN_OK;
  return mn_fail(MN_ERR_FORMAT, "mn_tokenizer_load: %s: %s[%zu]: '%.*s' is not in %s", t->label,
                 what, i, (int)n, s, vocab);
}

mn_status mn_tok_add_merge(mn_tokenizer *t, mn_tok_pool *scratch, const char *what,
                           const char *vocab, size_t i, const char *a, size_t an, const char *b,
                           size_t bn) {
  uint32_t ia, ib, iab;
  mn_status st;
  if ((st = merge_part(t, what, vocab, i, a, an, &ia)) != MN_OK ||
      (st = merge_part(t, what, vocab, i, b, bn, &ib)) != MN_OK)
    return st;
  scratch->len = 0;
  mn_tok_span ja = mn_tok_pool_add(scratch, a, an);
  if (ja.off == MN_TOK_NONE) goto oom;
  scratch->len--; /* over the NUL, so that b follows a */
  if (mn_tok_pool_add(scratch, b, bn).off == MN_TOK_NONE) goto oom;
  if ((st = merge_part(t, what, vocab, i, scratch->data, an + bn, &iab)) != MN_OK) return st;
  if (i < UINT32_MAX && mn_tok_pairmap_put(&t->merges, ia, ib, (uint32_t)i, iab)) return MN_OK;
oom:
  return mn_fail(MN_ERR_OUT_OF_MEMORY, "mn_tokenizer_load: %s: out of memory", t->label);
}

void mn_tok_set_byte_tokens(mn_tokenizer *t) {
  for (int b = 0; b < 256; b++) {
    unsigned char ch[4];
    size_t n = mn_utf8_put(mn_tok_byte_char((unsigned char)b), ch);
    if (!mn_tok_strmap_get(&t->vocab, ch, n, &t->byte_token[b])) t->byte_token[b] = MN_TOK_NONE;
  }
}

bool mn_tok_add_added(mn_tokenizer *t, const mn_tok_added *a, const char *content, size_t n,
                      size_t cap) {
  if (!t->added && !(t->added = calloc(cap ? cap : 1, sizeof *t->added))) return false;
  t->added_by_content.pool = &t->pool;
  mn_tok_added *dst = &t->added[t->num_added];
  *dst = *a;
  dst->content = mn_tok_pool_add(&t->pool, content, n);
  if (dst->content.off == MN_TOK_NONE ||
      !mn_tok_strmap_put(&t->added_by_content, dst->content, a->id))
    return false;
  note_id(t, a->id);
  t->num_added++;
  return true;
}

mn_status mn_tok_add_splitter(mn_tokenizer *t, mn_tok_splitter sp) {
  mn_tok_splitter *v = realloc(t->splitters, (t->num_splitters + 1) * sizeof *v);
  if (!v) return mn_fail(MN_ERR_OUT_OF_MEMORY, "mn_tokenizer_load: %s: out of memory", t->label);
  t->splitters = v;
  v[t->num_splitters++] = sp;
  return MN_OK;
}

mn_status mn_tok_finish(mn_tokenizer *t) {
  if (mn_tok_build_added_sets(t) && mn_tok_build_id_tables(t)) return MN_OK;
  return mn_fail(MN_ERR_OUT_OF_MEMORY, "mn_tokenizer_load: %s: out of memory", t->label);
}

mn_tokenizer *mn_tok_new(const char *label) {
  mn_tokenizer *t = calloc(1, sizeof *t);
  if (!t || !(t->label = strdup(label))) {
    free(t);
    mn_fail(MN_ERR_OUT_OF_MEMORY, "mn_tokenizer_load: %s: out of memory", label);
    return NULL;
  }
  t->unk_id = MN_TOK_NONE;
  return t;
}
