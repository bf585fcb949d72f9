/* Conformance with the HF tokenizers package: scripts/fixtures/tokenizer_conformance.py trains a
 * byte-level BPE tokenizer of each style with the package, saves its tokenizer.json and encodes
 * hard cases and random strings (2000 by default; MN_TOKENIZER_CONFORMANCE_COUNT and
 * MN_TOKENIZER_CONFORMANCE_SEED change them). Here the same file is loaded and every string must
 * encode to the same ids; those ids must decode to the package's decoding (which replaces
 * invalid UTF-8 by U+FFFD where ours keeps the bytes, so ours is compared after the same
 * replacement) and, where every byte has a token, back to the string itself. Skipped without
 * python3 and the tokenizers package. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L /* popen, getline */
#endif
#include <stdio.h>
#include <stdlib.h>

#include "tests/support/mn_test.h"
#include "tests/support/tmp_dir.h"

static void require_python(void) {
  if (system("python3 -c 'import tokenizers' >/dev/null 2>&1") != 0)
    cr_skip_test("python tokenizers package not available");
}

/* The script lies next to this file's folder: <root>/tests/this.c -> <root>/scripts/... */
static void script_path(char *out, size_t size) {
  const char *me = __FILE__;
  const char *tail = strstr(me, "tests/test_tokenizer_conformance.c");
  cr_assert_not_null(tail, "cannot locate the source tree from %s", me);
  snprintf(out, size, "%.*sscripts/fixtures/tokenizer_conformance.py", (int)(tail - me), me);
}

static void run_script(const mn_tmp_dir *d, const char *style, long count, long seed) {
  char script[512], cmd[1024];
  script_path(script, sizeof script);
  snprintf(cmd, sizeof cmd, "python3 '%s' '%s' --styles %s --count %ld --seed %ld 2>&1", script,
           d->path, style, count, seed);
  FILE *p = popen(cmd, "r");
  cr_assert_not_null(p, "popen failed");
  char out[4096];
  size_t n = fread(out, 1, sizeof out - 1, p);
  out[n] = '\0';
  int status = pclose(p);
  cr_assert_eq(status, 0, "`%s` failed (status %d):\n%s", cmd, status, out);
}

static int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  cr_assert_fail("bad hex digit '%c'", c);
  return 0;
}

/* Decodes `len` hex digits into a fresh NUL-terminated buffer. */
static char *unhex(const char *h, size_t len, size_t *n) {
  cr_assert_eq(len % 2, 0);
  char *b = malloc(len / 2 + 1);
  for (size_t i = 0; i < len / 2; i++)
    b[i] = (char)(hex_digit(h[2 * i]) << 4 | hex_digit(h[2 * i + 1]));
  b[len / 2] = '\0';
  *n = len / 2;
  return b;
}

static size_t parse_ids(const char *s, uint32_t *ids, size_t cap) {
  size_t n = 0;
  while (*s && *s != '\t') {
    char *end;
    unsigned long v = strtoul(s, &end, 10);
    cr_assert(end != s && n < cap, "bad id list at \"%.20s\"", s);
    ids[n++] = (uint32_t)v;
    s = *end == ',' ? end + 1 : end;
  }
  return n;
}

/* Shows a text with control and non-ASCII bytes escaped. */
static void show(char *out, size_t size, const char *s, size_t n) {
  size_t k = 0;
  for (size_t i = 0; i < n && k + 5 < size; i++) {
    unsigned char c = (unsigned char)s[i];
    k += (size_t)snprintf(out + k, size - k, c >= 0x20 && c < 0x7f ? "%c" : "\\x%02x", c);
  }
  out[k] = '\0';
}

static void show_ids(char *out, size_t size, const uint32_t *ids, size_t n) {
  size_t k = 0;
  out[0] = '\0';
  for (size_t i = 0; i < n && k + 12 < size; i++)
    k += (size_t)snprintf(out + k, size - k, "%s%u", i ? "," : "", ids[i]);
}

/* Length of the maximal start of a UTF-8 sequence at s[0] that is valid so far (at least 1):
 * what one U+FFFD replaces in Rust's String::from_utf8_lossy (Unicode's "maximal subpart"). */
static size_t valid_prefix(const unsigned char *s, size_t n, bool *complete) {
  unsigned c = s[0];
  size_t len = c < 0x80                 ? 1
               : c >= 0xC2 && c <= 0xDF ? 2
               : c >= 0xE0 && c <= 0xEF ? 3
               : c >= 0xF0 && c <= 0xF4 ? 4
                                        : 0;
  *complete = len == 1;
  if (len <= 1) return 1;
  unsigned lo = c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80;
  unsigned hi = c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;
  size_t k = 1;
  for (; k < len && k < n; k++) {
    if (s[k] < (k == 1 ? lo : 0x80) || s[k] > (k == 1 ? hi : 0xBF)) break;
  }
  *complete = k == len;
  return k;
}

/* s with every maximal invalid subpart replaced by U+FFFD, in a fresh buffer. */
static char *lossy(const char *text, size_t n, size_t *out_len) {
  const unsigned char *s = (const unsigned char *)text;
  char *out = malloc(3 * n + 1);
  size_t k = 0;
  for (size_t i = 0; i < n;) {
    bool complete;
    size_t len = valid_prefix(s + i, n - i, &complete);
    if (complete) {
      memcpy(out + k, s + i, len);
      k += len;
    } else {
      memcpy(out + k, "\xef\xbf\xbd", 3);
      k += 3;
    }
    i += len;
  }
  *out_len = k;
  return out;
}

static void conform(const char *style) {
  require_python();
  const char *env = getenv("MN_TOKENIZER_CONFORMANCE_COUNT");
  long count = env ? atol(env) : 2000;
  env = getenv("MN_TOKENIZER_CONFORMANCE_SEED");
  long seed = env ? atol(env) : 20240611;
  bool full_alphabet = strcmp(style, "sparse") != 0;
  mn_tmp_dir d = mn_tmp_dir_make("mn_tok_conf");
  run_script(&d, style, count, seed);

  char name[64];
  snprintf(name, sizeof name, "%s.json", style);
  mn_tokenizer *t = NULL;
  mn_status st = mn_tokenizer_load(mn_tmp_path(&d, name), &t);
  cr_assert_eq(st, MN_OK, "load: %s", mn_last_error());

  snprintf(name, sizeof name, "%s.tsv", style);
  FILE *f = fopen(mn_tmp_path(&d, name), "r");
  cr_assert_not_null(f);
  enum { CAP = 1 << 14 };
  uint32_t *want = malloc(CAP * sizeof *want), *got = malloc(CAP * sizeof *got);
  char *line = NULL, *dec = malloc(1 << 16);
  size_t line_cap = 0, strings = 0, id_diffs = 0, decode_diffs = 0, ids_total = 0, trips = 0;
  while (getline(&line, &line_cap, f) > 0) {
    char *tab1 = strchr(line, '\t'), *tab2 = tab1 ? strchr(tab1 + 1, '\t') : NULL;
    cr_assert(tab1 && tab2, "bad line %zu", strings + 1);
    size_t text_len, want_dec_len, n_got, dec_len;
    char *text = unhex(line, (size_t)(tab1 - line), &text_len);
    char *want_dec = unhex(tab2 + 1, strcspn(tab2 + 1, "\n"), &want_dec_len);
    size_t n_want = parse_ids(tab1 + 1, want, CAP);
    strings++;
    ids_total += n_want;

    st = mn_tokenizer_encode(t, text, text_len, got, CAP, &n_got);
    cr_assert_eq(st, MN_OK, "encode: %s", mn_last_error());
    if (n_got != n_want || memcmp(got, want, n_want * sizeof *want) != 0) {
      if (id_diffs++ < 8) {
        char shown[512], a[512], b[512];
        show(shown, sizeof shown, text, text_len);
        show_ids(a, sizeof a, got, n_got);
        show_ids(b, sizeof b, want, n_want);
        cr_log_error("%s: \"%s\"\n  got  [%s]\n  want [%s]", style, shown, a, b);
      }
    }
    st = mn_tokenizer_decode(t, want, n_want, dec, 1 << 16, &dec_len);
    cr_assert_eq(st, MN_OK, "decode: %s", mn_last_error());
    size_t fixed_len;
    char *fixed = lossy(dec, dec_len, &fixed_len);
    if (fixed_len != want_dec_len || memcmp(fixed, want_dec, fixed_len) != 0) {
      if (decode_diffs++ < 8) {
        char a[512], b[512];
        show(a, sizeof a, fixed, fixed_len);
        show(b, sizeof b, want_dec, want_dec_len);
        cr_log_error("%s: decode\n  got  \"%s\"\n  want \"%s\"", style, a, b);
      }
    }
    free(fixed);
    if (full_alphabet) {
      cr_assert(dec_len == text_len && memcmp(dec, text, text_len) == 0,
                "%s: decode(encode(x)) != x for string %zu", style, strings);
      trips++;
    }
    free(text);
    free(want_dec);
  }
  fclose(f);
  free(line);
  free(want);
  free(got);
  free(dec);
  mn_tokenizer_free(t);
  mn_tmp_dir_remove(&d);
  cr_log_info("%s: %zu strings (%zu ids) compared: %zu differ in ids, %zu in decoding; %zu "
              "exact round trips",
              style, strings, ids_total, id_diffs, decode_diffs, trips);
  cr_assert_geq(strings, (size_t)count, "only %zu strings", strings);
  cr_assert_eq(id_diffs, 0, "%s: %zu of %zu strings encode differently", style, id_diffs, strings);
  cr_assert_eq(decode_diffs, 0, "%s: %zu of %zu decodings differ", style, decode_diffs, strings);
}

/* ByteLevel with the GPT-2 regex; merges in the older "a b" string form. */
Test(tokenizer_conformance, gpt2) { conform("gpt2"); }
/* Sequence[Digits(individual_digits), ByteLevel], as SmolLM2's tokenizer.json. */
Test(tokenizer_conformance, smollm2) { conform("smollm2"); }
/* Sequence[Split(Llama-3 regex), ByteLevel(use_regex false)], ignore_merges. */
Test(tokenizer_conformance, llama3) { conform("llama3"); }
/* Sequence[Split(Qwen2 regex), ByteLevel(use_regex false)]. */
Test(tokenizer_conformance, qwen2) { conform("qwen2"); }
/* Split(\p{N}) then ByteLevel(add_prefix_space), unknown bytes as a fused <unk>, added tokens
 * with lstrip/rstrip and a normalized one. */
Test(tokenizer_conformance, sparse) { conform("sparse"); }
