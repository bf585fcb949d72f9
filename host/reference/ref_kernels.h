/* Reference (CPU) kernels: one function per op, named mn_ref_<ENUM>, computing exactly
 * what API.md's "Op semantics" says, in plain C with reductions accumulated in double.
 * The table in ref_table.c is generated from the op list, so an op without a kernel
 * fails to link. */
#ifndef MN_HOST_REF_KERNELS_H
#define MN_HOST_REF_KERNELS_H

#include <stdio.h>

#include "host/graph.h"

typedef struct mn_ref_ctx {
  const mn_graph *g;
  mn_node id;
  const mn_node_rec *node;
  void *out;                             /* node's buffer (for in-place ops, also in[1]) */
  void *extra_out[MN_MAX_EXTRA_OUTPUTS]; /* multi-output nodes: the buffers of values 1.. */
  const void *in[MN_MAX_INPUTS];         /* inputs' buffers, in node->inputs order */
  char *error;                           /* runtime failures (bad indices) write a message here */
  uint64_t micro_step;  /* the session's micro-step counter (MN_OPF_RANDOM ops, host/ops.h) */
  mn_dtype out_storage; /* how the node's buffer stores its value (F32 unless low precision) */
  size_t error_size;
} mn_ref_ctx;

typedef mn_status (*mn_ref_kernel)(const mn_ref_ctx *c);

static inline const mn_tensor_type *mn_ref_in_type(const mn_ref_ctx *c, int i) {
  return &c->g->nodes[c->node->inputs[i]].type;
}
static inline const float *mn_ref_in_f32(const mn_ref_ctx *c, int i) {
  return (const float *)c->in[i];
}
static inline const uint32_t *mn_ref_in_u32(const mn_ref_ctx *c, int i) {
  return (const uint32_t *)c->in[i];
}
static inline float *mn_ref_out_f32(const mn_ref_ctx *c) { return (float *)c->out; }
static inline size_t mn_ref_numel(const mn_ref_ctx *c) {
  return (size_t)mn_tensor_type_numel(&c->node->type);
}

/* Records a runtime failure of this node ("node 5 (embedding): ..."); returns s. */
mn_status mn_ref_fail(const mn_ref_ctx *c, mn_status s, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define MN_REF_DECLARE(e, name, arity, flags) mn_status mn_ref_##e(const mn_ref_ctx *c);
MN_OP_LIST(MN_REF_DECLARE)
#undef MN_REF_DECLARE

extern const mn_ref_kernel mn_ref_kernels[MN_OP_COUNT];

#endif
