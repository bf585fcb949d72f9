/* A pointwise gradient with the column sums of its value (lower_reduce.c): the bias
 * gradient of the layer whose activation it differentiates, summed by the kernel that makes
 * the gradient instead of by a kernel after the weight gradient's product. */
#ifndef MN_CUDA_LOWER_COLSUM_H
#define MN_CUDA_LOWER_COLSUM_H

#include "cuda/emit.h"

/* The node's value [rows, N] as pointwise op `op` (an mn_pw_op of two inputs) of x and dy,
 * its column sums (of the value as stored) into node `sums` ([N] or [1, N]) and, where `act`
 * is not MN_NO_NODE, gelu(x) into node `act`. dy may be the node's own value. */
mn_status mn_cu_pointwise_colsum(const mn_cu_op_ctx *c, int op, mn_cu_arg x, mn_cu_arg dy,
                                 mn_node sums, mn_node act);

#endif
