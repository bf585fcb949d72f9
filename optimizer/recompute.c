#include "optimizer/recompute.h"

#include <stdlib.h>

#include "host/error.h"
#include "optimizer/pass_switch.h"
#include "optimizer/readers.h"

static bool cheap_activation(const mn_node_rec *n) {
  return (mn_op_flags(n->op) & MN_OPF_POINTWISE) && n->op != MN_OP_FUSED && n->num_inputs <= 2;
}

/* A saved attention gradient names the very q, k and v (or qkv) its forward read
 * (host/plan_check.c): a value it reads in those slots stays the forward's. */
static bool reads_as_attention_operand(const mn_node_rec *reader, mn_node value) {
  if (reader->op == MN_OP_QKV_ATTENTION_GRAD_SAVED) return reader->inputs[0] == value;
  if (!mn_op_is_saved_attention_grad(reader->op)) return false;
  for (int k = 0; k < 3; k++)
    if (reader->inputs[k] == value) return true;
  return false;
}

static bool is_output(const mn_graph *g, mn_node id) {
  for (size_t i = 0; i < g->num_outputs; i++)
    if (g->outputs[i] == id) return true;
  return false;
}

/* The first late reader of node i (MN_NO_NODE when none): the first reader at least
 * MN_RECOMPUTE_MIN_GAP nodes after the reader before it (or after i), provided every input of
 * i is read again at or after it, so that recomputing there keeps no input alive longer, and no
 * late reader is a saved attention gradient taking i as q, k or v. */
static mn_node first_late_reader(const mn_graph *g, const mn_readers *u, mn_node i) {
  mn_node prev = i, late = MN_NO_NODE;
  for (size_t r = u->start[i]; r < u->start[i + 1]; r++) {
    mn_node reader = u->readers[r];
    if (reader >= prev + MN_RECOMPUTE_MIN_GAP) {
      late = reader;
      break;
    }
    prev = reader;
  }
  if (late == MN_NO_NODE) return MN_NO_NODE;
  for (size_t r = u->start[i]; r < u->start[i + 1]; r++)
    if (u->readers[r] >= late && reads_as_attention_operand(&g->nodes[u->readers[r]], i))
      return MN_NO_NODE;
  const mn_node_rec *n = &g->nodes[i];
  for (int k = 0; k < n->num_inputs; k++) {
    mn_node in = n->inputs[k];
    if (mn_op_flags(g->nodes[in].op) & MN_OPF_LEAF) continue; /* pinned: always there */
    if (u->start[in] == u->start[in + 1] || u->readers[u->start[in + 1] - 1] < late)
      return MN_NO_NODE;
  }
  return late;
}

/* Whether node `from` of g reads, directly or not, a reader of `value` at or after node `late`
 * (readers as u lists them; g may have grown past them, seen and stack hold g's nodes). */
static bool reads_late_reader(const mn_graph *g, const mn_readers *u, mn_node value, mn_node late,
                              mn_node from, bool *seen, mn_node *stack) {
  for (size_t i = 0; i < g->num_nodes; i++)
    seen[i] = false;
  size_t top = 0;
  stack[top++] = from;
  seen[from] = true;
  while (top) {
    const mn_node_rec *n = &g->nodes[stack[--top]];
    for (int k = 0; k < n->num_inputs; k++) {
      mn_node in = n->inputs[k];
      if (seen[in]) continue;
      for (size_t r = u->start[value]; r < u->start[value + 1]; r++)
        if (u->readers[r] >= late && u->readers[r] == in) return true;
      seen[in] = true;
      stack[top++] = in;
    }
  }
  return false;
}

/* For a GELU i of `in` recomputed before `late`: the gelu_grad_bgrad (variant 0) that reads i's
 * input as its x and, in `work` (in with the rewrites so far, which add edges), reads none of
 * i's late readers, which can then write gelu(x) as its value 2: the backward reads x once for
 * both, in one kernel. MN_NO_NODE when there is none. */
static mn_node gelu_partner(const mn_graph *in, const mn_graph *work, const mn_readers *u,
                            mn_node i, mn_node late, bool *seen, mn_node *stack) {
  const mn_node_rec *n = &in->nodes[i];
  if (n->op != MN_OP_GELU || n->num_inputs != 1 ||
      mn_optimize_pass_off("recompute_gelu_in_gradient"))
    return MN_NO_NODE;
  mn_node x = n->inputs[0];
  for (size_t r = u->start[x]; r < u->start[x + 1]; r++) {
    mn_node j = u->readers[r];
    const mn_node_rec *p = &in->nodes[j];
    if (p->op != MN_OP_GELU_GRAD_BGRAD || p->attrs.variant != 0 || p->inputs[0] != x ||
        !mn_type_same_shape(&p->type, &n->type))
      continue;
    if (work->nodes[j].attrs.variant == 0 && !reads_late_reader(work, u, i, late, j, seen, stack))
      return j;
  }
  return MN_NO_NODE;
}

mn_status mn_recompute_activations(mn_graph **g, size_t *made) {
  *made = 0;
  const mn_graph *in = *g;
  size_t n = in->num_nodes;
  mn_readers u;
  /* each recomputed value appends one node to the work graph */
  bool *seen = malloc((2 * n + 1) * sizeof *seen);
  mn_node *stack = malloc((2 * n + 1) * sizeof *stack);
  if (!mn_readers_init(&u, in) || !seen || !stack) {
    mn_readers_free(&u);
    free(seen);
    free(stack);
    return mn_fail(MN_ERR_OUT_OF_MEMORY, "optimizer: out of memory recomputing activations");
  }
  mn_graph *work = NULL;
  mn_status st = MN_OK;
  for (size_t i = 0; i < n && st == MN_OK; i++) {
    const mn_node_rec *r = &in->nodes[i];
    if (!cheap_activation(r) || is_output(in, (mn_node)i)) continue;
    mn_node late = first_late_reader(in, &u, (mn_node)i);
    if (late == MN_NO_NODE) continue;
    if (!work && !(work = mn_graph_clone(in))) {
      st = mn_fail(MN_ERR_OUT_OF_MEMORY, "optimizer: out of memory recomputing activations");
      break;
    }
    const mn_node_rec *src = &work->nodes[i];
    mn_tensor_type type = src->type;
    mn_op_attrs attrs = src->attrs;
    mn_node ins[MN_MAX_INPUTS];
    for (int k = 0; k < src->num_inputs; k++)
      ins[k] = src->inputs[k];
    mn_node partner = gelu_partner(in, work, &u, (mn_node)i, late, seen, stack), again;
    if (partner != MN_NO_NODE) {
      mn_op_attrs value2 = {.variant = 2};
      again = mn_graph_append(work, MN_OP_EXTRA_OUTPUT, &partner, 1, &type, &value2, NULL);
      if (again != MN_NO_NODE) work->nodes[partner].attrs.variant = 1;
    } else {
      again = mn_graph_append(work, src->op, ins, src->num_inputs, &type, &attrs, NULL);
    }
    if (again == MN_NO_NODE) {
      st = mn_fail(MN_ERR_OUT_OF_MEMORY, "optimizer: out of memory recomputing activations");
      break;
    }
    for (size_t k = u.start[i]; k < u.start[i + 1]; k++) {
      mn_node reader = u.readers[k];
      if (reader < late) continue;
      mn_node_rec *rr = &work->nodes[reader];
      for (int a = 0; a < rr->num_inputs; a++)
        if (rr->inputs[a] == (mn_node)i) rr->inputs[a] = again;
    }
    (*made)++;
  }
  mn_readers_free(&u);
  free(seen);
  free(stack);
  if (st != MN_OK || !work) {
    mn_graph_free(work);
    if (st != MN_OK) *made = 0;
    return st;
  }
  /* The copies stand at the end; the sort places each right before its first late reader
   * (a depth-first sort in node order reaches it from there first). */
  return mn_graph_replace_sorted(g, work);
}
