/* safetensors dtypes and UTF-8 validation (the f32 <-> f16/bf16 conversions: host/half.c). */
#include <string.h>

#include "io/safetensors_internal.h"

/* `order` is the declaration order of the reference's Dtype enum, which its writer sorts by
 * (descending) so that files are byte-identical to the Python package's. The sub-byte types
 * are listed so that a file using them gets a precise message rather than "unknown". */
static const mn_st_dtype_desc DTYPES[] = {
    {"BOOL", 1, 0},    {"F4", 0, 1},          {"F6_E2M3", 0, 2},      {"F6_E3M2", 0, 3},
    {"U8", 1, 4},      {"I8", 1, 5},          {"F8_E5M2", 1, 6},      {"F8_E4M3", 1, 7},
    {"F8_E8M0", 1, 8}, {"F8_E4M3FNUZ", 1, 9}, {"F8_E5M2FNUZ", 1, 10}, {"I16", 2, 11},
    {"U16", 2, 12},    {"F16", 2, 13},        {"BF16", 2, 14},        {"I32", 4, 15},
    {"U32", 4, 16},    {"F32", 4, 17},        {"C64", 8, 18},         {"F64", 8, 19},
    {"I64", 8, 20},    {"U64", 8, 21},
};

const mn_st_dtype_desc *mn_st_dtype_find(const char *name) {
  if (!name) return NULL;
  for (size_t i = 0; i < sizeof DTYPES / sizeof DTYPES[0]; i++)
    if (strcmp(DTYPES[i].name, name) == 0) return &DTYPES[i];
  return NULL;
}

size_t mn_st_dtype_size(const char *dtype) {
  const mn_st_dtype_desc *d = mn_st_dtype_find(dtype);
  return d ? d->size : 0;
}

/* ---------------------------------------------------------------- UTF-8 */

static bool is_continuation(unsigned char c) { return (c & 0xC0) == 0x80; }

size_t mn_st_utf8_seq(const unsigned char *s, size_t avail) {
  if (avail == 0) return 0;
  unsigned char c = s[0];
  if (c < 0x80) return 1;
  size_t len;
  unsigned char lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    if (c == 0xE0) lo = 0xA0; /* overlong */
    if (c == 0xED) hi = 0x9F; /* UTF-16 surrogates */
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    if (c == 0xF0) lo = 0x90; /* overlong */
    if (c == 0xF4) hi = 0x8F; /* beyond U+10FFFF */
  } else {
    return 0;
  }
  if (avail < len || s[1] < lo || s[1] > hi) return 0;
  for (size_t i = 2; i < len; i++)
    if (!is_continuation(s[i])) return 0;
  return len;
}

bool mn_st_utf8_valid(const char *s) {
  const unsigned char *p = (const unsigned char *)s;
  size_t left = strlen(s);
  while (left > 0) {
    size_t n = mn_st_utf8_seq(p, left);
    if (n == 0) return false;
    p += n;
    left -= n;
  }
  return true;
}
