#include "optimizer/attention_qkv.h"

#include <stdint.h>
#include <stdlib.h>

#include "host/error.h"
#include "optimizer/pass_switch.h"
#include "optimizer/readers.h"

/* The one reader of i (read in one slot), or MN_NO_NODE. */
static mn_node only_reader(const mn_readers *r, mn_node i) {
  return mn_readers_count(r, i) == 1 ? r->readers[r->start[i]] : MN_NO_NODE;
}

static bool is_output(const mn_graph *g, mn_node id) {
  for (size_t i = 0; i < g->num_outputs; i++)
    if (g->outputs[i] == id) return true;
  return false;
}

static int64_t last_dim(const mn_tensor_type *t) { return t->shape[t->rank - 1]; }

/* Whether node s is slice_last(x, start, len). */
static bool is_slice(const mn_graph *g, mn_node s, mn_node x, int64_t start, int64_t len) {
  const mn_node_rec *n = &g->nodes[s];
  return n->op == MN_OP_SLICE_LAST && n->inputs[0] == x && n->attrs.pos_offset == start &&
         last_dim(&n->type) == len;
}

/* Whether node s is slice_last_grad(dy) placing dy at column `start` of a tensor typed like x. */
static bool is_slice_grad(const mn_graph *g, mn_node s, mn_node dy, int64_t start,
                          const mn_tensor_type *x) {
  const mn_node_rec *n = &g->nodes[s];
  return n->op == MN_OP_SLICE_LAST_GRAD && n->inputs[0] == dy && n->attrs.pos_offset == start &&
         n->type.dtype == MN_F32 && mn_type_same_shape(&n->type, x);
}

/* The node that sums exactly parts[0..2], each read once by it: a fused node of two adds over
 * them, or add(add(a, b), c) in any order (the inner add read only by the outer); else
 * MN_NO_NODE. *inner gets the inner add (MN_NO_NODE for a fused sum). */
static mn_node sum_of(const mn_graph *g, const mn_readers *r, const mn_node parts[3],
                      mn_node *inner) {
  *inner = MN_NO_NODE;
  mn_node first[3];
  for (int i = 0; i < 3; i++)
    if ((first[i] = only_reader(r, parts[i])) == MN_NO_NODE) return MN_NO_NODE;
  if (first[0] == first[1] && first[1] == first[2]) {
    const mn_node_rec *s = &g->nodes[first[0]];
    if (s->op != MN_OP_FUSED || s->num_inputs != 3 || !s->fused || s->fused->num_instrs != 2 ||
        mn_node_num_extra_outputs(s) != 0)
      return MN_NO_NODE;
    /* add(a, b) of two inputs, then add of that and the third (operand 3: result 0). */
    const mn_fused_instr *i0 = &s->fused->instrs[0], *i1 = &s->fused->instrs[1];
    if (i0->op != MN_OP_ADD || i1->op != MN_OP_ADD || i0->out || i1->out) return MN_NO_NODE;
    int a = i0->args[0], b = i0->args[1], x = i1->args[0] == 3 ? i1->args[1] : i1->args[0];
    if ((i1->args[0] != 3 && i1->args[1] != 3) || a > 2 || b > 2 || x > 2 || a == b || a == x ||
        b == x)
      return MN_NO_NODE;
    return first[0];
  }
  /* Two parts meet in the inner add, the third in the outer one that reads it. */
  for (int lone = 0; lone < 3; lone++) {
    int a = (lone + 1) % 3, b = (lone + 2) % 3;
    mn_node in = first[a], out = first[lone];
    if (first[b] != in || in == out) continue;
    const mn_node_rec *ni = &g->nodes[in], *no = &g->nodes[out];
    if (ni->op != MN_OP_ADD || no->op != MN_OP_ADD || only_reader(r, in) != out) return MN_NO_NODE;
    if (!((no->inputs[0] == in && no->inputs[1] == parts[lone]) ||
          (no->inputs[1] == in && no->inputs[0] == parts[lone])))
      return MN_NO_NODE;
    *inner = in;
    return out;
  }
  return MN_NO_NODE;
}

/* What one match rewrites. */
typedef struct qkv_match {
  mn_node f, x, stats, dq, dkv, dy, sum;
} qkv_match;

/* The saved gradient of f of kind op among the readers of q (MN_NO_NODE when none, or when
 * there are two). */
static mn_node saved_grad(const mn_graph *g, const mn_readers *r, mn_node f, mn_node stats,
                          mn_op op) {
  const mn_node_rec *fr = &g->nodes[f];
  mn_node found = MN_NO_NODE;
  for (size_t k = r->start[fr->inputs[0]]; k < r->start[fr->inputs[0] + 1]; k++) {
    mn_node b = r->readers[k];
    const mn_node_rec *n = &g->nodes[b];
    if (n->op != op) continue;
    bool same = n->inputs[4] == f && n->inputs[5] == stats && n->attrs.variant == 1 &&
                n->attrs.num_heads == fr->attrs.num_heads &&
                n->attrs.num_kv_heads == fr->attrs.num_kv_heads &&
                n->attrs.head_dim == fr->attrs.head_dim;
    for (int i = 0; i < 3; i++)
      same = same && n->inputs[i] == fr->inputs[i];
    if (!same || found != MN_NO_NODE) return MN_NO_NODE;
    found = b;
  }
  return found;
}

/* f's statistics: its one extra_output of value 1. */
static mn_node stats_of(const mn_graph *g, const mn_readers *r, mn_node f) {
  mn_node found = MN_NO_NODE;
  for (size_t k = r->start[f]; k < r->start[f + 1]; k++) {
    const mn_node_rec *n = &g->nodes[r->readers[k]];
    if (n->op != MN_OP_EXTRA_OUTPUT || n->attrs.variant != 1) continue;
    if (found != MN_NO_NODE) return MN_NO_NODE;
    found = r->readers[k];
  }
  return found;
}

static bool match(const mn_graph *g, const mn_readers *r, mn_node f, qkv_match *m) {
  const mn_node_rec *fr = &g->nodes[f];
  if (fr->op != MN_OP_CAUSAL_ATTENTION || fr->attrs.variant != 1) return false;
  int64_t hd = fr->attrs.head_dim, h = fr->attrs.num_heads, kvh = fr->attrs.num_kv_heads;
  if (hd < 16 || hd % 16 || hd > 128 || h < 1 || kvh < 1) return false;
  mn_node q = fr->inputs[0], k = fr->inputs[1], v = fr->inputs[2];
  mn_node x = g->nodes[q].inputs[0];
  const mn_tensor_type *xt = &g->nodes[x].type;
  if (!is_slice(g, q, x, 0, h * hd) || !is_slice(g, k, x, h * hd, kvh * hd) ||
      !is_slice(g, v, x, (h + kvh) * hd, kvh * hd) || last_dim(xt) != (h + 2 * kvh) * hd ||
      xt->rank < 2 || xt->shape[xt->rank - 2] >= INT32_MAX / 2)
    return false;
  /* A leaf (a parameter, an input) keeps fp32 storage, which the wide-row kernels do not read;
   * and the bitwise agreement holds where X is stored as the slices were. */
  if (mn_op_flags(g->nodes[x].op) & MN_OPF_LEAF) return false;
  m->f = f;
  m->x = x;
  if ((m->stats = stats_of(g, r, f)) == MN_NO_NODE) return false;
  m->dq = saved_grad(g, r, f, m->stats, MN_OP_ATTENTION_GRAD_Q_SAVED);
  m->dkv = saved_grad(g, r, f, m->stats, MN_OP_ATTENTION_GRAD_KV_SAVED);
  if (m->dq == MN_NO_NODE || m->dkv == MN_NO_NODE) return false;
  m->dy = g->nodes[m->dq].inputs[3];
  if (g->nodes[m->dkv].inputs[3] != m->dy) return false;
  /* q, k and v: read by the attention and its two gradients only. */
  const mn_node qkv[3] = {q, k, v};
  for (int i = 0; i < 3; i++) {
    if (is_output(g, qkv[i])) return false;
    for (size_t j = r->start[qkv[i]]; j < r->start[qkv[i] + 1]; j++) {
      mn_node u = r->readers[j];
      if (u != f && u != m->dq && u != m->dkv) return false;
    }
  }
  /* dK | dV taken apart into dK and dV, each placed at its block of X. */
  if (mn_readers_count(r, m->dkv) != 2 || is_output(g, m->dkv) || is_output(g, m->dq)) return false;
  mn_node a = r->readers[r->start[m->dkv]], b = r->readers[r->start[m->dkv] + 1];
  mn_node dk = is_slice(g, a, m->dkv, 0, kvh * hd) ? a : b, dv = dk == a ? b : a;
  if (!is_slice(g, dk, m->dkv, 0, kvh * hd) || !is_slice(g, dv, m->dkv, kvh * hd, kvh * hd) ||
      is_output(g, dk) || is_output(g, dv))
    return false;
  mn_node parts[3] = {only_reader(r, m->dq), only_reader(r, dk), only_reader(r, dv)};
  const int64_t at[3] = {0, h * hd, (h + kvh) * hd};
  const mn_node from[3] = {m->dq, dk, dv};
  for (int i = 0; i < 3; i++)
    if (parts[i] == MN_NO_NODE || !is_slice_grad(g, parts[i], from[i], at[i], xt) ||
        is_output(g, parts[i]))
      return false;
  mn_node inner;
  m->sum = sum_of(g, r, parts, &inner);
  return m->sum != MN_NO_NODE && (inner == MN_NO_NODE || !is_output(g, inner));
}

static void rewrite(mn_graph *w, const mn_readers *r, const qkv_match *m) {
  mn_node_rec *f = &w->nodes[m->f];
  f->op = MN_OP_QKV_CAUSAL_ATTENTION;
  f->inputs[0] = m->x;
  for (int i = 1; i < MN_MAX_INPUTS; i++)
    f->inputs[i] = 0;
  f->num_inputs = 1;
  mn_node_rec *d = &w->nodes[m->dq];
  d->op = MN_OP_QKV_ATTENTION_GRAD_SAVED;
  d->inputs[0] = m->x;
  d->inputs[1] = m->dy;
  d->inputs[2] = m->f;
  d->inputs[3] = m->stats;
  for (int i = 4; i < MN_MAX_INPUTS; i++)
    d->inputs[i] = 0;
  d->num_inputs = 4;
  d->type = w->nodes[m->sum].type;
  for (size_t k = r->start[m->sum]; k < r->start[m->sum + 1]; k++) {
    mn_node_rec *u = &w->nodes[r->readers[k]];
    for (int i = 0; i < u->num_inputs; i++)
      if (u->inputs[i] == m->sum) u->inputs[i] = m->dq;
  }
  for (size_t i = 0; i < w->num_outputs; i++)
    if (w->outputs[i] == m->sum) w->outputs[i] = m->dq;
}

mn_status mn_attention_read_qkv_in_place(mn_graph **g, size_t *made) {
  *made = 0;
  if (mn_optimize_pass_off("attention_qkv")) return MN_OK;
  const mn_graph *in = *g;
  mn_readers r = {0};
  mn_graph *work = NULL;
  if (!mn_readers_init(&r, in)) goto oom;
  for (size_t i = 0; i < in->num_nodes; i++) {
    qkv_match m;
    if (!match(in, &r, (mn_node)i, &m)) continue;
    if (!work && !(work = mn_graph_clone(in))) goto oom;
    rewrite(work, &r, &m);
    (*made)++;
  }
  mn_readers_free(&r);
  /* The slices, dK | dV and the sum are read by nothing now: sorting drops them. */
  return work ? mn_graph_replace_sorted(g, work) : MN_OK;
oom:
  mn_readers_free(&r);
  mn_graph_free(work);
  *made = 0;
  return mn_fail(MN_ERR_OUT_OF_MEMORY, "optimizer: out of memory reading q, k and v in place");
}
