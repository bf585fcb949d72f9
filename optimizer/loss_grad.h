/* The sparse cross-entropy loss and its gradient in one pass over the logits: a
 * sparse_cross_entropy_loss and the sparse_cross_entropy_grad of the same logits and labels
 * become one sparse_cross_entropy_loss_grad, whose value is the loss and whose extra value 1,
 * read through the extra_output node that takes the gradient's place, is the gradient (ops.h).
 * The kernels then read the logits once instead of twice (a language model's [B, T, V], the
 * largest activation of the step), and the gradient may overwrite them (host/memplan.c).
 *
 * The gradient is computed where the loss is, so its upstream value dy must not depend on the
 * loss (it is the loss seed in a training graph); a pair where it does is left alone. Only for
 * low-precision sessions (mn_optimize_graph_limits decides), like the other step-shaping passes:
 * fp32 sessions keep their plans. */
#ifndef MN_OPTIMIZER_LOSS_GRAD_H
#define MN_OPTIMIZER_LOSS_GRAD_H

#include "host/graph.h"

/* Rewrites *g (replaced by a new, toposorted graph when anything changed); *made counts the
 * pairs fused. MN_ERR_OUT_OF_MEMORY on allocation failure. */
mn_status mn_fuse_loss_gradients(mn_graph **g, size_t *made);

#endif
