#include "optimizer/extract.h"

#include <stdlib.h>
#include <string.h>

#include "host/error.h"
#include "optimizer/cost.h"

typedef struct heap_item {
  double cost;
  eg_id node;
} heap_item;

typedef struct heap {
  heap_item *a;
  size_t n, cap;
} heap;

/* Ties go to the older node, so that of equal choices the graph's own op is kept. */
static bool item_less(heap_item x, heap_item y) {
  return x.cost < y.cost || (x.cost == y.cost && x.node < y.node);
}

static bool heap_push(heap *h, double cost, eg_id node) {
  if (h->n == h->cap) {
    size_t cap = h->cap ? 2 * h->cap : 256;
    heap_item *a = realloc(h->a, cap * sizeof *a);
    if (!a) return false;
    h->a = a;
    h->cap = cap;
  }
  size_t i = h->n++;
  heap_item it = {cost, node};
  while (i && item_less(it, h->a[(i - 1) / 2])) {
    h->a[i] = h->a[(i - 1) / 2];
    i = (i - 1) / 2;
  }
  h->a[i] = it;
  return true;
}

static heap_item heap_pop(heap *h) {
  heap_item top = h->a[0], last = h->a[--h->n];
  size_t i = 0;
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= h->n) break;
    if (c + 1 < h->n && item_less(h->a[c + 1], h->a[c])) c++;
    if (!item_less(h->a[c], last)) break;
    h->a[i] = h->a[c];
    i = c;
  }
  if (h->n) h->a[i] = last;
  return top;
}

typedef struct extractor {
  mn_egraph *eg;
  eg_id *best;
  double *cost;     /* per class: cost of its choice */
  uint32_t *users;  /* per class: distinct classes using it */
  uint8_t *pending; /* per node: input classes not final yet */
  uint8_t *done, *relaxed;
  eg_id *seen; /* per node: the class whose finalization last counted it */
  heap h;
} extractor;

static double node_cost(extractor *x, eg_id id) {
  mn_egraph *eg = x->eg;
  const eg_node *n = &eg->nodes[id];
  const mn_tensor_type *ins[MN_MAX_INPUTS];
  double shared = 0;
  for (int k = 0; k < n->num_kids; k++) {
    eg_id c = eg_find(eg, n->kids[k]);
    ins[k] = eg_class_type(eg, c);
    shared += x->cost[c] / (x->users[c] ? x->users[c] : 1);
  }
  return mn_cost_op(n->op, eg_type(eg, n->type), ins, n->num_kids) + shared;
}

static void count_users(extractor *x, eg_id *mark) {
  mn_egraph *eg = x->eg;
  for (size_t c = 0; c < eg->num_nodes; c++)
    mark[c] = EG_NONE;
  for (size_t c = 0; c < eg->num_nodes; c++) {
    if (eg_find(eg, (eg_id)c) != c) continue;
    EG_FOR_USES(eg, c, u) {
      eg_id p = eg->uses[u].node;
      if (eg->nodes[p].dead) continue;
      eg_id pc = eg_find(eg, p);
      if (mark[pc] == c) continue;
      mark[pc] = (eg_id)c;
      x->users[c]++;
    }
  }
}

static bool finalize(extractor *x, eg_id c, heap_item it) {
  mn_egraph *eg = x->eg;
  x->done[c] = 1;
  x->best[c] = it.node;
  x->cost[c] = it.cost;
  EG_FOR_USES(eg, c, u) {
    eg_id p = eg->uses[u].node;
    if (eg->nodes[p].dead || x->seen[p] == c) continue;
    x->seen[p] = c;
    if (--x->pending[p] == 0 && !heap_push(&x->h, node_cost(x, p), p)) return false;
  }
  return true;
}

/* A pinned class whose pinned node cannot be computed takes any node instead (the
 * emitted outputs are then still checked for distinct buffers). */
static bool relax_pins(extractor *x, bool *pushed) {
  mn_egraph *eg = x->eg;
  *pushed = false;
  for (size_t c = 0; c < eg->num_nodes; c++) {
    if (eg_find(eg, (eg_id)c) != c || eg->classes[c].pinned == EG_NONE || x->done[c] ||
        x->relaxed[c])
      continue;
    x->relaxed[c] = 1;
    EG_FOR_NODES(eg, c, id) {
      if (eg->nodes[id].dead || x->pending[id]) continue;
      if (!heap_push(&x->h, node_cost(x, id), id)) return false;
      *pushed = true;
    }
  }
  return true;
}

static bool run(extractor *x) {
  mn_egraph *eg = x->eg;
  for (size_t id = 0; id < eg->num_nodes; id++) {
    const eg_node *n = &eg->nodes[id];
    if (n->dead) continue;
    int distinct = 0;
    for (int k = 0; k < n->num_kids; k++) {
      bool repeated = false;
      for (int j = 0; j < k; j++)
        repeated |= eg_find(eg, n->kids[j]) == eg_find(eg, n->kids[k]);
      distinct += !repeated;
    }
    x->pending[id] = (uint8_t)distinct;
    if (!distinct && !heap_push(&x->h, node_cost(x, (eg_id)id), (eg_id)id)) return false;
  }
  for (;;) {
    while (x->h.n) {
      heap_item it = heap_pop(&x->h);
      eg_id c = eg_find(eg, it.node);
      if (x->done[c]) continue;
      eg_id pin = eg_resolve(eg, eg->classes[c].pinned);
      if (pin != EG_NONE && pin != it.node && !x->relaxed[c]) continue;
      if (!finalize(x, c, it)) return false;
    }
    bool pushed;
    if (!relax_pins(x, &pushed)) return false;
    if (!pushed) return true;
  }
}

/* ---- refining the choices against the cost of the whole graph
 *
 * The greedy pass prices a shared input at its cost over its users, an estimate: a class
 * counts every class that could use it, chosen or not. Where the estimate is off, it picks a
 * node that computes a value (a product, a norm) a second time although the separate ops
 * would cost less, or keeps a value alive for one user although another node would do
 * without it. The refinement then moves one class at a time to another of its nodes when
 * that lowers the exact cost of the graph the outputs need (every needed class's node
 * priced once by the cost model), until no such move is left. */

typedef struct refiner {
  mn_egraph *eg;
  eg_id *best;
  uint32_t *refs;  /* per class: chosen nodes of needed classes reading it, plus 1 per output */
  eg_id *stack;    /* one cascade at a time: each class enters it at most once */
  uint32_t *stamp; /* per class: cycle search marks */
  uint32_t gen;
} refiner;

static double own_cost(mn_egraph *eg, eg_id id) {
  const eg_node *n = &eg->nodes[id];
  const mn_tensor_type *ins[MN_MAX_INPUTS];
  for (int k = 0; k < n->num_kids; k++)
    ins[k] = eg_class_type(eg, n->kids[k]);
  return mn_cost_op(n->op, eg_type(eg, n->type), ins, n->num_kids);
}

/* One more reader of class c: what the classes this makes needed cost. */
static double need(refiner *r, eg_id c) {
  mn_egraph *eg = r->eg;
  double added = 0;
  size_t top = 0;
  if (r->refs[c]++ == 0) r->stack[top++] = c;
  while (top) {
    eg_id id = r->best[r->stack[--top]];
    if (id == EG_NONE) continue;
    added += own_cost(eg, id);
    for (int k = 0; k < eg->nodes[id].num_kids; k++) {
      eg_id kc = eg_find(eg, eg->nodes[id].kids[k]);
      if (r->refs[kc]++ == 0) r->stack[top++] = kc;
    }
  }
  return added;
}

/* One reader less: what the classes no longer needed cost. */
static double release(refiner *r, eg_id c) {
  mn_egraph *eg = r->eg;
  double removed = 0;
  size_t top = 0;
  if (--r->refs[c] == 0) r->stack[top++] = c;
  while (top) {
    eg_id id = r->best[r->stack[--top]];
    if (id == EG_NONE) continue;
    removed += own_cost(eg, id);
    for (int k = 0; k < eg->nodes[id].num_kids; k++) {
      eg_id kc = eg_find(eg, eg->nodes[id].kids[k]);
      if (--r->refs[kc] == 0) r->stack[top++] = kc;
    }
  }
  return removed;
}

/* Makes `to` class c's choice in place of `from`; the change in the graph's cost. */
static double switch_node(refiner *r, eg_id c, eg_id from, eg_id to) {
  mn_egraph *eg = r->eg;
  r->best[c] = to;
  double delta = own_cost(eg, to) - own_cost(eg, from);
  for (int k = 0; k < eg->nodes[to].num_kids; k++)
    delta += need(r, eg_find(eg, eg->nodes[to].kids[k]));
  for (int k = 0; k < eg->nodes[from].num_kids; k++)
    delta -= release(r, eg_find(eg, eg->nodes[from].kids[k]));
  return delta;
}

/* Whether class c is reachable from node id's inputs through the choices (a cycle). */
static bool reaches(refiner *r, eg_id id, eg_id c) {
  mn_egraph *eg = r->eg;
  size_t top = 0;
  r->gen++;
  for (int k = 0; k < eg->nodes[id].num_kids; k++) {
    eg_id kc = eg_find(eg, eg->nodes[id].kids[k]);
    if (r->stamp[kc] != r->gen) r->stamp[r->stack[top++] = kc] = r->gen;
  }
  while (top) {
    eg_id cur = r->stack[--top];
    if (cur == c) return true;
    eg_id n = r->best[cur];
    if (n == EG_NONE) continue;
    for (int k = 0; k < eg->nodes[n].num_kids; k++) {
      eg_id kc = eg_find(eg, eg->nodes[n].kids[k]);
      if (r->stamp[kc] != r->gen) r->stamp[r->stack[top++] = kc] = r->gen;
    }
  }
  return false;
}

/* Whether every input class of node id has a choice. */
static bool computable(mn_egraph *eg, const eg_id *best, eg_id id) {
  for (int k = 0; k < eg->nodes[id].num_kids; k++)
    if (best[eg_find(eg, eg->nodes[id].kids[k])] == EG_NONE) return false;
  return true;
}

/* Half a byte: the cost model counts bytes, so a smaller change is rounding. */
#define MN_REFINE_MIN_GAIN   0.5
#define MN_REFINE_MAX_SWEEPS 8

/* Tries class c's other nodes; keeps the best strict improvement. */
static bool improve_class(refiner *r, eg_id c) {
  mn_egraph *eg = r->eg;
  eg_id cur = r->best[c], pick = EG_NONE;
  double gain = MN_REFINE_MIN_GAIN;
  EG_FOR_NODES(eg, c, id) {
    if (id == cur || eg->nodes[id].dead || !computable(eg, r->best, id)) continue;
    double delta = switch_node(r, c, cur, id);
    bool better = -delta > gain && !reaches(r, id, c);
    switch_node(r, c, id, cur);
    if (better) {
      gain = -delta;
      pick = id;
    }
  }
  if (pick == EG_NONE) return false;
  switch_node(r, c, cur, pick);
  return true;
}

static bool refine(mn_egraph *eg, eg_id *best) {
  size_t n = eg->num_nodes ? eg->num_nodes : 1;
  refiner r = {.eg = eg, .best = best};
  r.refs = calloc(n, sizeof *r.refs);
  r.stack = malloc(n * sizeof *r.stack);
  r.stamp = calloc(n, sizeof *r.stamp);
  bool ok = r.refs && r.stack && r.stamp;
  for (size_t c = 0; ok && c < eg->num_nodes; c++)
    if (eg_find(eg, (eg_id)c) == c && eg->classes[c].pinned != EG_NONE) need(&r, (eg_id)c);
  for (int sweep = 0, moved = 1; ok && moved && sweep < MN_REFINE_MAX_SWEEPS; sweep++) {
    moved = 0;
    for (size_t c = 0; c < eg->num_nodes; c++) {
      if (eg_find(eg, (eg_id)c) != c || !r.refs[c] || best[c] == EG_NONE ||
          eg->classes[c].pinned != EG_NONE || eg->classes[c].first_node == eg->classes[c].last_node)
        continue;
      moved |= improve_class(&r, (eg_id)c);
    }
  }
  free(r.refs);
  free(r.stack);
  free(r.stamp);
  return ok;
}

mn_status mn_extract(mn_egraph *eg, eg_id *best) {
  size_t n = eg->num_nodes ? eg->num_nodes : 1;
  extractor x = {.eg = eg, .best = best};
  x.cost = malloc(n * sizeof *x.cost);
  x.users = calloc(n, sizeof *x.users);
  x.pending = malloc(n);
  x.done = calloc(n, 1);
  x.relaxed = calloc(n, 1);
  x.seen = malloc(n * sizeof *x.seen);
  bool ok = x.cost && x.users && x.pending && x.done && x.relaxed && x.seen;
  if (ok) {
    for (size_t i = 0; i < eg->num_nodes; i++) {
      best[i] = EG_NONE;
      x.cost[i] = 0;
    }
    count_users(&x, x.seen);
    for (size_t i = 0; i < eg->num_nodes; i++)
      x.seen[i] = EG_NONE;
    ok = run(&x);
  }
  ok = ok && refine(eg, best);
  free(x.cost);
  free(x.users);
  free(x.pending);
  free(x.done);
  free(x.relaxed);
  free(x.seen);
  free(x.h.a);
  return ok ? MN_OK : mn_fail(MN_ERR_OUT_OF_MEMORY, "optimizer: out of memory extracting");
}

/* ---- emitting the chosen graph */

enum { UNSEEN = 0, ON_STACK, DONE };

typedef struct emitter {
  mn_egraph *eg;
  const eg_id *best;
  const mn_graph *orig;
  mn_graph *g;
  mn_node *new_id;   /* per class */
  mn_node *leaf_new; /* per original node: its emitted named leaf */
  uint8_t *state;    /* per class */
  eg_id *stack;
  eg_id *out_class; /* per output: its class */
} emitter;

static bool is_named_leaf(mn_op op) { return op == MN_OP_INPUT || op == MN_OP_PARAMETER; }

static mn_node emit_leaf(emitter *e, mn_node i) {
  if (e->leaf_new[i] != MN_NO_NODE) return e->leaf_new[i];
  const mn_node_rec *r = &e->orig->nodes[i];
  return e->leaf_new[i] = mn_graph_append(e->g, r->op, NULL, 0, &r->type, &r->attrs, r->name);
}

static mn_node emit_node(emitter *e, eg_id id) {
  const eg_node *n = &e->eg->nodes[id];
  if (is_named_leaf(n->op)) return emit_leaf(e, n->identity);
  mn_node ins[MN_MAX_INPUTS];
  for (int k = 0; k < n->num_kids; k++)
    ins[k] = e->new_id[eg_find(e->eg, n->kids[k])];
  const mn_tensor_type *t = eg_type(e->eg, n->type);
  mn_node out = mn_graph_append(e->g, n->op, ins, n->num_kids, t, &n->attrs, NULL);
  if (out != MN_NO_NODE && n->fused && !(e->g->nodes[out].fused = mn_fused_prog_dup(n->fused)))
    return mn_graph_fail(e->g, MN_ERR_OUT_OF_MEMORY, "optimizer: out of memory");
  if (out == MN_NO_NODE || !n->data) return out;
  size_t bytes = (size_t)mn_tensor_type_numel(t) * sizeof(float);
  float *copy = malloc(bytes ? bytes : 1);
  if (!copy) return mn_graph_fail(e->g, MN_ERR_OUT_OF_MEMORY, "optimizer: out of memory");
  memcpy(copy, n->data, bytes);
  e->g->nodes[out].data = copy;
  return out;
}

/* Emits class c after everything it needs, depth first without recursion. */
static mn_status emit_class(emitter *e, eg_id c) {
  mn_egraph *eg = e->eg;
  c = eg_find(eg, c);
  if (e->state[c] == DONE) return MN_OK;
  size_t top = 0;
  e->stack[top++] = c;
  e->state[c] = ON_STACK;
  while (top) {
    eg_id cur = e->stack[top - 1], id = e->best[cur];
    if (id == EG_NONE)
      return mn_fail(MN_ERR_STATE, "optimizer: class %u has no computable node", cur);
    const eg_node *n = &eg->nodes[id];
    bool pushed = false;
    for (int k = 0; k < n->num_kids && !pushed; k++) {
      eg_id kc = eg_find(eg, n->kids[k]);
      if (e->state[kc] == DONE) continue;
      if (e->state[kc] == ON_STACK)
        return mn_fail(MN_ERR_STATE, "optimizer: extraction chose a cycle through class %u", kc);
      e->state[kc] = ON_STACK;
      e->stack[top++] = kc;
      pushed = true;
    }
    if (pushed) continue;
    if ((e->new_id[cur] = emit_node(e, id)) == MN_NO_NODE)
      return mn_fail(e->g->status, "optimizer: %s", e->g->error);
    e->state[cur] = DONE;
    top--;
  }
  return MN_OK;
}

/* What output k must be given the node it got: a node of its own when an earlier
 * output (a different node originally) took the same one, and a computed node when it
 * was computed originally (a gradient in a parameter's buffer would alias it). */
static mn_node own_output(emitter *e, size_t k, mn_node node, mn_node *claimed) {
  mn_node orig = e->orig->outputs[k];
  bool was_leaf = mn_op_flags(e->orig->nodes[orig].op) & MN_OPF_LEAF;
  bool taken = claimed[node] != MN_NO_NODE && claimed[node] != orig;
  if (!taken && (was_leaf || !(mn_op_flags(e->g->nodes[node].op) & MN_OPF_LEAF))) {
    claimed[node] = orig;
    return node;
  }
  mn_node_rec r = e->g->nodes[node];
  mn_op_attrs one = {.scale = 1.0f};
  mn_node copy;
  if (!(mn_op_flags(r.op) & MN_OPF_LEAF)) {
    copy = mn_graph_append(e->g, r.op, r.inputs, r.num_inputs, &r.type, &r.attrs, NULL);
    if (copy != MN_NO_NODE && r.fused && !(e->g->nodes[copy].fused = mn_fused_prog_dup(r.fused)))
      copy = mn_graph_fail(e->g, MN_ERR_OUT_OF_MEMORY, "optimizer: out of memory");
  } else if (r.type.dtype == MN_F32)
    copy = mn_graph_append(e->g, MN_OP_SCALE, &node, 1, &r.type, &one, NULL);
  else
    copy = mn_graph_append(e->g, MN_OP_RESHAPE, &node, 1, &r.type, NULL, NULL);
  if (copy != MN_NO_NODE) claimed[copy] = orig;
  return copy;
}

static mn_status emit_outputs(emitter *e) {
  const mn_graph *orig = e->orig;
  size_t n = e->g->num_nodes + orig->num_outputs;
  mn_node *claimed = malloc((n ? n : 1) * sizeof *claimed);
  mn_node *outs = malloc((orig->num_outputs ? orig->num_outputs : 1) * sizeof *outs);
  if (!claimed || !outs) {
    free(claimed);
    free(outs);
    return mn_fail(MN_ERR_OUT_OF_MEMORY, "optimizer: out of memory");
  }
  for (size_t i = 0; i < n; i++)
    claimed[i] = MN_NO_NODE;
  for (size_t k = 0; k < orig->num_outputs; k++) {
    outs[k] = own_output(e, k, e->new_id[e->out_class[k]], claimed);
  }
  free(claimed);
  e->g->outputs = outs;
  e->g->num_outputs = orig->num_outputs;
  return e->g->status == MN_OK ? MN_OK : mn_fail(e->g->status, "optimizer: %s", e->g->error);
}

/* Marks the classes that the outputs need through the chosen nodes. */
static mn_status mark_live(emitter *e, uint8_t *live) {
  mn_egraph *eg = e->eg;
  size_t top = 0;
  for (size_t k = 0; k < e->orig->num_outputs; k++)
    if (!live[e->out_class[k]]) live[e->stack[top++] = e->out_class[k]] = 1;
  while (top) {
    eg_id c = e->stack[--top], id = e->best[c];
    if (id == EG_NONE)
      return mn_fail(MN_ERR_STATE, "optimizer: class %u has no computable node", c);
    const eg_node *n = &eg->nodes[id];
    for (int k = 0; k < n->num_kids; k++) {
      eg_id kc = eg_find(eg, n->kids[k]);
      if (!live[kc]) live[e->stack[top++] = kc] = 1;
    }
  }
  return MN_OK;
}

mn_status mn_emit_graph(mn_egraph *eg, const eg_id *best, const mn_graph *orig,
                        const eg_id *orig_node, mn_graph **out) {
  *out = NULL;
  size_t n = eg->num_nodes ? eg->num_nodes : 1, m = orig->num_nodes ? orig->num_nodes : 1;
  size_t k = orig->num_outputs ? orig->num_outputs : 1;
  emitter e = {.eg = eg, .best = best, .orig = orig};
  e.g = mn_graph_new();
  e.new_id = malloc(n * sizeof *e.new_id);
  e.leaf_new = malloc(m * sizeof *e.leaf_new);
  e.state = calloc(n, 1);
  e.stack = malloc(n * sizeof *e.stack);
  uint8_t *live = calloc(n, 1);
  e.out_class = malloc(k * sizeof *e.out_class);
  mn_status st = MN_OK;
  if (!e.g || !e.new_id || !e.leaf_new || !e.state || !e.stack || !live || !e.out_class) {
    st = mn_fail(MN_ERR_OUT_OF_MEMORY, "optimizer: out of memory emitting the graph");
    goto done;
  }
  for (size_t i = 0; i < eg->num_nodes; i++)
    e.new_id[i] = MN_NO_NODE;
  for (size_t i = 0; i < orig->num_nodes; i++)
    e.leaf_new[i] = MN_NO_NODE;
  for (size_t i = 0; i < orig->num_outputs; i++)
    e.out_class[i] = eg_find(eg, orig_node[orig->outputs[i]]);
  if ((st = mark_live(&e, live)) != MN_OK) goto done;
  for (size_t i = 0; i < orig->num_nodes && st == MN_OK; i++) {
    eg_id c = eg_find(eg, orig_node[i]);
    if (is_named_leaf(orig->nodes[i].op)) {
      if (emit_leaf(&e, (mn_node)i) == MN_NO_NODE) {
        st = mn_fail(e.g->status, "optimizer: %s", e.g->error);
      } else if (best[c] == orig_node[i]) {
        e.new_id[c] = e.leaf_new[i];
        e.state[c] = DONE;
      }
    } else if (live[c]) {
      st = emit_class(&e, c);
    }
  }
  for (size_t i = 0; i < orig->num_outputs && st == MN_OK; i++)
    st = emit_class(&e, e.out_class[i]);
  if (st == MN_OK) st = emit_outputs(&e);
done:
  if (st == MN_OK) {
    *out = e.g;
    e.g = NULL;
  }
  mn_graph_free(e.g);
  free(e.new_id);
  free(e.leaf_new);
  free(e.state);
  free(e.stack);
  free(live);
  free(e.out_class);
  return st;
}
