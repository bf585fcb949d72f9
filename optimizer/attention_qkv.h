/* Attention over one fused projection reads it in place: where q, k and v are the column blocks
 * q | k | v of one tensor X [.., T, (H + 2 KVH) hd] (GPT-2's c_attn, sliced by slice_last), the
 * training step copied each block out (three slice_last forward), took dK | dV apart (two more),
 * and built X's gradient as three zero-padded slice_last_grad tensors and their sum. This pass
 * makes the forward a qkv_causal_attention of X, and dQ, dK | dV, their slices and the sum one
 * qkv_attention_grad_saved, which writes dQ | dK | dV straight into X's layout (ops.h). The
 * values are the same ones, bit for bit: the kernels read and write the same elements through
 * wider rows, and the sum only added zeros.
 *
 * It runs after the statistics pass (attention_stats.h: the _saved gradients only) on graphs the
 * pointwise fusion has seen, and matches when, for one causal attention with statistics:
 * - its q, k and v are exactly those three slices of one computed X (not a parameter or input,
 *   which keep fp32 storage), read by nothing but the attention,
 *   its dQ (attention_grad_q_saved) and its dK | dV (attention_grad_kv_saved);
 * - dK | dV is read only by the two slices that take dK and dV apart, and dQ, dK and dV each
 *   only by the slice_last_grad that places it at its block of X;
 * - those three are read only by one node that sums them: a fused node of two adds over exactly
 *   them, or two add nodes;
 * - the head dim is a multiple of 16 up to 128 (the CUDA kernels that read wider rows are the
 *   16-bit pipelined ones, attention_pipe.cuh; hence only low-precision plans run this pass).
 * None of the nodes it removes may be a graph output. MN_OPTIMIZE_OFF=attention_qkv (a comma-
 * separated list of pass names) turns it off, for comparisons. */
#ifndef MN_OPTIMIZER_ATTENTION_QKV_H
#define MN_OPTIMIZER_ATTENTION_QKV_H

#include "host/graph.h"

/* Rewrites *g (replaced by a new, toposorted graph when anything changed); *made counts the
 * attentions that now read their projection in place. MN_ERR_OUT_OF_MEMORY on allocation
 * failure (*g unchanged). */
mn_status mn_attention_read_qkv_in_place(mn_graph **g, size_t *made);

#endif
