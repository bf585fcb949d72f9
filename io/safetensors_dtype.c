/* safetensors dtypes, UTF-8 validation, and the f32 <-> f16/bf16 conversions. */
#include <math.h>
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

/* ---------------------------------------------------------------- f16 / bf16 */

static uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static float bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* Shifts x right by `shift` (1..31) bits, rounding to nearest with ties to even. */
static uint32_t shift_round_even(uint32_t x, unsigned shift) {
  uint32_t rest = x & ((1u << shift) - 1);
  uint32_t half = 1u << (shift - 1);
  uint32_t r = x >> shift;
  if (rest > half || (rest == half && (r & 1))) r++;
  return r;
}

uint16_t mn_f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  /* Setting the quiet bit keeps a NaN whose payload lies only in the dropped bits a NaN. */
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x0040u);
  /* A carry out of the mantissa correctly bumps the exponent, up to infinity. */
  return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1)) >> 16);
}

float mn_bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

uint16_t mn_f32_to_f16(float f) {
  uint32_t u = f32_bits(f);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return (uint16_t)(sign | 0x7E00u | ((a >> 13) & 0x3FFu));
  /* 65520 is halfway between the largest half (65504) and 2^16; ties go to the even
   * neighbour, which is infinity. */
  if (a >= 0x477FF000u) return (uint16_t)(sign | 0x7C00u);
  unsigned exp = a >> 23;
  if (exp >= 113) /* normal half: rebias the exponent from 127 to 15 */
    return (uint16_t)(sign | shift_round_even(a - (112u << 23), 13));
  if (exp < 102) return sign; /* below half the smallest subnormal, 2^-25: rounds to zero */
  /* Subnormal half: the value in units of 2^-24 is mantissa * 2^(exp - 126). A round up to
   * 0x400 gives the smallest normal, which is its correct encoding. */
  uint32_t mant = (a & 0x7FFFFFu) | 0x800000u;
  return (uint16_t)(sign | shift_round_even(mant, 126 - exp));
}

float mn_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t mant = h & 0x3FFu;
  if (exp == 0x1F) return bits_f32(sign | 0x7F800000u | (mant << 13));
  if (exp != 0) return bits_f32(sign | ((exp + 112) << 23) | (mant << 13));
  float v = ldexpf((float)mant, -24); /* zero or subnormal, exact in f32 */
  return sign ? -v : v;
}
