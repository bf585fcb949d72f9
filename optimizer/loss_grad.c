#include "optimizer/loss_grad.h"

#include <stdlib.h>

#include "host/error.h"

/* Whether node `from` depends on node `target` (a depth-first search over inputs). */
static bool depends(const mn_graph *g, mn_node from, mn_node target, unsigned char *seen,
                    mn_node *stack) {
  size_t top = 0;
  for (size_t i = 0; i < g->num_nodes; i++)
    seen[i] = 0;
  stack[top++] = from;
  seen[from] = 1;
  while (top) {
    const mn_node_rec *n = &g->nodes[stack[--top]];
    for (int k = 0; k < n->num_inputs; k++) {
      mn_node in = n->inputs[k];
      if (in == target) return true;
      if (!seen[in]) seen[stack[top++] = in] = 1;
    }
  }
  return false;
}

/* The loss over the same logits and labels as gradient node `grad` that no gradient took
 * yet (`work`, when there is one, shows the losses already fused), or MN_NO_NODE. */
static mn_node loss_of(const mn_graph *g, const mn_graph *work, const mn_node_rec *grad) {
  for (size_t i = 0; i < g->num_nodes; i++) {
    const mn_node_rec *n = &g->nodes[i];
    if (n->op == MN_OP_SPARSE_CROSS_ENTROPY_LOSS && n->inputs[0] == grad->inputs[0] &&
        n->inputs[1] == grad->inputs[1] &&
        (!work || work->nodes[i].op == MN_OP_SPARSE_CROSS_ENTROPY_LOSS))
      return (mn_node)i;
  }
  return MN_NO_NODE;
}

mn_status mn_fuse_loss_gradients(mn_graph **g, size_t *made) {
  *made = 0;
  const mn_graph *in = *g;
  size_t n = in->num_nodes;
  mn_graph *work = NULL;
  unsigned char *seen = malloc(n ? n : 1);
  mn_node *stack = malloc((n ? n : 1) * sizeof *stack);
  if (!seen || !stack) goto oom;
  for (size_t i = 0; i < n; i++) {
    const mn_node_rec *grad = &in->nodes[i];
    if (grad->op != MN_OP_SPARSE_CROSS_ENTROPY_GRAD) continue;
    mn_node loss = loss_of(in, work, grad);
    if (loss == MN_NO_NODE || depends(in, grad->inputs[2], loss, seen, stack)) continue;
    if (!work && !(work = mn_graph_clone(in))) goto oom;
    mn_node_rec *l = &work->nodes[loss], *d = &work->nodes[i];
    l->op = MN_OP_SPARSE_CROSS_ENTROPY_LOSS_GRAD;
    l->inputs[2] = d->inputs[2];
    l->num_inputs = 3;
    d->op = MN_OP_EXTRA_OUTPUT;
    d->inputs[0] = loss;
    d->num_inputs = 1;
    d->attrs = (mn_op_attrs){.variant = 1};
    (*made)++;
  }
  free(seen);
  free(stack);
  /* The loss now reads dy, which may stand after it. */
  return work ? mn_graph_replace_sorted(g, work) : MN_OK;
oom:
  free(seen);
  free(stack);
  mn_graph_free(work);
  *made = 0;
  return mn_fail(MN_ERR_OUT_OF_MEMORY, "optimizer: out of memory fusing a loss and its gradient");
}
