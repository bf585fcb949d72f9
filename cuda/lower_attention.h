/* Attention lowerings shared with the decode layers (lower_decode_layer.c). */
#ifndef MN_CUDA_LOWER_ATTENTION_H
#define MN_CUDA_LOWER_ATTENTION_H

#include "cuda/emit.h"

/* Decode attention (kernels/attention_decode.cuh) of q [batch, H hd] over caches [batch, max_seq,
 * KVH hd], with the heads of c's node attrs and `split` cache rows a block (32, 64, 128 or 256):
 * the scratch of the split kernel's partial results, from byte `at` (a multiple of 256) on,
 * named by parts[0..2] (maxima, sums, outputs) as mn_attn_decode_combine reads them; then the
 * launch of the split kernel itself. With merge (an fp32 output [batch, H hd] and batch x H
 * counters that an earlier kernel of the same stream zeroed), the kernel merges the splits into
 * the output itself and reports a bad kv_len; without, mn_attn_decode_combine has to. */
mn_status mn_cu_decode_attention_scratch(const mn_cu_op_ctx *c, int64_t batch, int64_t max_seq,
                                         int split, size_t at, mn_cu_arg parts[3]);
mn_status mn_cu_decode_attention_parts(const mn_cu_op_ctx *c, mn_cu_arg q, mn_cu_arg k_cache,
                                       mn_cu_arg v_cache, mn_cu_arg kv_len, int64_t batch,
                                       int64_t max_seq, int split, const mn_cu_arg parts[3],
                                       const mn_cu_arg *merge);

#endif
