#include "host/graph.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/error.h"

const mn_op_desc mn_op_table[MN_OP_COUNT] = {
#define MN_OP_DESC(e, nm, ar, fl) [MN_OP_##e] = {.name = nm, .arity = ar, .flags = fl},
    MN_OP_LIST(MN_OP_DESC)
#undef MN_OP_DESC
};

size_t mn_dtype_size(mn_dtype dt) {
  switch (dt) {
  case MN_F32:
  case MN_U32: return 4;
  case MN_BF16:
  case MN_F16: return 2;
  }
  return 0;
}

int64_t mn_tensor_type_numel(const mn_tensor_type *t) {
  if (!t || t->rank < 0 || t->rank > MN_MAX_RANK) return 0;
  int64_t n = 1;
  for (int i = 0; i < t->rank; i++)
    n *= t->shape[i];
  return n;
}

size_t mn_tensor_type_bytes(const mn_tensor_type *t) {
  if (!t) return 0;
  return (size_t)mn_tensor_type_numel(t) * mn_dtype_size(t->dtype);
}

mn_tensor_type mn_type_make(mn_dtype dt, const int64_t *shape, int rank) {
  mn_tensor_type t;
  memset(&t, 0, sizeof t);
  t.dtype = dt;
  t.rank = rank;
  for (int i = 0; i < rank && i < MN_MAX_RANK; i++)
    t.shape[i] = shape[i];
  return t;
}

bool mn_type_same_shape(const mn_tensor_type *a, const mn_tensor_type *b) {
  if (a->rank != b->rank) return false;
  for (int i = 0; i < a->rank; i++)
    if (a->shape[i] != b->shape[i]) return false;
  return true;
}

static const struct {
  const char *name;
  mn_dtype dt;
} dtype_names[] = {{"f32", MN_F32}, {"u32", MN_U32}, {"bf16", MN_BF16}, {"f16", MN_F16}};

const char *mn_dtype_name(mn_dtype dt) {
  for (size_t i = 0; i < sizeof dtype_names / sizeof dtype_names[0]; i++)
    if (dtype_names[i].dt == dt) return dtype_names[i].name;
  return "?";
}

bool mn_dtype_from_name(const char *s, mn_dtype *out) {
  for (size_t i = 0; s && i < sizeof dtype_names / sizeof dtype_names[0]; i++)
    if (strcmp(s, dtype_names[i].name) == 0) {
      *out = dtype_names[i].dt;
      return true;
    }
  return false;
}

const char *mn_shape_str(const mn_tensor_type *t, char *buf, size_t size) {
  size_t used = 0;
  int w = snprintf(buf, size, "[");
  used = w > 0 ? (size_t)w : 0;
  for (int i = 0; i < t->rank && used < size; i++) {
    w = snprintf(buf + used, size - used, i ? ",%lld" : "%lld", (long long)t->shape[i]);
    if (w > 0) used += (size_t)w;
  }
  if (used < size) snprintf(buf + used, size - used, t->dtype == MN_U32 ? "] u32" : "]");
  return buf;
}

mn_graph *mn_graph_new(void) { return calloc(1, sizeof(mn_graph)); }

/* ---------------------------------------------------------------- name index
 *
 * Open addressing over node ids + 1 (0: an empty slot), keyed by the hash of the name alone,
 * so that a node whose op is rewritten in place (the optimizer does that to unnamed nodes)
 * keeps its slot; a probe compares op and name. Model graphs have ~10 named leaves per layer,
 * and every leaf builder and session lookup asks for a name: a scan made building a
 * 1,600-layer model quadratic. */
struct mn_name_index {
  const mn_node_rec *nodes; /* the array indexed: another one means index again */
  size_t indexed;           /* nodes [0, indexed) are in */
  size_t count, cap;        /* named nodes in slots; slots (a power of two, or 0) */
  uint32_t *slots;
};

static _Thread_local size_t name_compares;

size_t mn_graph_name_compares(void) { return name_compares; }

/* FNV-1a. */
static uint64_t name_hash(const char *s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (; *s; s++)
    h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
  return h;
}

static void slot_put(uint32_t *slots, size_t cap, const char *name, size_t id) {
  size_t i = (size_t)name_hash(name) & (cap - 1);
  while (slots[i])
    i = (i + 1) & (cap - 1);
  slots[i] = (uint32_t)id + 1;
}

/* Room for one more name at most half full; false when out of memory. */
static bool index_reserve(struct mn_name_index *x) {
  if (2 * (x->count + 1) <= x->cap) return true;
  size_t cap = x->cap ? 2 * x->cap : 64;
  uint32_t *slots = calloc(cap, sizeof *slots);
  if (!slots) return false;
  for (size_t i = 0; i < x->cap; i++) {
    if (!x->slots[i]) continue;
    /* A name cleared by hand since it was indexed leaves the index. */
    const char *name = x->nodes[x->slots[i] - 1].name;
    if (name)
      slot_put(slots, cap, name, x->slots[i] - 1);
    else
      x->count--;
  }
  free(x->slots);
  x->slots = slots;
  x->cap = cap;
  return true;
}

static void index_free(mn_graph *g) {
  if (!g->names) return;
  free(g->names->slots);
  free(g->names);
  g->names = NULL;
}

/* Brings g's index up to date (writing nothing when it already is); false when out of
 * memory, with the index dropped, so that lookups scan instead. */
static bool index_sync(mn_graph *g) {
  struct mn_name_index *x = g->names;
  if (x && x->nodes == g->nodes && x->indexed == g->num_nodes) return true;
  if (!x && !(x = g->names = calloc(1, sizeof *x))) return false;
  if (x->nodes != g->nodes || x->indexed > g->num_nodes) {
    if (x->cap) memset(x->slots, 0, x->cap * sizeof *x->slots);
    x->count = x->indexed = 0;
    x->nodes = g->nodes;
  }
  for (; x->indexed < g->num_nodes; x->indexed++) {
    const char *name = g->nodes[x->indexed].name;
    if (!name) continue;
    if (!index_reserve(x)) {
      index_free(g);
      return false;
    }
    slot_put(x->slots, x->cap, name, x->indexed);
    x->count++;
  }
  return true;
}

void mn_graph_free(mn_graph *g) {
  if (!g) return;
  for (size_t i = 0; i < g->num_nodes; i++) {
    free(g->nodes[i].name);
    free(g->nodes[i].data);
    free(g->nodes[i].fused);
  }
  index_free(g);
  free(g->nodes);
  free(g->outputs);
  free(g);
}

mn_status mn_graph_status(const mn_graph *g) { return g ? g->status : MN_ERR_INVALID_ARGUMENT; }

const char *mn_graph_error(const mn_graph *g) {
  if (!g) return "mn_graph_error: graph is NULL";
  return g->error;
}

mn_node mn_graph_fail(mn_graph *g, mn_status s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  mn_vfail(s, fmt, ap);
  va_end(ap);
  if (g && g->status == MN_OK) {
    g->status = s;
    snprintf(g->error, sizeof g->error, "%s", mn_last_error());
  }
  return MN_NO_NODE;
}

bool mn_graph_check_inputs(mn_graph *g, const char *fn, const mn_node *ins, int n) {
  if (!g) {
    mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: graph is NULL", fn);
    return false;
  }
  if (g->status != MN_OK) {
    mn_set_last_error(g->error);
    return false;
  }
  for (int i = 0; i < n; i++) {
    if (ins[i] == MN_NO_NODE) {
      /* An earlier builder failed on another graph or the caller passed the sentinel
       * by hand; either way this graph has no message yet, so record one. */
      mn_graph_fail(g, MN_ERR_INVALID_ARGUMENT, "%s: input %d is MN_NO_NODE", fn, i);
      return false;
    }
    if (ins[i] >= g->num_nodes) {
      mn_graph_fail(g, MN_ERR_INVALID_ARGUMENT,
                    "%s: input %d is node %u, but the graph has %zu nodes", fn, i, ins[i],
                    g->num_nodes);
      return false;
    }
  }
  return true;
}

mn_node mn_graph_append(mn_graph *g, mn_op op, const mn_node *inputs, int num_inputs,
                        const mn_tensor_type *type, const mn_op_attrs *attrs, const char *name) {
  if (g->num_nodes >= (size_t)MN_NO_NODE - 1)
    return mn_graph_fail(g, MN_ERR_OUT_OF_MEMORY, "%s: graph has too many nodes", mn_op_name(op));
  if (num_inputs < 0 || num_inputs > MN_MAX_INPUTS)
    return mn_graph_fail(g, MN_ERR_INVALID_ARGUMENT, "%s: %d inputs", mn_op_name(op), num_inputs);
  /* Builders pass types, attrs and input lists that point into g->nodes (the type of
   * their first input); copy them before realloc can move that array. */
  mn_tensor_type type_copy = *type;
  mn_op_attrs attrs_copy;
  memset(&attrs_copy, 0, sizeof attrs_copy);
  if (attrs) attrs_copy = *attrs;
  mn_node inputs_copy[MN_MAX_INPUTS];
  for (int i = 0; i < num_inputs; i++)
    inputs_copy[i] = inputs[i];
  if (g->num_nodes == g->cap_nodes) {
    size_t cap = g->cap_nodes ? g->cap_nodes * 2 : 64;
    mn_node_rec *nodes = realloc(g->nodes, cap * sizeof *nodes);
    if (!nodes) return mn_graph_fail(g, MN_ERR_OUT_OF_MEMORY, "%s: out of memory", mn_op_name(op));
    /* realloc moved the nodes the index holds, not changed them. */
    if (g->names && g->names->nodes == g->nodes) g->names->nodes = nodes;
    g->nodes = nodes;
    g->cap_nodes = cap;
  }
  mn_node_rec *n = &g->nodes[g->num_nodes];
  memset(n, 0, sizeof *n);
  n->op = op;
  n->num_inputs = num_inputs;
  for (int i = 0; i < num_inputs; i++)
    n->inputs[i] = inputs_copy[i];
  n->type = type_copy;
  n->attrs = attrs_copy;
  if (name) {
    n->name = strdup(name);
    if (!n->name)
      return mn_graph_fail(g, MN_ERR_OUT_OF_MEMORY, "%s: out of memory", mn_op_name(op));
  }
  /* Nodes cut off by hand and appended again: index them anew. */
  if (g->names && g->names->indexed > g->num_nodes) g->names->indexed = SIZE_MAX;
  g->num_nodes++;
  /* Indexed now, so that lookups on a built graph only read it (graphs are shared between
   * threads as const). */
  index_sync(g);
  return (mn_node)(g->num_nodes - 1);
}

static bool leaf_is(const mn_node_rec *n, mn_op op, const char *name) {
  name_compares++;
  return n->op == op && n->name && strcmp(n->name, name) == 0;
}

mn_node mn_graph_find_leaf(const mn_graph *g, mn_op op, const char *name) {
  if (!g || !name) return MN_NO_NODE;
  /* The index is a cache of g's names, not part of its value. */
  if (!index_sync((mn_graph *)g)) {
    for (size_t i = 0; i < g->num_nodes; i++)
      if (leaf_is(&g->nodes[i], op, name)) return (mn_node)i;
    return MN_NO_NODE;
  }
  const struct mn_name_index *x = g->names;
  size_t found = SIZE_MAX;
  if (!x->cap) return MN_NO_NODE;
  /* Every node of this name is on the probe chain: the first one wins, as a scan would. */
  for (size_t i = (size_t)name_hash(name) & (x->cap - 1); x->slots[i]; i = (i + 1) & (x->cap - 1)) {
    size_t id = x->slots[i] - 1;
    if (id < found && leaf_is(&g->nodes[id], op, name)) found = id;
  }
  return found == SIZE_MAX ? MN_NO_NODE : (mn_node)found;
}

bool mn_node_rec_copy(mn_node_rec *dst, const mn_node_rec *src) {
  *dst = *src;
  dst->name = NULL;
  dst->data = NULL;
  dst->fused = NULL;
  if (src->name && !(dst->name = strdup(src->name))) return false;
  if (src->fused && !(dst->fused = mn_fused_prog_dup(src->fused))) return false;
  if (src->data) {
    size_t bytes = (size_t)mn_tensor_type_numel(&src->type) * sizeof(float);
    if (!(dst->data = malloc(bytes))) return false;
    memcpy(dst->data, src->data, bytes);
  }
  return true;
}

mn_graph *mn_graph_clone(const mn_graph *g) {
  mn_graph *c = mn_graph_new();
  if (!c) return NULL;
  c->status = g->status;
  memcpy(c->error, g->error, sizeof c->error);
  if (g->num_nodes) {
    c->nodes = calloc(g->num_nodes, sizeof *c->nodes);
    if (!c->nodes) goto oom;
    c->cap_nodes = g->num_nodes;
  }
  for (size_t i = 0; i < g->num_nodes; i++) {
    c->num_nodes = i + 1;
    if (!mn_node_rec_copy(&c->nodes[i], &g->nodes[i])) goto oom;
  }
  if (g->num_outputs) {
    c->outputs = malloc(g->num_outputs * sizeof *c->outputs);
    if (!c->outputs) goto oom;
    memcpy(c->outputs, g->outputs, g->num_outputs * sizeof *c->outputs);
    c->num_outputs = g->num_outputs;
  }
  return c;
oom:
  mn_graph_free(c);
  return NULL;
}

void mn_set_trainable(mn_graph *g, mn_node param, bool trainable) {
  if (!mn_graph_check_inputs(g, "mn_set_trainable", &param, 1)) return;
  mn_node_rec *n = &g->nodes[param];
  if (n->op != MN_OP_PARAMETER) {
    mn_graph_fail(g, MN_ERR_INVALID_ARGUMENT, "mn_set_trainable: node %u (%s) is not a parameter",
                  param, mn_op_name(n->op));
    return;
  }
  n->attrs.variant = trainable ? 0 : MN_PARAM_FROZEN;
}

void mn_set_outputs(mn_graph *g, const mn_node *outputs, size_t n) {
  if (!mn_graph_check_inputs(g, "mn_set_outputs", NULL, 0)) return;
  if (n > 0 && !outputs) {
    mn_graph_fail(g, MN_ERR_INVALID_ARGUMENT, "mn_set_outputs: outputs is NULL with n = %zu", n);
    return;
  }
  for (size_t i = 0; i < n; i++) {
    if (outputs[i] == MN_NO_NODE || outputs[i] >= g->num_nodes) {
      mn_graph_fail(g, MN_ERR_INVALID_ARGUMENT,
                    "mn_set_outputs: output %zu is node %u, but the graph has %zu nodes", i,
                    outputs[i], g->num_nodes);
      return;
    }
  }
  mn_node *copy = NULL;
  if (n) {
    copy = malloc(n * sizeof *copy);
    if (!copy) {
      mn_graph_fail(g, MN_ERR_OUT_OF_MEMORY, "mn_set_outputs: out of memory");
      return;
    }
    memcpy(copy, outputs, n * sizeof *copy);
  }
  free(g->outputs);
  g->outputs = copy;
  g->num_outputs = n;
}

size_t mn_graph_outputs(const mn_graph *g, const mn_node **outputs) {
  if (outputs) *outputs = g ? g->outputs : NULL;
  return g ? g->num_outputs : 0;
}

size_t mn_graph_num_nodes(const mn_graph *g) { return g ? g->num_nodes : 0; }

mn_status mn_graph_node(const mn_graph *g, mn_node id, mn_node_info *out) {
  if (!g) return mn_fail(MN_ERR_INVALID_ARGUMENT, "mn_graph_node: graph is NULL");
  if (!out) return mn_fail(MN_ERR_INVALID_ARGUMENT, "mn_graph_node: out is NULL");
  if (id >= g->num_nodes)
    return mn_fail(MN_ERR_NOT_FOUND, "mn_graph_node: node %u out of range (graph has %zu nodes)",
                   id, g->num_nodes);
  const mn_node_rec *n = &g->nodes[id];
  out->id = id;
  out->op = mn_op_name(n->op);
  out->name = n->name;
  out->inputs = n->inputs;
  out->num_inputs = n->num_inputs;
  out->type = n->type;
  return MN_OK;
}

mn_fused_prog *mn_fused_prog_dup(const mn_fused_prog *p) {
  mn_fused_prog *c = malloc(sizeof *c);
  if (c) *c = *p;
  return c;
}

int mn_node_num_extra_outputs(const mn_node_rec *n) {
  switch (n->op) {
  case MN_OP_MATMUL_AT_BGRAD:
  case MN_OP_MATMUL_DRELU_BGRAD:
  case MN_OP_SPARSE_CROSS_ENTROPY_LOSS_GRAD: return 1;
  case MN_OP_GELU_GRAD_BGRAD: return 1 + (n->attrs.variant == 1); /* and gelu(x) */
  case MN_OP_CAUSAL_ATTENTION:
  case MN_OP_FULL_ATTENTION:
  case MN_OP_CROSS_ATTENTION:
  case MN_OP_CAUSAL_ATTENTION_PACKED:
  case MN_OP_QKV_CAUSAL_ATTENTION: return n->attrs.variant == 1; /* its row statistics */
  case MN_OP_FUSED: return n->fused ? mn_fused_prog_num_extra(n->fused) : 0;
  default: return 0;
  }
}

static uint32_t float_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

bool mn_fused_prog_equal(const mn_fused_prog *a, const mn_fused_prog *b) {
  if (a == b) return true;
  if (!a || !b || a->num_instrs != b->num_instrs) return false;
  for (int i = 0; i < a->num_instrs; i++) {
    const mn_fused_instr *x = &a->instrs[i], *y = &b->instrs[i];
    /* Attributes by their bits, as the e-graph compares them. */
    if (x->op != y->op || float_bits(x->scale) != float_bits(y->scale) ||
        float_bits(x->eps) != float_bits(y->eps) || x->out != y->out ||
        memcmp(x->args, y->args, sizeof x->args) != 0)
      return false;
  }
  return true;
}

bool mn_fused_is_row_op(mn_op op) {
  return op == MN_OP_LAYER_NORM || op == MN_OP_RMS_NORM || op == MN_OP_LAYER_NORM_GRAD_X ||
         op == MN_OP_RMS_NORM_GRAD_X;
}

int mn_fused_prog_row(const mn_fused_prog *p) {
  for (int i = 0; i < p->num_instrs; i++)
    if (mn_fused_is_row_op(p->instrs[i].op)) return i;
  return -1;
}

/* Operand k of a row op is a row vector: the weight (1) of every norm op, the bias (2) of
 * layer_norm; x (0) and the gradients' dy (2) are elementwise. */
static bool row_operand(mn_op op, int k) { return k == 1 || (k == 2 && op == MN_OP_LAYER_NORM); }

bool mn_fused_input_is_row(const mn_fused_prog *p, int k) {
  int r = mn_fused_prog_row(p);
  if (r < 0) return false;
  const mn_fused_instr *in = &p->instrs[r];
  for (int a = 0; a < mn_op_table[in->op].arity; a++)
    if (row_operand(in->op, a) && in->args[a] == k) return true;
  return false;
}

int mn_fused_prog_num_extra(const mn_fused_prog *p) {
  int n = 0;
  for (int i = 0; i < p->num_instrs && i < MN_FUSED_MAX_INSTRS; i++)
    if (p->instrs[i].out > n) n = p->instrs[i].out;
  return n;
}

static bool instr_ok(const mn_fused_instr *in, int i, bool *seen_row, char *why, size_t why_size) {
  bool known = (unsigned)in->op < MN_OP_COUNT;
  int arity = known ? mn_op_table[in->op].arity : 0;
  bool row = known && mn_fused_is_row_op(in->op);
  if (!known || in->op == MN_OP_FUSED || (!(mn_op_flags(in->op) & MN_OPF_POINTWISE) && !row) ||
      arity < 1 || arity > MN_FUSED_MAX_ARGS) {
    snprintf(why, why_size, "instruction %d: not a pointwise or row op", i);
    return false;
  }
  if (row && *seen_row) {
    snprintf(why, why_size, "instruction %d: a second row op", i);
    return false;
  }
  *seen_row |= row;
  bool stray = false;
  for (int k = arity; k < MN_FUSED_MAX_ARGS; k++)
    stray |= in->args[k] != 0;
  if (stray || (in->op != MN_OP_SCALE && in->scale != 0.0f) || (!row && in->eps != 0.0f)) {
    snprintf(why, why_size, "instruction %d: stray operand or attribute", i);
    return false;
  }
  if (in->out > MN_MAX_EXTRA_OUTPUTS) {
    snprintf(why, why_size, "instruction %d: extra value %d", i, in->out);
    return false;
  }
  return true;
}

bool mn_fused_prog_check(const mn_fused_prog *p, int num_inputs, char *why, size_t why_size) {
  if (num_inputs < 1 || num_inputs > MN_FUSED_MAX_INPUTS) {
    snprintf(why, why_size, "%d inputs", num_inputs);
    return false;
  }
  if (p->num_instrs < 1 || p->num_instrs > MN_FUSED_MAX_INSTRS) {
    snprintf(why, why_size, "%d instructions", p->num_instrs);
    return false;
  }
  /* used: 1 read elementwise, 2 read as a row vector */
  unsigned char used[MN_FUSED_MAX_INPUTS + MN_FUSED_MAX_INSTRS] = {0};
  int outs[MN_MAX_EXTRA_OUTPUTS + 1] = {0};
  bool seen_row = false;
  for (int i = 0; i < p->num_instrs; i++) {
    const mn_fused_instr *in = &p->instrs[i];
    if (!instr_ok(in, i, &seen_row, why, why_size)) return false;
    for (int k = 0; k < mn_op_table[in->op].arity; k++) {
      int a = in->args[k];
      if (a >= num_inputs + i) {
        snprintf(why, why_size, "instruction %d: operand %d is not an input or earlier result", i,
                 a);
        return false;
      }
      unsigned char how = mn_fused_is_row_op(in->op) && row_operand(in->op, k) ? 2 : 1;
      if (how == 2 && a >= num_inputs) {
        snprintf(why, why_size, "instruction %d: row operand %d is not an input", i, a);
        return false;
      }
      if (used[a] && used[a] != how) {
        snprintf(why, why_size, "instruction %d: input %d read both as a row and elementwise", i,
                 a);
        return false;
      }
      used[a] = how;
    }
    if (in->out) {
      if (i == p->num_instrs - 1 || outs[in->out]++) {
        snprintf(why, why_size, "instruction %d: extra value %d taken twice", i, in->out);
        return false;
      }
    }
  }
  int extra = mn_fused_prog_num_extra(p);
  for (int k = 1; k <= extra; k++)
    if (!outs[k]) {
      snprintf(why, why_size, "extra value %d is never written", k);
      return false;
    }
  for (int a = 0; a < num_inputs + p->num_instrs - 1; a++)
    if (!used[a] && !(a >= num_inputs && p->instrs[a - num_inputs].out)) {
      snprintf(why, why_size, "%s %d is never read", a < num_inputs ? "input" : "result",
               a < num_inputs ? a : a - num_inputs);
      return false;
    }
  return true;
}
