/* The cost model that extraction minimizes, in bytes of memory traffic: a node costs the
 * bytes it reads and writes, plus its arithmetic expressed as the bytes that move in the
 * same time, plus a fixed price per kernel launch. Leaves cost nothing (they are buffers
 * the session fills, not work); an extra_output node costs the bytes its producer writes
 * for it. */
#ifndef MN_OPTIMIZER_COST_H
#define MN_OPTIMIZER_COST_H

#include "host/graph.h"

/* One launch: about 5 us of overhead, priced as what 3 TB/s of HBM moves meanwhile. */
#define MN_COST_LAUNCH_BYTES 15.0e6
/* Bytes per flop: bandwidth (3 TB/s) over dense fp32 throughput (60 TFLOP/s). */
#define MN_COST_BYTES_PER_FLOP (3.0 / 60.0)

/* cuBLASLt's DGELU epilogue runs its products at a fraction of the plain GEMM's speed: on
 * an H200 (TF32, GPT-2 124M, batch 16 x 1024) the 12 [16384,768]x[768,3072] products took
 * 7.07 ms with it against 2.57 ms plain, more than the 2.95 ms of the gelu_grad kernels it
 * saves (docs/performance.md). Its flops are priced at that ratio, so large products keep
 * the separate gelu_grad and only launch-bound ones take the epilogue. */
#define MN_COST_DGELU_SLOWDOWN 2.75

/* Cost of one op producing `out` from inputs of types ins[0..n). */
double mn_cost_op(mn_op op, const mn_tensor_type *out, const mn_tensor_type *const *ins, int n);

/* Sum of mn_cost_op over every node of g (an estimate for reports). */
double mn_cost_graph(const mn_graph *g);

#endif
