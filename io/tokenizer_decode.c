/* From ids back to bytes: the ByteLevel decoder. Every token's characters are mapped back to
 * the bytes GPT-2's byte map gave them; a token with a character outside that map (an added
 * token such as "<|im_start|>" is fine, one with CJK text is not) stands for its own UTF-8
 * bytes instead, as in the library. The bytes of every id are computed once at load. Unlike the
 * library, which replaces invalid UTF-8 in the result with U+FFFD, decode returns the bytes as
 * they are, so decode(encode(x)) == x for any bytes x. */
#include <stdlib.h>
#include <string.h>

#include "host/error.h"
#include "io/tokenizer_internal.h"
#include "io/tokenizer_unicode.h"

#define MAX_MAPPED_CHAR 0x144 /* one past the last character of the byte map, U+0143 */

bool mn_tok_build_id_tables(mn_tokenizer *t) {
  size_t n = t->num_ids;
  t->id_token = malloc((n ? n : 1) * sizeof *t->id_token);
  t->id_bytes = malloc((n ? n : 1) * sizeof *t->id_bytes);
  if (!t->id_token || !t->id_bytes) return false;
  for (size_t i = 0; i < n; i++)
    t->id_token[i] = t->id_bytes[i] = (mn_tok_span){MN_TOK_NONE, 0};
  for (size_t i = 0; i < t->vocab.cap; i++)
    if (t->vocab.keys[i].off != MN_TOK_NONE) t->id_token[t->vocab.values[i]] = t->vocab.keys[i];
  /* the library looks an id up among the added tokens first */
  for (size_t i = 0; i < t->num_added; i++)
    t->id_token[t->added[i].id] = t->added[i].content;

  int byte_of[MAX_MAPPED_CHAR];
  for (int c = 0; c < MAX_MAPPED_CHAR; c++)
    byte_of[c] = -1;
  for (int b = 0; b < 256; b++)
    byte_of[mn_tok_byte_char((unsigned char)b)] = b;

  unsigned char *bytes = NULL;
  size_t cap = 0;
  bool ok = true;
  for (size_t id = 0; id < n && ok; id++) {
    mn_tok_span tok = t->id_token[id];
    if (tok.off == MN_TOK_NONE) continue;
    const unsigned char *s = (const unsigned char *)t->pool.data + tok.off;
    if (tok.len > cap) {
      unsigned char *b = realloc(bytes, tok.len);
      if (!b) {
        ok = false;
        break;
      }
      bytes = b;
      cap = tok.len;
    }
    size_t len = 0;
    for (size_t i = 0; i < tok.len;) {
      uint32_t cp;
      i += mn_utf8_next(s, tok.len, i, &cp);
      if (cp >= MAX_MAPPED_CHAR || byte_of[cp] < 0) {
        len = SIZE_MAX; /* not a byte-level token: its own bytes */
        break;
      }
      bytes[len++] = (unsigned char)byte_of[cp];
    }
    t->id_bytes[id] = len == SIZE_MAX ? mn_tok_pool_add(&t->decoded, s, tok.len)
                                      : mn_tok_pool_add(&t->decoded, bytes, len);
    ok = t->id_bytes[id].off != MN_TOK_NONE;
  }
  free(bytes);
  return ok;
}

mn_status mn_tokenizer_decode(const mn_tokenizer *t, const uint32_t *ids, size_t n, char *out,
                              size_t cap, size_t *len_out) {
  if (!t || !len_out || (n && !ids) || (cap && !out))
    return mn_fail(MN_ERR_INVALID_ARGUMENT,
                   "mn_tokenizer_decode: tokenizer %s, ids %s (n %zu), out %s (cap %zu), len_out "
                   "%s: NULL where a pointer is needed",
                   t ? "set" : "NULL", ids ? "set" : "NULL", n, out ? "set" : "NULL", cap,
                   len_out ? "set" : "NULL");
  size_t total = 0;
  for (size_t i = 0; i < n; i++) {
    if (ids[i] >= t->num_ids || t->id_bytes[ids[i]].off == MN_TOK_NONE) {
      *len_out = 0;
      return mn_fail(MN_ERR_INVALID_ARGUMENT,
                     "mn_tokenizer_decode: %s: ids[%zu] = %u is not a token (vocabulary size %u)",
                     t->label, i, ids[i], t->num_ids);
    }
    total += t->id_bytes[ids[i]].len;
  }
  *len_out = total;
  if (!out) return MN_OK; /* the size query: out NULL, cap 0 */
  size_t room = cap - 1, done = 0;
  for (size_t i = 0; i < n && done < room; i++) {
    mn_tok_span b = t->id_bytes[ids[i]];
    size_t k = b.len < room - done ? b.len : room - done;
    memcpy(out + done, t->decoded.data + b.off, k);
    done += k;
  }
  out[done] = '\0';
  if (total + 1 > cap)
    return mn_fail(MN_ERR_INVALID_ARGUMENT,
                   "mn_tokenizer_decode: %s: the text needs %zu bytes and a NUL, cap is %zu",
                   t->label, total, cap);
  return MN_OK;
}
