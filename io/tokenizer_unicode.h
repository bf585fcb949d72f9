/* Unicode character classes for the tokenizer's pre-tokenizers, as the HF tokenizers package
 * classifies them: letters, numbers and numeric from generated tables (io/unicode_tables.c,
 * probed from the package by scripts/gen_unicode_tables.py) and White_Space, plus strict UTF-8
 * decoding. */
#ifndef MN_IO_TOKENIZER_UNICODE_H
#define MN_IO_TOKENIZER_UNICODE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

bool mn_unicode_is_letter(uint32_t cp);  /* \p{L} of the package's regex engine (Oniguruma) */
bool mn_unicode_is_number(uint32_t cp);  /* \p{N} of the regex engine: the split regexes */
bool mn_unicode_is_numeric(uint32_t cp); /* Rust's char::is_numeric: the Digits pre-tokenizer */
/* The package the tables were probed from, e.g. "tokenizers 0.23.3". The regex engine and Rust
 * may carry different Unicode versions, so numbers and numeric can differ. */
const char *mn_unicode_version(void);

/* Not a code point: what mn_utf8_next reports for a byte that does not start a valid sequence. */
#define MN_UTF8_INVALID 0xFFFFFFFFu

/* Decodes the character at s[i] (i < n) into *cp and returns its length in bytes. Overlong
 * forms, surrogates, code points above U+10FFFF and truncated sequences are invalid: each such
 * byte is a character of its own (length 1, *cp = MN_UTF8_INVALID), so arbitrary bytes can be
 * tokenized and decoded back unchanged. */
static inline size_t mn_utf8_next(const unsigned char *s, size_t n, size_t i, uint32_t *cp) {
  unsigned c = s[i];
  *cp = MN_UTF8_INVALID;
  if (c < 0x80) {
    *cp = c;
    return 1;
  }
  size_t len;
  uint32_t v, min;
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2, v = c & 0x1F, min = 0x80;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3, v = c & 0x0F, min = 0x800;
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4, v = c & 0x07, min = 0x10000;
  } else {
    return 1;
  }
  if (n - i < len) return 1;
  for (size_t k = 1; k < len; k++) {
    if ((s[i + k] & 0xC0) != 0x80) return 1;
    v = v << 6 | (s[i + k] & 0x3F);
  }
  if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 1;
  *cp = v;
  return len;
}

/* White_Space, which is both Oniguruma's \s and Rust's char::is_whitespace (checked against the
 * package by scripts/gen_unicode_tables.py, whose SPACES must list the same code points). */
static inline bool mn_unicode_is_space(uint32_t cp) {
  if (cp < 0x80) return cp == ' ' || (cp >= 0x09 && cp <= 0x0D);
  return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
         cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

/* Writes cp as UTF-8 into out (room for 4 bytes) and returns the length. */
static inline size_t mn_utf8_put(uint32_t cp, unsigned char *out) {
  if (cp < 0x80) {
    out[0] = (unsigned char)cp;
    return 1;
  }
  if (cp < 0x800) {
    out[0] = (unsigned char)(0xC0 | cp >> 6);
    out[1] = (unsigned char)(0x80 | (cp & 0x3F));
    return 2;
  }
  if (cp < 0x10000) {
    out[0] = (unsigned char)(0xE0 | cp >> 12);
    out[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    out[2] = (unsigned char)(0x80 | (cp & 0x3F));
    return 3;
  }
  out[0] = (unsigned char)(0xF0 | cp >> 18);
  out[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
  out[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
  out[3] = (unsigned char)(0x80 | (cp & 0x3F));
  return 4;
}

#endif
