#include "optimizer/scale_fold.h"

#include <stdlib.h>

#include "host/error.h"

static bool is_product(mn_op op) {
  return op == MN_OP_MATMUL || op == MN_OP_MATMUL_BT || op == MN_OP_MATMUL_AT;
}

mn_status mn_fold_scales_into_products(mn_graph **g, size_t *made) {
  *made = 0;
  const mn_graph *in = *g;
  size_t n = in->num_nodes;
  /* Readers of each node, outputs included: a product read elsewhere keeps its own value. */
  unsigned *readers = calloc(n ? n : 1, sizeof *readers);
  mn_node *to = malloc((n ? n : 1) * sizeof *to);
  if (!readers || !to) {
    free(readers);
    free(to);
    return mn_fail(MN_ERR_OUT_OF_MEMORY, "optimizer: out of memory folding scales");
  }
  for (size_t i = 0; i < n; i++) {
    to[i] = (mn_node)i;
    for (int k = 0; k < in->nodes[i].num_inputs; k++)
      readers[in->nodes[i].inputs[k]]++;
  }
  for (size_t i = 0; i < in->num_outputs; i++)
    readers[in->outputs[i]]++;
  mn_graph *work = NULL;
  for (size_t i = 0; i < n; i++) {
    const mn_node_rec *s = &in->nodes[i];
    if (s->op != MN_OP_SCALE || s->type.dtype != MN_F32) continue;
    mn_node p = s->inputs[0];
    const mn_node_rec *prod = &in->nodes[p];
    if (!is_product(prod->op) || readers[p] != 1 || prod->attrs.scale != 0.0f ||
        s->attrs.scale == 0.0f)
      continue;
    if (!work && !(work = mn_graph_clone(in))) {
      free(readers);
      free(to);
      return mn_fail(MN_ERR_OUT_OF_MEMORY, "optimizer: out of memory folding scales");
    }
    work->nodes[p].attrs.scale = s->attrs.scale;
    to[i] = p;
    (*made)++;
  }
  if (work) {
    /* Readers of a folded scale read its product; the scale is left to the sort to drop. */
    for (size_t i = 0; i < n; i++)
      for (int k = 0; k < work->nodes[i].num_inputs; k++)
        work->nodes[i].inputs[k] = to[work->nodes[i].inputs[k]];
    for (size_t i = 0; i < work->num_outputs; i++)
      work->outputs[i] = to[work->outputs[i]];
  }
  free(readers);
  free(to);
  return work ? mn_graph_replace_sorted(g, work) : MN_OK;
}
