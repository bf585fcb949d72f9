#include "host/plan.h"

#include <stdlib.h>

#include "host/decode_layer.h"
#include "host/error.h"
#include "host/memplan.h"
#include "host/plan_check.h"

/* is_output: 0 not an output, 1 a user output, 2 a gradient. */
static mn_buffer_role role_of(const mn_graph *g, mn_node id, const unsigned char *is_output) {
  switch (g->nodes[id].op) {
  case MN_OP_INPUT: return MN_BUF_INPUT;
  case MN_OP_PARAMETER: return MN_BUF_PARAMETER;
  case MN_OP_CONSTANT: return MN_BUF_CONSTANT;
  default:
    return is_output[id] == 2 ? MN_BUF_GRADIENT : is_output[id] ? MN_BUF_OUTPUT : MN_BUF_ACTIVATION;
  }
}

/* Every extra value of a multi-output node read by exactly one extra_output node. */
static mn_status fill_extra_outputs(mn_plan *p) {
  const mn_graph *g = p->graph;
  size_t slots = g->num_nodes * MN_MAX_EXTRA_OUTPUTS;
  if (!(p->extra_outputs = malloc((slots ? slots : 1) * sizeof *p->extra_outputs)))
    return mn_fail(MN_ERR_OUT_OF_MEMORY, "mn_plan_build: out of memory");
  for (size_t i = 0; i < slots; i++)
    p->extra_outputs[i] = MN_NO_NODE;
  for (size_t i = 0; i < g->num_nodes; i++) {
    const mn_node_rec *n = &g->nodes[i];
    if (n->op != MN_OP_EXTRA_OUTPUT) continue;
    int k = n->attrs.variant;
    if (n->num_inputs != 1 || k < 1 || k > mn_node_num_extra_outputs(&g->nodes[n->inputs[0]]))
      return mn_fail(MN_ERR_STATE, "mn_plan_build: node %zu reads no extra value of its input", i);
    if (!mn_plan_extra_type_ok(g, &g->nodes[n->inputs[0]], n))
      return mn_fail(MN_ERR_STATE,
                     "mn_plan_build: node %zu does not have the type of value %d of %u", i, k,
                     n->inputs[0]);
    mn_node *slot = &p->extra_outputs[(size_t)n->inputs[0] * MN_MAX_EXTRA_OUTPUTS + (size_t)k - 1];
    if (*slot != MN_NO_NODE)
      return mn_fail(MN_ERR_STATE, "mn_plan_build: value %d of node %u is read twice", k,
                     n->inputs[0]);
    *slot = (mn_node)i;
  }
  for (size_t i = 0; i < g->num_nodes; i++)
    for (int k = 1; k <= mn_node_num_extra_outputs(&g->nodes[i]); k++)
      if (p->extra_outputs[i * MN_MAX_EXTRA_OUTPUTS + (size_t)k - 1] == MN_NO_NODE)
        return mn_fail(MN_ERR_STATE, "mn_plan_build: value %d of node %zu has no extra_output", k,
                       i);
  return MN_OK;
}

static mn_status bind_layout(mn_plan *p, const mn_param_layout *layout) {
  mn_param_layout empty = {0};
  if (!mn_param_layout_copy(&p->layout, layout ? layout : &empty))
    return mn_fail(MN_ERR_OUT_OF_MEMORY, "mn_plan_build: out of memory");
  char why[256];
  if (!mn_param_layout_bind(&p->layout, p->graph, why, sizeof why))
    return mn_fail(MN_ERR_STATE, "mn_plan_build: derived parameters: %s", why);
  return MN_OK;
}

static mn_status fill_params(mn_plan *p, const int32_t *grad_output) {
  const mn_graph *g = p->graph;
  for (size_t i = 0; i < g->num_nodes; i++)
    p->num_params += g->nodes[i].op == MN_OP_PARAMETER;
  p->params = calloc(p->num_params ? p->num_params : 1, sizeof *p->params);
  if (!p->params) return mn_fail(MN_ERR_OUT_OF_MEMORY, "mn_plan_build: out of memory");
  size_t k = 0;
  for (size_t i = 0; i < g->num_nodes; i++) {
    if (g->nodes[i].op != MN_OP_PARAMETER) continue;
    p->params[k].param = (mn_node)i;
    p->params[k++].grad = grad_output[i] >= 0 ? g->outputs[grad_output[i]] : MN_NO_NODE;
  }
  return MN_OK;
}

void mn_plan_free(mn_plan *p) {
  if (!p) return;
  mn_graph_free(p->graph);
  free(p->dispatches);
  free(p->buffers);
  free(p->node_buffer);
  free(p->extra_outputs);
  free(p->external);
  free(p->params);
  mn_param_layout_clear(&p->layout);
  free(p);
}

mn_status mn_plan_build(mn_graph *g, size_t num_user_outputs, const int32_t *grad_output,
                        const mn_param_layout *layout, mn_plan **out) {
  *out = NULL;
  mn_plan *p = calloc(1, sizeof *p);
  if (!p) {
    mn_graph_free(g);
    return mn_fail(MN_ERR_OUT_OF_MEMORY, "mn_plan_build: out of memory");
  }
  p->graph = g;
  size_t n = g->num_nodes;
  unsigned char *is_output = calloc(n ? n : 1, 1);
  p->dispatches = malloc((n ? n : 1) * sizeof *p->dispatches);
  p->buffers = malloc((n ? n : 1) * sizeof *p->buffers);
  p->node_buffer = malloc((n ? n : 1) * sizeof *p->node_buffer);
  if (!is_output || !p->dispatches || !p->buffers || !p->node_buffer) {
    free(is_output);
    mn_plan_free(p);
    return mn_fail(MN_ERR_OUT_OF_MEMORY, "mn_plan_build: out of memory (%zu nodes)", n);
  }
  p->num_user_outputs = num_user_outputs;
  for (size_t i = 0; i < g->num_outputs; i++)
    is_output[g->outputs[i]] = i < num_user_outputs ? 1 : 2;
  mn_status extra = mn_plan_check_optimizer_ops(g);
  if (extra == MN_OK) extra = fill_extra_outputs(p);
  if (extra == MN_OK) extra = bind_layout(p, layout);
  if (extra != MN_OK) {
    free(is_output);
    mn_plan_free(p);
    return extra;
  }
  if (grad_output) {
    mn_status st = fill_params(p, grad_output);
    if (st != MN_OK) {
      free(is_output);
      mn_plan_free(p);
      return st;
    }
  }

  for (size_t i = 0; i < n; i++) {
    const mn_node_rec *node = &g->nodes[i];
    if (!(mn_op_flags(node->op) & (MN_OPF_LEAF | MN_OPF_EXTRA_OUTPUT)))
      p->dispatches[p->num_dispatches++].node = (mn_node)i;
    if (mn_op_flags(node->op) & MN_OPF_INPLACE) {
      /* The updated tensor is input 1 (the cache); its buffer becomes this node's. */
      p->node_buffer[i] = p->node_buffer[node->inputs[1]];
      continue;
    }
    mn_buffer_desc *b = &p->buffers[p->num_buffers];
    b->bytes = mn_tensor_type_bytes(&node->type);
    b->node = (mn_node)i;
    b->role = role_of(g, (mn_node)i, is_output);
    b->storage = node->type.dtype;
    b->pitch = 0;
    p->node_buffer[i] = (uint32_t)p->num_buffers++;
  }
  free(is_output);
  mn_status st = mn_memplan_layout(p, MN_LAYOUT_PLANNED);
  if (st != MN_OK) {
    mn_plan_free(p);
    return st;
  }

  p->loss_scale = mn_graph_find_leaf(g, MN_OP_INPUT, MN_LOSS_SCALE_INPUT);
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

bool mn_plan_input_persists(const mn_plan *p, uint32_t b) {
  const mn_graph *g = p->graph;
  for (size_t i = 0; i < g->num_nodes; i++) {
    const mn_node_rec *n = &g->nodes[i];
    if ((mn_op_flags(n->op) & MN_OPF_INPLACE) && p->node_buffer[i] == b) return true;
    if (n->op == MN_OP_MATMUL_QUANT && p->node_buffer[n->inputs[1]] == b) return true;
    for (int k = 0; k < n->num_inputs; k++)
      if ((mn_decode_layer_writes(n, k) ||
           (mn_decode_layer_weight(n, k) && g->nodes[n->inputs[k]].type.dtype == MN_U32)) &&
          p->node_buffer[n->inputs[k]] == b)
        return true;
  }
  return false;
}
