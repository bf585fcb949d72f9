/* A scale whose input is a matrix product that nothing else reads becomes the product's alpha:
 * matmul, matmul_bt and matmul_at multiply their result by attrs.scale when it is not 0 (ops.h),
 * which cuBLASLt does for free in its epilogue and the reference does after the product. LoRA
 * adapters are the case: (alpha / r) (x A^T) and, in the backward, (alpha / r) (dy B) were one
 * launch each per adapter. Runs last in the full stage, so that no pass that pairs a product
 * with its neighbours (epilogues, bias gradients) meets a scaled product. */
#ifndef MN_OPTIMIZER_SCALE_FOLD_H
#define MN_OPTIMIZER_SCALE_FOLD_H

#include "host/graph.h"

/* Rewrites *g (replaced by a new, toposorted graph when anything changed); *made counts the
 * scales folded. MN_ERR_OUT_OF_MEMORY on allocation failure. */
mn_status mn_fold_scales_into_products(mn_graph **g, size_t *made);

#endif
