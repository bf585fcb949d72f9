/* The execution plan: plain data that every backend executes. A toposorted graph, the
 * ordered dispatches, and the buffers that hold node values with their arena offsets. */
#ifndef MN_HOST_PLAN_H
#define MN_HOST_PLAN_H

#include "graph.h"

typedef enum mn_buffer_role {
  MN_BUF_INPUT,      /* set by the user, persists across steps */
  MN_BUF_PARAMETER,  /* trainable weights, persist */
  MN_BUF_CONSTANT,   /* filled once when the session is created */
  MN_BUF_ACTIVATION, /* intermediate value, may share memory with others */
  MN_BUF_OUTPUT,     /* graph output, readable after wait */
  MN_BUF_GRADIENT,   /* dLoss/dparameter */
  MN_BUF_OPT_STATE,  /* optimizer state (Adam moments) */
} mn_buffer_role;

typedef struct mn_buffer_desc {
  size_t bytes;
  size_t offset; /* into the session arena */
  mn_node node;  /* the node whose value it first holds, MN_NO_NODE for optimizer state */
  mn_buffer_role role;
} mn_buffer_desc;

typedef struct mn_dispatch {
  mn_node node; /* the node the dispatch computes */
} mn_dispatch;

struct mn_plan {
  mn_graph *graph; /* toposorted; owned */
  mn_dispatch *dispatches;
  size_t num_dispatches;
  mn_buffer_desc *buffers;
  size_t num_buffers;
  uint32_t *node_buffer; /* buffer index of every node of graph */
  size_t arena_bytes;
  mn_node loss; /* output 0 when it is an F32 [1] node, else MN_NO_NODE */
};
typedef struct mn_plan mn_plan;

/* Lowers a graph (which the plan takes ownership of, sorted or not) to a plan. Every
 * non-leaf node becomes one dispatch; every node gets a buffer, except in-place ops,
 * which share the buffer of the tensor they update. Buffers are aligned to 256 bytes. */
mn_status mn_plan_build(mn_graph *g, mn_plan **out);
void mn_plan_free(mn_plan *p);

static inline const mn_buffer_desc *mn_plan_buffer_of(const mn_plan *p, mn_node id) {
  return &p->buffers[p->node_buffer[id]];
}

#endif
