/* From text to pre-token words, as the HF library's PreTokenizedString does it: the text is cut
 * into pieces, each either an added token (its id is known) or text still to split. Added tokens
 * are found first (non-normalized ones, then normalized ones in what is left: without a
 * normalizer both match the raw text, but the two passes still decide overlaps), then each
 * Split/Digits step cuts the text pieces further, and the ByteLevel step last splits them with
 * the GPT-2 regex (use_regex) and hands every word to BPE. Empty pieces are dropped after every
 * step, as the library does. */
#include <stdlib.h>
#include <string.h>

#include "io/tokenizer_internal.h"
#include "io/tokenizer_unicode.h"

typedef struct piece {
  size_t start, end;
  uint32_t id; /* an added token's id, or MN_TOK_NONE for text */
} piece;

typedef struct pieces {
  piece *v;
  size_t n, cap;
} pieces;

static bool push(pieces *p, size_t start, size_t end, uint32_t id) {
  if (p->n == p->cap) {
    size_t cap = p->cap ? 2 * p->cap : 16;
    piece *v = realloc(p->v, cap * sizeof *v);
    if (!v) return false;
    p->v = v;
    p->cap = cap;
  }
  p->v[p->n++] = (piece){start, end, id};
  return true;
}

bool mn_tok_ids_push(mn_tok_ids *ids, uint32_t id) {
  if (ids->n == ids->cap) {
    size_t cap = ids->cap ? 2 * ids->cap : 64;
    uint32_t *v = realloc(ids->v, cap * sizeof *v);
    if (!v) return false;
    ids->v = v;
    ids->cap = cap;
  }
  ids->v[ids->n++] = id;
  return true;
}

/* ---------------------------------------------------------------- added tokens */

/* Start of the White_Space run that ends s[0, end) (Rust's \s*$). */
static size_t trailing_space_start(const unsigned char *s, size_t end) {
  while (end > 0) {
    size_t j = end - 1;
    while (j > 0 && end - j < 4 && (s[j] & 0xC0) == 0x80)
      j--;
    uint32_t cp;
    if (mn_utf8_next(s, end, j, &cp) != end - j || !mn_unicode_is_space(cp)) break;
    end = j;
  }
  return end;
}

/* Length of the White_Space run that starts s[0, n) (Rust's ^\s*). */
static size_t leading_space_len(const unsigned char *s, size_t n) {
  size_t i = 0;
  while (i < n) {
    uint32_t cp;
    size_t len = mn_utf8_next(s, n, i, &cp);
    if (!mn_unicode_is_space(cp)) break;
    i += len;
  }
  return i;
}

/* Leftmost-longest search (the library's Aho-Corasick automaton) for the tokens of one pass in
 * s[from, n): the index into added[] of the match, or MN_TOK_NONE. */
static uint32_t find_added(const mn_tokenizer *t, const mn_tok_added_set *set,
                           const unsigned char *s, size_t n, size_t from, size_t *at) {
  for (size_t i = from; i < n; i++) {
    uint32_t lo = set->first[s[i]], hi = set->first[s[i] + 1];
    for (uint32_t k = lo; k < hi; k++) { /* longest first */
      const mn_tok_added *a = &t->added[set->order[k]];
      if (a->content.len <= n - i &&
          memcmp(s + i, t->pool.data + a->content.off, a->content.len) == 0) {
        *at = i;
        return set->order[k];
      }
    }
  }
  return MN_TOK_NONE;
}

/* One pass of AddedVocabulary::find_matches over the text pieces of `in`. */
static bool split_added(const mn_tokenizer *t, const mn_tok_added_set *set,
                        const unsigned char *text, const pieces *in, pieces *out) {
  out->n = 0;
  for (size_t p = 0; p < in->n; p++) {
    piece pc = in->v[p];
    if (pc.id != MN_TOK_NONE) {
      if (!push(out, pc.start, pc.end, pc.id)) return false;
      continue;
    }
    const unsigned char *s = text + pc.start;
    size_t n = pc.end - pc.start, done = 0, from = 0, ms;
    uint32_t k;
    while ((k = find_added(t, set, s, n, from, &ms)) != MN_TOK_NONE) {
      const mn_tok_added *a = &t->added[k];
      size_t me = ms + a->content.len, start = ms, stop = me;
      if (a->lstrip) {
        start = trailing_space_start(s, ms);
        if (start < done) start = done;
      }
      if (a->rstrip) stop += leading_space_len(s + me, n - me);
      if (done < start && !push(out, pc.start + done, pc.start + start, MN_TOK_NONE)) return false;
      if (!push(out, pc.start + start, pc.start + stop, a->id)) return false;
      done = stop;
      from = me; /* the automaton goes on after the match itself, as the library's does */
    }
    if (done < n && !push(out, pc.start + done, pc.end, MN_TOK_NONE)) return false;
  }
  return true;
}

/* ---------------------------------------------------------------- Split and Digits */

typedef struct span_flag {
  size_t start, end;
  bool match;
} span_flag;

/* NormalizedString::split of one text piece: the pattern's matches and the gaps between them,
 * then combined by the behavior. */
static bool split_piece(const mn_tokenizer *t, const mn_tok_splitter *sp, const unsigned char *text,
                        piece pc, span_flag **tmp, size_t *tmp_cap, pieces *out) {
  const unsigned char *s = text + pc.start;
  size_t n = pc.end - pc.start, count = 0, prev = 0, ms, me;
  /* at most one gap and one match per character, and a last gap */
  if (2 * n + 1 > *tmp_cap) {
    span_flag *v = realloc(*tmp, (2 * n + 1) * sizeof *v);
    if (!v) return false;
    *tmp = v;
    *tmp_cap = 2 * n + 1;
  }
  span_flag *m = *tmp;
  for (size_t from = 0; mn_tok_find(t, sp, s, n, from, &ms, &me) && me > ms; from = me) {
    if (prev != ms) m[count++] = (span_flag){prev, ms, false};
    m[count++] = (span_flag){ms, me, true};
    prev = me;
  }
  if (prev != n) m[count++] = (span_flag){prev, n, false};
  if (sp->invert)
    for (size_t i = 0; i < count; i++)
      m[i].match = !m[i].match;

  /* fold in place: w counts the kept spans */
  size_t w = 0;
  bool prev_match = false;
  switch (sp->behavior) {
  case MN_TOK_ISOLATED: w = count; break;
  case MN_TOK_REMOVED:
    for (size_t i = 0; i < count; i++)
      if (!m[i].match) m[w++] = m[i];
    break;
  case MN_TOK_CONTIGUOUS:
  case MN_TOK_MERGED_WITH_PREVIOUS:
    for (size_t i = 0; i < count; i++) {
      bool join =
          sp->behavior == MN_TOK_CONTIGUOUS ? m[i].match == prev_match : m[i].match && !prev_match;
      prev_match = m[i].match;
      if (join && w > 0)
        m[w - 1].end = m[i].end;
      else
        m[w++] = m[i];
    }
    break;
  case MN_TOK_MERGED_WITH_NEXT:
    /* the same walk from the end, keeping the kept spans at the end of the array */
    w = count;
    for (size_t i = count; i-- > 0;) {
      bool join = m[i].match && !prev_match;
      prev_match = m[i].match;
      if (join && w < count)
        m[w].start = m[i].start;
      else
        m[--w] = m[i];
    }
    memmove(m, m + w, (count - w) * sizeof *m);
    w = count - w;
    break;
  }
  for (size_t i = 0; i < w; i++)
    if (m[i].end > m[i].start &&
        !push(out, pc.start + m[i].start, pc.start + m[i].end, MN_TOK_NONE))
      return false;
  return true;
}

/* ---------------------------------------------------------------- the whole pipeline */

static const mn_tok_splitter gpt2_regex = {MN_TOK_PAT_GPT2, MN_TOK_ISOLATED, false, 0, {0, 0}};

/* The ByteLevel step on one text piece: the prefix space, then the GPT-2 regex. */
static mn_status byte_level(const mn_tokenizer *t, const unsigned char *s, size_t n,
                            unsigned char **buf, size_t *buf_cap, mn_tok_word_fn fn, void *ctx) {
  if (t->prefix_space && n > 0 && s[0] != ' ') {
    if (n + 1 > *buf_cap) {
      unsigned char *b = realloc(*buf, n + 1);
      if (!b) return MN_ERR_OUT_OF_MEMORY;
      *buf = b;
      *buf_cap = n + 1;
    }
    (*buf)[0] = ' ';
    memcpy(*buf + 1, s, n);
    s = *buf;
    n++;
  }
  if (!t->use_regex) return fn(ctx, s, n, MN_TOK_NONE);
  size_t prev = 0, ms, me;
  for (size_t from = 0; mn_tok_find(t, &gpt2_regex, s, n, from, &ms, &me) && me > ms; from = me) {
    mn_status st = MN_OK;
    if (prev != ms) st = fn(ctx, s + prev, ms - prev, MN_TOK_NONE);
    if (st == MN_OK) st = fn(ctx, s + ms, me - ms, MN_TOK_NONE);
    if (st != MN_OK) return st;
    prev = me;
  }
  return prev != n ? fn(ctx, s + prev, n - prev, MN_TOK_NONE) : MN_OK;
}

mn_status mn_tok_pretokenize(const mn_tokenizer *t, const unsigned char *text, size_t n,
                             mn_tok_word_fn fn, void *ctx) {
  pieces a = {0}, b = {0};
  span_flag *tmp = NULL;
  size_t tmp_cap = 0, buf_cap = 0;
  unsigned char *buf = NULL;
  mn_status st = MN_ERR_OUT_OF_MEMORY;
  if (n > 0 && !push(&a, 0, n, MN_TOK_NONE)) goto done;
  for (int pass = 0; pass < 2; pass++) {
    if (t->passes[pass].first[256] == 0) continue;
    if (!split_added(t, &t->passes[pass], text, &a, &b)) goto done;
    pieces swap = a;
    a = b;
    b = swap;
  }
  for (size_t k = 0; k < t->num_splitters; k++) {
    b.n = 0;
    for (size_t p = 0; p < a.n; p++) {
      bool ok = a.v[p].id != MN_TOK_NONE
                    ? push(&b, a.v[p].start, a.v[p].end, a.v[p].id)
                    : split_piece(t, &t->splitters[k], text, a.v[p], &tmp, &tmp_cap, &b);
      if (!ok) goto done;
    }
    pieces swap = a;
    a = b;
    b = swap;
  }
  st = MN_OK;
  for (size_t p = 0; p < a.n && st == MN_OK; p++) {
    const unsigned char *s = text + a.v[p].start;
    size_t len = a.v[p].end - a.v[p].start;
    st = a.v[p].id != MN_TOK_NONE ? fn(ctx, s, len, a.v[p].id)
                                  : byte_level(t, s, len, &buf, &buf_cap, fn, ctx);
  }
done:
  free(a.v);
  free(b.v);
  free(tmp);
  free(buf);
  return st;
}

typedef struct encoder {
  const mn_tokenizer *t;
  mn_tok_scratch sc;
  mn_tok_ids *out;
} encoder;

static mn_status encode_word(void *ctx, const unsigned char *w, size_t n, uint32_t added_id) {
  encoder *e = ctx;
  if (added_id != MN_TOK_NONE)
    return mn_tok_ids_push(e->out, added_id) ? MN_OK : MN_ERR_OUT_OF_MEMORY;
  return mn_tok_bpe_word(e->t, w, n, &e->sc, e->out);
}

mn_status mn_tok_encode_text(const mn_tokenizer *t, const unsigned char *text, size_t n,
                             mn_tok_ids *out) {
  encoder e = {t, {0}, out};
  mn_status st = mn_tok_pretokenize(t, text, n, encode_word, &e);
  mn_tok_scratch_free(&e.sc);
  return st;
}

/* ---------------------------------------------------------------- search sets */

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

/* Orders one pass's tokens by first byte, then longest first, then file order (the sort key
 * packs the three), and notes where each first byte's run starts. */
static bool build_set(mn_tokenizer *t, mn_tok_added_set *set, bool normalized) {
  size_t n = 0;
  uint64_t *keys = malloc((t->num_added + 1) * sizeof *keys);
  set->order = malloc((t->num_added + 1) * sizeof *set->order);
  if (!keys || !set->order) {
    free(keys);
    return false;
  }
  for (size_t i = 0; i < t->num_added; i++) {
    const mn_tok_added *a = &t->added[i];
    if (a->normalized != normalized || a->content.len == 0) continue;
    uint64_t first = (unsigned char)t->pool.data[a->content.off];
    keys[n++] = first << 56 | (uint64_t)(0xFFFFFFu - (a->content.len & 0xFFFFFFu)) << 32 | i;
  }
  qsort(keys, n, sizeof *keys, cmp_u64);
  memset(set->first, 0, sizeof set->first);
  for (size_t k = 0; k < n; k++) {
    set->order[k] = (uint32_t)keys[k];
    set->first[(keys[k] >> 56) + 1]++;
  }
  for (int b = 0; b < 256; b++)
    set->first[b + 1] += set->first[b];
  free(keys);
  return true;
}

bool mn_tok_build_added_sets(mn_tokenizer *t) {
  /* the library matches non-normalized tokens first, then normalized ones */
  return build_set(t, &t->passes[0], false) && build_set(t, &t->passes[1], true);
}
