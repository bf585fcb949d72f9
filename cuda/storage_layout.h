/* How the CUDA backend lays out a plan's values in device memory, decided without a device:
 * the padded rows of wide low-precision logits, 2-byte buffers, and the weights'
 * low-precision copy. The session build applies these; tools that report memory
 * (benchmarks/memory_lm.c) call the same functions, so their numbers are the backend's.
 * Nothing here includes CUDA headers. */
#ifndef MN_CUDA_STORAGE_LAYOUT_H
#define MN_CUDA_STORAGE_LAYOUT_H

#include <stdbool.h>
#include <stddef.h>

#include "host/plan.h"

/* The cuBLASLt workspace every session with a product holds (matmul_lt.c). */
#define MN_LT_WORKSPACE_BYTES (32u << 20)

/* Pads the rows of wide logits and their gradient (mn_buffer_desc.pitch) to 16-byte multiples
 * when every op that touches them reads the pitch. Before the arena is planned. Returns whether
 * any buffer got a pitch. */
bool mn_cu_pitch_rows(mn_plan *p);

/* A plan (mn_plan_set_precision done) as the backend stores it: padded rows, then every
 * low-precision buffer at 2 bytes a value and the arena planned again (mn_plan_store_narrow);
 * a small plan (at most 64 MiB of buffers) then gives every buffer memory of its own. A large
 * fp32 plan without padded rows is left as it is. */
mn_status mn_cu_size_plan(mn_plan *p);

/* Whether buffer d lies in the update block (the parameters the optimizer updates). */
bool mn_cu_in_update_block(const mn_plan *p, const mn_buffer_desc *d);

/* The weights' low-precision copy: the parameters of the update block at half their byte
 * offset in it, the other parameters after them. Fills shadow_at[buffer] (may be NULL;
 * SIZE_MAX for a buffer that is not a parameter) and returns the bytes of the copy. */
size_t mn_cu_low_shadow_layout(const mn_plan *p, size_t *shadow_at);

#endif
