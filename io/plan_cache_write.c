/* Writing the plan cache: a lowered training plan as JSON (layout in plan_cache.h). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/error.h"
#include "io/plan_cache.h"

mn_hash128 mn_plan_cache_checksum(const mn_graph *lowered, size_t num_user_outputs,
                                  const int32_t *grad_output, const mn_param_layout *layout) {
  mn_hasher h;
  mn_hasher_init(&h);
  mn_hasher_str(&h, "meganeura plan cache checksum");
  mn_hash_graph(&h, lowered);
  mn_hasher_u64(&h, num_user_outputs);
  for (size_t i = 0; i < lowered->num_nodes; i++)
    if (grad_output[i] >= 0) {
      mn_hasher_u64(&h, i);
      mn_hasher_u64(&h, (uint64_t)grad_output[i]);
    }
  mn_hasher_u64(&h, layout->num_sources);
  for (size_t i = 0; i < layout->num_sources; i++) {
    const mn_param_source *s = &layout->sources[i];
    mn_hasher_str(&h, s->name);
    mn_hasher_u64(&h, s->node);
    mn_hasher_u64(&h, s->offset);
    mn_hasher_u64(&h, (uint64_t)s->type.dtype);
    mn_hasher_u64(&h, (uint64_t)(int64_t)s->type.rank);
    for (int k = 0; k < s->type.rank && k < MN_MAX_RANK; k++)
      mn_hasher_u64(&h, (uint64_t)s->type.shape[k]);
  }
  return mn_hasher_final(&h);
}

/* Builds a cJSON tree, remembering the first allocation failure so that the construction
 * reads straight through and is checked once at the end. */
typedef struct builder {
  bool ok;
} builder;

static cJSON *checked(builder *b, cJSON *item) {
  if (!item) b->ok = false;
  return item;
}

static void add(builder *b, cJSON *parent, const char *key, cJSON *item) {
  if (!item) {
    b->ok = false;
    return;
  }
  bool added = key ? cJSON_AddItemToObject(parent, key, item) : cJSON_AddItemToArray(parent, item);
  if (!added) {
    cJSON_Delete(item);
    b->ok = false;
  }
}

static cJSON *int_item(builder *b, long long v) {
  char buf[32];
  snprintf(buf, sizeof buf, "%lld", v);
  return checked(b, cJSON_CreateRaw(buf));
}

static cJSON *float_item(builder *b, float v) {
  char buf[32];
  if (isfinite(v)) {
    snprintf(buf, sizeof buf, "%.9g", (double)v);
    return checked(b, cJSON_CreateRaw(buf));
  }
  uint32_t bits;
  memcpy(&bits, &v, sizeof bits);
  snprintf(buf, sizeof buf, "0x%08x", (unsigned)bits);
  return checked(b, cJSON_CreateString(buf));
}

static bool float_nonzero(float v) {
  uint32_t bits;
  memcpy(&bits, &v, sizeof bits);
  return bits != 0;
}

static cJSON *attrs_item(builder *b, const mn_op_attrs *a) {
  cJSON *o = checked(b, cJSON_CreateObject());
  if (!o) return NULL;
  const struct {
    const char *key;
    float v;
  } floats[] = {{"scale", a->scale}, {"eps", a->eps}, {"theta", a->theta}};
  for (size_t i = 0; i < sizeof floats / sizeof floats[0]; i++)
    if (float_nonzero(floats[i].v)) add(b, o, floats[i].key, float_item(b, floats[i].v));
  const struct {
    const char *key;
    long long v;
  } ints[] = {{"pos_offset", a->pos_offset}, {"head_dim", a->head_dim},
              {"num_heads", a->num_heads},   {"num_kv_heads", a->num_kv_heads},
              {"stride", a->stride},         {"padding", a->padding},
              {"groups", a->groups},         {"channels_a", a->channels_a},
              {"variant", a->variant},       {"act", a->act},
              {"num_rows", a->num_rows},     {"seed", a->seed}};
  for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
    if (ints[i].v) add(b, o, ints[i].key, int_item(b, ints[i].v));
  if (!o->child) {
    cJSON_Delete(o);
    return NULL;
  }
  return o;
}

/* The user graph's constant holding exactly this node's type and data, or -1. */
static long long find_user_constant(const mn_graph *user, const mn_node_rec *n) {
  size_t bytes = (size_t)mn_tensor_type_numel(&n->type) * sizeof(float);
  for (size_t i = 0; i < user->num_nodes; i++) {
    const mn_node_rec *u = &user->nodes[i];
    if (u->op != MN_OP_CONSTANT || !u->data || u->type.dtype != n->type.dtype ||
        !mn_type_same_shape(&u->type, &n->type))
      continue;
    if (memcmp(u->data, n->data, bytes) == 0) return (long long)i;
  }
  return -1;
}

/* A fused node's program: one {"op", "args", "attrs" (scale's or eps, as a node's), "out"
 * (the extra value it is, when it is one)} per instruction. */
static cJSON *program_item(builder *b, const mn_fused_prog *p) {
  cJSON *list = checked(b, cJSON_CreateArray());
  for (int i = 0; list && i < p->num_instrs; i++) {
    const mn_fused_instr *in = &p->instrs[i];
    cJSON *o = checked(b, cJSON_CreateObject()), *args = checked(b, cJSON_CreateArray());
    if (o) add(b, o, "op", checked(b, cJSON_CreateString(mn_op_name(in->op))));
    for (int k = 0; args && k < mn_op_table[in->op].arity; k++)
      add(b, args, NULL, int_item(b, in->args[k]));
    if (o)
      add(b, o, "args", args);
    else
      cJSON_Delete(args);
    mn_op_attrs attrs = {.scale = in->scale, .eps = in->eps};
    cJSON *a = o ? attrs_item(b, &attrs) : NULL;
    if (a) add(b, o, "attrs", a);
    if (o && in->out) add(b, o, "out", int_item(b, in->out));
    add(b, list, NULL, o);
  }
  return list;
}

static void type_fields(builder *b, cJSON *o, const mn_tensor_type *t) {
  add(b, o, "dtype", checked(b, cJSON_CreateString(mn_dtype_name(t->dtype))));
  cJSON *shape = checked(b, cJSON_CreateArray());
  for (int k = 0; shape && k < t->rank; k++)
    add(b, shape, NULL, int_item(b, t->shape[k]));
  add(b, o, "shape", shape);
}

static cJSON *node_item(builder *b, const mn_graph *user, const mn_node_rec *n) {
  cJSON *o = checked(b, cJSON_CreateObject());
  if (!o) return NULL;
  add(b, o, "op", checked(b, cJSON_CreateString(mn_op_name(n->op))));
  if (n->num_inputs > 0) {
    cJSON *in = checked(b, cJSON_CreateArray());
    for (int k = 0; in && k < n->num_inputs; k++)
      add(b, in, NULL, int_item(b, n->inputs[k]));
    add(b, o, "in", in);
  }
  type_fields(b, o, &n->type);
  cJSON *attrs = attrs_item(b, &n->attrs);
  if (attrs) add(b, o, "attrs", attrs);
  if (n->name) add(b, o, "name", checked(b, cJSON_CreateString(n->name)));
  if (n->op == MN_OP_FUSED && n->fused) add(b, o, "program", program_item(b, n->fused));
  if (n->op == MN_OP_CONSTANT && n->data) {
    long long idx = find_user_constant(user, n);
    if (idx >= 0) {
      add(b, o, "user_constant", int_item(b, idx));
    } else {
      cJSON *data = checked(b, cJSON_CreateArray());
      size_t numel = (size_t)mn_tensor_type_numel(&n->type);
      for (size_t k = 0; data && b->ok && k < numel; k++)
        add(b, data, NULL, float_item(b, n->data[k]));
      add(b, o, "data", data);
    }
  }
  return o;
}

/* One {"name", "param", "offset", "dtype", "shape"} per source of a derived parameter. */
static cJSON *param_sources_item(builder *b, const mn_param_layout *l) {
  cJSON *list = checked(b, cJSON_CreateArray());
  for (size_t i = 0; list && i < l->num_sources; i++) {
    const mn_param_source *s = &l->sources[i];
    cJSON *o = checked(b, cJSON_CreateObject());
    if (o) {
      add(b, o, "name", checked(b, cJSON_CreateString(s->name)));
      add(b, o, "param", int_item(b, s->node));
      add(b, o, "offset", int_item(b, (long long)s->offset));
      type_fields(b, o, &s->type);
    }
    add(b, list, NULL, o);
  }
  return list;
}

/* grad_output[i]: the output index holding the gradient of parameter node i, else -1. */
static int32_t *grad_outputs_of(const mn_plan *plan) {
  const mn_graph *g = plan->graph;
  int32_t *grad_output = malloc((g->num_nodes ? g->num_nodes : 1) * sizeof *grad_output);
  if (!grad_output) return NULL;
  for (size_t i = 0; i < g->num_nodes; i++)
    grad_output[i] = -1;
  for (size_t k = 0; k < plan->num_params; k++) {
    if (plan->params[k].grad == MN_NO_NODE) continue;
    for (size_t j = plan->num_user_outputs; j < g->num_outputs; j++)
      if (g->outputs[j] == plan->params[k].grad) {
        grad_output[plan->params[k].param] = (int32_t)j;
        break;
      }
  }
  return grad_output;
}

mn_status mn_plan_cache_serialize(const mn_plan *plan, const mn_graph *user,
                                  const mn_session_options *o, char **json) {
  const char *fn = "mn_build_session_cached";
  *json = NULL;
  const mn_graph *g = plan->graph;
  int32_t *grad_output = grad_outputs_of(plan);
  if (!grad_output) return mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
  char key[MN_HASH128_HEX], sum[MN_HASH128_HEX];
  mn_hash128_hex(mn_plan_cache_key(user, o), key);
  mn_hash128_hex(mn_plan_cache_checksum(g, plan->num_user_outputs, grad_output, &plan->layout),
                 sum);

  builder b = {.ok = true};
  cJSON *root = checked(&b, cJSON_CreateObject());
  if (root) {
    add(&b, root, "format", checked(&b, cJSON_CreateString(MN_PLAN_CACHE_FORMAT)));
    add(&b, root, "format_version", int_item(&b, MN_PLAN_CACHE_FORMAT_VERSION));
    add(&b, root, "library_version", checked(&b, cJSON_CreateString(mn_version())));
    add(&b, root, "key", checked(&b, cJSON_CreateString(key)));
    add(&b, root, "checksum", checked(&b, cJSON_CreateString(sum)));
    add(&b, root, "num_user_outputs", int_item(&b, (long long)plan->num_user_outputs));
    cJSON *outs = checked(&b, cJSON_CreateArray());
    for (size_t i = 0; outs && i < g->num_outputs; i++)
      add(&b, outs, NULL, int_item(&b, g->outputs[i]));
    add(&b, root, "outputs", outs);
    cJSON *grads = checked(&b, cJSON_CreateArray());
    for (size_t i = 0; grads && i < g->num_nodes; i++) {
      if (grad_output[i] < 0) continue;
      cJSON *pair = checked(&b, cJSON_CreateArray());
      if (pair) {
        add(&b, pair, NULL, int_item(&b, (long long)i));
        add(&b, pair, NULL, int_item(&b, grad_output[i]));
      }
      add(&b, grads, NULL, pair);
    }
    add(&b, root, "param_grads", grads);
    add(&b, root, "param_sources", param_sources_item(&b, &plan->layout));
    cJSON *nodes = checked(&b, cJSON_CreateArray());
    for (size_t i = 0; nodes && b.ok && i < g->num_nodes; i++)
      add(&b, nodes, NULL, node_item(&b, user, &g->nodes[i]));
    add(&b, root, "nodes", nodes);
  }
  free(grad_output);
  char *text = b.ok ? cJSON_PrintUnformatted(root) : NULL;
  cJSON_Delete(root);
  if (!text) return mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: out of memory writing the plan cache", fn);
  *json = text;
  return MN_OK;
}
