/* The tokenizer's containers: a string pool, a byte-string -> id map for the vocabulary and the
 * added tokens, a pair -> (rank, id) map for the merges, and GPT-2's byte -> character map.
 * Both hash maps use open addressing with linear probing at a load factor of at most 1/2. */
#include <stdlib.h>
#include <string.h>

#include "io/tokenizer_internal.h"

/* ---------------------------------------------------------------- pool */

mn_tok_span mn_tok_pool_add(mn_tok_pool *p, const void *s, size_t n) {
  mn_tok_span none = {MN_TOK_NONE, 0};
  if (n >= UINT32_MAX / 2 || p->len + n + 1 >= UINT32_MAX) return none;
  if (p->len + n + 1 > p->cap) {
    size_t cap = p->cap ? p->cap : 4096;
    while (cap < p->len + n + 1)
      cap *= 2;
    char *d = realloc(p->data, cap);
    if (!d) return none;
    p->data = d;
    p->cap = cap;
  }
  mn_tok_span sp = {(uint32_t)p->len, (uint32_t)n};
  if (n) memcpy(p->data + p->len, s, n);
  p->data[p->len + n] = '\0';
  p->len += n + 1;
  return sp;
}

/* ---------------------------------------------------------------- string map */

static uint64_t hash_bytes(const void *s, size_t n) {
  const unsigned char *b = s;
  uint64_t h = 0xcbf29ce484222325u; /* FNV-1a */
  for (size_t i = 0; i < n; i++)
    h = (h ^ b[i]) * 0x100000001b3u;
  return h ^ (h >> 29);
}

static size_t strmap_slot(const mn_tok_strmap *m, const void *s, size_t n, bool *found) {
  size_t mask = m->cap - 1;
  size_t i = (size_t)hash_bytes(s, n) & mask;
  for (;; i = (i + 1) & mask) {
    mn_tok_span k = m->keys[i];
    if (k.off == MN_TOK_NONE) {
      *found = false;
      return i;
    }
    if (k.len == n && memcmp(m->pool->data + k.off, s, n) == 0) {
      *found = true;
      return i;
    }
  }
}

static bool strmap_grow(mn_tok_strmap *m) {
  size_t cap = m->cap ? m->cap * 2 : 64;
  mn_tok_span *keys = malloc(cap * sizeof *keys);
  uint32_t *values = malloc(cap * sizeof *values);
  if (!keys || !values) {
    free(keys);
    free(values);
    return false;
  }
  for (size_t i = 0; i < cap; i++)
    keys[i].off = MN_TOK_NONE;
  mn_tok_strmap old = *m;
  m->keys = keys;
  m->values = values;
  m->cap = cap;
  for (size_t i = 0; i < old.cap; i++) {
    if (old.keys[i].off == MN_TOK_NONE) continue;
    bool found;
    size_t j = strmap_slot(m, old.pool->data + old.keys[i].off, old.keys[i].len, &found);
    m->keys[j] = old.keys[i];
    m->values[j] = old.values[i];
  }
  free(old.keys);
  free(old.values);
  return true;
}

bool mn_tok_strmap_put(mn_tok_strmap *m, mn_tok_span key, uint32_t value) {
  if (2 * (m->count + 1) > m->cap && !strmap_grow(m)) return false;
  bool found;
  size_t i = strmap_slot(m, m->pool->data + key.off, key.len, &found);
  if (!found) {
    m->keys[i] = key;
    m->count++;
  }
  m->values[i] = value;
  return true;
}

bool mn_tok_strmap_get(const mn_tok_strmap *m, const void *s, size_t n, uint32_t *value) {
  if (!m->cap) return false;
  bool found;
  size_t i = strmap_slot(m, s, n, &found);
  if (found) *value = m->values[i];
  return found;
}

void mn_tok_strmap_free(mn_tok_strmap *m) {
  free(m->keys);
  free(m->values);
  m->keys = NULL;
  m->values = NULL;
  m->count = m->cap = 0;
}

/* ---------------------------------------------------------------- pair map */

static size_t pair_slot(const mn_tok_pairmap *m, uint64_t key) {
  size_t mask = m->cap - 1;
  uint64_t h = key * 0x9E3779B97F4A7C15u;
  size_t i = (size_t)(h >> 32) & mask;
  while (m->keys[i] != UINT64_MAX && m->keys[i] != key)
    i = (i + 1) & mask;
  return i;
}

static bool pairmap_grow(mn_tok_pairmap *m) {
  size_t cap = m->cap ? m->cap * 2 : 64;
  uint64_t *keys = malloc(cap * sizeof *keys);
  uint32_t *ranks = malloc(cap * sizeof *ranks), *merged = malloc(cap * sizeof *merged);
  if (!keys || !ranks || !merged) {
    free(keys);
    free(ranks);
    free(merged);
    return false;
  }
  for (size_t i = 0; i < cap; i++)
    keys[i] = UINT64_MAX;
  mn_tok_pairmap old = *m;
  m->keys = keys;
  m->ranks = ranks;
  m->merged = merged;
  m->cap = cap;
  for (size_t i = 0; i < old.cap; i++) {
    if (old.keys[i] == UINT64_MAX) continue;
    size_t j = pair_slot(m, old.keys[i]);
    m->keys[j] = old.keys[i];
    m->ranks[j] = old.ranks[i];
    m->merged[j] = old.merged[i];
  }
  free(old.keys);
  free(old.ranks);
  free(old.merged);
  return true;
}

bool mn_tok_pairmap_put(mn_tok_pairmap *m, uint32_t a, uint32_t b, uint32_t rank, uint32_t merged) {
  if (2 * (m->count + 1) > m->cap && !pairmap_grow(m)) return false;
  uint64_t key = (uint64_t)a << 32 | b;
  size_t i = pair_slot(m, key);
  if (m->keys[i] == UINT64_MAX) {
    m->keys[i] = key;
    m->count++;
  }
  m->ranks[i] = rank;
  m->merged[i] = merged;
  return true;
}

bool mn_tok_pairmap_get(const mn_tok_pairmap *m, uint32_t a, uint32_t b, uint32_t *rank,
                        uint32_t *merged) {
  if (!m->cap) return false;
  size_t i = pair_slot(m, (uint64_t)a << 32 | b);
  if (m->keys[i] == UINT64_MAX) return false;
  *rank = m->ranks[i];
  *merged = m->merged[i];
  return true;
}

void mn_tok_pairmap_free(mn_tok_pairmap *m) {
  free(m->keys);
  free(m->ranks);
  free(m->merged);
  memset(m, 0, sizeof *m);
}

/* ---------------------------------------------------------------- GPT-2 byte map */

/* Bytes '!'..'~', 0xA1..0xAC and 0xAE..0xFF are printable and stand for themselves; the others
 * get U+0100, U+0101, ... in byte order. */
static bool printable(unsigned b) {
  return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

uint32_t mn_tok_byte_char(unsigned char b) {
  if (printable(b)) return b;
  uint32_t n = 0;
  for (unsigned x = 0; x < b; x++)
    n += !printable(x);
  return 0x100 + n;
}
