#include "fusion.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "cost.h"
#include "error.h"

static atomic_bool fusion_on = true;

void mn_fusion_set_enabled(bool on) { atomic_store(&fusion_on, on); }
bool mn_fusion_enabled(void) { return atomic_load(&fusion_on); }

typedef struct fuser {
  const mn_graph *g;
  uint32_t *user_start, *users; /* users of node i: users[user_start[i] .. user_start[i+1]) */
  unsigned char *is_output, *fusable;
  int32_t *group_of;     /* per node: the group it joined, -1 */
  mn_node *members;      /* every group's members, group after group, ascending */
  uint32_t *group_start; /* group k's members: members[group_start[k] .. [k+1]) */
  mn_node *roots;        /* per group */
  size_t num_groups, num_members;
} fuser;

static bool same_type(const mn_tensor_type *a, const mn_tensor_type *b) {
  return a->dtype == b->dtype && mn_type_same_shape(a, b);
}

/* A node a group may hold: a pointwise op over F32 inputs of its own type (no broadcast).
 * A fused node is not taken apart again. */
static bool is_fusable(const mn_graph *g, const mn_node_rec *n) {
  if (!(mn_op_flags(n->op) & MN_OPF_POINTWISE) || n->op == MN_OP_FUSED || n->type.dtype != MN_F32 ||
      n->num_inputs != mn_op_table[n->op].arity || n->num_inputs > MN_FUSED_MAX_ARGS)
    return false;
  for (int k = 0; k < n->num_inputs; k++)
    if (!same_type(&g->nodes[n->inputs[k]].type, &n->type)) return false;
  return true;
}

static bool fuser_init(fuser *f, const mn_graph *g) {
  size_t n = g->num_nodes ? g->num_nodes : 1, edges = 0;
  for (size_t i = 0; i < g->num_nodes; i++)
    edges += (size_t)g->nodes[i].num_inputs;
  *f = (fuser){.g = g};
  f->user_start = calloc(n + 1, sizeof *f->user_start);
  f->users = malloc((edges ? edges : 1) * sizeof *f->users);
  f->is_output = calloc(n, 1);
  f->fusable = calloc(n, 1);
  f->group_of = malloc(n * sizeof *f->group_of);
  f->members = malloc(n * sizeof *f->members);
  f->group_start = malloc((n + 1) * sizeof *f->group_start);
  f->roots = malloc(n * sizeof *f->roots);
  if (!f->user_start || !f->users || !f->is_output || !f->fusable || !f->group_of || !f->members ||
      !f->group_start || !f->roots)
    return false;
  for (size_t i = 0; i < g->num_nodes; i++)
    for (int k = 0; k < g->nodes[i].num_inputs; k++)
      f->user_start[g->nodes[i].inputs[k] + 1]++;
  for (size_t i = 0; i < g->num_nodes; i++)
    f->user_start[i + 1] += f->user_start[i];
  uint32_t *fill = malloc(n * sizeof *fill);
  if (!fill) return false;
  memcpy(fill, f->user_start, g->num_nodes * sizeof *fill);
  for (size_t i = 0; i < g->num_nodes; i++)
    for (int k = 0; k < g->nodes[i].num_inputs; k++)
      f->users[fill[g->nodes[i].inputs[k]]++] = (uint32_t)i;
  free(fill);
  for (size_t i = 0; i < g->num_outputs; i++)
    f->is_output[g->outputs[i]] = 1;
  for (size_t i = 0; i < g->num_nodes; i++) {
    f->group_of[i] = -1;
    f->fusable[i] = is_fusable(g, &g->nodes[i]);
  }
  return true;
}

static void fuser_free(fuser *f) {
  free(f->user_start);
  free(f->users);
  free(f->is_output);
  free(f->fusable);
  free(f->group_of);
  free(f->members);
  free(f->group_start);
  free(f->roots);
}

/* The values a group reads: members' inputs that are no members, each once. Returns how
 * many, or MN_MAX_INPUTS + 1 when more (ext then holds the first MN_MAX_INPUTS). */
static int externals(const fuser *f, int32_t gid, const mn_node *mem, size_t nm, mn_node *ext) {
  int ne = 0;
  for (size_t m = 0; m < nm; m++) {
    const mn_node_rec *r = &f->g->nodes[mem[m]];
    for (int k = 0; k < r->num_inputs; k++) {
      mn_node v = r->inputs[k];
      bool seen = f->group_of[v] == gid;
      for (int j = 0; !seen && j < ne; j++)
        seen = ext[j] == v;
      if (seen) continue;
      if (ne == MN_MAX_INPUTS) return MN_MAX_INPUTS + 1;
      ext[ne++] = v;
    }
  }
  return ne;
}

/* Whether v may join group gid: a pointwise node of the root's type, no output, every
 * user of it a member already (so its value never leaves the group). */
static bool may_join(const fuser *f, int32_t gid, mn_node root, mn_node v) {
  if (!f->fusable[v] || f->group_of[v] != -1 || f->is_output[v] ||
      !same_type(&f->g->nodes[v].type, &f->g->nodes[root].type))
    return false;
  for (uint32_t u = f->user_start[v]; u < f->user_start[v + 1]; u++)
    if (f->group_of[f->users[u]] != gid) return false;
  return true;
}

static int by_node(const void *a, const void *b) {
  mn_node x = *(const mn_node *)a, y = *(const mn_node *)b;
  return x < y ? -1 : x > y;
}

/* Cost of the group's ops one by one, and as one fused node reading its externals. */
static bool cheaper_fused(const fuser *f, const mn_node *mem, size_t nm, const mn_node *ext,
                          int ne) {
  const mn_graph *g = f->g;
  const mn_tensor_type *ins[MN_MAX_INPUTS];
  double apart = 0;
  for (size_t m = 0; m < nm; m++) {
    const mn_node_rec *r = &g->nodes[mem[m]];
    for (int k = 0; k < r->num_inputs; k++)
      ins[k] = &g->nodes[r->inputs[k]].type;
    apart += mn_cost_op(r->op, &r->type, ins, r->num_inputs);
  }
  for (int k = 0; k < ne; k++)
    ins[k] = &g->nodes[ext[k]].type;
  return mn_cost_op(MN_OP_FUSED, &g->nodes[mem[nm - 1]].type, ins, ne) < apart;
}

/* Grows the group rooted at r by absorbing, one at a time, the latest external that may
 * join and keeps the group within MN_MAX_INPUTS reads; keeps it when it has two ops or
 * more and the cost model prefers it. */
static void grow(fuser *f, mn_node r) {
  int32_t gid = (int32_t)f->num_groups;
  mn_node *mem = f->members + f->num_members, ext[MN_MAX_INPUTS];
  size_t nm = 0;
  mem[nm++] = r;
  f->group_of[r] = gid;
  int ne = externals(f, gid, mem, nm, ext);
  for (bool grew = true; grew && nm < MN_FUSED_MAX_INSTRS;) {
    grew = false;
    /* Latest first: a value is tried after its users, which may have to join first. */
    qsort(ext, (size_t)ne, sizeof *ext, by_node);
    for (int j = ne; j-- > 0 && !grew;) {
      mn_node v = ext[j];
      if (!may_join(f, gid, r, v)) continue;
      mn_node next[MN_MAX_INPUTS];
      f->group_of[v] = gid;
      mem[nm] = v;
      int nn = externals(f, gid, mem, nm + 1, next);
      if (nn > MN_MAX_INPUTS) {
        f->group_of[v] = -1;
        continue;
      }
      nm++;
      ne = nn;
      memcpy(ext, next, (size_t)nn * sizeof *ext);
      grew = true;
    }
  }
  qsort(mem, nm, sizeof *mem, by_node);
  if (nm < 2 || !cheaper_fused(f, mem, nm, ext, ne)) {
    for (size_t m = 0; m < nm; m++)
      f->group_of[mem[m]] = -1;
    return;
  }
  f->group_start[gid] = (uint32_t)f->num_members;
  f->roots[gid] = r;
  f->num_members += nm;
  f->num_groups++;
}

/* The program of group k and the values it reads, in the order the program first reads
 * them; returns how many. */
static int program_of(const fuser *f, size_t k, mn_fused_prog *p, mn_node *ext) {
  const mn_node *mem = f->members + f->group_start[k];
  size_t nm = (k + 1 < f->num_groups ? f->group_start[k + 1] : f->num_members) - f->group_start[k];
  int ne = externals(f, (int32_t)k, mem, nm, ext);
  memset(p, 0, sizeof *p);
  p->num_instrs = (int)nm;
  for (size_t m = 0; m < nm; m++) {
    const mn_node_rec *r = &f->g->nodes[mem[m]];
    mn_fused_instr *in = &p->instrs[m];
    in->op = r->op;
    in->scale = r->op == MN_OP_SCALE ? r->attrs.scale : 0.0f;
    for (int a = 0; a < r->num_inputs; a++) {
      mn_node v = r->inputs[a];
      int slot = 0;
      if (f->group_of[v] == (int32_t)k) {
        while (mem[slot] != v)
          slot++;
        slot += ne;
      } else {
        while (ext[slot] != v)
          slot++;
      }
      in->args[a] = (uint8_t)slot;
    }
  }
  return ne;
}

/* The fused graph: every node but the groups' inner members, each group's root replaced
 * by its fused node, inputs and outputs renumbered. */
static mn_status rebuild(const fuser *f, mn_graph **out) {
  const mn_graph *g = f->g;
  mn_graph *c = mn_graph_new();
  mn_node *new_id = malloc((g->num_nodes ? g->num_nodes : 1) * sizeof *new_id);
  size_t *group_at = malloc((g->num_nodes ? g->num_nodes : 1) * sizeof *group_at);
  bool ok = c && new_id && group_at;
  if (ok && g->num_nodes) ok = (c->nodes = calloc(g->num_nodes, sizeof *c->nodes)) != NULL;
  if (ok && g->num_outputs) ok = (c->outputs = malloc(g->num_outputs * sizeof *c->outputs));
  if (ok) {
    c->cap_nodes = g->num_nodes;
    for (size_t i = 0; i < g->num_nodes; i++)
      group_at[i] = SIZE_MAX;
    for (size_t k = 0; k < f->num_groups; k++)
      group_at[f->roots[k]] = k;
  }
  for (size_t i = 0; ok && i < g->num_nodes; i++) {
    new_id[i] = MN_NO_NODE;
    if (f->group_of[i] >= 0 && group_at[i] == SIZE_MAX) continue; /* inside a group */
    mn_node_rec *dst = &c->nodes[c->num_nodes];
    c->num_nodes++; /* counted first so that mn_graph_free releases it */
    if (group_at[i] == SIZE_MAX) {
      ok = mn_node_rec_copy(dst, &g->nodes[i]);
      for (int k = 0; ok && k < dst->num_inputs; k++)
        dst->inputs[k] = new_id[dst->inputs[k]];
    } else {
      mn_node ext[MN_MAX_INPUTS];
      ok = (dst->fused = malloc(sizeof *dst->fused)) != NULL;
      if (ok) {
        dst->op = MN_OP_FUSED;
        dst->type = g->nodes[i].type;
        dst->num_inputs = program_of(f, group_at[i], dst->fused, ext);
        for (int k = 0; k < dst->num_inputs; k++)
          dst->inputs[k] = new_id[ext[k]];
      }
    }
    new_id[i] = (mn_node)(c->num_nodes - 1);
  }
  if (ok) {
    for (size_t i = 0; i < g->num_outputs; i++)
      c->outputs[i] = new_id[g->outputs[i]];
    c->num_outputs = g->num_outputs;
    *out = c;
  } else {
    mn_graph_free(c);
  }
  free(new_id);
  free(group_at);
  return ok ? MN_OK : mn_fail(MN_ERR_OUT_OF_MEMORY, "optimizer: out of memory fusing");
}

mn_status mn_fuse_pointwise(mn_graph **g, size_t *fusions) {
  *fusions = 0;
  fuser f;
  if (!fuser_init(&f, *g)) {
    fuser_free(&f);
    return mn_fail(MN_ERR_OUT_OF_MEMORY, "optimizer: out of memory fusing");
  }
  /* Roots latest first: a group grows towards its inputs, so every node that could hold
   * this one in its group has been a root already. */
  for (size_t i = (*g)->num_nodes; i-- > 0;)
    if (f.fusable[i] && f.group_of[i] == -1) grow(&f, (mn_node)i);
  mn_status st = MN_OK;
  if (f.num_groups) {
    mn_graph *fused = NULL;
    st = rebuild(&f, &fused);
    if (st == MN_OK) {
      mn_graph_free(*g);
      *g = fused;
      *fusions = f.num_groups;
    }
  }
  fuser_free(&f);
  return st;
}
