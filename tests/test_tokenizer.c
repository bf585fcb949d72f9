/* The byte-level BPE tokenizer (io/tokenizer*.c) on tiny tokenizer.json files written here, whose
 * encodings are worked out by hand: merge order, the pre-tokenizer regexes and Split behaviors,
 * added tokens, unknown bytes; every error path with its status and message; and round trips
 * decode(encode(x)) == x for arbitrary bytes. Conformance with the HF package on trained
 * tokenizers is in test_tokenizer_conformance.c.
 *
 * The fixtures give every byte the id of its value (the byte's GPT-2 character is the token),
 * so an unmerged byte's id is the byte itself: "hi" is [104, 105], a space is 32. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L /* open_memstream */
#endif
#include <stdio.h>
#include <stdlib.h>

#include "io/tokenizer_internal.h"
#include "io/tokenizer_unicode.h"
#include "tests/support/mn_test.h"
#include "tests/support/tmp_dir.h"

#define LEN(a)   (sizeof(a) / sizeof((a)[0]))
#define IDS(...) ((const uint32_t[]){__VA_ARGS__}), LEN(((const uint32_t[]){__VA_ARGS__}))

#define BYTE_LEVEL "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":true}"

/* ---------------------------------------------------------------- fixtures */

typedef struct fixture {
  const char *top;    /* top-level members placed first, so they win over the defaults */
  const char *pre;    /* the pre_tokenizer (default: BYTE_LEVEL) */
  const char *vocab;  /* vocabulary entries after the bytes', e.g. "\"ll\":256" */
  const char *merges; /* the merges array's elements */
  const char *added;  /* the added_tokens array's elements */
  const char *model;  /* model members placed first, e.g. "\"ignore_merges\":true" */
  bool letters_only;  /* bytes 'a'..'z' only instead of all 256 */
} fixture;

static mn_tmp_dir dir;
static void setup(void) { dir = mn_tmp_dir_make("mn_tok"); }
static void teardown(void) { mn_tmp_dir_remove(&dir); }
TestSuite(tokenizer, .init = setup, .fini = teardown);

/* A byte's GPT-2 character as JSON string content. */
static void put_byte_char(FILE *f, unsigned b) {
  unsigned char u[4];
  size_t n = mn_utf8_put(mn_tok_byte_char((unsigned char)b), u);
  if (b == '"' || b == '\\') fputc('\\', f);
  fwrite(u, 1, n, f);
}

static char *fixture_json(const fixture *fx) {
  char *text = NULL;
  size_t size = 0;
  FILE *f = open_memstream(&text, &size);
  fprintf(f, "{%s%s\"version\":\"1.0\",\"truncation\":null,\"padding\":null,",
          fx->top ? fx->top : "", fx->top ? "," : "");
  fprintf(f, "\"added_tokens\":[%s],\"normalizer\":null,\"pre_tokenizer\":%s,",
          fx->added ? fx->added : "", fx->pre ? fx->pre : BYTE_LEVEL);
  fprintf(f, "\"post_processor\":null,\"decoder\":{\"type\":\"ByteLevel\",\"add_prefix_space\":"
             "true,\"trim_offsets\":true,\"use_regex\":true},");
  fprintf(f,
          "\"model\":{%s%s\"type\":\"BPE\",\"dropout\":null,\"unk_token\":null,"
          "\"continuing_subword_prefix\":null,\"end_of_word_suffix\":null,\"fuse_unk\":false,"
          "\"byte_fallback\":false,\"vocab\":{",
          fx->model ? fx->model : "", fx->model ? "," : "");
  bool first = true;
  for (unsigned b = 0; b < 256; b++) {
    if (fx->letters_only && (b < 'a' || b > 'z')) continue;
    fprintf(f, "%s\"", first ? "" : ",");
    put_byte_char(f, b);
    fprintf(f, "\":%u", b);
    first = false;
  }
  if (fx->vocab) fprintf(f, ",%s", fx->vocab);
  fprintf(f, "},\"merges\":[%s]}}", fx->merges ? fx->merges : "");
  fclose(f);
  return text;
}

static const char *write_json(const char *name, const char *json) {
  const char *path = mn_tmp_path(&dir, name);
  mn_test_write_file(path, json, strlen(json));
  return path;
}

static mn_tokenizer *load(const fixture *fx) {
  char *json = fixture_json(fx);
  mn_tokenizer *t = NULL;
  mn_status st = mn_tokenizer_load(write_json("tokenizer.json", json), &t);
  cr_assert_eq(st, MN_OK, "load failed: %s\n%s", mn_last_error(), json);
  free(json);
  return t;
}

static void expect_ids(const mn_tokenizer *t, const char *text, const uint32_t *want, size_t n) {
  uint32_t got[256];
  size_t n_got;
  mn_status st = mn_tokenizer_encode(t, text, strlen(text), got, LEN(got), &n_got);
  cr_assert_eq(st, MN_OK, "encode \"%s\": %s", text, mn_last_error());
  char g[1024] = "", w[1024] = "";
  for (size_t i = 0; i < n_got && i < 64; i++)
    snprintf(g + strlen(g), sizeof g - strlen(g), "%u ", got[i]);
  for (size_t i = 0; i < n; i++)
    snprintf(w + strlen(w), sizeof w - strlen(w), "%u ", want[i]);
  cr_assert(n_got == n && (n == 0 || memcmp(got, want, n * sizeof *want) == 0),
            "encode \"%s\": got [%s], want [%s]", text, g, w);
}

/* The pieces the pre-tokenizer hands to BPE, joined by '|'; added tokens as [id]. */
static mn_status collect(void *ctx, const unsigned char *w, size_t n, uint32_t added_id) {
  char *out = ctx;
  size_t k = strlen(out);
  if (k) out[k++] = '|';
  if (added_id != MN_TOK_NONE)
    snprintf(out + k, 1024 - k, "[%u]", added_id);
  else
    snprintf(out + k, 1024 - k, "%.*s", (int)n, (const char *)w);
  return MN_OK;
}

static void expect_pieces(const mn_tokenizer *t, const char *text, const char *want) {
  char got[1024] = "";
  mn_status st = mn_tok_pretokenize(t, (const unsigned char *)text, strlen(text), collect, got);
  cr_assert_eq(st, MN_OK);
  cr_assert_str_eq(got, want, "pieces of \"%s\": got \"%s\", want \"%s\"", text, got, want);
}

/* ---------------------------------------------------------------- BPE */

/* "ll" ranks first, then "he", then "he"+"ll"; " world" merges "Ġw" then "or" then "Ġw"+"or". */
static const fixture hello = {
    .vocab = "\"ll\":256,\"he\":257,\"hell\":258,\"\xc4\xa0w\":259,\"or\":260,\"\xc4\xa0wor\":261",
    .merges = "\"l l\",\"h e\",\"he ll\",\"\xc4\xa0 w\",\"o r\",\"\xc4\xa0w or\""};

Test(tokenizer, merges_apply_by_rank) {
  mn_tokenizer *t = load(&hello);
  expect_ids(t, "hello world", IDS(258, 'o', 261, 'l', 'd'));
  expect_ids(t, "hel", IDS(257, 'l')); /* "el" has no merge, "he" has */
  expect_ids(t, "", NULL, 0);
  cr_assert_eq(mn_tokenizer_vocab_size(t), 262);
  mn_tokenizer_free(t);
}

Test(tokenizer, merges_in_array_form) {
  fixture fx = hello;
  fx.merges = "[\"l\",\"l\"],[\"h\",\"e\"],[\"he\",\"ll\"],[\"\xc4\xa0\",\"w\"],[\"o\",\"r\"],"
              "[\"\xc4\xa0w\",\"or\"]";
  mn_tokenizer *t = load(&fx);
  expect_ids(t, "hello world", IDS(258, 'o', 261, 'l', 'd'));
  mn_tokenizer_free(t);
}

Test(tokenizer, lower_rank_wins_over_position) {
  fixture fx = {.vocab = "\"bc\":256,\"ab\":257", .merges = "\"b c\",\"a b\""};
  mn_tokenizer *t = load(&fx);
  expect_ids(t, "abc", IDS('a', 256)); /* not [ab, c]: "b c" ranks first */
  expect_ids(t, "ab", IDS(257));
  mn_tokenizer_free(t);
}

Test(tokenizer, equal_ranks_merge_leftmost_first) {
  fixture fx = {.vocab = "\"aa\":256", .merges = "\"a a\""};
  mn_tokenizer *t = load(&fx);
  expect_ids(t, "aaa", IDS(256, 'a'));
  expect_ids(t, "aaaa", IDS(256, 256));
  expect_ids(t, "aaaaa", IDS(256, 256, 'a'));
  mn_tokenizer_free(t);
}

Test(tokenizer, merges_never_cross_pre_tokens) {
  /* "a b" would merge with "a Ġ", but the regex cuts "a" from " b" */
  fixture fx = {.vocab = "\"a\xc4\xa0\":256,\"\xc4\xa0\xc4\xa0\":257",
                .merges = "\"a \xc4\xa0\",\"\xc4\xa0 \xc4\xa0\""};
  mn_tokenizer *t = load(&fx);
  expect_ids(t, "a b", IDS('a', ' ', 'b'));
  expect_ids(t, "a   b", IDS('a', 257, ' ', 'b')); /* "a", "  ", " b" */
  mn_tokenizer_free(t);
}

Test(tokenizer, ignore_merges_takes_whole_words) {
  fixture fx = {.vocab = "\"abc\":256,\"ab\":257", .merges = "\"a b\""};
  mn_tokenizer *t = load(&fx);
  expect_ids(t, "abc", IDS(257, 'c'));
  mn_tokenizer_free(t);
  fx.model = "\"ignore_merges\":true";
  t = load(&fx);
  expect_ids(t, "abc", IDS(256));
  expect_ids(t, "abcd", IDS(257, 'c', 'd'));
  mn_tokenizer_free(t);
}

Test(tokenizer, unknown_bytes) {
  /* letters only: other bytes are dropped without an unk_token (as the HF library does) */
  fixture fx = {.letters_only = true,
                .pre = "{\"type\":\"ByteLevel\",\"use_regex\":false,"
                       "\"add_prefix_space\":false}"};
  mn_tokenizer *t = load(&fx);
  expect_ids(t, "a!!b", IDS('a', 'b'));
  mn_tokenizer_free(t);

  fx.vocab = "\"<unk>\":0";
  fx.model = "\"unk_token\":\"<unk>\"";
  t = load(&fx);
  expect_ids(t, "a!!b?", IDS('a', 0, 0, 'b', 0));
  mn_tokenizer_free(t);

  fx.model = "\"unk_token\":\"<unk>\",\"fuse_unk\":true";
  t = load(&fx);
  expect_ids(t, "a!!b?", IDS('a', 0, 'b', 0));
  mn_tokenizer_free(t);

  fx.vocab = NULL; /* unk_token not in the vocabulary: an error once it is needed */
  t = load(&fx);
  expect_ids(t, "ab", IDS('a', 'b'));
  size_t n;
  uint32_t ids[8];
  mn_assert_error(mn_tokenizer_encode(t, "a!", 2, ids, 8, &n), MN_ERR_FORMAT,
                  "model.unk_token '<unk>' is not in model.vocab");
  mn_tokenizer_free(t);
}

/* ---------------------------------------------------------------- pre-tokenizers */

Test(tokenizer, gpt2_regex) {
  fixture fx = {0};
  mn_tokenizer *t = load(&fx);
  expect_pieces(t, "Hello world", "Hello| world");
  expect_pieces(t, "a   b", "a|  | b");
  expect_pieces(t, "a  ", "a|  ");
  expect_pieces(t, "don't 's 'S", "don|'t| '|s| '|S"); /* " '" comes before "'s" */
  expect_pieces(t, "we're 'll'd'm've", "we|'re| '|ll|'d|'m|'ve");
  expect_pieces(t, "12345 abc 3.5", "12345| abc| 3|.|5");
  expect_pieces(t, "!!\n\nx", "!!|\n|\n|x");
  expect_pieces(t, "a \n\n b", "a| \n\n| b");
  expect_pieces(t, "x\xe3\x80\x80\xe3\x80\x80y", "x|\xe3\x80\x80|\xe3\x80\x80|y"); /* U+3000 */
  expect_pieces(t, "caf\xc3\xa9 \xe4\xbd\xa0\xe5\xa5\xbd!",
                "caf\xc3\xa9| \xe4\xbd\xa0\xe5\xa5\xbd|!");
  expect_pieces(t, "\xc2\xbd\xe2\x85\xab", "\xc2\xbd\xe2\x85\xab"); /* No and Nl are numbers */
  expect_pieces(t,
                "a\xff\xfe"
                "b",
                "a|\xff\xfe|b"); /* invalid bytes: punctuation-like */
  expect_pieces(t, " ?!x", " ?!|x");
  mn_tokenizer_free(t);
}

Test(tokenizer, llama3_and_qwen2_regexes) {
  fixture fx = {.pre = "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{"
                       "\"Regex\":\"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?"
                       "\\\\p{L}+|\\\\p{N}{1,3}| ?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*["
                       "\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"},\"behavior\":\"Isolated\","
                       "\"invert\":false},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"
                       "\"use_regex\":false}]}"};
  mn_tokenizer *t = load(&fx);
  /* these, the GPT-2 ones and the Split behaviors agree with the HF library's pre_tokenize_str */
  expect_pieces(t, "x'\xc5\xbftill", "x|'\xc5\xbf|till"); /* 'ſ folds to 's */
  expect_pieces(t, "x'STILL", "x|'S|TILL");
  expect_pieces(t, "a \n\n b", "a| \n\n| b");
  expect_pieces(t, "12345", "123|45");
  expect_pieces(t, " !!\n\nx", " !!\n\n|x");
  expect_pieces(t,
                "a\xc2\xa0\xc2\xa0"
                "b",
                "a|\xc2\xa0|\xc2\xa0"
                "b");
  expect_pieces(t, "(hello) $x", "(hello|)| $|x");
  expect_pieces(t, "\tfoo\nbar", "\tfoo|\n|bar");
  mn_tokenizer_free(t);
}

static mn_tokenizer *split_fixture(const char *behavior, bool invert) {
  char pre[512];
  snprintf(pre, sizeof pre,
           "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"String\":"
           "\"-\"},\"behavior\":\"%s\",\"invert\":%s},{\"type\":\"ByteLevel\","
           "\"add_prefix_space\":false,\"use_regex\":false}]}",
           behavior, invert ? "true" : "false");
  fixture fx = {.pre = pre};
  return load(&fx);
}

Test(tokenizer, split_behaviors) {
  static const struct {
    const char *behavior;
    bool invert;
    const char *want;
  } cases[] = {
      {"Removed", false, "a|b|c"},
      {"Isolated", false, "a|-|b|-|-|c"},
      {"MergedWithPrevious", false, "a-|b-|-|c"},
      {"MergedWithNext", false, "a|-b|-|-c"},
      {"Contiguous", false, "a|-|b|--|c"},
      {"Removed", true, "-|-|-"},
  };
  for (size_t i = 0; i < LEN(cases); i++) {
    mn_tokenizer *t = split_fixture(cases[i].behavior, cases[i].invert);
    expect_pieces(t, "a-b--c", cases[i].want);
    mn_tokenizer_free(t);
  }
}

Test(tokenizer, digits) {
  fixture fx = {.pre = "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Digits\","
                       "\"individual_digits\":true}," BYTE_LEVEL "]}"};
  mn_tokenizer *t = load(&fx);
  expect_pieces(t, "abc123 def\xd9\xa3\xd9\xa4", "abc|1|2|3| def|\xd9\xa3|\xd9\xa4");
  mn_tokenizer_free(t);
  fx.pre = "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Digits\","
           "\"individual_digits\":false}," BYTE_LEVEL "]}";
  t = load(&fx);
  expect_pieces(t, "abc123 def", "abc|123| def");
  mn_tokenizer_free(t);
}

/* Digits splits what Rust's char::is_numeric calls numeric, Split \p{N} what the regex engine
 * calls a number: the Tolong Siki digit U+11DE0 is only the former (tokenizers 0.23.3), the Kawi
 * digit U+11F50 both. */
Test(tokenizer, digits_numeric_and_split_number) {
#define TOLONG_0 "\xf0\x91\xb7\xa0"
#define KAWI_0   "\xf0\x91\xbd\x90"
  fixture fx = {.pre = "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Digits\","
                       "\"individual_digits\":true}," BYTE_LEVEL "]}"};
  mn_tokenizer *t = load(&fx);
  expect_pieces(t, "x-" TOLONG_0 "-" KAWI_0, "x|-|" TOLONG_0 "|-|" KAWI_0);
  mn_tokenizer_free(t);
  fx.pre = "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{"
           "\"Regex\":\"\\\\p{N}\"},\"behavior\":\"Isolated\",\"invert\":false}," BYTE_LEVEL "]}";
  t = load(&fx);
  expect_pieces(t, "x-" TOLONG_0 "-" KAWI_0, "x|-" TOLONG_0 "-|" KAWI_0);
  mn_tokenizer_free(t);
#undef TOLONG_0
#undef KAWI_0
}

Test(tokenizer, add_prefix_space_on_every_piece) {
  fixture fx = {.pre = "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Digits\","
                       "\"individual_digits\":true},{\"type\":\"ByteLevel\","
                       "\"add_prefix_space\":true,\"use_regex\":true}]}",
                .added = "{\"id\":300,\"content\":\"<s>\",\"special\":true,\"normalized\":false}"};
  mn_tokenizer *t = load(&fx);
  expect_pieces(t, "hi", " hi");
  expect_pieces(t, " hi", " hi");
  expect_pieces(t, "a12", " a| 1| 2");
  expect_pieces(t, "<s>hi<s>", "[300]| hi|[300]");
  expect_ids(t, "<s>hi", IDS(300, ' ', 'h', 'i'));
  mn_tokenizer_free(t);
}

/* ---------------------------------------------------------------- added tokens */

static const fixture with_added = {
    .added = "{\"id\":300,\"content\":\"<|endoftext|>\",\"single_word\":false,\"lstrip\":false,"
             "\"rstrip\":false,\"normalized\":false,\"special\":true},"
             "{\"id\":301,\"content\":\"<|a\",\"normalized\":false,\"special\":true},"
             "{\"id\":302,\"content\":\"<|a|>\",\"normalized\":false,\"special\":true},"
             "{\"id\":303,\"content\":\"bc\",\"normalized\":false},"
             "{\"id\":304,\"content\":\"ab\",\"normalized\":true},"
             "{\"id\":305,\"content\":\"<m>\",\"lstrip\":true,\"rstrip\":true,"
             "\"normalized\":false,\"special\":true}"};

Test(tokenizer, special_tokens) {
  mn_tokenizer *t = load(&with_added);
  expect_ids(t, "x<|endoftext|>y", IDS('x', 300, 'y'));
  expect_ids(t, "<|endoftext|><|endoftext|>", IDS(300, 300));
  expect_ids(t, "<|endoftext", IDS('<', '|', 'e', 'n', 'd', 'o', 'f', 't', 'e', 'x', 't'));
  expect_ids(t, "<|a|>", IDS(302)); /* leftmost, then longest */
  expect_ids(t, "<|a>", IDS(301, '>'));
  cr_assert_eq(mn_tokenizer_token_id(t, "<|endoftext|>"), 300);
  cr_assert_eq(mn_tokenizer_token_id(t, "h"), 'h');
  cr_assert_eq(mn_tokenizer_token_id(t, "\xc4\xa0"), ' '); /* Ġ */
  cr_assert_eq(mn_tokenizer_token_id(t, "<|nope|>"), -1);
  cr_assert_eq(mn_tokenizer_token_id(t, NULL), -1);
  cr_assert_str_eq(mn_tokenizer_token(t, 300), "<|endoftext|>");
  cr_assert_str_eq(mn_tokenizer_token(t, ' '), "\xc4\xa0");
  cr_assert_null(mn_tokenizer_token(t, 299));
  cr_assert_null(mn_tokenizer_token(t, 100000));
  cr_assert_eq(mn_tokenizer_vocab_size(t), 306);
  mn_tokenizer_free(t);
}

Test(tokenizer, added_tokens_not_normalized_match_first) {
  /* "bc" (not normalized) is found in a first pass, "ab" (normalized) only in what is left */
  mn_tokenizer *t = load(&with_added);
  expect_ids(t, "abc", IDS('a', 303));
  expect_ids(t, "abx", IDS(304, 'x'));
  mn_tokenizer_free(t);
}

Test(tokenizer, added_tokens_strip_spaces) {
  mn_tokenizer *t = load(&with_added);
  expect_pieces(t, "x  <m>\t y", "x|[305]|y");
  expect_ids(t, "x  <m>\t y", IDS('x', 305, 'y'));
  mn_tokenizer_free(t);
}

/* ---------------------------------------------------------------- decode */

Test(tokenizer, decode) {
  mn_tokenizer *t = load(&with_added);
  const uint32_t ids[] = {'h', 'i', ' ', 300, 0xE4, 0xBD, 0xA0};
  char out[64];
  size_t len;
  cr_assert_eq(mn_tokenizer_decode(t, ids, LEN(ids), out, sizeof out, &len), MN_OK, "%s",
               mn_last_error());
  cr_assert_eq(len, 19);
  cr_assert_str_eq(out, "hi <|endoftext|>\xe4\xbd\xa0");

  /* the size query, then a buffer one byte short of the NUL */
  cr_assert_eq(mn_tokenizer_decode(t, ids, LEN(ids), NULL, 0, &len), MN_OK);
  cr_assert_eq(len, 19);
  mn_assert_error(mn_tokenizer_decode(t, ids, LEN(ids), out, 19, &len), MN_ERR_INVALID_ARGUMENT,
                  "needs 19 bytes and a NUL, cap is 19");
  cr_assert_eq(len, 19);
  cr_assert_eq(strlen(out), 18);

  const uint32_t bad[] = {'h', 9999};
  mn_assert_error(mn_tokenizer_decode(t, bad, 2, out, sizeof out, &len), MN_ERR_INVALID_ARGUMENT,
                  "ids[1] = 9999 is not a token");
  const uint32_t hole[] = {299};
  mn_assert_error(mn_tokenizer_decode(t, hole, 1, out, sizeof out, &len), MN_ERR_INVALID_ARGUMENT,
                  "ids[0] = 299");
  cr_assert_eq(mn_tokenizer_decode(t, NULL, 0, out, sizeof out, &len), MN_OK);
  cr_assert_eq(len, 0);
  cr_assert_str_eq(out, "");
  mn_tokenizer_free(t);
}

Test(tokenizer, decode_token_outside_the_byte_map_is_its_own_bytes) {
  /* "<你>" has a character no byte maps to: it stands for its UTF-8 bytes; "Ġx" for " x" */
  fixture fx = {.added = "{\"id\":300,\"content\":\"<\xe4\xbd\xa0>\",\"special\":true,"
                         "\"normalized\":false}",
                .vocab = "\"\xc4\xa0x\":256"};
  mn_tokenizer *t = load(&fx);
  const uint32_t ids[] = {300, 256};
  char out[32];
  size_t len;
  cr_assert_eq(mn_tokenizer_decode(t, ids, 2, out, sizeof out, &len), MN_OK);
  cr_assert_str_eq(out, "<\xe4\xbd\xa0> x");
  mn_tokenizer_free(t);
}

/* ---------------------------------------------------------------- round trips */

static void round_trip(const mn_tokenizer *t, const char *x, size_t n) {
  uint32_t ids[512];
  char out[600];
  size_t n_ids, len;
  cr_assert_eq(mn_tokenizer_encode(t, x, n, ids, LEN(ids), &n_ids), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_tokenizer_decode(t, ids, n_ids, out, sizeof out, &len), MN_OK, "%s",
               mn_last_error());
  cr_assert(len == n && memcmp(out, x, n) == 0, "round trip of %zu bytes failed (got %zu)", n, len);
}

Test(tokenizer, round_trip_arbitrary_bytes_and_unicode) {
  static const char *pres[] = {
      BYTE_LEVEL,
      "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Digits\",\"individual_digits\":true}"
      "," BYTE_LEVEL "]}",
      "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":"
      "\"\\\\p{N}\"},\"behavior\":\"Contiguous\",\"invert\":false},{\"type\":\"ByteLevel\","
      "\"add_prefix_space\":false,\"use_regex\":false}]}",
  };
  for (size_t p = 0; p < LEN(pres); p++) {
    fixture fx = hello;
    fx.pre = pres[p];
    fx.added = with_added.added;
    mn_tokenizer *t = load(&fx);
    mn_rng rng = mn_rng_new(17 + p);
    char x[512];
    for (int k = 0; k < 2000; k++) {
      size_t n = (size_t)(mn_rng_uniform(&rng) * 80);
      if (k % 2 == 0) { /* any bytes: invalid UTF-8, NULs, truncated sequences */
        for (size_t i = 0; i < n; i++)
          x[i] = (char)(mn_rng_uniform(&rng) * 256);
      } else { /* valid UTF-8 of code points from every plane, with spaces and specials */
        size_t len = 0;
        while (len + 16 < sizeof x && len < n * 2) {
          double r = mn_rng_uniform(&rng);
          uint32_t cp = r < 0.3   ? (uint32_t)(' ' + mn_rng_uniform(&rng) * 95)
                        : r < 0.4 ? (uint32_t)(mn_rng_uniform(&rng) * 32)
                                  : (uint32_t)(mn_rng_uniform(&rng) * 0x110000);
          if (cp >= 0xD800 && cp <= 0xDFFF) continue;
          if (r > 0.97) {
            memcpy(x + len, "<|endoftext|>", 13);
            len += 13;
            continue;
          }
          len += mn_utf8_put(cp, (unsigned char *)x + len);
        }
        n = len;
      }
      round_trip(t, x, n);
    }
    mn_tokenizer_free(t);
  }
}

/* ---------------------------------------------------------------- the encode buffer */

Test(tokenizer, encode_buffer_sizes) {
  mn_tokenizer *t = load(&hello);
  size_t n = 99;
  cr_assert_eq(mn_tokenizer_encode(t, "hello world", 11, NULL, 0, &n), MN_OK);
  cr_assert_eq(n, 5);
  uint32_t ids[3] = {0};
  mn_assert_error(mn_tokenizer_encode(t, "hello world", 11, ids, 3, &n), MN_ERR_INVALID_ARGUMENT,
                  "the text has 5 tokens, cap is 3");
  cr_assert_eq(n, 5);
  cr_assert(ids[0] == 258 && ids[1] == 'o' && ids[2] == 261);
  mn_assert_error(mn_tokenizer_encode(t, NULL, 3, ids, 3, &n), MN_ERR_INVALID_ARGUMENT,
                  "mn_tokenizer_encode: ");
  mn_assert_error(mn_tokenizer_encode(t, "x", 1, ids, 3, NULL), MN_ERR_INVALID_ARGUMENT,
                  "n_out NULL");
  mn_assert_error(mn_tokenizer_encode(NULL, "x", 1, ids, 3, &n), MN_ERR_INVALID_ARGUMENT,
                  "tokenizer NULL");
  cr_assert_eq(mn_tokenizer_encode(t, NULL, 0, NULL, 0, &n), MN_OK);
  cr_assert_eq(n, 0);
  /* an embedded NUL is a byte like any other */
  cr_assert_eq(mn_tokenizer_encode(t, "a\0b", 3, ids, 3, &n), MN_OK);
  cr_assert(n == 3 && ids[0] == 'a' && ids[1] == 0 && ids[2] == 'b');
  mn_tokenizer_free(t);
  mn_tokenizer_free(NULL);
  cr_assert_eq(mn_tokenizer_vocab_size(NULL), 0);
}

/* ---------------------------------------------------------------- errors */

static void expect_load_error(const char *json, mn_status want, const char *fragment) {
  mn_tokenizer *t = (mn_tokenizer *)&t;
  const char *path = write_json("bad.json", json);
  mn_assert_error(mn_tokenizer_load(path, &t), want, fragment);
  cr_assert_null(t);
  cr_assert(strncmp(mn_last_error(), "mn_tokenizer_load: ", 19) == 0 &&
                strstr(mn_last_error(), path),
            "message \"%s\" does not name the function and the file", mn_last_error());
}

/* The hello fixture with `from` replaced by `to` (which must occur). */
static char *edited(const fixture *fx, const char *from, const char *to) {
  char *json = fixture_json(fx);
  char *at = strstr(json, from);
  cr_assert_not_null(at, "\"%s\" is not in the fixture", from);
  size_t a = (size_t)(at - json), nf = strlen(from), nt = strlen(to), n = strlen(json);
  char *out = malloc(n - nf + nt + 1);
  memcpy(out, json, a);
  memcpy(out + a, to, nt);
  memcpy(out + a + nt, at + nf, n - a - nf + 1);
  free(json);
  return out;
}

static void expect_edit_error(const char *from, const char *to, mn_status want,
                              const char *fragment) {
  char *json = edited(&hello, from, to);
  expect_load_error(json, want, fragment);
  free(json);
}

Test(tokenizer, load_errors_io_and_json) {
  mn_tokenizer *t = NULL;
  const char *missing = mn_tmp_path(&dir, "missing.json");
  mn_assert_error(mn_tokenizer_load(missing, &t), MN_ERR_IO, "cannot open");
  cr_assert(strstr(mn_last_error(), missing));
  mn_assert_error(mn_tokenizer_load(NULL, &t), MN_ERR_INVALID_ARGUMENT, "mn_tokenizer_load");
  expect_load_error("{\"model\": ", MN_ERR_FORMAT, "not valid JSON");
  expect_load_error("", MN_ERR_FORMAT, "not valid JSON");
  expect_load_error("[1, 2]", MN_ERR_FORMAT, "not a JSON object");
  expect_load_error("{}", MN_ERR_FORMAT, "model: missing");
  expect_load_error("{\"model\":{\"type\":\"BPE\",\"merges\":[]}}", MN_ERR_FORMAT,
                    "model.vocab: missing");
  expect_load_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{}}}", MN_ERR_FORMAT,
                    "model.merges: missing");
}

Test(tokenizer, load_errors_format) {
  expect_edit_error("\"ll\":256", "\"ll\":-1", MN_ERR_FORMAT, "model.vocab['ll']: the id must be");
  expect_edit_error("\"ll\":256", "\"ll\":2.5", MN_ERR_FORMAT, "model.vocab['ll']");
  expect_edit_error("\"ll\":256", "\"ll\":\"x\"", MN_ERR_FORMAT, "model.vocab['ll']");
  expect_edit_error("\"ll\":256", "\"ll\":99999999", MN_ERR_FORMAT, "model.vocab['ll']");
  expect_edit_error("\"l l\"", "\"l z z\"", MN_ERR_FORMAT, "model.merges[0]: 'l z z' is not two");
  expect_edit_error("\"l l\"", "\"ll\"", MN_ERR_FORMAT, "model.merges[0]: 'll' is not two");
  expect_edit_error("\"h e\"", "\"h q\"", MN_ERR_FORMAT,
                    "model.merges[1]: 'hq' is not in model.vocab");
  expect_edit_error("\"h e\"", "\"h \xe4\xbd\xa0\"", MN_ERR_FORMAT,
                    "model.merges[1]: '\xe4\xbd\xa0'");
  expect_edit_error("\"h e\"", "[\"h\"]", MN_ERR_FORMAT, "model.merges[1]: expected");
  expect_edit_error("\"h e\"", "7", MN_ERR_FORMAT, "model.merges[1]: expected");
  expect_edit_error("\"fuse_unk\":false", "\"fuse_unk\":1", MN_ERR_FORMAT,
                    "model.fuse_unk: expected true or false");
  expect_edit_error("\"unk_token\":null", "\"unk_token\":5", MN_ERR_FORMAT, "model.unk_token");
  expect_edit_error("\"added_tokens\":[]", "\"added_tokens\":[{\"id\":1}]", MN_ERR_FORMAT,
                    "added_tokens[0].content: missing");
  expect_edit_error("\"added_tokens\":[]", "\"added_tokens\":[{\"id\":-4,\"content\":\"x\"}]",
                    MN_ERR_FORMAT, "added_tokens[0].id: the id must be");
  expect_edit_error("\"added_tokens\":[]", "\"added_tokens\":{}", MN_ERR_FORMAT,
                    "added_tokens: not an array");
  expect_edit_error(BYTE_LEVEL, "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"\\\\p{N}\"}}",
                    MN_ERR_FORMAT, "pre_tokenizer.behavior: missing or unknown");
  expect_edit_error(BYTE_LEVEL, "{\"type\":\"Sequence\"}", MN_ERR_FORMAT,
                    "pre_tokenizer.pretokenizers: missing");
}

Test(tokenizer, load_errors_unsupported) {
  expect_edit_error("\"normalizer\":null", "\"normalizer\":{\"type\":\"NFC\"}", MN_ERR_UNSUPPORTED,
                    "normalizer: type 'NFC' is not supported");
  expect_edit_error(BYTE_LEVEL, "{\"type\":\"Whitespace\"}", MN_ERR_UNSUPPORTED,
                    "pre_tokenizer: type 'Whitespace' is not supported");
  expect_edit_error(BYTE_LEVEL, "null", MN_ERR_UNSUPPORTED, "pre_tokenizer: null");
  expect_edit_error(BYTE_LEVEL, "{\"type\":\"Digits\"}", MN_ERR_UNSUPPORTED, "no ByteLevel");
  expect_edit_error(BYTE_LEVEL,
                    "{\"type\":\"Sequence\",\"pretokenizers\":[" BYTE_LEVEL
                    ",{\"type\":\"Digits\"}]}",
                    MN_ERR_UNSUPPORTED, "pre_tokenizer.pretokenizers[1]: 'Digits' after ByteLevel");
  expect_edit_error(BYTE_LEVEL,
                    "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{"
                    "\"Regex\":\"\\\\w+\"},\"behavior\":\"Isolated\",\"invert\":false}," BYTE_LEVEL
                    "]}",
                    MN_ERR_UNSUPPORTED, "pre_tokenizer.pretokenizers[0].pattern: regex '\\w+'");
  expect_edit_error("\"type\":\"BPE\"", "\"type\":\"WordPiece\"", MN_ERR_UNSUPPORTED,
                    "model.type 'WordPiece' is not supported");
  expect_edit_error("\"byte_fallback\":false", "\"byte_fallback\":true", MN_ERR_UNSUPPORTED,
                    "model.byte_fallback");
  expect_edit_error("\"dropout\":null", "\"dropout\":0.1", MN_ERR_UNSUPPORTED, "model.dropout");
  expect_edit_error("\"continuing_subword_prefix\":null", "\"continuing_subword_prefix\":\"##\"",
                    MN_ERR_UNSUPPORTED, "model.continuing_subword_prefix");
  expect_edit_error("\"decoder\":{\"type\":\"ByteLevel\"", "\"decoder\":{\"type\":\"WordPiece\"",
                    MN_ERR_UNSUPPORTED, "decoder: type 'WordPiece'");
  expect_edit_error("\"version\":\"1.0\"", "\"version\":\"2.0\"", MN_ERR_UNSUPPORTED, "version");
  expect_edit_error("\"added_tokens\":[]",
                    "\"added_tokens\":[{\"id\":300,\"content\":\"<x>\",\"single_word\":true}]",
                    MN_ERR_UNSUPPORTED, "added_tokens[0] ('<x>'): single_word");
}

Test(tokenizer, unicode_tables) {
  cr_assert(mn_unicode_is_letter('a') && mn_unicode_is_letter(0xE9) &&
            mn_unicode_is_letter(0x4F60));
  cr_assert(!mn_unicode_is_letter('1') && !mn_unicode_is_letter(0x1F600) &&
            !mn_unicode_is_letter(0x301));
  cr_assert(mn_unicode_is_number('7') && mn_unicode_is_number(0xBD) &&
            mn_unicode_is_number(0x216B));
  cr_assert(!mn_unicode_is_number('x') && !mn_unicode_is_number(MN_UTF8_INVALID));
  cr_assert(mn_unicode_is_space(0x3000) && mn_unicode_is_space(0x85) &&
            !mn_unicode_is_space(0x200B));
  /* probed from the package, "tokenizers X.Y.Z" */
  const char *version = mn_unicode_version();
  cr_assert(strncmp(version, "tokenizers ", 11) == 0 && version[11] >= '0' && version[11] <= '9' &&
                strspn(version + 11, "0123456789.") == strlen(version + 11),
            "version \"%s\"", version);
  /* letters and numbers of Unicode 15 and later: Kawi U+11F04 and digit U+11F50, CJK extensions
   * H U+31350 and I U+2EBF0, the Garay digit U+10D40 (16) */
  cr_assert(mn_unicode_is_letter(0x11F04) && mn_unicode_is_letter(0x31350) &&
            mn_unicode_is_letter(0x2EBF0));
  cr_assert(mn_unicode_is_number(0x11F50) && mn_unicode_is_numeric(0x11F50) &&
            mn_unicode_is_number(0x10D40) && mn_unicode_is_numeric(0x10D40));
  /* Rust's is_numeric knows U+11DE0..U+11DE9 (Tolong Siki digits) and U+16FF4..U+16FF6 of
   * Unicode 17, the regex engine's \p{N} does not (tokenizers 0.23.3) */
  cr_assert(mn_unicode_is_numeric(0x11DE0) && mn_unicode_is_numeric(0x11DE9) &&
            mn_unicode_is_numeric(0x16FF4) && !mn_unicode_is_number(0x11DE0) &&
            !mn_unicode_is_letter(0x11DE0));
  cr_assert(mn_unicode_is_numeric('7') && !mn_unicode_is_numeric('x') &&
            !mn_unicode_is_numeric(0xE9) && !mn_unicode_is_numeric(MN_UTF8_INVALID));
  /* letters, numbers and space are disjoint (classify() in tokenizer_regex.c relies on it), so
   * are letters, numeric and space, and White_Space has its 25 code points */
  size_t spaces = 0;
  for (uint32_t c = 0; c <= 0x10FFFF; c++) {
    bool letter = mn_unicode_is_letter(c), number = mn_unicode_is_number(c);
    bool numeric = mn_unicode_is_numeric(c), space = mn_unicode_is_space(c);
    cr_assert(letter + number + space <= 1 && letter + numeric + space <= 1, "U+%04X", (unsigned)c);
    spaces += space;
  }
  cr_assert_eq(spaces, 25);
  uint32_t cp;
  const unsigned char overlong[] = {0xC0, 0xAF}, surrogate[] = {0xED, 0xA0, 0x80};
  cr_assert(mn_utf8_next(overlong, 2, 0, &cp) == 1 && cp == MN_UTF8_INVALID);
  cr_assert(mn_utf8_next(surrogate, 3, 0, &cp) == 1 && cp == MN_UTF8_INVALID);
}
