/* The algebraic rules: identities that remove work, the activations that have a fused
 * op of their own, and constant folding. Common subexpressions are merged by the
 * e-graph's hash-consing and dead code disappears in extraction, so neither needs a row.
 *
 * Every identity here holds for every value an F32 element can take (NaN and infinities
 * included), except that x + 0 turns an x of -0.0 into +0.0, which compares equal. */
#include "rules.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "reference/ref_kernels.h"

/* A class known to be a constant whose every element equals v (+0.0 and -0.0 alike). */
static bool class_is_filled(mn_egraph *eg, eg_id cls, float v) {
  cls = eg_find(eg, cls);
  eg_id k = eg->classes[cls].const_node;
  if (k == EG_NONE) return false;
  const eg_node *n = &eg->nodes[k];
  if (eg_type(eg, n->type)->dtype != MN_F32) return false;
  size_t numel = (size_t)mn_tensor_type_numel(eg_type(eg, n->type));
  for (size_t i = 0; i < numel; i++)
    if (n->data[i] != v) return false;
  return true;
}

static bool pred_ones(mn_egraph *eg, eg_id cls) { return class_is_filled(eg, cls, 1.0f); }

static bool pred_zeros(mn_egraph *eg, eg_id cls) {
  if (class_is_filled(eg, cls, 0.0f)) return true;
  cls = eg_find(eg, cls);
  EG_FOR_NODES(eg, cls, n)
  if (!eg->nodes[n].dead && eg->nodes[n].op == MN_OP_ZEROS) return true;
  return false;
}

static bool scale_is_one(mn_egraph *eg, const mn_match *m) {
  return eg->nodes[m->nodes[0]].attrs.scale == 1.0f;
}

/* scale(scale(x, a), b) = scale(x, a*b) when a*b is a normal float: a product that
 * overflows or underflows would differ from rounding twice by more than an ulp. */
static bool scale_product_ok(mn_egraph *eg, const mn_match *m) {
  double p = (double)eg->nodes[m->nodes[0]].attrs.scale * eg->nodes[m->nodes[1]].attrs.scale;
  return isfinite(p) && fabs(p) >= FLT_MIN && fabs(p) <= FLT_MAX;
}

static void scale_product(mn_egraph *eg, const mn_match *m, int entry, mn_op_attrs *out) {
  (void)entry;
  out->scale =
      (float)((double)eg->nodes[m->nodes[0]].attrs.scale * eg->nodes[m->nodes[1]].attrs.scale);
}

/* Runs the reference kernel of a node whose inputs are all constants, on a graph of
 * just those constants and the node, and adds the result as a CONSTANT node. */
static eg_id fold_constants(mn_egraph *eg, eg_id id) {
  const eg_node *n = &eg->nodes[id];
  unsigned flags = mn_op_flags(n->op);
  const mn_tensor_type *t = eg_type(eg, n->type);
  if (n->num_kids == 0 || (flags & (MN_OPF_LEAF | MN_OPF_INPLACE)) || t->dtype != MN_F32)
    return EG_NONE;
  if (mn_tensor_type_numel(t) > MN_FOLD_MAX_ELEMS) return EG_NONE;
  if (eg->classes[eg_find(eg, id)].const_node != EG_NONE) return EG_NONE;
  mn_node_rec recs[MN_MAX_INPUTS + 1];
  memset(recs, 0, sizeof recs);
  mn_ref_ctx ctx;
  memset(&ctx, 0, sizeof ctx);
  for (int i = 0; i < n->num_kids; i++) {
    eg_id k = eg->classes[eg_find(eg, n->kids[i])].const_node;
    if (k == EG_NONE || eg_type(eg, eg->nodes[k].type)->dtype != MN_F32) return EG_NONE;
    recs[i].op = MN_OP_CONSTANT;
    recs[i].type = *eg_type(eg, eg->nodes[k].type);
    ctx.in[i] = eg->nodes[k].data;
  }
  mn_node_rec *op = &recs[n->num_kids];
  op->op = n->op;
  op->num_inputs = n->num_kids;
  for (int i = 0; i < n->num_kids; i++)
    op->inputs[i] = (mn_node)i;
  op->type = *t;
  op->attrs = n->attrs;
  op->fused = (mn_fused_prog *)n->fused; /* read only: the kernel interprets it */
  mn_graph mini;
  memset(&mini, 0, sizeof mini);
  mini.nodes = recs;
  mini.num_nodes = (size_t)n->num_kids + 1;
  char error[128] = "";
  size_t bytes = (size_t)mn_tensor_type_numel(t) * sizeof(float);
  float *out = malloc(bytes ? bytes : 1);
  if (!out) return eg->oom = true, EG_NONE;
  ctx.g = &mini;
  ctx.id = (mn_node)n->num_kids;
  ctx.node = op;
  ctx.out = out;
  ctx.error = error;
  ctx.error_size = sizeof error;
  if (mn_ref_kernels[n->op](&ctx) != MN_OK) {
    free(out);
    return EG_NONE;
  }
  if (!eg_own_data(eg, out)) return EG_NONE;
  eg_node_key key;
  memset(&key, 0, sizeof key);
  key.op = MN_OP_CONSTANT;
  key.type = n->type;
  key.identity = EG_NONE;
  key.data = out;
  return eg_add(eg, &key);
}

static const mn_rule rule_table[] = {
    {.name = "neg-neg", .lhs = "(neg (neg ?x))", .rhs = "?x"},
    {.name = "mul-one", .lhs = "(mul ?x ?one:ones)", .rhs = "?x", .flags = MN_RULE_COMMUTE},
    {.name = "add-zero", .lhs = "(add ?x ?zero:zeros)", .rhs = "?x", .flags = MN_RULE_COMMUTE},
    {.name = "scale-one", .lhs = "(scale ?x)", .rhs = "?x", .cond = scale_is_one},
    {.name = "scale-scale",
     .lhs = "(scale (scale ?x))",
     .rhs = "(scale ?x)",
     .cond = scale_product_ok,
     .attrs = scale_product},
    {.name = "silu", .lhs = "(mul ?x (sigmoid ?x))", .rhs = "(silu ?x)", .flags = MN_RULE_COMMUTE},
    /* swiglu(gate, up) = silu(gate) * up (host/build_transformer.c) */
    {.name = "swiglu",
     .lhs = "(mul (silu ?gate) ?up)",
     .rhs = "(swiglu ?gate ?up)",
     .flags = MN_RULE_COMMUTE},
    {.name = "constant-fold", .custom = fold_constants},
};

static const mn_rule_predicate predicates[] = {
    {"ones", pred_ones},
    {"zeros", pred_zeros},
};

const mn_rule *mn_rule_table(size_t *count) {
  *count = sizeof rule_table / sizeof rule_table[0];
  return rule_table;
}

const mn_rule_predicate *mn_rule_predicates(size_t *count) {
  *count = sizeof predicates / sizeof predicates[0];
  return predicates;
}
