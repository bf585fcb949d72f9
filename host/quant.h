/* Quantized weight formats of mn_matmul_quant: the matrix W [out, in] is stored row by row,
 * each row a run of blocks along `in` padded with zero bytes to whole U32 words, so that the
 * node is U32 [out, row words] and a row starts on a word.
 *   Q8_0, Q4_0, Q4_1: GGML's blocks of 32 (below; GGUF files hold the same), quantized by ggml's
 * reference rules. affine int8 / int4 of group g (MLX style): per group a block of f16 scale, f16
 * bias, then the codes q (int8: g bytes; int4: g / 2 bytes, element j in the low nibble of byte j
 * and element j + g/2 in its high nibble, as GGML's 4-bit blocks), w = scale * q + bias with bias
 * the group's minimum and scale (max - min) / (2^bits - 1). */
#ifndef MN_HOST_QUANT_H
#define MN_HOST_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "meganeura.h"

/* GGML's block layouts (blocks of 32 values, little-endian). */
#define MN_GGML_QK 32
typedef struct mn_block_q8_0 {
  uint16_t d; /* f16 scale */
  int8_t qs[MN_GGML_QK];
} mn_block_q8_0;
typedef struct mn_block_q4_0 {
  uint16_t d;
  uint8_t qs[MN_GGML_QK / 2]; /* element j in the low nibble of qs[j], j + 16 in the high one */
} mn_block_q4_0;
typedef struct mn_block_q4_1 {
  uint16_t d, m;
  uint8_t qs[MN_GGML_QK / 2];
} mn_block_q4_1;
_Static_assert(sizeof(mn_block_q8_0) == 34 && sizeof(mn_block_q4_0) == 18 &&
                   sizeof(mn_block_q4_1) == 20,
               "GGML block layouts have no padding");

/* Weights per block and bytes per block of a format (group_size read by the affine ones);
 * false for MN_QUANT_NONE or an unknown format. */
bool mn_quant_block(mn_quant q, int group_size, size_t *block, size_t *bytes);
/* Whether group_size suits the format: 32, 64 or 128 for the affine formats; the GGML formats
 * ignore it. */
bool mn_quant_group_ok(mn_quant q, int group_size);
/* "q8_0", "int4", ... ; "?" for an unknown value. */
const char *mn_quant_name(mn_quant q);
/* Bytes of the blocks of one row of `in` weights (in a multiple of the block), and U32 words
 * of a row once padded. */
size_t mn_quant_row_bytes(mn_quant q, int group_size, int64_t in);
size_t mn_quant_row_words(mn_quant q, int group_size, int64_t in);
/* Quantizes rows x cols values (row-major, cols a multiple of the block) into dst, which holds
 * rows * mn_quant_row_words words; the padding is zeroed. */
void mn_quantize(mn_quant q, int group_size, const float *src, size_t rows, size_t cols, void *dst);
/* One quantized row of `cols` weights back to f32. */
void mn_dequantize_row(mn_quant q, int group_size, const void *row, float *dst, size_t cols);

#endif
