/* The execution plan: plain data that every backend executes. A toposorted graph, the
 * ordered dispatches, and the buffers that hold node values with their arena offsets. */
#ifndef MN_HOST_PLAN_H
#define MN_HOST_PLAN_H

#include "host/graph.h"
#include "host/param_layout.h"

typedef enum mn_buffer_role {
  MN_BUF_INPUT,      /* set by the user, persists across steps */
  MN_BUF_PARAMETER,  /* trainable weights, persist */
  MN_BUF_CONSTANT,   /* filled once when the session is created */
  MN_BUF_ACTIVATION, /* intermediate value, may share memory with others */
  MN_BUF_OUTPUT,     /* graph output, readable after wait */
  MN_BUF_GRADIENT,   /* dLoss/dparameter */
} mn_buffer_role;

typedef struct mn_buffer_desc {
  size_t bytes;
  size_t offset; /* into the session arena */
  mn_node node;  /* the node whose value it first holds */
  mn_buffer_role role;
  /* How the value is stored (host/storage.h): its node's dtype, or MN_BF16 / MN_F16 for a
   * value a mixed-precision session keeps in low precision. bytes and offset are still those
   * of the node's dtype: the CPU backend stores a low-precision value as the float it rounds
   * to. */
  mn_dtype storage;
  /* Values per row as stored, when a backend pads the rows (0: dense). The CUDA backend pads
   * the wide rows of logits so that matrix products read aligned rows. */
  int64_t pitch;
} mn_buffer_desc;

/* The name of the input that seeds the loss gradient with the loss scale (F16 training). */
#define MN_LOSS_SCALE_INPUT "#loss_scale"

typedef struct mn_dispatch {
  mn_node node; /* the node the dispatch computes */
} mn_dispatch;

/* A trainable parameter and the node holding its gradient (MN_NO_NODE when the loss
 * does not depend on it: the optimizer then leaves it alone, as PyTorch does). */
typedef struct mn_param_slot {
  mn_node param;
  mn_node grad;
} mn_param_slot;

struct mn_plan {
  mn_graph *graph; /* toposorted; owned */
  mn_dispatch *dispatches;
  size_t num_dispatches;
  mn_buffer_desc *buffers;
  size_t num_buffers;
  uint32_t *node_buffer; /* buffer index of every node of graph */
  /* extra_outputs[node * MN_MAX_EXTRA_OUTPUTS + k - 1]: the extra_output node holding value k
   * of a multi-output node, else MN_NO_NODE */
  mn_node *extra_outputs;
  /* Per buffer (NULL: none): memory the session reads where another session keeps it (shared
   * parameters, KV caches and quantized weights), which the layout gives no arena space. */
  bool *external;
  size_t arena_bytes;
  mn_node loss;            /* output 0 when it is an F32 [1] node, else MN_NO_NODE */
  size_t num_user_outputs; /* graph outputs [0, n) are the user's; the rest gradients */
  mn_param_slot *params;   /* training plans: every parameter, in node order */
  size_t num_params;
  /* The parameters that have a gradient lie back to back from update_params_offset, and
   * their gradients in the same order and spacing from update_grads_offset, so one
   * optimizer kernel updates them as a single flat vector of update_bytes. */
  size_t update_params_offset, update_grads_offset, update_bytes;
  /* Where the user's parameters lie in derived parameters, bound to graph (param_layout.h). */
  mn_param_layout layout;
  mn_precision precision; /* which the storage types were chosen for (host/storage.h) */
  /* The [1] input named MN_LOSS_SCALE_INPUT that seeds the loss gradient of an F16 training
   * plan (the backend writes the loss scale there every step), else MN_NO_NODE. */
  mn_node loss_scale;
};
typedef struct mn_plan mn_plan;

/* Lowers a toposorted graph (which the plan takes ownership of, even on failure) to a
 * plan. Every non-leaf node becomes one dispatch, except extra_output nodes, whose value
 * the dispatch of their input writes; every node gets a buffer, except in-place ops, which
 * share the buffer of the tensor they update. A multi-output node must have exactly one
 * extra_output node for each of its extra values (MN_ERR_STATE otherwise). Offsets come from
 * the memory planner (memplan.h): activations share memory by lifetime. For training,
 * grad_output[i] is the index of the graph output holding the gradient of parameter node i (-1:
 * none) and outputs from num_user_outputs on are gradients; inference passes grad_output = NULL and
 * all outputs are the user's. layout (NULL: none) is the table of the derived parameters of g,
 * copied into the plan and bound to g; a table that does not describe g is MN_ERR_STATE. */
mn_status mn_plan_build(mn_graph *g, size_t num_user_outputs, const int32_t *grad_output,
                        const mn_param_layout *layout, mn_plan **out);
void mn_plan_free(mn_plan *p);

/* Whether input buffer b keeps its contents from one step to the next with no copy from the
 * host: an in-place op or a decode layer updates it (KV caches, the decode state), or it holds a quantized
 * weight's packed rows, set once and read by every step. Backends that stage inputs leave these
 * out, and only these can be shared between sessions. */
bool mn_plan_input_persists(const mn_plan *p, uint32_t b);

/* The extra_output node that holds value k (1 .. MN_MAX_EXTRA_OUTPUTS) of node id. */
static inline mn_node mn_plan_extra_output(const mn_plan *p, mn_node id, int k) {
  return p->extra_outputs[(size_t)id * MN_MAX_EXTRA_OUTPUTS + (size_t)(k - 1)];
}

/* The node holding the value that dispatch `id` may write over its input 0
 * (MN_OPF_MAY_OVERWRITE, ops.h): its own, or a multi-output op's extra value 1. */
static inline mn_node mn_plan_overwriting_value(const mn_plan *p, mn_node id) {
  return mn_node_num_extra_outputs(&p->graph->nodes[id]) ? mn_plan_extra_output(p, id, 1) : id;
}

static inline const mn_buffer_desc *mn_plan_buffer_of(const mn_plan *p, mn_node id) {
  return &p->buffers[p->node_buffer[id]];
}

/* Whether buffer d lies in the update block: a parameter that has a gradient, that gradient,
 * or an activation computed in a gradient's memory before the gradient is written (memplan.h).
 * Backends leave such an activation out when they poison buffers, which would poison the
 * gradient (it reads as zeros before the first step). */
static inline bool mn_plan_in_update_block(const mn_plan *p, const mn_buffer_desc *d) {
  return p->update_bytes && d->offset >= p->update_params_offset &&
         d->offset < p->update_grads_offset + p->update_bytes;
}

#endif
