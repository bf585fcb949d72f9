#include "optimizer/attention_stats.h"

#include <stdlib.h>

#include "host/error.h"
#include "host/plan_check.h"

/* f and b have the same heads, and f's output is typed like b's upstream gradient. */
static bool same_heads(const mn_graph *g, const mn_node_rec *f, const mn_node_rec *b) {
  return f->attrs.num_heads == b->attrs.num_heads &&
         f->attrs.num_kv_heads == b->attrs.num_kv_heads && f->attrs.head_dim == b->attrs.head_dim &&
         f->type.dtype == MN_F32 && mn_type_same_shape(&f->type, &g->nodes[b->inputs[3]].type);
}

/* Whether forward node f computes the probabilities backward node b recomputes: the same q,
 * k and v (and positions, b's last input, for a packed gradient), heads and masking, and an
 * output typed like b's upstream gradient. */
static bool same_attention(const mn_graph *g, const mn_node_rec *f, const mn_node_rec *b) {
  if (!mn_op_is_attention(f->op) || f->attrs.variant > 1) return false;
  for (int k = 0; k < 3; k++)
    if (f->inputs[k] != b->inputs[k]) return false;
  bool packed = mn_op_is_packed_attention_grad(b->op);
  if ((f->op == MN_OP_CAUSAL_ATTENTION_PACKED) != packed) return false;
  if (packed) return f->inputs[3] == b->inputs[4] && same_heads(g, f, b);
  return (f->op == MN_OP_CAUSAL_ATTENTION) == (b->attrs.variant == 1) && same_heads(g, f, b);
}

/* The forward attention matching backward node b, or MN_NO_NODE. */
static mn_node forward_of(const mn_graph *g, mn_node b) {
  const mn_node_rec *r = &g->nodes[b];
  for (size_t i = 0; i < g->num_nodes; i++)
    if (same_attention(g, &g->nodes[i], r)) return (mn_node)i;
  return MN_NO_NODE;
}

/* The extra_output holding f's statistics, appended (and f switched to writing them) the
 * first time; MN_NO_NODE when out of memory. */
static mn_node stats_of(mn_graph *g, mn_node f, mn_node *stats) {
  if (stats[f] != MN_NO_NODE) return stats[f];
  mn_tensor_type t = {.dtype = MN_F32, .rank = 1};
  t.shape[0] = mn_attention_stats_numel(g, &g->nodes[f]);
  mn_op_attrs value1 = {.variant = 1};
  mn_node s = mn_graph_append(g, MN_OP_EXTRA_OUTPUT, &f, 1, &t, &value1, NULL);
  if (s == MN_NO_NODE) return MN_NO_NODE;
  g->nodes[f].attrs.variant = 1;
  return stats[f] = s;
}

/* The _saved form of a dQ or dK | dV gradient; op itself for any other. */
static mn_op saved_op(mn_op op) {
  switch (op) {
  case MN_OP_ATTENTION_GRAD_Q: return MN_OP_ATTENTION_GRAD_Q_SAVED;
  case MN_OP_ATTENTION_GRAD_KV: return MN_OP_ATTENTION_GRAD_KV_SAVED;
  case MN_OP_PACKED_ATTENTION_GRAD_Q: return MN_OP_PACKED_ATTENTION_GRAD_Q_SAVED;
  case MN_OP_PACKED_ATTENTION_GRAD_KV: return MN_OP_PACKED_ATTENTION_GRAD_KV_SAVED;
  default: return op;
  }
}

mn_status mn_attention_save_stats(mn_graph **g, size_t *made) {
  *made = 0;
  const mn_graph *in = *g;
  mn_graph *work = NULL;
  mn_node *stats = NULL;
  size_t n = in->num_nodes;
  for (size_t b = 0; b < n; b++) {
    mn_op op = in->nodes[b].op;
    mn_op saved = saved_op(op);
    if (saved == op) continue;
    mn_node f = forward_of(in, (mn_node)b);
    if (f == MN_NO_NODE) continue;
    if (!work) {
      if (!(work = mn_graph_clone(in)) || !(stats = malloc(n * sizeof *stats))) goto oom;
      for (size_t i = 0; i < n; i++)
        stats[i] = MN_NO_NODE;
    }
    mn_node s = stats_of(work, f, stats);
    if (s == MN_NO_NODE) goto oom;
    mn_node_rec *r = &work->nodes[b];
    r->op = saved;
    /* A packed gradient's positions move behind the two new inputs. */
    if (r->num_inputs == 5) r->inputs[6] = r->inputs[4];
    r->inputs[4] = f;
    r->inputs[5] = s;
    r->num_inputs += 2;
    (*made)++;
  }
  free(stats);
  /* The statistics nodes were appended after the gradients that now read them. */
  return work ? mn_graph_replace_sorted(g, work) : MN_OK;
oom:
  free(stats);
  mn_graph_free(work);
  *made = 0;
  return mn_fail(MN_ERR_OUT_OF_MEMORY, "optimizer: out of memory saving attention statistics");
}
