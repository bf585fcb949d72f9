#include "optimizer/recompute.h"

#include <stdlib.h>

#include "host/error.h"
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

mn_status mn_recompute_activations(mn_graph **g, size_t *made) {
  *made = 0;
  const mn_graph *in = *g;
  size_t n = in->num_nodes;
  mn_readers u;
  if (!mn_readers_init(&u, in)) {
    mn_readers_free(&u);
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
    mn_node again = mn_graph_append(work, src->op, ins, src->num_inputs, &type, &attrs, NULL);
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
  if (st != MN_OK || !work) {
    mn_graph_free(work);
    if (st != MN_OK) *made = 0;
    return st;
  }
  /* The copies stand at the end; the sort places each right before its first late reader
   * (a depth-first sort in node order reaches it from there first). */
  return mn_graph_replace_sorted(g, work);
}
