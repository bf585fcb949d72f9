/* The split patterns, matched by hand over UTF-8 instead of by a regex engine. Each matcher
 * tries the alternatives of its regex in order at one position, with the backtracking the
 * regex would do, so its matches are those of Oniguruma's leftmost-first search (what the HF
 * tokenizers library runs):
 *
 *   GPT-2:   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *   cl100k:  (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
 *            ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+        (Llama-3; Qwen2 has \p{N})
 *
 * Bytes that are not valid UTF-8 count as characters that are neither letters, numbers nor
 * space (the library takes only valid UTF-8 strings, so it never sees them). */
#include <string.h>

#include "io/tokenizer_internal.h"
#include "io/tokenizer_unicode.h"

typedef struct cursor {
  const unsigned char *s;
  size_t n;
} cursor;

enum { C_LETTER = 1, C_NUMBER = 2, C_SPACE = 4, C_NEWLINE = 8 };

static unsigned classify(uint32_t cp) {
  if (cp == MN_UTF8_INVALID) return 0;
  if (cp == '\r' || cp == '\n') return C_SPACE | C_NEWLINE;
  if (mn_unicode_is_space(cp)) return C_SPACE;
  if (mn_unicode_is_letter(cp)) return C_LETTER;
  if (mn_unicode_is_number(cp)) return C_NUMBER;
  return 0;
}

/* The class of the character at i, its code point and where the next one starts; class 0 and
 * *next == i at the end. */
static unsigned at(const cursor *c, size_t i, uint32_t *cp, size_t *next) {
  if (i >= c->n) {
    *cp = MN_UTF8_INVALID;
    *next = i;
    return 0;
  }
  *next = i + mn_utf8_next(c->s, c->n, i, cp);
  return classify(*cp);
}

static bool is_other(unsigned cls) { return (cls & (C_LETTER | C_NUMBER | C_SPACE)) == 0; }

/* End of the run of characters from i whose class has any bit of `mask` (or, with mask 0, that
 * are "other"), taking at most max characters. */
static size_t run(const cursor *c, size_t i, unsigned mask, size_t max) {
  size_t count = 0;
  while (i < c->n && count < max) {
    uint32_t cp;
    size_t next;
    unsigned cls = at(c, i, &cp, &next);
    if (mask ? !(cls & mask) : !is_other(cls)) break;
    i = next;
    count++;
  }
  return i;
}

/* \s+(?!\S)|\s+ at i (a space character): the run, less its last character when a non-space
 * follows and the run has two or more characters. */
static size_t space_run(const cursor *c, size_t i) {
  size_t last = i, k = i;
  while (k < c->n) {
    uint32_t cp;
    size_t next;
    if (!(at(c, k, &cp, &next) & C_SPACE)) break;
    last = k;
    k = next;
  }
  if (k == c->n || last == i) return k;
  return last;
}

/* 's|'t|'re|'ve|'m|'ll|'d at i, case-insensitively when `fold` (then 's' also matches U+017F,
 * LATIN SMALL LETTER LONG S, which Unicode case folding maps to 's'). Returns the end, or i. */
static size_t contraction(const cursor *c, size_t i, bool fold) {
  if (c->s[i] != '\'' || i + 1 >= c->n) return i;
  uint32_t a, b;
  size_t an, bn;
  at(c, i + 1, &a, &an);
  at(c, an, &b, &bn);
  if (fold) {
    if (a == 0x17F) a = 's';
    if (a < 0x80) a |= 0x20;
    if (b < 0x80) b |= 0x20;
  }
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return an;
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return bn;
  return i;
}

static size_t match_gpt2(const cursor *c, size_t i) {
  size_t end = contraction(c, i, false);
  if (end > i) return end;
  uint32_t cp, cp1;
  size_t next, next1;
  unsigned cls = at(c, i, &cp, &next);
  unsigned cls1 = at(c, next, &cp1, &next1);
  /* ` ?X+`: the optional space is taken first; without it, X must match at i */
  if (cp == ' ' && (cls1 & C_LETTER)) return run(c, next, C_LETTER, SIZE_MAX);
  if (cls & C_LETTER) return run(c, i, C_LETTER, SIZE_MAX);
  if (cp == ' ' && (cls1 & C_NUMBER)) return run(c, next, C_NUMBER, SIZE_MAX);
  if (cls & C_NUMBER) return run(c, i, C_NUMBER, SIZE_MAX);
  if (cp == ' ' && is_other(cls1) && next1 > next) return run(c, next, 0, SIZE_MAX);
  if (is_other(cls)) return run(c, i, 0, SIZE_MAX);
  return space_run(c, i);
}

static size_t match_cl100k(const cursor *c, size_t i, int max_digits) {
  size_t end = contraction(c, i, true);
  if (end > i) return end;
  uint32_t cp, cp1;
  size_t next, next1;
  unsigned cls = at(c, i, &cp, &next);
  unsigned cls1 = at(c, next, &cp1, &next1);
  /* [^\r\n\p{L}\p{N}]?\p{L}+ */
  if (!(cls & (C_NEWLINE | C_LETTER | C_NUMBER)) && (cls1 & C_LETTER))
    return run(c, next, C_LETTER, SIZE_MAX);
  if (cls & C_LETTER) return run(c, i, C_LETTER, SIZE_MAX);
  /* \p{N}{1,max} */
  if (cls & C_NUMBER) return run(c, i, C_NUMBER, (size_t)max_digits);
  /*  ?[^\s\p{L}\p{N}]+[\r\n]* */
  size_t from = i;
  if (cp == ' ' && is_other(cls1) && next1 > next)
    from = next;
  else if (!is_other(cls))
    from = SIZE_MAX;
  if (from != SIZE_MAX) return run(c, run(c, from, 0, SIZE_MAX), C_NEWLINE, SIZE_MAX);
  /* \s*[\r\n]+: the space run up to its last line break, if it has one */
  size_t k = i, after_newline = i;
  while (k < c->n) {
    unsigned kc = at(c, k, &cp, &next);
    if (!(kc & C_SPACE)) break;
    k = next;
    if (kc & C_NEWLINE) after_newline = k;
  }
  if (after_newline > i) return after_newline;
  return space_run(c, i);
}

/* The next start at or after `from` where the literal occurs. */
static bool find_literal(const unsigned char *s, size_t n, size_t from, const unsigned char *lit,
                         size_t len, size_t *ms) {
  if (len == 0 || len > n) return false;
  for (size_t i = from; i + len <= n; i++) {
    const unsigned char *hit = memchr(s + i, lit[0], n - len + 1 - i);
    if (!hit) return false;
    i = (size_t)(hit - s);
    if (memcmp(hit, lit, len) == 0) {
      *ms = i;
      return true;
    }
  }
  return false;
}

bool mn_tok_find(const mn_tokenizer *t, const mn_tok_splitter *sp, const unsigned char *s, size_t n,
                 size_t from, size_t *ms, size_t *me) {
  if (from >= n) return false;
  cursor c = {s, n};
  switch (sp->pattern) {
  case MN_TOK_PAT_LITERAL:
    if (!find_literal(s, n, from, (const unsigned char *)t->pool.data + sp->text.off, sp->text.len,
                      ms))
      return false;
    *me = *ms + sp->text.len;
    return true;
  case MN_TOK_PAT_NUMBER:
  case MN_TOK_PAT_NUMERIC:
    /* Split \p{N} classifies with the regex engine's tables, Digits with Rust's
     * char::is_numeric, which can know more characters */
    for (size_t i = from; i < n;) {
      uint32_t cp;
      size_t next;
      unsigned cls = at(&c, i, &cp, &next);
      if (sp->pattern == MN_TOK_PAT_NUMERIC ? mn_unicode_is_numeric(cp) : (cls & C_NUMBER) != 0) {
        *ms = i;
        *me = next;
        return true;
      }
      i = next;
    }
    return false;
  case MN_TOK_PAT_GPT2:
    /* every character starts a match of these two patterns, so the leftmost one is at `from` */
    *ms = from;
    *me = match_gpt2(&c, from);
    return true;
  case MN_TOK_PAT_CL100K:
    *ms = from;
    *me = match_cl100k(&c, from, sp->max_digits);
    return true;
  }
  return false;
}
