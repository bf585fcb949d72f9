/* Recomputation of cheap activations for the backward, as torch.compile's partitioner does:
 * an activation (a pointwise op that is not a fused group: GELU, SwiGLU, ...) whose value a
 * reader needs long after the forward made it (the next product's weight gradient, in the
 * backward) is computed again right before that reader, from inputs the backward keeps alive
 * anyway (GELU's pre-activation for gelu_grad, SwiGLU's gate and up for its gradients). Its
 * buffer is then free between the forward and the backward, where the arena peaks: for GPT-2
 * 124M at batch 16 x 1024 in bf16 the twelve [16384, 3072] GELU outputs, 1152 MiB, for one
 * GELU launch per layer more. The recomputed node is the same op on the same inputs, so it
 * stores the same bits and training does not change.
 *
 * A GELU whose gradient's kernel reads the same input (gelu_grad_bgrad, optimizer/bgrad.h) is
 * recomputed by that kernel instead, as its value 2: the backward then reads the
 * pre-activation once for both and launches one kernel fewer, provided that kernel reads none
 * of the GELU's late readers (it would have to run after itself). MN_OPTIMIZE_OFF=
 * recompute_gelu_in_gradient keeps the GELU a kernel of its own, MN_OPTIMIZE_OFF=recompute
 * recomputes nothing (A/B runs, optimizer/pass_switch.h).
 *
 * Only for low-precision sessions (mn_optimize_graph_limits decides): there the bar is
 * PyTorch's autocast peak; fp32 sessions keep their step times. */
#ifndef MN_OPTIMIZER_RECOMPUTE_H
#define MN_OPTIMIZER_RECOMPUTE_H

#include "host/graph.h"

/* A reader at least this many nodes after the one before it (or after the value itself) is a
 * late reader: between them the value would hold its buffer for nothing. */
#define MN_RECOMPUTE_MIN_GAP 32

/* Rewrites *g, which must be in topological order (replaced by a new, toposorted graph when
 * anything changed); *made counts the values recomputed. MN_ERR_OUT_OF_MEMORY on allocation
 * failure. */
mn_status mn_recompute_activations(mn_graph **g, size_t *made);

#endif
