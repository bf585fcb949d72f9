/* GGML tensor types: their names and block sizes (for validating every tensor's extent, even of
 * types we cannot convert), and the conversion to f32 of F32, F16, BF16, Q8_0, Q4_0 and Q4_1.
 * The formulas are the formats' definitions, computed in the order gguf-py's dequantize uses
 * (one f32 product, then one f32 sum for Q4_1), so both give the same bits. */
#include <stdio.h>
#include <string.h>

#include "host/error.h"
#include "io/gguf.h"
#include "io/safetensors.h"

typedef struct type_desc {
  const char *name;
  uint32_t block, bytes; /* 0: the id is unused (a removed type) */
} type_desc;

/* ggml_type ids as gguf-py's GGMLQuantizationType numbers them. */
static const type_desc types[] = {
    [0] = {"F32", 1, 4},         [1] = {"F16", 1, 2},         [2] = {"Q4_0", 32, 18},
    [3] = {"Q4_1", 32, 20},      [6] = {"Q5_0", 32, 22},      [7] = {"Q5_1", 32, 24},
    [8] = {"Q8_0", 32, 34},      [9] = {"Q8_1", 32, 40},      [10] = {"Q2_K", 256, 84},
    [11] = {"Q3_K", 256, 110},   [12] = {"Q4_K", 256, 144},   [13] = {"Q5_K", 256, 176},
    [14] = {"Q6_K", 256, 210},   [15] = {"Q8_K", 256, 292},   [16] = {"IQ2_XXS", 256, 66},
    [17] = {"IQ2_XS", 256, 74},  [18] = {"IQ3_XXS", 256, 98}, [19] = {"IQ1_S", 256, 50},
    [20] = {"IQ4_NL", 32, 18},   [21] = {"IQ3_S", 256, 110},  [22] = {"IQ2_S", 256, 82},
    [23] = {"IQ4_XS", 256, 136}, [24] = {"I8", 1, 1},         [25] = {"I16", 1, 2},
    [26] = {"I32", 1, 4},        [27] = {"I64", 1, 8},        [28] = {"F64", 1, 8},
    [29] = {"IQ1_M", 256, 56},   [30] = {"BF16", 1, 2},       [34] = {"TQ1_0", 256, 54},
    [35] = {"TQ2_0", 256, 66},   [39] = {"MXFP4", 32, 17},    [40] = {"NVFP4", 64, 36},
    [41] = {"Q1_0", 128, 18},
};
#define NTYPES (sizeof types / sizeof types[0])

const char *mn_ggml_type_name(uint32_t type) {
  if (type < NTYPES && types[type].name) return types[type].name;
  static _Thread_local char buf[24];
  snprintf(buf, sizeof buf, "type %u", type);
  return buf;
}

bool mn_ggml_type_size(uint32_t type, uint64_t *block, uint64_t *bytes) {
  if (type >= NTYPES || !types[type].block) return false;
  *block = types[type].block;
  *bytes = types[type].bytes;
  return true;
}

bool mn_ggml_type_convertible(uint32_t type) {
  return type == MN_GGML_F32 || type == MN_GGML_F16 || type == MN_GGML_BF16 ||
         type == MN_GGML_Q8_0 || type == MN_GGML_Q4_0 || type == MN_GGML_Q4_1;
}

void mn_ggml_to_f32(uint32_t type, const void *src, float *dst, uint64_t n) {
  const unsigned char *s = src;
  switch (type) {
  case MN_GGML_F32: memcpy(dst, s, n * sizeof *dst); break;
  case MN_GGML_F16:
  case MN_GGML_BF16:
    for (uint64_t i = 0; i < n; i++) {
      uint16_t h;
      memcpy(&h, s + 2 * i, 2);
      dst[i] = type == MN_GGML_F16 ? mn_f16_to_f32(h) : mn_bf16_to_f32(h);
    }
    break;
  case MN_GGML_Q8_0: mn_dequantize_row(MN_QUANT_Q8_0, 0, s, dst, n); break;
  case MN_GGML_Q4_0: mn_dequantize_row(MN_QUANT_Q4_0, 0, s, dst, n); break;
  case MN_GGML_Q4_1: mn_dequantize_row(MN_QUANT_Q4_1, 0, s, dst, n); break;
  default: break;
  }
}

mn_status mn_gguf_check_convertible(const mn_gguf *g, const mn_gguf_tensor *t) {
  if (mn_ggml_type_convertible(t->type)) return MN_OK;
  return mn_fail(MN_ERR_UNSUPPORTED,
                 "%s: tensor \"%s\" has type %s; supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1",
                 mn_gguf_label(g), t->name, mn_ggml_type_name(t->type));
}

mn_status mn_gguf_read_f32(const mn_gguf *g, const mn_gguf_tensor *t, float *out, uint64_t n) {
  mn_status st = mn_gguf_check_convertible(g, t);
  if (st != MN_OK) return st;
  if (n != t->numel)
    return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: tensor \"%s\" has %llu values, not %llu",
                   mn_gguf_label(g), t->name, (unsigned long long)t->numel, (unsigned long long)n);
  mn_ggml_to_f32(t->type, t->data, out, n);
  return MN_OK;
}
