/* The fused graph from the groups of fusion.c: each group's program, the order of the new
 * graph, and the extra_output nodes through which values leaving a group are read. */
#include <stdlib.h>
#include <string.h>

#include "host/error.h"
#include "optimizer/fusion_groups.h"

/* The program of group k and the values it reads, in the order the program first reads
 * them; returns how many. Members whose value leaves the group (but the root, the node's
 * own value) become extra values 1, 2, .. in member order; out_of[m] is member m's. */
static int program_of(const mn_fuser *f, size_t k, mn_fused_prog *p, mn_node *ext, int *out_of) {
  size_t nm;
  const mn_node *mem = mn_fuser_group(f, k, &nm);
  int32_t gid = (int32_t)k;
  int ne = 0, extra = 0;
  memset(p, 0, sizeof *p);
  p->num_instrs = (int)nm;
  for (size_t m = 0; m < nm; m++) {
    const mn_node_rec *r = &f->g->nodes[mem[m]];
    mn_fused_instr *in = &p->instrs[m];
    in->op = r->op;
    in->scale = r->op == MN_OP_SCALE ? r->attrs.scale : 0.0f;
    in->eps = mn_fused_is_row_op(r->op) ? r->attrs.eps : 0.0f;
    out_of[m] = m + 1 < nm && mn_fuser_leaves(f, gid, mem[m]) ? ++extra : 0;
    in->out = (uint8_t)out_of[m];
    for (int a = 0; a < r->num_inputs; a++) {
      mn_node v = r->inputs[a];
      int slot = 0;
      if (f->group_of[v] == gid) {
        while (mem[slot] != v)
          slot++;
        slot += MN_FUSED_MAX_INPUTS; /* renumbered below, once the inputs are counted */
      } else {
        while (slot < ne && ext[slot] != v)
          slot++;
        if (slot == ne) ext[ne++] = v;
      }
      in->args[a] = (uint8_t)slot;
    }
  }
  for (size_t m = 0; m < nm; m++)
    for (int a = 0; a < mn_op_table[p->instrs[m].op].arity; a++)
      if (p->instrs[m].args[a] >= MN_FUSED_MAX_INPUTS)
        p->instrs[m].args[a] = (uint8_t)(p->instrs[m].args[a] - MN_FUSED_MAX_INPUTS + ne);
  return ne;
}

/* A node of the fused graph in the making: a node left as it was (group -1) or a group. */
typedef struct entry {
  double pos;
  mn_node node; /* the node, or the group's root */
  int32_t group;
} entry;

static int by_place(const void *a, const void *b) {
  const entry *x = a, *y = b;
  if (x->pos != y->pos) return x->pos < y->pos ? -1 : 1;
  return x->node < y->node ? -1 : x->node > y->node;
}

/* Why emitting a node failed. */
typedef enum emit_result { EMITTED, EMIT_OOM, EMIT_MISORDER } emit_result;

/* Appends group k's fused node and its extra_output nodes; sets new_id of the members whose
 * values leave. */
static emit_result emit_group(const mn_fuser *f, size_t k, mn_graph *c, mn_node *new_id) {
  size_t nm;
  const mn_node *mem = mn_fuser_group(f, k, &nm);
  mn_node ext[MN_FUSED_MAX_INPUTS];
  int out_of[MN_FUSED_MAX_INSTRS];
  mn_node_rec *dst = &c->nodes[c->num_nodes];
  mn_node fused = (mn_node)c->num_nodes++; /* counted first so that mn_graph_free releases it */
  if (!(dst->fused = malloc(sizeof *dst->fused))) return EMIT_OOM;
  dst->op = MN_OP_FUSED;
  dst->type = f->g->nodes[mem[nm - 1]].type;
  dst->num_inputs = program_of(f, k, dst->fused, ext, out_of);
  for (int i = 0; i < dst->num_inputs; i++)
    if ((dst->inputs[i] = new_id[ext[i]]) == MN_NO_NODE) return EMIT_MISORDER;
  new_id[mem[nm - 1]] = fused;
  for (size_t m = 0; m < nm; m++) {
    if (!out_of[m]) continue;
    mn_node_rec *x = &c->nodes[c->num_nodes];
    x->op = MN_OP_EXTRA_OUTPUT;
    x->num_inputs = 1;
    x->inputs[0] = fused;
    x->type = f->g->nodes[mem[m]].type;
    x->attrs.variant = out_of[m];
    new_id[mem[m]] = (mn_node)c->num_nodes++;
  }
  return EMITTED;
}

static emit_result emit_node(const mn_fuser *f, mn_node i, mn_graph *c, mn_node *new_id) {
  mn_node_rec *dst = &c->nodes[c->num_nodes];
  c->num_nodes++;
  if (!mn_node_rec_copy(dst, &f->g->nodes[i])) return EMIT_OOM;
  for (int k = 0; k < dst->num_inputs; k++)
    if ((dst->inputs[k] = new_id[dst->inputs[k]]) == MN_NO_NODE) return EMIT_MISORDER;
  new_id[i] = (mn_node)(c->num_nodes - 1);
  return EMITTED;
}

mn_status mn_fuser_rebuild(const mn_fuser *f, mn_graph **out) {
  const mn_graph *g = f->g;
  size_t n = g->num_nodes ? g->num_nodes : 1, num_entries = 0;
  mn_graph *c = mn_graph_new();
  mn_node *new_id = malloc(n * sizeof *new_id);
  entry *order = malloc(n * sizeof *order);
  emit_result res = c && new_id && order ? EMITTED : EMIT_OOM;
  /* A group of m members makes at most m nodes (its fused node and extras), so the new
   * graph has at most as many nodes as the old one. */
  if (res == EMITTED && g->num_nodes && !(c->nodes = calloc(g->num_nodes, sizeof *c->nodes)))
    res = EMIT_OOM;
  if (res == EMITTED && g->num_outputs &&
      !(c->outputs = malloc(g->num_outputs * sizeof *c->outputs)))
    res = EMIT_OOM;
  if (res == EMITTED) {
    c->cap_nodes = g->num_nodes;
    for (size_t i = 0; i < g->num_nodes; i++) {
      new_id[i] = MN_NO_NODE;
      if (f->group_of[i] < 0)
        order[num_entries++] = (entry){.pos = f->pos[i], .node = (mn_node)i, .group = -1};
    }
    for (size_t k = 0; k < f->num_groups; k++)
      order[num_entries++] =
          (entry){.pos = f->pos[f->roots[k]], .node = f->roots[k], .group = (int32_t)k};
    qsort(order, num_entries, sizeof *order, by_place);
  }
  for (size_t e = 0; res == EMITTED && e < num_entries; e++)
    res = order[e].group < 0 ? emit_node(f, order[e].node, c, new_id)
                             : emit_group(f, (size_t)order[e].group, c, new_id);
  for (size_t i = 0; res == EMITTED && i < g->num_outputs; i++)
    if ((c->outputs[i] = new_id[g->outputs[i]]) == MN_NO_NODE) res = EMIT_MISORDER;
  free(new_id);
  free(order);
  if (res == EMITTED) {
    c->num_outputs = g->num_outputs;
    *out = c;
    return MN_OK;
  }
  mn_graph_free(c);
  return res == EMIT_OOM
             ? mn_fail(MN_ERR_OUT_OF_MEMORY, "optimizer: out of memory fusing")
             : mn_fail(MN_ERR_STATE, "optimizer: fusion left a value read before it is made");
}
