/* The attention backward reads what the forward already computed: each attention_grad_q or
 * attention_grad_kv (or packed_attention_grad_q / _kv, whose positions must match too) over the
 * same q, k and v as a forward attention becomes its _saved form, which also reads the forward's
 * output y and the row statistics the forward now writes as its extra value 1 (ops.h). Its kernels then skip the statistics pre-pass (a second pass
 * over every score) and take delta = dy . y per query row from one cheap pass over dy and y.
 *
 * Only for low-precision sessions (mn_optimize_graph_limits decides): there y is the stored
 * value the probabilities' products also round to, as FlashAttention does, while fp32
 * sessions keep delta = sum P dP, which gives exact zeros where a query sees one key. */
#ifndef MN_OPTIMIZER_ATTENTION_STATS_H
#define MN_OPTIMIZER_ATTENTION_STATS_H

#include "host/graph.h"

/* Rewrites *g (replaced by a new graph when anything changed, toposorted); *made counts the
 * backward nodes that now read saved statistics. MN_ERR_OUT_OF_MEMORY on allocation failure. */
mn_status mn_attention_save_stats(mn_graph **g, size_t *made);

#endif
