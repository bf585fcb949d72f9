/* The 16-bit float formats as bits: f32 -> bf16 and f32 -> f16 round to nearest, ties to
 * even; values beyond the target's range become infinities; NaN stays NaN (quiet, sign kept).
 * The reverse directions are exact. */
#ifndef MN_HOST_HALF_H
#define MN_HOST_HALF_H

#include <stdint.h>

uint16_t mn_f32_to_bf16(float f);
uint16_t mn_f32_to_f16(float f);
float mn_bf16_to_f32(uint16_t h);
float mn_f16_to_f32(uint16_t h);

#endif
