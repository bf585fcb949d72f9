/* Reading the plan cache: every field is checked before the plan is built, because the file
 * is only a build artifact on disk and a bad one must cost a rebuild, never a crash. The
 * checks make the graph safe for mn_plan_build and the backends' bookkeeping (indices, sizes,
 * the leaves the session exposes, the gradient slots); the key and the checksum make it the
 * graph that lowering produced for this user graph. */
#include <cjson/cJSON.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/plan_cache.h"

/* Bounds that no real graph reaches; they keep sizes and their sums far from overflow. */
#define MAX_NODES       (1u << 24)
#define MAX_DIM         (1LL << 40)
#define MAX_NUMEL       (1LL << 40)
#define MAX_TOTAL_BYTES (1ULL << 52)
#define MAX_JSON_INT    (1LL << 53) /* integers a double holds exactly */

typedef struct reader {
  char *why;
  size_t why_size;
  const mn_graph *user;
  mn_graph *g;
  int32_t *grad_output;
  unsigned char *user_seen; /* user leaves already matched by a lowered leaf or a source */
  uint64_t total_bytes;
  mn_param_layout layout; /* param_sources */
  bool loss_scale;        /* an F16 plan may have the loss-scale input, once */
} reader;

static mn_status miss(reader *r, mn_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static mn_status miss(reader *r, mn_status st, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r->why, r->why_size, fmt, ap);
  va_end(ap);
  return st;
}
#define CORRUPT(r, ...) miss((r), MN_ERR_FORMAT, __VA_ARGS__)

static const cJSON *member(const cJSON *obj, const char *key) {
  return cJSON_GetObjectItemCaseSensitive(obj, key);
}

static bool get_int(const cJSON *item, long long lo, long long hi, long long *out) {
  if (!cJSON_IsNumber(item)) return false;
  double v = item->valuedouble;
  if (!isfinite(v) || v != floor(v) || v < (double)lo || v > (double)hi) return false;
  *out = (long long)v;
  return true;
}

static int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

/* A number, or for values JSON cannot spell, "0x" and the 8 hex digits of the bits. */
static bool get_float(const cJSON *item, float *out) {
  if (cJSON_IsNumber(item)) {
    float f = (float)item->valuedouble;
    if (!isfinite(f)) return false;
    *out = f;
    return true;
  }
  const char *s = cJSON_GetStringValue(item);
  if (!s || strlen(s) != 10 || s[0] != '0' || s[1] != 'x') return false;
  uint32_t bits = 0;
  for (int i = 2; i < 10; i++) {
    int d = hex_digit(s[i]);
    if (d < 0) return false;
    bits = bits << 4 | (uint32_t)d;
  }
  memcpy(out, &bits, sizeof bits);
  return !isfinite(*out); /* finite values are numbers: one spelling per value */
}

static bool find_op(const char *name, mn_op *out) {
  for (int op = 0; name && op < MN_OP_COUNT; op++) {
    const char *candidate = mn_op_table[op].name;
    if (candidate[0] == name[0] && strcmp(candidate, name) == 0) {
      *out = (mn_op)op;
      return true;
    }
  }
  return false;
}

static bool same_type(const mn_tensor_type *a, const mn_tensor_type *b) {
  return a->dtype == b->dtype && mn_type_same_shape(a, b);
}

/* The members of one node object, each looked at once. */
typedef struct node_fields {
  const cJSON *op, *in, *dtype, *shape, *attrs, *name, *user_constant, *data, *program;
} node_fields;

static mn_status split_fields(reader *r, size_t i, const cJSON *node, node_fields *f) {
  memset(f, 0, sizeof *f);
  const struct {
    const char *key;
    const cJSON **slot;
  } slots[] = {{"op", &f->op},          {"in", &f->in},
               {"dtype", &f->dtype},    {"shape", &f->shape},
               {"attrs", &f->attrs},    {"name", &f->name},
               {"data", &f->data},      {"user_constant", &f->user_constant},
               {"program", &f->program}};
  const cJSON *m;
  cJSON_ArrayForEach(m, node) {
    size_t k = 0;
    while (k < sizeof slots / sizeof slots[0] && strcmp(m->string, slots[k].key) != 0)
      k++;
    if (k == sizeof slots / sizeof slots[0])
      return CORRUPT(r, "node %zu: unknown field \"%.40s\"", i, m->string);
    if (*slots[k].slot) return CORRUPT(r, "node %zu: field %s twice", i, slots[k].key);
    *slots[k].slot = m;
  }
  return MN_OK;
}

/* A dtype and a shape, of `what` i (a node or a source) in messages. */
static mn_status parse_type(reader *r, const char *what, size_t i, const cJSON *dtype,
                            const cJSON *shape, mn_tensor_type *t, long long *numel) {
  memset(t, 0, sizeof *t);
  if (!mn_dtype_from_name(cJSON_GetStringValue(dtype), &t->dtype))
    return CORRUPT(r, "%s %zu: missing or unknown dtype", what, i);
  if (!cJSON_IsArray(shape)) return CORRUPT(r, "%s %zu: shape is not an array", what, i);
  *numel = 1;
  const cJSON *d;
  cJSON_ArrayForEach(d, shape) {
    long long v;
    if (t->rank == MN_MAX_RANK) return CORRUPT(r, "%s %zu: rank above %d", what, i, MN_MAX_RANK);
    if (!get_int(d, 1, MAX_DIM, &v)) return CORRUPT(r, "%s %zu: bad dimension", what, i);
    if (*numel > MAX_NUMEL / v) return CORRUPT(r, "%s %zu: too many elements", what, i);
    *numel *= v;
    t->shape[t->rank++] = v;
  }
  return MN_OK;
}

static mn_status read_type(reader *r, size_t i, const node_fields *node, mn_tensor_type *t) {
  long long numel = 0;
  mn_status st = parse_type(r, "node", i, node->dtype, node->shape, t, &numel);
  if (st != MN_OK) return st;
  r->total_bytes += (uint64_t)numel * mn_dtype_size(t->dtype);
  if (r->total_bytes > MAX_TOTAL_BYTES) return CORRUPT(r, "node %zu: tensors too large", i);
  return MN_OK;
}

static mn_status read_attrs(reader *r, size_t i, const cJSON *attrs, mn_op_attrs *a) {
  memset(a, 0, sizeof *a);
  if (!attrs) return MN_OK;
  if (!cJSON_IsObject(attrs)) return CORRUPT(r, "node %zu: attrs is not an object", i);
  float *floats[] = {&a->scale, &a->eps, &a->theta};
  const char *float_keys[] = {"scale", "eps", "theta"};
  int *ints[] = {&a->pos_offset, &a->head_dim, &a->num_heads,  &a->num_kv_heads, &a->stride,
                 &a->padding,    &a->groups,   &a->channels_a, &a->variant,      &a->act};
  const char *int_keys[] = {"pos_offset", "head_dim", "num_heads",  "num_kv_heads", "stride",
                            "padding",    "groups",   "channels_a", "variant",      "act"};
  const cJSON *f;
  cJSON_ArrayForEach(f, attrs) {
    bool known = false;
    for (size_t k = 0; !known && k < sizeof floats / sizeof floats[0]; k++) {
      if (strcmp(f->string, float_keys[k]) != 0) continue;
      if (!get_float(f, floats[k])) return CORRUPT(r, "node %zu: bad attribute %s", i, f->string);
      known = true;
    }
    for (size_t k = 0; !known && k < sizeof ints / sizeof ints[0]; k++) {
      long long v;
      if (strcmp(f->string, int_keys[k]) != 0) continue;
      if (!get_int(f, INT_MIN, INT_MAX, &v))
        return CORRUPT(r, "node %zu: bad attribute %s", i, f->string);
      *ints[k] = (int)v;
      known = true;
    }
    int64_t *wide[] = {&a->num_rows, &a->seed};
    const char *wide_keys[] = {"num_rows", "seed"};
    for (size_t k = 0; !known && k < sizeof wide / sizeof wide[0]; k++) {
      long long v;
      if (strcmp(f->string, wide_keys[k]) != 0) continue;
      if (!get_int(f, -MAX_JSON_INT, MAX_JSON_INT, &v))
        return CORRUPT(r, "node %zu: bad attribute %s", i, f->string);
      *wide[k] = v;
      known = true;
    }
    if (!known) return CORRUPT(r, "node %zu: unknown attribute \"%s\"", i, f->string);
  }
  return MN_OK;
}

/* A derived parameter's name is its own (param_sources says what it holds): it must be no
 * user leaf's. */
static mn_status read_derived_name(reader *r, size_t i, const char *s, mn_node_rec *n) {
  if (mn_graph_find_leaf(r->user, MN_OP_PARAMETER, s) != MN_NO_NODE ||
      mn_graph_find_leaf(r->user, MN_OP_INPUT, s) != MN_NO_NODE)
    return CORRUPT(r, "node %zu: derived parameter has a user leaf's name", i);
  if (!(n->name = strdup(s))) return miss(r, MN_ERR_OUT_OF_MEMORY, "out of memory");
  return MN_OK;
}

/* The input that seeds an F16 plan's loss gradient with the loss scale (plan.h): the library's,
 * not the user's, so it is no user leaf; an F32 [1], at most once, and only in an F16 plan. */
static mn_status read_loss_scale(reader *r, size_t i, mn_node_rec *n) {
  if (!r->loss_scale) return CORRUPT(r, "node %zu: a loss-scale input outside an f16 plan", i);
  if (mn_graph_find_leaf(r->user, MN_OP_INPUT, MN_LOSS_SCALE_INPUT) != MN_NO_NODE)
    return CORRUPT(r, "node %zu: the loss-scale input has a user leaf's name", i);
  if (n->type.dtype != MN_F32 || mn_tensor_type_numel(&n->type) != 1)
    return CORRUPT(r, "node %zu: the loss-scale input is not one f32", i);
  r->loss_scale = false;
  if (!(n->name = strdup(MN_LOSS_SCALE_INPUT)))
    return miss(r, MN_ERR_OUT_OF_MEMORY, "out of memory");
  return MN_OK;
}

/* Inputs and parameters: the session's interface, so each must be one of the user graph's
 * leaves with its exact type, and appear once. */
static mn_status read_name(reader *r, size_t i, const node_fields *node, mn_node_rec *n) {
  const cJSON *name = node->name;
  bool named_leaf = n->op == MN_OP_INPUT || n->op == MN_OP_PARAMETER;
  if (!named_leaf) return name ? CORRUPT(r, "node %zu: only leaves have names", i) : MN_OK;
  const char *s = cJSON_GetStringValue(name);
  if (!s) return CORRUPT(r, "node %zu: %s without a name", i, mn_op_name(n->op));
  if (mn_param_is_derived(n)) return read_derived_name(r, i, s, n);
  if (n->op == MN_OP_INPUT && strcmp(s, MN_LOSS_SCALE_INPUT) == 0) return read_loss_scale(r, i, n);
  mn_node u = mn_graph_find_leaf(r->user, n->op, s);
  if (u == MN_NO_NODE)
    return CORRUPT(r, "node %zu: the graph has no %s named \"%s\"", i, mn_op_name(n->op), s);
  if (!same_type(&r->user->nodes[u].type, &n->type))
    return CORRUPT(r, "node %zu: \"%s\" has another type in the graph", i, s);
  if (r->user_seen[u]) return CORRUPT(r, "node %zu: \"%s\" appears twice", i, s);
  r->user_seen[u] = 1;
  if (!(n->name = strdup(s))) return miss(r, MN_ERR_OUT_OF_MEMORY, "out of memory");
  return MN_OK;
}

static mn_status read_constant(reader *r, size_t i, const node_fields *node, mn_node_rec *n) {
  const cJSON *ref = node->user_constant, *data = node->data;
  if (n->op != MN_OP_CONSTANT)
    return ref || data ? CORRUPT(r, "node %zu: only constants have data", i) : MN_OK;
  if (n->type.dtype != MN_F32) return CORRUPT(r, "node %zu: constant is not f32", i);
  if (!ref == !data) return CORRUPT(r, "node %zu: constant needs user_constant or data", i);
  size_t numel = (size_t)mn_tensor_type_numel(&n->type);
  const float *src = NULL;
  if (ref) {
    long long u;
    if (!get_int(ref, 0, (long long)r->user->num_nodes - 1, &u))
      return CORRUPT(r, "node %zu: bad user_constant", i);
    const mn_node_rec *un = &r->user->nodes[u];
    if (un->op != MN_OP_CONSTANT || !un->data || !same_type(&un->type, &n->type))
      return CORRUPT(r, "node %zu: user_constant %lld is not a constant of this type", i, u);
    src = un->data;
  } else if (!cJSON_IsArray(data) || (size_t)cJSON_GetArraySize(data) != numel) {
    return CORRUPT(r, "node %zu: data does not hold %zu numbers", i, numel);
  }
  if (!(n->data = malloc(numel * sizeof(float))))
    return miss(r, MN_ERR_OUT_OF_MEMORY, "out of memory");
  if (src) {
    memcpy(n->data, src, numel * sizeof(float));
    return MN_OK;
  }
  size_t k = 0;
  const cJSON *v;
  cJSON_ArrayForEach(v, data) {
    if (!get_float(v, &n->data[k++])) return CORRUPT(r, "node %zu: bad data value", i);
  }
  return MN_OK;
}

static mn_status read_instr(reader *r, size_t i, int k, const cJSON *obj, mn_fused_instr *in) {
  if (!cJSON_IsObject(obj)) return CORRUPT(r, "node %zu: instruction %d is not an object", i, k);
  const cJSON *op = NULL, *args = NULL, *attrs = NULL, *out = NULL, *m;
  cJSON_ArrayForEach(m, obj) {
    const cJSON **slot = strcmp(m->string, "op") == 0      ? &op
                         : strcmp(m->string, "args") == 0  ? &args
                         : strcmp(m->string, "attrs") == 0 ? &attrs
                         : strcmp(m->string, "out") == 0   ? &out
                                                           : NULL;
    if (!slot || *slot) return CORRUPT(r, "node %zu: instruction %d: bad field", i, k);
    *slot = m;
  }
  if (!find_op(cJSON_GetStringValue(op), &in->op))
    return CORRUPT(r, "node %zu: instruction %d: unknown op", i, k);
  int arity = mn_op_table[in->op].arity;
  if (!cJSON_IsArray(args) || arity < 1 || arity > MN_FUSED_MAX_ARGS ||
      cJSON_GetArraySize(args) != arity)
    return CORRUPT(r, "node %zu: instruction %d: bad args", i, k);
  int na = 0;
  const cJSON *v;
  cJSON_ArrayForEach(v, args) {
    long long x;
    if (!get_int(v, 0, MN_FUSED_MAX_INPUTS + MN_FUSED_MAX_INSTRS, &x))
      return CORRUPT(r, "node %zu: instruction %d: bad operand", i, k);
    in->args[na++] = (uint8_t)x;
  }
  long long x = 0;
  if (out && !get_int(out, 1, MN_MAX_EXTRA_OUTPUTS, &x))
    return CORRUPT(r, "node %zu: instruction %d: bad out", i, k);
  in->out = (uint8_t)x;
  /* Written as a node's attrs; an instruction carries scale's or a norm's attribute only. */
  mn_op_attrs a, only;
  mn_status st = read_attrs(r, i, attrs, &a);
  if (st != MN_OK) return st;
  memset(&only, 0, sizeof only);
  only.scale = a.scale;
  only.eps = a.eps;
  if (memcmp(&a, &only, sizeof a) != 0 || (a.scale != 0.0f && in->op != MN_OP_SCALE) ||
      (a.eps != 0.0f && !mn_fused_is_row_op(in->op)))
    return CORRUPT(r, "node %zu: instruction %d: bad attrs", i, k);
  in->scale = a.scale;
  in->eps = a.eps;
  return MN_OK;
}

/* Fused nodes: the program, well formed (graph.h), over F32 inputs of the node's type (or
 * rows of its last axis, for a row op's weight and bias), as the kernels read them. */
static mn_status read_program(reader *r, size_t i, const node_fields *node, mn_node_rec *n) {
  const cJSON *prog = node->program;
  if (n->op != MN_OP_FUSED)
    return prog ? CORRUPT(r, "node %zu: only fused nodes have a program", i) : MN_OK;
  if (!cJSON_IsArray(prog) || cJSON_GetArraySize(prog) < 1 ||
      cJSON_GetArraySize(prog) > MN_FUSED_MAX_INSTRS)
    return CORRUPT(r, "node %zu: fused without a program", i);
  if (!(n->fused = calloc(1, sizeof *n->fused)))
    return miss(r, MN_ERR_OUT_OF_MEMORY, "out of memory");
  const cJSON *v;
  cJSON_ArrayForEach(v, prog) {
    mn_status st =
        read_instr(r, i, n->fused->num_instrs, v, &n->fused->instrs[n->fused->num_instrs]);
    if (st != MN_OK) return st;
    n->fused->num_instrs++;
  }
  char why[128];
  if (!mn_fused_prog_check(n->fused, n->num_inputs, why, sizeof why))
    return CORRUPT(r, "node %zu: bad program: %s", i, why);
  bool f32 = n->type.dtype == MN_F32 && n->type.rank >= 1;
  for (int k = 0; f32 && k < n->num_inputs; k++) {
    const mn_tensor_type *t = &r->g->nodes[n->inputs[k]].type;
    if (mn_fused_input_is_row(n->fused, k))
      f32 = t->dtype == MN_F32 && t->rank == 1 && t->shape[0] == n->type.shape[n->type.rank - 1];
    else
      f32 = same_type(t, &n->type);
  }
  return f32 ? MN_OK
             : CORRUPT(r, "node %zu: fused inputs must be f32 of its shape or of its rows", i);
}

static mn_status read_node(reader *r, size_t i, const cJSON *obj, mn_node_rec *n) {
  if (!cJSON_IsObject(obj)) return CORRUPT(r, "node %zu is not an object", i);
  node_fields fields, *node = &fields;
  mn_status st = split_fields(r, i, obj, node);
  if (st != MN_OK) return st;
  const char *op = cJSON_GetStringValue(node->op);
  if (!op) return CORRUPT(r, "node %zu has no op", i);
  if (!find_op(op, &n->op)) return CORRUPT(r, "node %zu: unknown op \"%.40s\"", i, op);
  int arity = mn_op_table[n->op].arity > 0 ? mn_op_table[n->op].arity : 0;
  const cJSON *in = node->in;
  if (in && !cJSON_IsArray(in)) return CORRUPT(r, "node %zu: in is not an array", i);
  int count = in ? cJSON_GetArraySize(in) : 0;
  if (mn_op_table[n->op].arity == MN_ARITY_VARIADIC && count >= 1 && count <= MN_FUSED_MAX_INPUTS)
    arity = count;
  if (count != arity || arity > MN_MAX_INPUTS)
    return CORRUPT(r, "node %zu: %s takes %d inputs, not %d", i, op, arity, count);
  const cJSON *v;
  cJSON_ArrayForEach(v, in) {
    long long x;
    /* Inputs come strictly earlier: the graph is toposorted and acyclic. */
    if (!get_int(v, 0, (long long)i - 1, &x))
      return CORRUPT(r, "node %zu: input is not an earlier node", i);
    n->inputs[n->num_inputs++] = (mn_node)x;
  }
  st = read_type(r, i, node, &n->type);
  if (st == MN_OK) st = read_attrs(r, i, node->attrs, &n->attrs);
  if (st == MN_OK) st = read_name(r, i, node, n);
  if (st == MN_OK) st = read_constant(r, i, node, n);
  if (st == MN_OK) st = read_program(r, i, node, n);
  if (st != MN_OK) return st;
  /* In-place ops hand their output the buffer of input 1, so it must fit exactly. */
  if ((mn_op_flags(n->op) & MN_OPF_INPLACE) &&
      (n->num_inputs < 2 || !same_type(&n->type, &r->g->nodes[n->inputs[1]].type)))
    return CORRUPT(r, "node %zu: in-place %s changes the type of its buffer", i, op);
  return MN_OK;
}

static mn_status read_nodes(reader *r, const cJSON *nodes) {
  if (!cJSON_IsArray(nodes)) return CORRUPT(r, "nodes is not an array");
  int n = cJSON_GetArraySize(nodes);
  if (n < 1 || (unsigned)n > MAX_NODES) return CORRUPT(r, "%d nodes", n);
  mn_graph *g = r->g;
  if (!(g->nodes = calloc((size_t)n, sizeof *g->nodes)) ||
      !(r->grad_output = malloc((size_t)n * sizeof *r->grad_output)))
    return miss(r, MN_ERR_OUT_OF_MEMORY, "out of memory");
  g->cap_nodes = (size_t)n;
  for (int i = 0; i < n; i++)
    r->grad_output[i] = -1;
  const cJSON *node;
  cJSON_ArrayForEach(node, nodes) {
    size_t i = g->num_nodes++; /* counted first so that mn_graph_free releases it */
    mn_status st = read_node(r, i, node, &g->nodes[i]);
    if (st != MN_OK) return st;
  }
  return MN_OK;
}

/* User outputs keep the user's types (output 0 is the [1] loss); every other output is the
 * gradient of exactly one parameter, a computed node of its own of that parameter's type. */
static mn_status read_outputs(reader *r, const cJSON *root, size_t *num_user) {
  mn_graph *g = r->g;
  const cJSON *outs = member(root, "outputs");
  long long nu;
  if (!get_int(member(root, "num_user_outputs"), 0, MAX_NODES, &nu) ||
      (size_t)nu != r->user->num_outputs)
    return CORRUPT(r, "num_user_outputs does not match the graph");
  *num_user = (size_t)nu;
  if (!cJSON_IsArray(outs)) return CORRUPT(r, "outputs is not an array");
  int count = cJSON_GetArraySize(outs);
  if (count < 1 || (size_t)count < *num_user || (unsigned)count > MAX_NODES)
    return CORRUPT(r, "%d outputs for %zu user outputs", count, *num_user);
  if (!(g->outputs = malloc(((size_t)count + 1) * sizeof *g->outputs)))
    return miss(r, MN_ERR_OUT_OF_MEMORY, "out of memory");
  const cJSON *v;
  cJSON_ArrayForEach(v, outs) {
    long long x;
    if (!get_int(v, 0, (long long)g->num_nodes - 1, &x)) return CORRUPT(r, "bad output node");
    size_t j = g->num_outputs++;
    g->outputs[j] = (mn_node)x;
    if (j < *num_user && !same_type(&g->nodes[x].type, &r->user->nodes[r->user->outputs[j]].type))
      return CORRUPT(r, "output %zu: type differs from the graph's", j);
  }
  const mn_tensor_type *loss = &g->nodes[g->outputs[0]].type;
  if (loss->dtype != MN_F32 || loss->rank != 1 || loss->shape[0] != 1)
    return CORRUPT(r, "output 0 is not a [1] f32 loss");
  return MN_OK;
}

static mn_status read_param_grads(reader *r, const cJSON *pairs, size_t num_user) {
  mn_graph *g = r->g;
  if (!cJSON_IsArray(pairs)) return CORRUPT(r, "param_grads is not an array");
  unsigned char *used = calloc(g->num_outputs + g->num_nodes, 1);
  if (!used) return miss(r, MN_ERR_OUT_OF_MEMORY, "out of memory");
  unsigned char *node_used = used + g->num_outputs;
  for (size_t j = 0; j < num_user; j++)
    node_used[g->outputs[j]] = 1;
  mn_status st = MN_OK;
  const cJSON *pair;
  cJSON_ArrayForEach(pair, pairs) {
    long long p, j;
    if (!cJSON_IsArray(pair) || cJSON_GetArraySize(pair) != 2 ||
        !get_int(pair->child, 0, (long long)g->num_nodes - 1, &p) ||
        !get_int(pair->child->next, (long long)num_user, (long long)g->num_outputs - 1, &j)) {
      st = CORRUPT(r, "bad param_grads entry");
      break;
    }
    mn_node gn = g->outputs[j];
    /* A gradient owns its buffer: the optimizer reads it, clipping scales it in place. */
    unsigned shared = MN_OPF_LEAF | MN_OPF_INPLACE;
    if (g->nodes[p].op != MN_OP_PARAMETER || r->grad_output[p] >= 0 || used[j] || node_used[gn] ||
        (mn_op_flags(g->nodes[gn].op) & shared) ||
        !same_type(&g->nodes[gn].type, &g->nodes[p].type)) {
      st = CORRUPT(r, "param_grads: node %lld -> output %lld is not a gradient slot", p, j);
      break;
    }
    r->grad_output[p] = (int32_t)j;
    used[j] = node_used[gn] = 1;
  }
  for (size_t j = num_user; st == MN_OK && j < g->num_outputs; j++)
    if (!used[j]) st = CORRUPT(r, "output %zu is no parameter's gradient", j);
  free(used);
  return st;
}

/* The members of one param_sources entry, each looked at once. */
static mn_status split_source(reader *r, size_t i, const cJSON *entry, const cJSON **f) {
  static const char *const keys[] = {"name", "param", "offset", "dtype", "shape"};
  if (!cJSON_IsObject(entry)) return CORRUPT(r, "param_sources %zu is not an object", i);
  const cJSON *m;
  cJSON_ArrayForEach(m, entry) {
    size_t k = 0;
    while (k < 5 && strcmp(m->string, keys[k]) != 0)
      k++;
    if (k == 5) return CORRUPT(r, "param_sources %zu: unknown field \"%.40s\"", i, m->string);
    if (f[k]) return CORRUPT(r, "param_sources %zu: field %s twice", i, keys[k]);
    f[k] = m;
  }
  return MN_OK;
}

/* One source: a parameter of the user graph with exactly its type, named once in the whole
 * file, held by a derived parameter node from an element on. */
static mn_status read_source(reader *r, size_t i, const cJSON *entry) {
  const cJSON *f[5] = {NULL};
  mn_status st = split_source(r, i, entry, f);
  if (st != MN_OK) return st;
  const char *name = cJSON_GetStringValue(f[0]);
  long long param, offset, numel;
  mn_tensor_type t;
  if (!name) return CORRUPT(r, "param_sources %zu: no name", i);
  if (!get_int(f[1], 0, (long long)r->g->num_nodes - 1, &param) ||
      !mn_param_is_derived(&r->g->nodes[param]))
    return CORRUPT(r, "param_sources %zu: param is no derived parameter node", i);
  if (!get_int(f[2], 0, MAX_NUMEL, &offset)) return CORRUPT(r, "param_sources %zu: bad offset", i);
  if ((st = parse_type(r, "param_sources", i, f[3], f[4], &t, &numel)) != MN_OK) return st;
  mn_node u = mn_graph_find_leaf(r->user, MN_OP_PARAMETER, name);
  if (u == MN_NO_NODE)
    return CORRUPT(r, "param_sources %zu: the graph has no parameter named \"%.60s\"", i, name);
  if (!same_type(&r->user->nodes[u].type, &t))
    return CORRUPT(r, "param_sources %zu: \"%.60s\" has another type in the graph", i, name);
  if (r->user_seen[u]) return CORRUPT(r, "param_sources %zu: \"%.60s\" appears twice", i, name);
  r->user_seen[u] = 1;
  if (mn_param_layout_add(&r->layout, r->g->nodes[param].name, name, (size_t)offset, &t) != MN_OK)
    return miss(r, MN_ERR_OUT_OF_MEMORY, "out of memory");
  r->layout.sources[r->layout.num_sources - 1].node = (mn_node)param;
  return MN_OK;
}

/* The table of derived parameters: every source valid, and together they describe the nodes
 * (checked on a copy: binding orders the sources, and the checksum hashes them as written). */
static mn_status read_param_sources(reader *r, const cJSON *list) {
  if (!cJSON_IsArray(list)) return CORRUPT(r, "param_sources is not an array");
  size_t i = 0;
  const cJSON *entry;
  cJSON_ArrayForEach(entry, list) {
    mn_status st = read_source(r, i++, entry);
    if (st != MN_OK) return st;
  }
  mn_param_layout bound;
  if (!mn_param_layout_copy(&bound, &r->layout))
    return miss(r, MN_ERR_OUT_OF_MEMORY, "out of memory");
  char why[192];
  bool ok = mn_param_layout_bind(&bound, r->g, why, sizeof why);
  mn_param_layout_clear(&bound);
  return ok ? MN_OK : CORRUPT(r, "param_sources: %s", why);
}

static mn_status check_header(reader *r, const cJSON *root, const mn_session_options *o) {
  if (!cJSON_IsObject(root)) return CORRUPT(r, "not a JSON object");
  const char *format = cJSON_GetStringValue(member(root, "format"));
  if (!format || strcmp(format, MN_PLAN_CACHE_FORMAT) != 0)
    return CORRUPT(r, "no \"format\": \"" MN_PLAN_CACHE_FORMAT "\"");
  long long fv;
  if (!get_int(member(root, "format_version"), 0, INT_MAX, &fv))
    return CORRUPT(r, "no format_version");
  if (fv != MN_PLAN_CACHE_FORMAT_VERSION)
    return miss(r, MN_ERR_STATE, "format version %lld, this library writes %d", fv,
                MN_PLAN_CACHE_FORMAT_VERSION);
  const char *version = cJSON_GetStringValue(member(root, "library_version"));
  if (!version) return CORRUPT(r, "no library_version");
  if (strcmp(version, mn_version()) != 0)
    return miss(r, MN_ERR_STATE, "written by meganeura %.40s, this is %s", version, mn_version());
  const char *key = cJSON_GetStringValue(member(root, "key"));
  if (!key) return CORRUPT(r, "no key");
  char want[MN_HASH128_HEX];
  mn_hash128_hex(mn_plan_cache_key(r->user, o), want);
  if (strcmp(key, want) != 0) return miss(r, MN_ERR_STATE, "key mismatch");
  return MN_OK;
}

mn_status mn_plan_cache_parse(const char *json, size_t len, const mn_graph *user,
                              const mn_session_options *o, unsigned flags, mn_plan **out, char *why,
                              size_t why_size) {
  char scratch[256];
  reader r = {.why = why && why_size ? why : scratch,
              .why_size = why && why_size ? why_size : sizeof scratch,
              .user = user,
              .loss_scale = o && o->precision == MN_PRECISION_F16};
  r.why[0] = '\0';
  *out = NULL;
  cJSON *root = cJSON_ParseWithLength(json, len);
  if (!root) return CORRUPT(&r, "not valid JSON");
  mn_status st = check_header(&r, root, o);
  const char *sum = cJSON_GetStringValue(member(root, "checksum"));
  if (st == MN_OK && (!sum || strlen(sum) != MN_HASH128_HEX - 1)) st = CORRUPT(&r, "no checksum");
  size_t num_user = 0;
  if (st == MN_OK && (!(r.g = mn_graph_new()) || !(r.user_seen = calloc(user->num_nodes + 1, 1))))
    st = miss(&r, MN_ERR_OUT_OF_MEMORY, "out of memory");
  if (st == MN_OK) st = read_nodes(&r, member(root, "nodes"));
  if (st == MN_OK) st = read_outputs(&r, root, &num_user);
  if (st == MN_OK) st = read_param_grads(&r, member(root, "param_grads"), num_user);
  if (st == MN_OK) st = read_param_sources(&r, member(root, "param_sources"));
  if (st == MN_OK && (flags & MN_PLAN_CACHE_VERIFY_CHECKSUM)) {
    char got[MN_HASH128_HEX];
    mn_hash128_hex(mn_plan_cache_checksum(r.g, num_user, r.grad_output, &r.layout), got);
    if (strcmp(got, sum) != 0) st = CORRUPT(&r, "checksum mismatch");
  }
  cJSON_Delete(root);
  free(r.user_seen);
  if (st == MN_OK) {
    st = mn_plan_build(r.g, num_user, r.grad_output, &r.layout, out);
    r.g = NULL; /* the plan owns it now, even on failure */
    if (st != MN_OK) miss(&r, st, "building the plan: %s", mn_last_error());
  }
  mn_graph_free(r.g);
  free(r.grad_output);
  mn_param_layout_clear(&r.layout);
  return st;
}
