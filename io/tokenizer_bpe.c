/* BPE of one pre-token word, as the library's BPE::merge_word and Word::merge_all do it: each
 * byte becomes its GPT-2 character's token, then the pair of lowest merge rank is merged, the
 * leftmost first among equal ranks, until no adjacent pair has a merge. A min-heap of candidate
 * merges (rank, position) drives it; entries made stale by earlier merges are skipped when
 * popped. The result is the same as the textbook loop's, in O(n log n) per word. */
#include <stdlib.h>
#include <string.h>

#include "host/error.h"
#include "io/tokenizer_internal.h"
#include "io/tokenizer_unicode.h"

typedef struct symbol {
  uint32_t id;
  int32_t prev, next; /* neighbours still alive; -1 at the ends */
  uint32_t len;       /* bytes covered; 0 once merged into its left neighbour */
} symbol;

typedef struct merge {
  uint32_t rank, pos, merged;
} merge;

static bool before(merge a, merge b) { return a.rank != b.rank ? a.rank < b.rank : a.pos < b.pos; }

static void heap_push(merge *h, size_t *n, merge m) {
  size_t i = (*n)++;
  while (i > 0 && before(m, h[(i - 1) / 2])) {
    h[i] = h[(i - 1) / 2];
    i = (i - 1) / 2;
  }
  h[i] = m;
}

static merge heap_pop(merge *h, size_t *n) {
  merge top = h[0], last = h[--*n];
  size_t i = 0;
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= *n) break;
    if (c + 1 < *n && before(h[c + 1], h[c])) c++;
    if (!before(h[c], last)) break;
    h[i] = h[c];
    i = c;
  }
  h[i] = last;
  return top;
}

void mn_tok_scratch_free(mn_tok_scratch *sc) {
  free(sc->buf);
  free(sc->symbols);
  free(sc->heap);
  memset(sc, 0, sizeof *sc);
}

static bool reserve(void **p, size_t *cap, size_t want, size_t size) {
  if (want <= *cap) return true;
  void *q = realloc(*p, want * size);
  if (!q) return false;
  *p = q;
  *cap = want;
  return true;
}

static void add_symbol(symbol *sym, size_t *count, uint32_t id, uint32_t len) {
  size_t i = (*count)++;
  sym[i] = (symbol){id, (int32_t)i - 1, -1, len};
  if (i > 0) sym[i - 1].next = (int32_t)i;
}

static void queue_pair(const mn_tokenizer *t, const symbol *sym, int32_t left, merge *heap,
                       size_t *nheap) {
  uint32_t rank, merged;
  if (mn_tok_pairmap_get(&t->merges, sym[left].id, sym[sym[left].next].id, &rank, &merged))
    heap_push(heap, nheap, (merge){rank, (uint32_t)left, merged});
}

static void merge_all(const mn_tokenizer *t, symbol *sym, size_t count, merge *heap) {
  size_t nheap = 0;
  for (size_t i = 0; i + 1 < count; i++)
    queue_pair(t, sym, (int32_t)i, heap, &nheap);
  while (nheap > 0) {
    merge top = heap_pop(heap, &nheap);
    symbol *cur = &sym[top.pos];
    if (cur->len == 0 || cur->next < 0) continue;
    symbol right = sym[cur->next];
    uint32_t rank, merged;
    if (!mn_tok_pairmap_get(&t->merges, cur->id, right.id, &rank, &merged) || merged != top.merged)
      continue; /* stale: a neighbour changed since this entry was queued */
    sym[cur->next].len = 0;
    cur->id = merged;
    cur->len += right.len;
    cur->next = right.next;
    if (right.next >= 0) sym[right.next].prev = (int32_t)top.pos;
    if (cur->prev >= 0) queue_pair(t, sym, cur->prev, heap, &nheap);
    if (cur->next >= 0) queue_pair(t, sym, (int32_t)top.pos, heap, &nheap);
  }
}

mn_status mn_tok_bpe_word(const mn_tokenizer *t, const unsigned char *w, size_t n,
                          mn_tok_scratch *sc, mn_tok_ids *out) {
  if (n == 0) return MN_OK;
  if (n > INT32_MAX / 4) {
    return mn_fail(MN_ERR_INVALID_ARGUMENT,
                   "mn_tokenizer_encode: %s: a pre-token word of %zu bytes is too long", t->label,
                   n);
  }
  if (t->ignore_merges) {
    /* a word that is a token of its own is taken whole, merges or not */
    if (!reserve((void **)&sc->buf, &sc->buf_cap, 2 * n, 1)) return MN_ERR_OUT_OF_MEMORY;
    size_t len = 0;
    for (size_t i = 0; i < n; i++)
      len += mn_utf8_put(mn_tok_byte_char(w[i]), sc->buf + len);
    uint32_t id;
    if (mn_tok_strmap_get(&t->vocab, sc->buf, len, &id))
      return mn_tok_ids_push(out, id) ? MN_OK : MN_ERR_OUT_OF_MEMORY;
  }
  if (!reserve(&sc->symbols, &sc->symbols_cap, n, sizeof(symbol)) ||
      !reserve(&sc->heap, &sc->heap_cap, 3 * n, sizeof(merge)))
    return MN_ERR_OUT_OF_MEMORY;
  symbol *sym = sc->symbols;
  size_t count = 0;
  /* a byte whose character is not in the vocabulary becomes unk_token (runs of them one token
   * with fuse_unk), or is dropped when there is no unk_token, as in the library */
  uint32_t unk_len = 0;
  for (size_t i = 0; i < n; i++) {
    uint32_t id = t->byte_token[w[i]];
    if (id != MN_TOK_NONE) {
      if (unk_len) add_symbol(sym, &count, t->unk_id, unk_len);
      unk_len = 0;
      add_symbol(sym, &count, id, 1);
    } else if (t->has_unk) {
      if (t->unk_id == MN_TOK_NONE) {
        return mn_fail(MN_ERR_FORMAT,
                       "mn_tokenizer_encode: %s: byte 0x%02X is not in the vocabulary and "
                       "model.unk_token '%s' is not in model.vocab either",
                       t->label, w[i], t->pool.data + t->unk_name.off);
      }
      if (unk_len && !t->fuse_unk) {
        add_symbol(sym, &count, t->unk_id, unk_len);
        unk_len = 0;
      }
      unk_len++;
    }
  }
  if (unk_len) add_symbol(sym, &count, t->unk_id, unk_len);
  merge_all(t, sym, count, sc->heap);
  for (size_t i = 0; i < count; i++)
    if (sym[i].len && !mn_tok_ids_push(out, sym[i].id)) return MN_ERR_OUT_OF_MEMORY;
  return MN_OK;
}
