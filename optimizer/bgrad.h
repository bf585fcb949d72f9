/* Bias gradients as a second output of the weight-gradient product: the last pass of the
 * optimizer's full stage, after extraction and pointwise fusion.
 *
 * A linear layer's backward graph reads dy twice: matmul_at for the weight gradient and
 * sum_rows for the bias gradient. cuBLASLt's BGRADA/BGRADB epilogues reduce the operand's
 * columns while the product reads it, so the pair becomes one matmul_at_bgrad (variant 0
 * when dy is operand a, 1 when it is b) whose second value, the column sums, is read through
 * an extra_output node standing where the sum_rows stood.
 *
 * A pair is formed when sum_rows(d) and matmul_at read the same node d, F32, the sum being
 * d's last dim long ([N] or [1, N]), and the product does not depend on the sum (through
 * its other operand, or through pairs formed before: the two nodes become one, so a path
 * from the sum to the product would close a cycle). Each product takes one sum and each
 * sum one product. The pass runs after fusion, whose input therefore never holds a
 * multi-output node, and the e-graph never sees its result (optimize.c keeps such graphs
 * as they are). See docs/optimizer.md.
 *
 * A sum of a gelu_grad's value is paired with that gelu_grad first (gelu_grad_bgrad, value 1
 * its column sums): the kernel that makes the gradient sums it as it goes, and the weight
 * gradient's product runs without the epilogue, which slowed GPT-2's [768, 3072] products
 * from about 590 to 470 TFLOP/s on an H100 (docs/performance.md). MN_OPTIMIZE_OFF=gelu_bgrad turns
 * this pairing off. A sum of a matmul_drelu's value is paired with it the same way
 * (matmul_drelu_bgrad): where the product is cuBLASLt's, the ReLU gradient's kernel sums the
 * columns, and the weight gradient's product that follows needs no bias-gradient kernel after
 * it (an MLP's first layer, where it ended the step's longest chain). MN_OPTIMIZE_OFF=drelu_bgrad
 * turns it off. */
#ifndef MN_OPTIMIZER_BGRAD_H
#define MN_OPTIMIZER_BGRAD_H

#include "host/graph.h"

/* Replaces *g (topological) by the graph with every such pair fused, freeing the old graph;
 * *made counts the pairs. Outputs keep their order and count: an output that was a sum_rows
 * is now its extra_output node, one that was the product its matmul_at_bgrad (both computed
 * nodes of their own, so each gradient keeps its buffer); named leaves stay. On failure
 * (out of memory) *g is left as it was. */
mn_status mn_fuse_bias_gradients(mn_graph **g, size_t *made);

#endif
