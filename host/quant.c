/* The quantized weight formats (host/quant.h). The GGML formats follow ggml's reference
 * quantizers (quantize_row_*_ref), which gguf-py's numpy code reproduces bit for bit: scale
 * from the block's extreme, its reciprocal (0 for an all-zero block), then a truncating
 * conversion of x * id + offset (Q4_0, Q4_1) or round-half-away (Q8_0). */
#include "host/quant.h"

#include <float.h>
#include <math.h>
#include <string.h>

#include "host/half.h"

bool mn_quant_group_ok(mn_quant q, int group_size) {
  if (q == MN_QUANT_AFFINE_INT8 || q == MN_QUANT_AFFINE_INT4)
    return group_size == 32 || group_size == 64 || group_size == 128;
  return true;
}

bool mn_quant_block(mn_quant q, int group_size, size_t *block, size_t *bytes) {
  switch (q) {
  case MN_QUANT_Q8_0: *block = MN_GGML_QK, *bytes = sizeof(mn_block_q8_0); return true;
  case MN_QUANT_Q4_0: *block = MN_GGML_QK, *bytes = sizeof(mn_block_q4_0); return true;
  case MN_QUANT_Q4_1: *block = MN_GGML_QK, *bytes = sizeof(mn_block_q4_1); return true;
  case MN_QUANT_AFFINE_INT8:
  case MN_QUANT_AFFINE_INT4:
    if (!mn_quant_group_ok(q, group_size)) return false;
    *block = (size_t)group_size;
    *bytes = 4 + (q == MN_QUANT_AFFINE_INT8 ? (size_t)group_size : (size_t)group_size / 2);
    return true;
  default: return false;
  }
}

const char *mn_quant_name(mn_quant q) {
  switch (q) {
  case MN_QUANT_NONE: return "none";
  case MN_QUANT_Q8_0: return "q8_0";
  case MN_QUANT_Q4_0: return "q4_0";
  case MN_QUANT_Q4_1: return "q4_1";
  case MN_QUANT_AFFINE_INT8: return "int8";
  case MN_QUANT_AFFINE_INT4: return "int4";
  default: return "?";
  }
}

size_t mn_quant_row_bytes(mn_quant q, int group_size, int64_t in) {
  size_t block = 0, bytes = 0;
  if (!mn_quant_block(q, group_size, &block, &bytes)) return 0;
  return (size_t)in / block * bytes;
}

size_t mn_quant_row_words(mn_quant q, int group_size, int64_t in) {
  return (mn_quant_row_bytes(q, group_size, in) + 3) / 4;
}

static void q8_0(const float *x, mn_block_q8_0 *y) {
  float amax = 0.0f;
  for (int j = 0; j < MN_GGML_QK; j++)
    amax = fmaxf(amax, fabsf(x[j]));
  float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
  y->d = mn_f32_to_f16(d);
  for (int j = 0; j < MN_GGML_QK; j++)
    y->qs[j] = (int8_t)roundf(x[j] * id);
}

/* ggml keeps the signed value of largest magnitude (the first one on a tie) so that it maps
 * exactly to -8. */
static void q4_0(const float *x, mn_block_q4_0 *y) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < MN_GGML_QK; j++)
    if (amax < fabsf(x[j])) {
      amax = fabsf(x[j]);
      max = x[j];
    }
  float d = max / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
  y->d = mn_f32_to_f16(d);
  for (int j = 0; j < MN_GGML_QK / 2; j++) {
    int lo = (int8_t)(x[j] * id + 8.5f), hi = (int8_t)(x[j + MN_GGML_QK / 2] * id + 8.5f);
    y->qs[j] = (uint8_t)((lo < 15 ? lo : 15) | (hi < 15 ? hi : 15) << 4);
  }
}

static void q4_1(const float *x, mn_block_q4_1 *y) {
  float min = FLT_MAX, max = -FLT_MAX;
  for (int j = 0; j < MN_GGML_QK; j++) {
    min = x[j] < min ? x[j] : min;
    max = x[j] > max ? x[j] : max;
  }
  float d = (max - min) / 15.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
  y->d = mn_f32_to_f16(d);
  y->m = mn_f32_to_f16(min);
  for (int j = 0; j < MN_GGML_QK / 2; j++) {
    int lo = (int8_t)((x[j] - min) * id + 0.5f);
    int hi = (int8_t)((x[j + MN_GGML_QK / 2] - min) * id + 0.5f);
    y->qs[j] = (uint8_t)((lo < 15 ? lo : 15) | (hi < 15 ? hi : 15) << 4);
  }
}

/* Codes come from the stored (f16) scale and bias, so that rounding them does not shift every
 * weight of the group by the same error. */
static void affine(const float *x, int g, int bits, unsigned char *y) {
  float min = x[0], max = x[0];
  for (int j = 1; j < g; j++) {
    min = x[j] < min ? x[j] : min;
    max = x[j] > max ? x[j] : max;
  }
  int levels = (1 << bits) - 1;
  uint16_t hs = mn_f32_to_f16((max - min) / (float)levels), hb = mn_f32_to_f16(min);
  memcpy(y, &hs, 2);
  memcpy(y + 2, &hb, 2);
  float s = mn_f16_to_f32(hs), b = mn_f16_to_f32(hb);
  unsigned char *qs = y + 4;
  if (bits == 4) memset(qs, 0, (size_t)g / 2);
  for (int j = 0; j < g; j++) {
    float v = s != 0.0f ? roundf((x[j] - b) / s) : 0.0f;
    int q = v < 0 ? 0 : v > (float)levels ? levels : (int)v;
    if (bits == 8)
      qs[j] = (unsigned char)q;
    else
      qs[j % (g / 2)] |= (unsigned char)(j < g / 2 ? q : q << 4);
  }
}

void mn_quantize(mn_quant q, int group_size, const float *src, size_t rows, size_t cols,
                 void *dst) {
  size_t block = 0, bytes = 0;
  if (!mn_quant_block(q, group_size, &block, &bytes)) return;
  size_t stride = mn_quant_row_words(q, group_size, (int64_t)cols) * 4;
  memset(dst, 0, rows * stride);
  for (size_t i = 0; i < rows * cols / block; i++, src += block) {
    unsigned char *out =
        (unsigned char *)dst + i / (cols / block) * stride + i % (cols / block) * bytes;
    switch (q) {
    case MN_QUANT_Q8_0: {
      mn_block_q8_0 b;
      q8_0(src, &b);
      memcpy(out, &b, sizeof b);
      break;
    }
    case MN_QUANT_Q4_0: {
      mn_block_q4_0 b;
      q4_0(src, &b);
      memcpy(out, &b, sizeof b);
      break;
    }
    case MN_QUANT_Q4_1: {
      mn_block_q4_1 b;
      q4_1(src, &b);
      memcpy(out, &b, sizeof b);
      break;
    }
    case MN_QUANT_AFFINE_INT8: affine(src, group_size, 8, out); break;
    default: affine(src, group_size, 4, out); break;
    }
  }
}

/* volatile: the product rounds to f32 before the sum, as the CUDA kernel computes it. */
static void affine_row(const unsigned char *row, int g, int bits, float *dst, size_t cols) {
  size_t bytes = 4 + (size_t)(bits == 8 ? g : g / 2);
  for (size_t c = 0; c < cols; c += (size_t)g, row += bytes) {
    uint16_t hs, hb;
    memcpy(&hs, row, 2);
    memcpy(&hb, row + 2, 2);
    float s = mn_f16_to_f32(hs), b = mn_f16_to_f32(hb);
    const unsigned char *qs = row + 4;
    for (int j = 0; j < g; j++) {
      int code = bits == 8 ? qs[j] : j < g / 2 ? qs[j] & 0x0F : qs[j - g / 2] >> 4;
      volatile float p = s * (float)code;
      dst[c + (size_t)j] = p + b;
    }
  }
}

static void ggml_q8_0(const unsigned char *src, float *dst, uint64_t nblocks) {
  for (uint64_t b = 0; b < nblocks; b++, src += sizeof(mn_block_q8_0), dst += MN_GGML_QK) {
    mn_block_q8_0 blk;
    memcpy(&blk, src, sizeof blk);
    float d = mn_f16_to_f32(blk.d);
    for (int j = 0; j < MN_GGML_QK; j++)
      dst[j] = (float)blk.qs[j] * d;
  }
}

static void ggml_q4_0(const unsigned char *src, float *dst, uint64_t nblocks) {
  for (uint64_t b = 0; b < nblocks; b++, src += sizeof(mn_block_q4_0), dst += MN_GGML_QK) {
    mn_block_q4_0 blk;
    memcpy(&blk, src, sizeof blk);
    float d = mn_f16_to_f32(blk.d);
    for (int j = 0; j < MN_GGML_QK / 2; j++) {
      dst[j] = d * (float)((blk.qs[j] & 0x0F) - 8);
      dst[j + MN_GGML_QK / 2] = d * (float)((blk.qs[j] >> 4) - 8);
    }
  }
}

/* volatile keeps the product rounded to f32 before the sum: a fused multiply-add would round
 * once and differ from gguf-py in the last bit. */
static void ggml_q4_1(const unsigned char *src, float *dst, uint64_t nblocks) {
  for (uint64_t b = 0; b < nblocks; b++, src += sizeof(mn_block_q4_1), dst += MN_GGML_QK) {
    mn_block_q4_1 blk;
    memcpy(&blk, src, sizeof blk);
    float d = mn_f16_to_f32(blk.d), m = mn_f16_to_f32(blk.m);
    for (int j = 0; j < MN_GGML_QK / 2; j++) {
      volatile float lo = d * (float)(blk.qs[j] & 0x0F), hi = d * (float)(blk.qs[j] >> 4);
      dst[j] = lo + m;
      dst[j + MN_GGML_QK / 2] = hi + m;
    }
  }
}

void mn_dequantize_row(mn_quant q, int group_size, const void *row, float *dst, size_t cols) {
  switch (q) {
  case MN_QUANT_Q8_0: ggml_q8_0(row, dst, cols / MN_GGML_QK); break;
  case MN_QUANT_Q4_0: ggml_q4_0(row, dst, cols / MN_GGML_QK); break;
  case MN_QUANT_Q4_1: ggml_q4_1(row, dst, cols / MN_GGML_QK); break;
  case MN_QUANT_AFFINE_INT8: affine_row(row, group_size, 8, dst, cols); break;
  case MN_QUANT_AFFINE_INT4: affine_row(row, group_size, 4, dst, cols); break;
  default: break;
  }
}
