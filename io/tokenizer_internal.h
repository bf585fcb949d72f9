/* The byte-level BPE tokenizer's parts, shared by io/tokenizer*.c:
 *   tokenizer_load.c    tokenizer.json -> struct mn_tokenizer (cJSON), every check and message
 *   tokenizer_maps.c    the string and pair hash maps, GPT-2's byte -> character map
 *   tokenizer_regex.c   the split patterns written by hand (GPT-2, cl100k/Llama-3, \p{N}, literal)
 *   tokenizer_pretok.c  added tokens, Split/Digits behaviors, the ByteLevel step
 *   tokenizer_bpe.c     the merge loop of one pre-token word
 *   tokenizer_decode.c  ids -> bytes (ByteLevel decoder)
 *   tokenizer.c         the public functions: load, encode, lookups, free
 *   unicode_tables.c    \p{L} and \p{N} (generated; tokenizer_unicode.h declares them)
 * Encoding follows the HF tokenizers library step by step (AddedVocabulary, PreTokenizedString,
 * BPE::merge_word, Word::merge_all) so that ids agree with it exactly. A loaded tokenizer is
 * never written again: encode and decode may run on several threads at once. */
#ifndef MN_IO_TOKENIZER_INTERNAL_H
#define MN_IO_TOKENIZER_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "meganeura.h"

/* Ids above this are refused at load: the id -> token table is dense. */
#define MN_TOK_MAX_ID (1u << 24)
#define MN_TOK_NONE   UINT32_MAX

/* ---------------------------------------------------------------- maps (tokenizer_maps.c) */

/* A byte string in a pool, by offset so that the pool may grow. */
typedef struct mn_tok_span {
  uint32_t off, len;
} mn_tok_span;

typedef struct mn_tok_pool {
  char *data;
  size_t len, cap;
} mn_tok_pool;

/* Appends n bytes and a NUL (so pooled strings are C strings too); MN_TOK_NONE offset when out
 * of memory or past 4 GiB. */
mn_tok_span mn_tok_pool_add(mn_tok_pool *p, const void *s, size_t n);

/* Byte string -> u32, open addressing over a pool; a repeated key takes the later value. */
typedef struct mn_tok_strmap {
  const mn_tok_pool *pool;
  mn_tok_span *keys;
  uint32_t *values;
  size_t count, cap; /* cap: a power of two, or 0 */
} mn_tok_strmap;

bool mn_tok_strmap_put(mn_tok_strmap *m, mn_tok_span key, uint32_t value); /* false: no memory */
bool mn_tok_strmap_get(const mn_tok_strmap *m, const void *s, size_t n, uint32_t *value);
void mn_tok_strmap_free(mn_tok_strmap *m);

/* (left id, right id) -> (merge rank, merged id). */
typedef struct mn_tok_pairmap {
  uint64_t *keys; /* UINT64_MAX: empty (ids stay below 2^24) */
  uint32_t *ranks, *merged;
  size_t count, cap;
} mn_tok_pairmap;

bool mn_tok_pairmap_put(mn_tok_pairmap *m, uint32_t a, uint32_t b, uint32_t rank, uint32_t merged);
bool mn_tok_pairmap_get(const mn_tok_pairmap *m, uint32_t a, uint32_t b, uint32_t *rank,
                        uint32_t *merged);
void mn_tok_pairmap_free(mn_tok_pairmap *m);

/* GPT-2's bytes_to_unicode: printable bytes stand for themselves, the other 68 for U+0100.. */
uint32_t mn_tok_byte_char(unsigned char b);

/* ---------------------------------------------------------------- pre-tokenizer configuration */

typedef enum mn_tok_pattern {
  MN_TOK_PAT_LITERAL, /* Split {"String": ...} */
  MN_TOK_PAT_NUMBER,  /* one \p{N} character (the regex engine's tables): Split \p{N} */
  MN_TOK_PAT_NUMERIC, /* one Rust char::is_numeric character: Digits */
  MN_TOK_PAT_GPT2,    /* the GPT-2 regex (ByteLevel's own, or in a Split) */
  MN_TOK_PAT_CL100K,  /* the Llama-3 / cl100k family, digits in runs of up to max_digits */
} mn_tok_pattern;

typedef enum mn_tok_behavior {
  MN_TOK_REMOVED,
  MN_TOK_ISOLATED,
  MN_TOK_MERGED_WITH_PREVIOUS,
  MN_TOK_MERGED_WITH_NEXT,
  MN_TOK_CONTIGUOUS,
} mn_tok_behavior;

typedef struct mn_tok_splitter {
  mn_tok_pattern pattern;
  mn_tok_behavior behavior;
  bool invert;
  int max_digits;   /* MN_TOK_PAT_CL100K */
  mn_tok_span text; /* MN_TOK_PAT_LITERAL, in the tokenizer's pool */
} mn_tok_splitter;

/* One entry of added_tokens. */
typedef struct mn_tok_added {
  uint32_t id;
  mn_tok_span content;
  bool lstrip, rstrip, normalized, special;
} mn_tok_added;

/* Added tokens of one matching pass (non-normalized first, then normalized), for
 * leftmost-longest search: indices into added[] sorted by first byte then longest first, with
 * the start of each first byte's run. */
typedef struct mn_tok_added_set {
  uint32_t *order;
  uint32_t first[257];
} mn_tok_added_set;

struct mn_tokenizer {
  char *label; /* the path, for messages */
  mn_tok_pool pool;

  /* model: BPE */
  mn_tok_strmap vocab;
  mn_tok_pairmap merges;
  uint32_t byte_token[256]; /* id of each byte's character, MN_TOK_NONE when not in vocab */
  bool has_unk;             /* unk_token is set */
  uint32_t unk_id;          /* MN_TOK_NONE when unk_token is not in the vocabulary */
  mn_tok_span unk_name;
  bool fuse_unk, ignore_merges;

  /* added tokens */
  mn_tok_added *added;
  size_t num_added;
  mn_tok_strmap added_by_content;
  mn_tok_added_set passes[2];

  /* pre-tokenizer: splitters in order, then ByteLevel */
  mn_tok_splitter *splitters;
  size_t num_splitters;
  bool prefix_space, use_regex;

  /* ids: the token of each id (added tokens over the model's), and its decoded bytes */
  uint32_t num_ids; /* largest id + 1 */
  mn_tok_span *id_token, *id_bytes;
  mn_tok_pool decoded;
};

/* ---------------------------------------------------------------- encoding */

/* A growable id list. */
typedef struct mn_tok_ids {
  uint32_t *v;
  size_t n, cap;
} mn_tok_ids;
bool mn_tok_ids_push(mn_tok_ids *ids, uint32_t id);

/* Scratch memory of one encode call, reused across its words. */
typedef struct mn_tok_scratch {
  unsigned char *buf; /* a word with its prefix space, or its mapped characters */
  size_t buf_cap;
  void *symbols, *heap;
  size_t symbols_cap, heap_cap;
} mn_tok_scratch;
void mn_tok_scratch_free(mn_tok_scratch *sc);

/* Finds the leftmost match of the pattern in s[from, n): true with [*ms, *me), false if none. */
bool mn_tok_find(const mn_tokenizer *t, const mn_tok_splitter *sp, const unsigned char *s, size_t n,
                 size_t from, size_t *ms, size_t *me);

/* Receives the pre-tokenizer's output in order: a word for BPE (added_id MN_TOK_NONE; the bytes
 * after the ByteLevel step's prefix space) or an added token (its id and matched text). */
typedef mn_status (*mn_tok_word_fn)(void *ctx, const unsigned char *w, size_t n, uint32_t added_id);
/* Added tokens, then the Split/Digits steps, then ByteLevel: hands every piece of text[0, n) to
 * fn, stopping at the first status other than MN_OK, which it returns (MN_ERR_OUT_OF_MEMORY
 * without a message). */
mn_status mn_tok_pretokenize(const mn_tokenizer *t, const unsigned char *text, size_t n,
                             mn_tok_word_fn fn, void *ctx);

/* Appends the ids of text[0, n) (pre-tokenizer, then BPE per word). MN_ERR_OUT_OF_MEMORY
 * (without a message) or MN_ERR_FORMAT (an unknown byte whose unk_token is not in the
 * vocabulary). */
mn_status mn_tok_encode_text(const mn_tokenizer *t, const unsigned char *text, size_t n,
                             mn_tok_ids *out);

/* BPE of one pre-token word (raw bytes; mapped to characters here). */
mn_status mn_tok_bpe_word(const mn_tokenizer *t, const unsigned char *w, size_t n,
                          mn_tok_scratch *sc, mn_tok_ids *out);

/* ---------------------------------------------------------------- loading */

/* Building blocks of every loader (tokenizer_build.c). A new tokenizer labelled for messages
 * (NULL, with the error set, when out of memory). */
mn_tokenizer *mn_tok_new(const char *label);
/* A vocabulary entry; false when out of memory. */
bool mn_tok_add_token(mn_tokenizer *t, const char *s, size_t n, uint32_t id);
/* Merge i, "a b": both parts and their concatenation must be in the vocabulary (MN_ERR_FORMAT
 * naming what[i] and the vocabulary's name otherwise). scratch: a pool reused across calls. */
mn_status mn_tok_add_merge(mn_tokenizer *t, mn_tok_pool *scratch, const char *what,
                           const char *vocab, size_t i, const char *a, size_t an, const char *b,
                           size_t bn);
/* The id of each byte's character (after the vocabulary is complete). */
void mn_tok_set_byte_tokens(mn_tokenizer *t);
/* An added token (a's fields but content, which is copied from content[0, n)); the first call
 * allocates room for cap of them. False when out of memory. */
bool mn_tok_add_added(mn_tokenizer *t, const mn_tok_added *a, const char *content, size_t n,
                      size_t cap);
mn_status mn_tok_add_splitter(mn_tokenizer *t, mn_tok_splitter sp);
/* The lookup tables, once everything is added. */
mn_status mn_tok_finish(mn_tokenizer *t);
/* A tokenizer from a GGUF file's tokenizer.ggml.* keys (tokenizer_gguf.c); path is a GGUF. */
mn_status mn_tok_load_gguf(const char *path, mn_tokenizer **out);

/* Fills t from the text of a tokenizer.json, json[len] being a NUL (t->label set, the rest
 * zero). */
mn_status mn_tok_load_json(mn_tokenizer *t, const char *json, size_t len);
/* The search sets of the two added-token passes (tokenizer_pretok.c). */
bool mn_tok_build_added_sets(mn_tokenizer *t);
/* The id -> token table and each id's decoded bytes (tokenizer_decode.c). */
bool mn_tok_build_id_tables(mn_tokenizer *t);
/* mn_tokenizer_load from the text instead of a file (json[len] being a NUL): the tokenizer or
 * the load's error, with `label` where messages name the file. For the fuzz target and the
 * test of its seeds. */
mn_status mn_tok_parse(const char *json, size_t len, const char *label, mn_tokenizer **out);

#endif
