/* f32 <-> bf16 and f16 bits, the conversions every file format and quantized block uses. */
#include "host/half.h"

#include <math.h>
#include <string.h>

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
