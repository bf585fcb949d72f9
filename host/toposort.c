/* Topological sort in linear time. Rewrites may append a node that earlier nodes then
 * read, so ids are not an order; this pass makes them one. Named leaves (inputs and
 * parameters) are the session's interface and are always kept; every other node is kept
 * only when an output depends on it (all nodes are live when no outputs are set). */
#include <stdlib.h>
#include <string.h>

#include "host/error.h"
#include "host/graph.h"

enum { UNSEEN = 0, ON_STACK, DONE };

typedef struct frame {
  mn_node id;
  int next_input;
} frame;

static bool is_named_leaf(const mn_node_rec *n) {
  return n->op == MN_OP_INPUT || n->op == MN_OP_PARAMETER;
}

/* Marks everything reachable from the outputs (iteratively: graphs can be deep). */
static void mark_live(const mn_graph *g, unsigned char *live, mn_node *stack) {
  size_t top = 0;
  if (g->num_outputs == 0) {
    memset(live, 1, g->num_nodes);
    return;
  }
  for (size_t i = 0; i < g->num_outputs; i++)
    if (!live[g->outputs[i]]) live[stack[top++] = g->outputs[i]] = 1;
  while (top) {
    const mn_node_rec *n = &g->nodes[stack[--top]];
    for (int k = 0; k < n->num_inputs; k++)
      if (!live[n->inputs[k]]) live[stack[top++] = n->inputs[k]] = 1;
  }
  for (size_t i = 0; i < g->num_nodes; i++)
    if (is_named_leaf(&g->nodes[i])) live[i] = 1;
}

mn_graph *mn_graph_toposort(const mn_graph *g) {
  mn_graph *out = NULL;
  mn_graph_toposort_status(g, &out);
  return out;
}

mn_status mn_graph_toposort_status(const mn_graph *g, mn_graph **sorted) {
  *sorted = NULL;
  if (!g) return mn_fail(MN_ERR_INVALID_ARGUMENT, "mn_graph_toposort: graph is NULL");
  if (g->status != MN_OK) return mn_fail(g->status, "%s", g->error);
  mn_status st = MN_OK;
  size_t n = g->num_nodes;
  unsigned char *live = calloc(n ? n : 1, 1), *state = calloc(n ? n : 1, 1);
  mn_node *order = malloc((n ? n : 1) * sizeof *order);
  mn_node *remap = malloc((n ? n : 1) * sizeof *remap);
  frame *stack = malloc((n ? n : 1) * sizeof *stack);
  mn_graph *out = NULL;
  if (!live || !state || !order || !remap || !stack) goto oom;
  mark_live(g, live, (mn_node *)remap);

  size_t count = 0;
  for (size_t root = 0; root < n; root++) {
    if (!live[root] || state[root] != UNSEEN) continue;
    size_t top = 0;
    stack[top++] = (frame){(mn_node)root, 0};
    state[root] = ON_STACK;
    while (top) {
      frame *f = &stack[top - 1];
      const mn_node_rec *node = &g->nodes[f->id];
      if (f->next_input < node->num_inputs) {
        mn_node in = node->inputs[f->next_input++];
        if (state[in] == ON_STACK) {
          st = mn_fail(MN_ERR_INVALID_ARGUMENT,
                       "mn_graph_toposort: node %u (%s) depends on itself through node %u", in,
                       mn_op_name(g->nodes[in].op), f->id);
          goto fail;
        }
        if (state[in] == UNSEEN) {
          state[in] = ON_STACK;
          stack[top++] = (frame){in, 0};
        }
      } else {
        state[f->id] = DONE;
        remap[f->id] = (mn_node)count;
        order[count++] = f->id;
        top--;
      }
    }
  }

  out = mn_graph_new();
  if (!out || (count && !(out->nodes = calloc(count, sizeof *out->nodes)))) goto oom;
  out->cap_nodes = count;
  for (size_t i = 0; i < count; i++) {
    mn_node_rec *dst = &out->nodes[i];
    out->num_nodes = i + 1;
    if (!mn_node_rec_copy(dst, &g->nodes[order[i]])) goto oom;
    for (int k = 0; k < dst->num_inputs; k++)
      dst->inputs[k] = remap[dst->inputs[k]];
  }
  if (g->num_outputs) {
    if (!(out->outputs = malloc(g->num_outputs * sizeof *out->outputs))) goto oom;
    for (size_t i = 0; i < g->num_outputs; i++)
      out->outputs[i] = remap[g->outputs[i]];
    out->num_outputs = g->num_outputs;
  }
  goto done;
oom:
  st = mn_fail(MN_ERR_OUT_OF_MEMORY, "mn_graph_toposort: out of memory (%zu nodes)", n);
fail:
  mn_graph_free(out);
  out = NULL;
done:
  free(live);
  free(state);
  free(order);
  free(remap);
  free(stack);
  *sorted = out;
  return st;
}

mn_status mn_graph_replace_sorted(mn_graph **g, mn_graph *work) {
  mn_graph *sorted = NULL;
  mn_status st = mn_graph_toposort_status(work, &sorted);
  mn_graph_free(work);
  if (st != MN_OK) return st;
  mn_graph_free(*g);
  *g = sorted;
  return MN_OK;
}
