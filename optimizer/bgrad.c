#include "optimizer/bgrad.h"

#include <stdlib.h>

#include "host/error.h"
#include "optimizer/pass_switch.h"

typedef struct pass {
  const mn_graph *in;
  mn_graph *work;               /* a copy of in, made at the first pair, rewritten in place */
  uint32_t *user_start, *users; /* users of node i in `in`: users[user_start[i] .. [i+1]) */
  uint32_t *stamp;              /* per node: marks of one dependence search */
  mn_node *stack;
  uint32_t gen;
} pass;

static bool pass_init(pass *p, const mn_graph *g) {
  size_t n = g->num_nodes ? g->num_nodes : 1, edges = 0;
  for (size_t i = 0; i < g->num_nodes; i++)
    edges += (size_t)g->nodes[i].num_inputs;
  *p = (pass){.in = g};
  p->user_start = calloc(n + 1, sizeof *p->user_start);
  p->users = malloc((edges ? edges : 1) * sizeof *p->users);
  p->stamp = calloc(n, sizeof *p->stamp);
  p->stack = malloc(n * sizeof *p->stack);
  uint32_t *fill = malloc(n * sizeof *fill);
  bool ok = p->user_start && p->users && p->stamp && p->stack && fill;
  if (ok) {
    for (size_t i = 0; i < g->num_nodes; i++)
      for (int k = 0; k < g->nodes[i].num_inputs; k++)
        p->user_start[g->nodes[i].inputs[k] + 1]++;
    for (size_t i = 0; i < g->num_nodes; i++)
      p->user_start[i + 1] += p->user_start[i];
    for (size_t i = 0; i < g->num_nodes; i++)
      fill[i] = p->user_start[i];
    for (size_t i = 0; i < g->num_nodes; i++)
      for (int k = 0; k < g->nodes[i].num_inputs; k++)
        p->users[fill[g->nodes[i].inputs[k]]++] = (uint32_t)i;
  }
  free(fill);
  return ok;
}

static void pass_free(pass *p) {
  free(p->user_start);
  free(p->users);
  free(p->stamp);
  free(p->stack);
  mn_graph_free(p->work);
}

static const mn_graph *current(const pass *p) { return p->work ? p->work : p->in; }

static int64_t last_dim(const mn_tensor_type *t) { return t->rank ? t->shape[t->rank - 1] : 0; }

/* A sum_rows whose value the BGRAD epilogue writes: F32 [N] or [1, N] from an F32 d whose
 * last dim is N. */
static bool sum_ok(const mn_graph *g, const mn_node_rec *s) {
  if (s->op != MN_OP_SUM_ROWS || s->num_inputs != 1 || s->type.dtype != MN_F32) return false;
  const mn_tensor_type *d = &g->nodes[s->inputs[0]].type;
  int64_t n = last_dim(d);
  bool row = (s->type.rank == 1 && s->type.shape[0] == n) ||
             (s->type.rank == 2 && s->type.shape[0] == 1 && s->type.shape[1] == n);
  return d->dtype == MN_F32 && d->rank >= 2 && n > 0 && row;
}

/* The operand of product m that is d (0: a, 1: b), or -1 when m is no matmul_at of d typed
 * as the builder types it (a [K.., M], b [K.., N] -> [M, N], all F32). */
static int operand_of(const mn_graph *g, mn_node m, mn_node d) {
  const mn_node_rec *p = &g->nodes[m];
  if (p->op != MN_OP_MATMUL_AT || p->num_inputs != 2) return -1;
  const mn_tensor_type *a = &g->nodes[p->inputs[0]].type, *b = &g->nodes[p->inputs[1]].type;
  int64_t ma = last_dim(a), nb = last_dim(b);
  if (a->dtype != MN_F32 || b->dtype != MN_F32 || p->type.dtype != MN_F32 || !ma || !nb ||
      mn_tensor_type_numel(a) / ma != mn_tensor_type_numel(b) / nb || p->type.rank != 2 ||
      p->type.shape[0] != ma || p->type.shape[1] != nb)
    return -1;
  return p->inputs[0] == d ? 0 : p->inputs[1] == d ? 1 : -1;
}

/* Whether node `from` depends on node `target` in the current graph. */
static bool depends(pass *p, mn_node from, mn_node target) {
  const mn_graph *g = current(p);
  size_t top = 0;
  p->gen++;
  p->stack[top++] = from;
  p->stamp[from] = p->gen;
  while (top) {
    const mn_node_rec *n = &g->nodes[p->stack[--top]];
    for (int k = 0; k < n->num_inputs; k++) {
      mn_node in = n->inputs[k];
      if (in == target) return true;
      if (p->stamp[in] != p->gen) p->stamp[p->stack[top++] = in] = p->gen;
    }
  }
  return false;
}

/* Pairs sum s with the first product of its input that takes it; false when out of memory. */
static bool pair(pass *p, mn_node s, size_t *made) {
  mn_node d = current(p)->nodes[s].inputs[0];
  for (uint32_t u = p->user_start[d]; u < p->user_start[d + 1]; u++) {
    mn_node m = p->users[u];
    int slot = operand_of(current(p), m, d);
    if (slot < 0 || depends(p, m, s)) continue;
    if (!p->work && !(p->work = mn_graph_clone(p->in))) return false;
    mn_node_rec *prod = &p->work->nodes[m], *sum = &p->work->nodes[s];
    prod->op = MN_OP_MATMUL_AT_BGRAD;
    prod->attrs = (mn_op_attrs){.variant = slot};
    sum->op = MN_OP_EXTRA_OUTPUT;
    sum->inputs[0] = m;
    sum->attrs = (mn_op_attrs){.variant = 1};
    (*made)++;
    return true;
  }
  return true;
}

/* Sum s of a gelu_grad's or matmul_drelu's value rides on that kernel (gelu_grad_bgrad,
 * matmul_drelu_bgrad): 1 when paired, 0 when s sums something else, -1 out of memory. */
static int pair_gradient(pass *p, mn_node s, size_t *made) {
  mn_node d = current(p)->nodes[s].inputs[0];
  const mn_node_rec *dn = &current(p)->nodes[d];
  bool gelu = dn->op == MN_OP_GELU_GRAD && !mn_optimize_pass_off("gelu_bgrad");
  bool drelu = dn->op == MN_OP_MATMUL_DRELU && !mn_optimize_pass_off("drelu_bgrad");
  if (!(gelu || drelu) || dn->type.dtype != MN_F32) return 0;
  if (!p->work && !(p->work = mn_graph_clone(p->in))) return -1;
  p->work->nodes[d].op = gelu ? MN_OP_GELU_GRAD_BGRAD : MN_OP_MATMUL_DRELU_BGRAD;
  /* gelu_grad_bgrad's variant 0: no value 2; matmul_drelu keeps its product's layout. */
  if (gelu) p->work->nodes[d].attrs = (mn_op_attrs){0};
  mn_node_rec *sum = &p->work->nodes[s];
  sum->op = MN_OP_EXTRA_OUTPUT;
  sum->inputs[0] = d;
  sum->attrs = (mn_op_attrs){.variant = 1};
  (*made)++;
  return 1;
}

static bool is_topological(const mn_graph *g) {
  for (size_t i = 0; i < g->num_nodes; i++)
    for (int k = 0; k < g->nodes[i].num_inputs; k++)
      if (g->nodes[i].inputs[k] >= i) return false;
  return true;
}

mn_status mn_fuse_bias_gradients(mn_graph **g, size_t *made) {
  *made = 0;
  pass p;
  mn_status st = MN_OK;
  if (!pass_init(&p, *g)) {
    pass_free(&p);
    return mn_fail(MN_ERR_OUT_OF_MEMORY, "optimizer: out of memory fusing bias gradients");
  }
  for (size_t s = 0; s < p.in->num_nodes && st == MN_OK; s++) {
    if (!sum_ok(p.in, &p.in->nodes[s])) continue;
    int paired = pair_gradient(&p, (mn_node)s, made);
    if (paired < 0 || (paired == 0 && !pair(&p, (mn_node)s, made)))
      st = mn_fail(MN_ERR_OUT_OF_MEMORY, "optimizer: out of memory fusing bias gradients");
  }
  /* A pair's product now stands where its sum stood, which may precede the product's own
   * place; sorting again moves it (the pairs closed no cycle, so the sort cannot fail but
   * for memory). */
  if (st == MN_OK && p.work && !is_topological(p.work)) {
    mn_graph *sorted = NULL;
    st = mn_graph_toposort_status(p.work, &sorted);
    if (st == MN_ERR_INVALID_ARGUMENT)
      st = mn_fail(MN_ERR_STATE, "optimizer: bias-gradient fusion closed a cycle");
    mn_graph_free(p.work);
    p.work = sorted;
  }
  if (st == MN_OK && p.work) {
    mn_graph_free(*g);
    *g = p.work;
    p.work = NULL;
  }
  if (st != MN_OK) *made = 0;
  pass_free(&p);
  return st;
}
