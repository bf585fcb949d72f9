#include "optimizer/siblings.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autodiff/autodiff.h"
#include "host/error.h"
#include "optimizer/cost.h"

/* ---------------------------------------------------------------- prices */

static mn_tensor_type with_last(const mn_tensor_type *t, int64_t last) {
  mn_tensor_type r = *t;
  r.shape[r.rank - 1] = last;
  return r;
}

static double cost2(mn_op op, const mn_tensor_type *out, const mn_tensor_type *a,
                    const mn_tensor_type *b) {
  const mn_tensor_type *ins[2] = {a, b};
  return mn_cost_op(op, out, ins, b ? 2 : 1);
}

mn_siblings_price mn_siblings_price_group(const mn_tensor_type *x, const int64_t *rows, size_t n,
                                          bool backward, bool x_grad) {
  mn_siblings_price p = {0, 0};
  int64_t in = x->shape[x->rank - 1], total = 0;
  for (size_t i = 0; i < n; i++)
    total += rows[i];
  mn_tensor_type y = with_last(x, total), w = mn_type_make(MN_F32, (int64_t[]){total, in}, 2);
  p.concat = cost2(MN_OP_MATMUL_BT, &y, x, &w);
  if (backward) {
    /* dP = matmul_at(dY, x) and dx = matmul(dY, P), dY summed from a slice_last_grad per
     * source; the separate form adds its n contributions to dx instead. */
    p.concat += cost2(MN_OP_MATMUL_AT, &w, &y, x) + (double)(n - 1) * cost2(MN_OP_ADD, &y, &y, &y);
    if (x_grad) p.concat += cost2(MN_OP_MATMUL, x, &y, &w);
    if (x_grad) p.separate += (double)(n - 1) * cost2(MN_OP_ADD, x, x, x);
  }
  for (size_t i = 0; i < n; i++) {
    mn_tensor_type yi = with_last(x, rows[i]),
                   wi = mn_type_make(MN_F32, (int64_t[]){rows[i], in}, 2);
    p.separate += cost2(MN_OP_MATMUL_BT, &yi, x, &wi);
    p.concat += cost2(MN_OP_SLICE_LAST, &yi, &y, NULL);
    if (!backward) continue;
    p.separate += cost2(MN_OP_MATMUL_AT, &wi, &yi, x);
    if (x_grad) p.separate += cost2(MN_OP_MATMUL, x, &yi, &wi);
    p.concat += cost2(MN_OP_SLICE_LAST_GRAD, &y, &yi, NULL);
  }
  return p;
}

/* ---------------------------------------------------------------- the pass */

typedef struct pass {
  const char *fn;
  const mn_graph *g;
  bool training, always;
  uint32_t *uses;           /* readers of each node, counted per input slot */
  unsigned char *is_output; /* graph outputs */
  unsigned char *x_grad;    /* a parameter reaches the node (the gradient flows back to it) */
  mn_node *next;            /* next candidate product with the same x, in node order */
  mn_node *first;           /* per x: its first candidate product */
  int32_t *grads;           /* training: autodiff's gradient outputs per node, made on demand */
  bool grads_tried;         /* grads was attempted (NULL then: autodiff failed, no groups) */
  int32_t *group_of;        /* per node: the group of a member product, else -1 */
  unsigned char *drop;      /* source weights, which the derived parameter replaces */
  mn_node *members;         /* the products of every group, group after group */
  size_t *group_start;      /* group k: members[group_start[k], group_start[k + 1]) */
  char **names;             /* group k: the derived parameter's name */
  size_t num_groups, num_members;
} pass;

static void pass_free(pass *p) {
  free(p->uses);
  free(p->is_output);
  free(p->x_grad);
  free(p->next);
  free(p->first);
  free(p->grads);
  free(p->group_of);
  free(p->drop);
  free(p->members);
  free(p->group_start);
  for (size_t k = 0; p->names && k < p->num_groups; k++)
    free(p->names[k]);
  free(p->names);
}

static bool pass_init(pass *p) {
  const mn_graph *g = p->g;
  size_t n = g->num_nodes ? g->num_nodes : 1;
  p->uses = calloc(n, sizeof *p->uses);
  p->is_output = calloc(n, 1);
  p->x_grad = calloc(n, 1);
  p->next = malloc(n * sizeof *p->next);
  p->first = malloc(n * sizeof *p->first);
  p->group_of = malloc(n * sizeof *p->group_of);
  p->drop = calloc(n, 1);
  p->members = malloc(n * sizeof *p->members);
  p->group_start = malloc((n + 1) * sizeof *p->group_start);
  p->names = calloc(n, sizeof *p->names);
  if (!p->uses || !p->is_output || !p->x_grad || !p->next || !p->first || !p->group_of ||
      !p->drop || !p->members || !p->group_start || !p->names)
    return false;
  for (size_t i = 0; i < g->num_outputs; i++)
    p->is_output[g->outputs[i]] = 1;
  for (size_t i = 0; i < g->num_nodes; i++) {
    const mn_node_rec *r = &g->nodes[i];
    p->next[i] = p->first[i] = MN_NO_NODE;
    p->group_of[i] = -1;
    p->x_grad[i] = r->op == MN_OP_PARAMETER;
    for (int k = 0; k < r->num_inputs; k++) {
      p->uses[r->inputs[k]]++;
      p->x_grad[i] |= p->x_grad[r->inputs[k]] && r->op != MN_OP_GREATER;
    }
  }
  p->group_start[0] = 0;
  return true;
}

/* A product the rules let into a group (gradients aside): matmul_bt of an F32 x with an
 * F32 [out, in] parameter that nothing else reads, neither of them a graph output. */
static bool candidate(const pass *p, mn_node i) {
  const mn_node_rec *m = &p->g->nodes[i];
  if (m->op != MN_OP_MATMUL_BT || m->num_inputs != 2 || p->is_output[i]) return false;
  const mn_node_rec *x = &p->g->nodes[m->inputs[0]], *w = &p->g->nodes[m->inputs[1]];
  return w->op == MN_OP_PARAMETER && !mn_param_is_derived(w) && !mn_param_is_frozen(w) &&
         w->type.dtype == MN_F32 && w->type.rank == 2 && p->uses[m->inputs[1]] == 1 &&
         !p->is_output[m->inputs[1]] && x->type.dtype == MN_F32 && x->type.rank >= 1 &&
         m->inputs[0] != m->inputs[1];
}

/* Whether source w gets a gradient from the unoptimized graph: autodiff of it, run once and
 * only when a group is about to form. */
static bool has_grad(pass *p, mn_node w) {
  if (!p->grads_tried) {
    p->grads_tried = true;
    size_t n = p->g->num_nodes ? p->g->num_nodes : 1;
    mn_graph *full = NULL;
    if ((p->grads = malloc(n * sizeof *p->grads)) &&
        mn_autodiff(p->fn, p->g, &full, p->grads) != MN_OK) {
      free(p->grads);
      p->grads = NULL;
    }
    mn_graph_free(full);
  }
  return p->grads && p->grads[w] >= 0;
}

static bool group_pays(const pass *p, const mn_node *prods, size_t n) {
  if (p->always) return true;
  int64_t rows[MN_SIBLINGS_MAX_GROUP];
  const mn_graph *g = p->g;
  for (size_t i = 0; i < n; i++)
    rows[i] = g->nodes[g->nodes[prods[i]].inputs[1]].type.shape[0];
  mn_node x = g->nodes[prods[0]].inputs[0];
  mn_siblings_price price =
      mn_siblings_price_group(&g->nodes[x].type, rows, n, p->training, p->x_grad[x] != 0);
  return price.concat < price.separate;
}

/* The products of x that form a group (at most MN_SIBLINGS_MAX_GROUP, in node order) into
 * prods; their count, 0 when none form. */
static size_t choose(pass *p, mn_node x, mn_node *prods) {
  size_t n = 0;
  int64_t rows = 0;
  for (mn_node i = p->first[x]; i != MN_NO_NODE && n < MN_SIBLINGS_MAX_GROUP; i = p->next[i]) {
    int64_t r = p->g->nodes[p->g->nodes[i].inputs[1]].type.shape[0];
    /* slice_last keeps its start in an int. */
    if (r > INT_MAX - rows) break;
    rows += r;
    prods[n++] = i;
  }
  if (n < 2 || !group_pays(p, prods, n)) return 0;
  if (!p->training) return n;
  size_t kept = 0;
  for (size_t i = 0; i < n; i++)
    if (has_grad(p, p->g->nodes[prods[i]].inputs[1])) prods[kept++] = prods[i];
  return kept >= 2 && group_pays(p, prods, kept) ? kept : 0;
}

/* "#siblings(q.weight,k.weight)", for reports; NULL when out of memory. */
static char *derived_name(const mn_graph *g, const mn_node *prods, size_t n) {
  size_t size = sizeof "#siblings()";
  for (size_t i = 0; i < n; i++)
    size += strlen(g->nodes[g->nodes[prods[i]].inputs[1]].name) + 1;
  char *s = malloc(size);
  if (!s) return NULL;
  size_t used = (size_t)snprintf(s, size, "#siblings(");
  for (size_t i = 0; i < n; i++)
    used += (size_t)snprintf(s + used, size - used, "%s%s", i ? "," : "",
                             g->nodes[g->nodes[prods[i]].inputs[1]].name);
  snprintf(s + used, size - used, ")");
  return s;
}

/* Whether name is taken: a leaf of the user's, however unlikely, or an earlier group's. */
static bool name_taken(const pass *p, const char *name) {
  for (size_t k = 0; k < p->num_groups; k++)
    if (strcmp(p->names[k], name) == 0) return true;
  return mn_graph_find_leaf(p->g, MN_OP_PARAMETER, name) != MN_NO_NODE ||
         mn_graph_find_leaf(p->g, MN_OP_INPUT, name) != MN_NO_NODE;
}

static mn_status find_groups(pass *p) {
  const mn_graph *g = p->g;
  /* Chains of candidates per x, in node order. */
  mn_node *tail = malloc((g->num_nodes ? g->num_nodes : 1) * sizeof *tail);
  if (!tail) return mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: out of memory", p->fn);
  for (size_t i = 0; i < g->num_nodes; i++)
    tail[i] = MN_NO_NODE;
  for (mn_node i = 0; i < g->num_nodes; i++) {
    if (!candidate(p, i)) continue;
    mn_node x = g->nodes[i].inputs[0];
    if (tail[x] == MN_NO_NODE)
      p->first[x] = i;
    else
      p->next[tail[x]] = i;
    tail[x] = i;
  }
  free(tail);
  mn_node prods[MN_SIBLINGS_MAX_GROUP];
  for (mn_node x = 0; x < g->num_nodes; x++) {
    if (p->first[x] == MN_NO_NODE) continue;
    size_t n = choose(p, x, prods);
    if (!n) continue;
    char *name = derived_name(g, prods, n);
    if (!name) return mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: out of memory", p->fn);
    if (name_taken(p, name)) {
      free(name);
      continue;
    }
    p->names[p->num_groups] = name;
    for (size_t k = 0; k < n; k++) {
      p->group_of[prods[k]] = (int32_t)p->num_groups;
      p->drop[g->nodes[prods[k]].inputs[1]] = 1;
      p->members[p->num_members++] = prods[k];
    }
    p->group_start[++p->num_groups] = p->num_members;
  }
  return MN_OK;
}

/* Appends a copy of r reading map[] of its inputs; MN_NO_NODE when out of memory. */
static mn_node append_copy(mn_graph *out, const mn_node_rec *r, const mn_node *map) {
  mn_node ins[MN_MAX_INPUTS];
  for (int k = 0; k < r->num_inputs; k++)
    ins[k] = map[r->inputs[k]];
  mn_node id = mn_graph_append(out, r->op, ins, r->num_inputs, &r->type, &r->attrs, r->name);
  if (id == MN_NO_NODE) return id;
  mn_node_rec *c = &out->nodes[id];
  if (r->data) {
    size_t bytes = (size_t)mn_tensor_type_numel(&r->type) * sizeof(float);
    if (!(c->data = malloc(bytes))) return MN_NO_NODE;
    memcpy(c->data, r->data, bytes);
  }
  if (r->fused && !(c->fused = mn_fused_prog_dup(r->fused))) return MN_NO_NODE;
  return id;
}

/* Group k at the place of its first product: P, Y = matmul_bt(x, P), a slice per product. */
static bool append_group(const pass *p, size_t k, mn_graph *out, mn_node *map) {
  const mn_graph *g = p->g;
  const mn_node *prods = p->members + p->group_start[k];
  size_t n = p->group_start[k + 1] - p->group_start[k];
  const mn_node_rec *m0 = &g->nodes[prods[0]];
  int64_t in = g->nodes[m0->inputs[1]].type.shape[1], total = 0;
  for (size_t i = 0; i < n; i++)
    total += g->nodes[g->nodes[prods[i]].inputs[1]].type.shape[0];
  mn_tensor_type pt = mn_type_make(MN_F32, (int64_t[]){total, in}, 2);
  mn_op_attrs marker = {.variant = MN_PARAM_DERIVED};
  mn_node param = mn_graph_append(out, MN_OP_PARAMETER, NULL, 0, &pt, &marker, p->names[k]);
  if (param == MN_NO_NODE) return false;
  mn_node ins[2] = {map[m0->inputs[0]], param};
  mn_tensor_type yt = with_last(&m0->type, total);
  mn_node y = mn_graph_append(out, MN_OP_MATMUL_BT, ins, 2, &yt, NULL, NULL);
  if (y == MN_NO_NODE) return false;
  int64_t offset = 0;
  for (size_t i = 0; i < n; i++) {
    mn_op_attrs at = {.pos_offset = (int)offset};
    mn_node s = mn_graph_append(out, MN_OP_SLICE_LAST, &y, 1, &g->nodes[prods[i]].type, &at, NULL);
    if (s == MN_NO_NODE) return false;
    map[prods[i]] = s;
    offset += g->nodes[g->nodes[prods[i]].inputs[1]].type.shape[0];
  }
  return true;
}

/* The table of group k: its sources' names and types, at their rows of the derived weight. */
static mn_status describe_group(const pass *p, size_t k, mn_param_layout *layout) {
  const mn_graph *g = p->g;
  size_t offset = 0;
  for (size_t i = p->group_start[k]; i < p->group_start[k + 1]; i++) {
    const mn_node_rec *w = &g->nodes[g->nodes[p->members[i]].inputs[1]];
    if (mn_param_layout_add(layout, p->names[k], w->name, offset, &w->type) != MN_OK)
      return mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: out of memory", p->fn);
    offset += (size_t)mn_tensor_type_numel(&w->type);
  }
  return MN_OK;
}

/* The rewritten graph: nodes in their order, each group's nodes where its first product
 * was (x comes earlier, every product's user later), the sources left out. */
static mn_status rebuild(const pass *p, mn_graph **out) {
  const mn_graph *g = p->g;
  mn_graph *r = mn_graph_new();
  mn_node *map = malloc((g->num_nodes ? g->num_nodes : 1) * sizeof *map);
  bool ok = r && map;
  unsigned char *placed = calloc(p->num_groups ? p->num_groups : 1, 1);
  ok = ok && placed;
  for (size_t i = 0; ok && i < g->num_nodes; i++) {
    int32_t k = p->group_of[i];
    if (p->drop[i]) {
      map[i] = MN_NO_NODE;
    } else if (k >= 0) {
      ok = placed[k] || append_group(p, (size_t)k, r, map);
      placed[k] = 1;
    } else {
      ok = (map[i] = append_copy(r, &g->nodes[i], map)) != MN_NO_NODE;
    }
  }
  if (ok && g->num_outputs) {
    ok = (r->outputs = malloc(g->num_outputs * sizeof *r->outputs)) != NULL;
    for (size_t i = 0; ok && i < g->num_outputs; i++)
      r->outputs[r->num_outputs++] = map[g->outputs[i]];
  }
  free(placed);
  free(map);
  if (!ok || r->status != MN_OK) {
    mn_graph_free(r);
    return mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: out of memory concatenating sibling weights", p->fn);
  }
  *out = r;
  return MN_OK;
}

mn_status mn_siblings_concat(const char *fn, mn_graph **g, const mn_session_options *o,
                             bool training, mn_param_layout *layout, size_t *groups) {
  if (groups) *groups = 0;
  if (!o || !o->optimize || o->siblings == MN_SIBLINGS_NEVER || (*g)->num_outputs == 0)
    return MN_OK;
  pass p = {.fn = fn, .g = *g, .training = training, .always = o->siblings == MN_SIBLINGS_ALWAYS};
  mn_status st =
      pass_init(&p) ? find_groups(&p) : mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
  mn_graph *out = NULL;
  if (st == MN_OK && p.num_groups) st = rebuild(&p, &out);
  for (size_t k = 0; st == MN_OK && k < p.num_groups; k++)
    st = describe_group(&p, k, layout);
  if (st != MN_OK) {
    mn_graph_free(out);
    out = NULL;
    mn_param_layout_clear(layout);
  }
  if (out) {
    mn_graph_free(*g);
    *g = out;
    if (groups) *groups = p.num_groups;
  }
  pass_free(&p);
  return st;
}
