#include "optimizer/fusion.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "host/error.h"
#include "optimizer/cost.h"
#include "optimizer/fusion_groups.h"

enum { FUSE_NONE, FUSE_POINTWISE, FUSE_ROW };

static bool same_type(const mn_tensor_type *a, const mn_tensor_type *b) {
  return a->dtype == b->dtype && mn_type_same_shape(a, b);
}

/* An F32 [N] vector of the last axis of t. */
static bool is_row_vector(const mn_tensor_type *v, const mn_tensor_type *t) {
  return v->dtype == MN_F32 && v->rank == 1 && t->rank >= 1 && v->shape[0] == t->shape[t->rank - 1];
}

/* What a group may take a node as: a pointwise op over F32 inputs of its own type (no
 * broadcast), or a row op (graph.h) whose x and dy have its type and whose weight and bias
 * are rows of it. A fused node is not taken apart again. */
static unsigned char kind_of(const mn_graph *g, const mn_node_rec *n) {
  if (n->op == MN_OP_FUSED || n->type.dtype != MN_F32 ||
      n->num_inputs != mn_op_table[n->op].arity || n->num_inputs > MN_FUSED_MAX_ARGS)
    return FUSE_NONE;
  bool row = mn_fused_is_row_op(n->op);
  if (!(mn_op_flags(n->op) & MN_OPF_POINTWISE) && !row) return FUSE_NONE;
  for (int k = 0; k < n->num_inputs; k++) {
    const mn_tensor_type *t = &g->nodes[n->inputs[k]].type;
    bool vec = row && (k == 1 || (k == 2 && n->op == MN_OP_LAYER_NORM));
    if (vec ? !is_row_vector(t, &n->type) : !same_type(t, &n->type)) return FUSE_NONE;
  }
  return row ? FUSE_ROW : FUSE_POINTWISE;
}

static bool fuser_init(mn_fuser *f, const mn_graph *g) {
  size_t n = g->num_nodes ? g->num_nodes : 1, edges = 0;
  for (size_t i = 0; i < g->num_nodes; i++)
    edges += (size_t)g->nodes[i].num_inputs;
  *f = (mn_fuser){.g = g};
  f->user_start = calloc(n + 1, sizeof *f->user_start);
  f->users = malloc((edges ? edges : 1) * sizeof *f->users);
  f->is_output = calloc(n, 1);
  f->kind = calloc(n, 1);
  f->group_of = malloc(n * sizeof *f->group_of);
  f->pos = malloc(n * sizeof *f->pos);
  f->members = malloc(n * sizeof *f->members);
  f->group_start = malloc((n + 1) * sizeof *f->group_start);
  f->roots = malloc(n * sizeof *f->roots);
  uint32_t *fill = malloc(n * sizeof *fill);
  bool ok = f->user_start && f->users && f->is_output && f->kind && f->group_of && f->pos &&
            f->members && f->group_start && f->roots && fill;
  if (!ok) {
    free(fill);
    return false;
  }
  for (size_t i = 0; i < g->num_nodes; i++)
    for (int k = 0; k < g->nodes[i].num_inputs; k++)
      f->user_start[g->nodes[i].inputs[k] + 1]++;
  for (size_t i = 0; i < g->num_nodes; i++)
    f->user_start[i + 1] += f->user_start[i];
  memcpy(fill, f->user_start, g->num_nodes * sizeof *fill);
  for (size_t i = 0; i < g->num_nodes; i++)
    for (int k = 0; k < g->nodes[i].num_inputs; k++)
      f->users[fill[g->nodes[i].inputs[k]]++] = (uint32_t)i;
  free(fill);
  for (size_t i = 0; i < g->num_outputs; i++)
    f->is_output[g->outputs[i]] = 1;
  for (size_t i = 0; i < g->num_nodes; i++) {
    f->group_of[i] = -1;
    f->pos[i] = (double)i;
    f->kind[i] = kind_of(g, &g->nodes[i]);
  }
  return true;
}

static void fuser_free(mn_fuser *f) {
  free(f->user_start);
  free(f->users);
  free(f->is_output);
  free(f->kind);
  free(f->group_of);
  free(f->pos);
  free(f->members);
  free(f->group_start);
  free(f->roots);
}

bool mn_fuser_leaves(const mn_fuser *f, int32_t gid, mn_node v) {
  if (f->is_output[v]) return true;
  for (uint32_t u = f->user_start[v]; u < f->user_start[v + 1]; u++)
    if (f->group_of[f->users[u]] != gid) return true;
  return false;
}

/* A candidate group (the members of gid) as the pass weighs it. */
typedef struct shape {
  mn_node
      ext[MN_FUSED_MAX_INPUTS]; /* the values it reads, in the order its members first read them */
  int ne, num_extra;            /* extra: members but the root whose value leaves */
  double max_in, min_out;       /* latest place it reads from, earliest place that reads it */
  double cost;                  /* as one fused node */
} shape;

/* Operand k of row op n is read as a row vector (its weight or bias). */
static bool row_vector_operand(const mn_node_rec *n, int k) {
  return mn_fused_is_row_op(n->op) && (k == 1 || (k == 2 && n->op == MN_OP_LAYER_NORM));
}

/* Reads of group gid: false when it reads more than MN_FUSED_MAX_INPUTS values, holds two row ops,
 * computes a row op's weight or bias itself, or reads a value both as a row and elementwise
 * (the kernels take a weight as a pointer to one row). */
static bool reads(const mn_fuser *f, int32_t gid, const mn_node *mem, size_t nm, shape *s) {
  unsigned char how[MN_FUSED_MAX_INPUTS] = {0};
  int rows = 0;
  s->ne = 0;
  s->max_in = -INFINITY;
  for (size_t m = 0; m < nm; m++) {
    const mn_node_rec *r = &f->g->nodes[mem[m]];
    rows += f->kind[mem[m]] == FUSE_ROW;
    for (int k = 0; k < r->num_inputs; k++) {
      mn_node v = r->inputs[k];
      unsigned char h = row_vector_operand(r, k) ? 2 : 1;
      if (f->group_of[v] == gid) {
        if (h == 2) return false;
        continue;
      }
      int j = 0;
      while (j < s->ne && s->ext[j] != v)
        j++;
      if (j == s->ne) {
        if (s->ne == MN_FUSED_MAX_INPUTS) return false;
        s->ext[s->ne++] = v;
        if (f->pos[v] > s->max_in) s->max_in = f->pos[v];
      }
      if (how[j] && how[j] != h) return false;
      how[j] = h;
    }
  }
  return rows <= 1;
}

/* Weighs the members of gid, mem[0..nm) ascending with the root last: false when the group
 * breaks a limit or no place for it keeps the contracted graph acyclic (some path leaves it
 * and comes back: with values leaving from several members, it need not be convex). */
static bool weigh(const mn_fuser *f, int32_t gid, const mn_node *mem, size_t nm, shape *s) {
  if (!reads(f, gid, mem, nm, s)) return false;
  const mn_graph *g = f->g;
  s->num_extra = 0;
  s->min_out = INFINITY;
  const mn_tensor_type *ins[MN_FUSED_MAX_INPUTS];
  for (int k = 0; k < s->ne; k++)
    ins[k] = &g->nodes[s->ext[k]].type;
  mn_node root = mem[nm - 1];
  s->cost = mn_cost_op(MN_OP_FUSED, &g->nodes[root].type, ins, s->ne);
  for (size_t m = 0; m < nm; m++) {
    mn_node v = mem[m];
    bool leaves = false;
    for (uint32_t u = f->user_start[v]; u < f->user_start[v + 1]; u++) {
      mn_node user = f->users[u];
      if (f->group_of[user] == gid) continue;
      leaves = true;
      if (f->pos[user] < s->min_out) s->min_out = f->pos[user];
    }
    if (v != root && (leaves || f->is_output[v])) {
      s->num_extra++;
      s->cost += mn_cost_op(MN_OP_EXTRA_OUTPUT, &g->nodes[v].type, NULL, 0);
    }
  }
  return s->num_extra <= MN_MAX_EXTRA_OUTPUTS && s->max_in < s->min_out;
}

/* Cost of node v as the op it is. */
static double cost_apart(const mn_graph *g, mn_node v) {
  const mn_node_rec *r = &g->nodes[v];
  const mn_tensor_type *ins[MN_MAX_INPUTS];
  for (int k = 0; k < r->num_inputs; k++)
    ins[k] = &g->nodes[r->inputs[k]].type;
  return mn_cost_op(r->op, &r->type, ins, r->num_inputs);
}

static int by_node(const void *a, const void *b) {
  mn_node x = *(const mn_node *)a, y = *(const mn_node *)b;
  return x < y ? -1 : x > y;
}

/* Tries v in group gid (members mem[0..*nm) ascending, *nm < MN_FUSED_MAX_INSTRS, the root
 * last): keeps it when the group stays within its limits and fused costs less than the group
 * without v plus v on its own. */
static bool try_join(mn_fuser *f, int32_t gid, mn_node *mem, size_t *nm, mn_node v, shape *s) {
  const mn_graph *g = f->g;
  mn_node root = mem[*nm - 1];
  if (f->kind[v] == FUSE_NONE || f->group_of[v] != -1 ||
      !same_type(&g->nodes[v].type, &g->nodes[root].type))
    return false;
  for (size_t m = 0; m < *nm; m++)
    if (f->kind[v] == FUSE_ROW && f->kind[mem[m]] == FUSE_ROW) return false;
  mn_node grown[MN_FUSED_MAX_INSTRS];
  grown[0] = v;
  memcpy(grown + 1, mem, *nm * sizeof *mem);
  qsort(grown, *nm + 1, sizeof *grown, by_node);
  f->group_of[v] = gid;
  shape t;
  bool ok = weigh(f, gid, grown, *nm + 1, &t) && t.cost < s->cost + cost_apart(g, v);
  if (ok) {
    memcpy(mem, grown, (*nm + 1) * sizeof *mem);
    (*nm)++;
    *s = t;
  } else {
    f->group_of[v] = -1;
  }
  return ok;
}

/* Grows the group rooted at r by absorbing, one at a time, the latest value it reads that
 * may join; keeps the group when it has two ops or more and the cost model prefers it to
 * its ops apart, and places it (pos) where every value it reads comes before it and every
 * reader of its values after it. */
static void grow(mn_fuser *f, mn_node r) {
  int32_t gid = (int32_t)f->num_groups;
  mn_node *mem = f->members + f->num_members;
  size_t nm = 1;
  mem[0] = r;
  f->group_of[r] = gid;
  shape s;
  if (!weigh(f, gid, mem, nm, &s)) {
    f->group_of[r] = -1;
    return;
  }
  for (bool grew = true; grew && nm < MN_FUSED_MAX_INSTRS;) {
    grew = false;
    mn_node ext[MN_FUSED_MAX_INPUTS];
    int ne = s.ne;
    memcpy(ext, s.ext, (size_t)ne * sizeof *ext);
    /* Latest first: a value is tried after its users, which may have to join first. */
    qsort(ext, (size_t)ne, sizeof *ext, by_node);
    for (int j = ne; j-- > 0 && !grew;)
      grew = try_join(f, gid, mem, &nm, ext[j], &s);
  }
  double apart = 0;
  for (size_t m = 0; m < nm; m++)
    apart += cost_apart(f->g, mem[m]);
  double place = s.min_out > (double)r ? (double)r : (s.max_in + s.min_out) / 2;
  if (nm < 2 || !(s.cost < apart) || !(s.max_in < place && place < s.min_out)) {
    for (size_t m = 0; m < nm; m++)
      f->group_of[mem[m]] = -1;
    return;
  }
  for (size_t m = 0; m < nm; m++)
    f->pos[mem[m]] = place;
  f->group_start[gid] = (uint32_t)f->num_members;
  f->roots[gid] = r;
  f->num_members += nm;
  f->num_groups++;
}

mn_status mn_fuse_pointwise(mn_graph **g, size_t *fusions) {
  *fusions = 0;
  mn_fuser f;
  if (!fuser_init(&f, *g)) {
    fuser_free(&f);
    return mn_fail(MN_ERR_OUT_OF_MEMORY, "optimizer: out of memory fusing");
  }
  /* Roots latest first: a group grows towards its inputs, so every node that could hold
   * this one in its group has been a root already. */
  for (size_t i = (*g)->num_nodes; i-- > 0;)
    if (f.kind[i] != FUSE_NONE && f.group_of[i] == -1) grow(&f, (mn_node)i);
  mn_status st = MN_OK;
  if (f.num_groups) {
    mn_graph *fused = NULL;
    st = mn_fuser_rebuild(&f, &fused);
    if (st == MN_OK) {
      mn_graph_free(*g);
      *g = fused;
      *fusions = f.num_groups;
    }
  }
  fuser_free(&f);
  return st;
}
