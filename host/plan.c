#include "plan.h"

#include <stdlib.h>

#include "error.h"

#define MN_BUFFER_ALIGN 256

static size_t align_up(size_t v) {
  return (v + MN_BUFFER_ALIGN - 1) / MN_BUFFER_ALIGN * MN_BUFFER_ALIGN;
}

static mn_buffer_role role_of(const mn_graph *g, mn_node id, const bool *is_output) {
  switch (g->nodes[id].op) {
  case MN_OP_INPUT: return MN_BUF_INPUT;
  case MN_OP_PARAMETER: return MN_BUF_PARAMETER;
  case MN_OP_CONSTANT: return MN_BUF_CONSTANT;
  default: return is_output[id] ? MN_BUF_OUTPUT : MN_BUF_ACTIVATION;
  }
}

void mn_plan_free(mn_plan *p) {
  if (!p) return;
  mn_graph_free(p->graph);
  free(p->dispatches);
  free(p->buffers);
  free(p->node_buffer);
  free(p);
}

mn_status mn_plan_build(mn_graph *g, mn_plan **out) {
  *out = NULL;
  mn_plan *p = calloc(1, sizeof *p);
  if (!p) {
    mn_graph_free(g);
    return mn_fail(MN_ERR_OUT_OF_MEMORY, "mn_plan_build: out of memory");
  }
  p->graph = g;
  size_t n = g->num_nodes;
  bool *is_output = calloc(n ? n : 1, sizeof *is_output);
  p->dispatches = malloc((n ? n : 1) * sizeof *p->dispatches);
  p->buffers = malloc((n ? n : 1) * sizeof *p->buffers);
  p->node_buffer = malloc((n ? n : 1) * sizeof *p->node_buffer);
  if (!is_output || !p->dispatches || !p->buffers || !p->node_buffer) {
    free(is_output);
    mn_plan_free(p);
    return mn_fail(MN_ERR_OUT_OF_MEMORY, "mn_plan_build: out of memory (%zu nodes)", n);
  }
  for (size_t i = 0; i < g->num_outputs; i++)
    is_output[g->outputs[i]] = true;

  for (size_t i = 0; i < n; i++) {
    const mn_node_rec *node = &g->nodes[i];
    if (!(mn_op_flags(node->op) & MN_OPF_LEAF))
      p->dispatches[p->num_dispatches++].node = (mn_node)i;
    if (mn_op_flags(node->op) & MN_OPF_INPLACE) {
      /* The updated tensor is input 1 (the cache); its buffer becomes this node's. */
      p->node_buffer[i] = p->node_buffer[node->inputs[1]];
      continue;
    }
    mn_buffer_desc *b = &p->buffers[p->num_buffers];
    b->bytes = mn_tensor_type_bytes(&node->type);
    b->offset = p->arena_bytes;
    b->node = (mn_node)i;
    b->role = role_of(g, (mn_node)i, is_output);
    p->arena_bytes += align_up(b->bytes);
    p->node_buffer[i] = (uint32_t)p->num_buffers++;
  }
  free(is_output);

  p->loss = MN_NO_NODE;
  if (g->num_outputs) {
    const mn_tensor_type *t = &g->nodes[g->outputs[0]].type;
    if (t->dtype == MN_F32 && t->rank == 1 && t->shape[0] == 1) p->loss = g->outputs[0];
  }
  *out = p;
  return MN_OK;
}

size_t mn_plan_num_dispatches(const mn_plan *p) { return p ? p->num_dispatches : 0; }
size_t mn_plan_num_buffers(const mn_plan *p) { return p ? p->num_buffers : 0; }
