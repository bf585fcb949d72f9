/* The cost model that extraction minimizes, in bytes of memory traffic: a node costs the
 * bytes it reads and writes, plus its arithmetic expressed as the bytes that move in the
 * same time, plus a fixed price per kernel launch. Leaves cost nothing (they are buffers
 * the session fills, not work); an extra_output node costs the bytes its producer writes
 * for it. */
#ifndef MN_OPTIMIZER_COST_H
#define MN_OPTIMIZER_COST_H

#include "graph.h"

/* One launch: about 5 us of overhead, priced as what 3 TB/s of HBM moves meanwhile. */
#define MN_COST_LAUNCH_BYTES 15.0e6
/* Bytes per flop: bandwidth (3 TB/s) over dense fp32 throughput (60 TFLOP/s). */
#define MN_COST_BYTES_PER_FLOP (3.0 / 60.0)

/* Cost of one op producing `out` from inputs of types ins[0..n). */
double mn_cost_op(mn_op op, const mn_tensor_type *out, const mn_tensor_type *const *ins, int n);

/* Sum of mn_cost_op over every node of g (an estimate for reports). */
double mn_cost_graph(const mn_graph *g);

#endif
