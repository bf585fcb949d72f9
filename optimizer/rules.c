/* The algebraic rules: identities that remove work, the activations that have a fused
 * op of their own, constant folding, and the products with an epilogue that the full stage
 * makes (docs/optimizer.md). Common subexpressions are merged by the e-graph's hash-consing
 * and dead code disappears in extraction, so neither needs a row.
 *
 * Every identity here holds for every value an F32 element can take (NaN and infinities
 * included), except that x + 0 turns an x of -0.0 into +0.0, which compares equal. The
 * epilogue ops compute bit for bit what the ops they stand for compute (their reference
 * kernels round every intermediate as those ops store it), so those rows change no value. */
#include "optimizer/rules.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "host/reference/ref_kernels.h"

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
  if (n->num_kids == 0 || (flags & (MN_OPF_LEAF | MN_OPF_INPLACE | MN_OPF_RANDOM)) ||
      t->dtype != MN_F32)
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

/* ---- products with an epilogue (full stage only: none of the ops they make has a VJP) */

static const mn_tensor_type *node_type(mn_egraph *eg, eg_id n) {
  return eg_type(eg, eg->nodes[n].type);
}

static bool same_type(const mn_tensor_type *a, const mn_tensor_type *b) {
  return a->dtype == b->dtype && mn_type_same_shape(a, b);
}

/* out = a op(b) as matmul (bt false: b [K, N]) or matmul_bt (bt true: b [N, K]) types it:
 * all F32, a [.., K] of rank >= 2, out a's leading dims then N. Checked again here because
 * a graph built past the builders (or a rule's output) may hold any types. */
static bool product_ok(const mn_tensor_type *a, const mn_tensor_type *b, const mn_tensor_type *out,
                       bool bt) {
  if (a->dtype != MN_F32 || b->dtype != MN_F32 || out->dtype != MN_F32) return false;
  if (a->rank < 2 || b->rank != 2 || out->rank != a->rank) return false;
  for (int i = 0; i + 1 < a->rank; i++)
    if (out->shape[i] != a->shape[i]) return false;
  int64_t k = a->shape[a->rank - 1], n = out->shape[out->rank - 1];
  return bt ? b->shape[1] == k && b->shape[0] == n : b->shape[0] == k && b->shape[1] == n;
}

/* The product matched at pattern entry `entry` over the variables numbered va and vb. */
static bool matched_product_ok(mn_egraph *eg, const mn_match *m, int entry, int va, int vb) {
  eg_id p = m->nodes[entry];
  return product_ok(eg_class_type(eg, m->vars[va]), eg_class_type(eg, m->vars[vb]),
                    node_type(eg, p), eg->nodes[p].op == MN_OP_MATMUL_BT);
}

/* bias_add(a op(b), bias), variables a, b, bias: the sum has the product's type and bias is
 * F32 [N] or [1, N]. */
static bool bias_of_product_ok(mn_egraph *eg, const mn_match *m) {
  const mn_tensor_type *out = node_type(eg, m->nodes[0]), *bias = eg_class_type(eg, m->vars[2]);
  if (!matched_product_ok(eg, m, 1, 0, 1) || !same_type(out, node_type(eg, m->nodes[1])) ||
      bias->dtype != MN_F32)
    return false;
  int64_t n = out->shape[out->rank - 1];
  return (bias->rank == 1 && bias->shape[0] == n) ||
         (bias->rank == 2 && bias->shape[0] == 1 && bias->shape[1] == n);
}

static void product_variant(mn_egraph *eg, const mn_match *m, int entry, mn_op_attrs *out) {
  (void)entry;
  out->variant = eg->nodes[m->nodes[1]].op == MN_OP_MATMUL_BT;
  out->act = MN_ACT_NONE;
}

/* act(matmul_bias_act{none}) or act(group_norm{none}): the inner node applies no activation
 * yet and the activation keeps its type. */
static bool plain_inner_ok(mn_egraph *eg, const mn_match *m) {
  const eg_node *inner = &eg->nodes[m->nodes[1]];
  return inner->attrs.act == MN_ACT_NONE && node_type(eg, m->nodes[0])->dtype == MN_F32 &&
         same_type(node_type(eg, m->nodes[0]), node_type(eg, m->nodes[1]));
}

static mn_act act_of(mn_op op) {
  switch (op) {
  case MN_OP_RELU: return MN_ACT_RELU;
  case MN_OP_GELU: return MN_ACT_GELU;
  case MN_OP_SILU: return MN_ACT_SILU;
  default: return MN_ACT_NONE;
  }
}

/* The inner node's attributes with the outer activation folded in. */
static void with_act(mn_egraph *eg, const mn_match *m, int entry, mn_op_attrs *out) {
  (void)entry;
  *out = eg->nodes[m->nodes[1]].attrs;
  out->act = act_of(eg->nodes[m->nodes[0]].op);
}

/* gelu_grad(pre, a op(b)) or relu_grad(x, a op(b)), variables pre (or x), a, b: pre, the
 * product and the gradient share one F32 type. */
static bool gated_product_ok(mn_egraph *eg, const mn_match *m) {
  const mn_tensor_type *out = node_type(eg, m->nodes[0]);
  return matched_product_ok(eg, m, 2, 1, 2) && same_type(out, node_type(eg, m->nodes[2])) &&
         same_type(out, eg_class_type(eg, m->vars[0]));
}

/* variant 1 where the product is matmul_bt. */
static void gated_product_variant(mn_egraph *eg, const mn_match *m, int entry, mn_op_attrs *out) {
  (void)entry;
  out->variant = eg->nodes[m->nodes[2]].op == MN_OP_MATMUL_BT;
}

/* relu_grad(x, dy) = relu_grad(relu(x), dy): relu(x) > 0 exactly when x > 0 (NaN and -0.0
 * included), which is all relu_grad reads of its first input. Only where relu(x) is already
 * computed, of x's own F32 type, so that x can lose this user. */
static bool relu_of_x_exists(mn_egraph *eg, const mn_match *m) {
  eg_id x = eg_find(eg, m->vars[0]);
  const mn_tensor_type *tx = eg_class_type(eg, x);
  if (tx->dtype != MN_F32 || !same_type(tx, node_type(eg, m->nodes[0])) ||
      !same_type(tx, eg_class_type(eg, m->vars[1])))
    return false;
  EG_FOR_USES(eg, x, u) {
    const eg_node *n = &eg->nodes[eg->uses[u].node];
    if (!n->dead && n->op == MN_OP_RELU && n->num_kids == 1 && eg_find(eg, n->kids[0]) == x &&
        n->type == eg->classes[x].type)
      return true;
  }
  return false;
}

/* reshape(reshape(x)) = reshape(x): a reshape copies its input's elements in order. */
static bool reshape_chain_ok(mn_egraph *eg, const mn_match *m) {
  const mn_tensor_type *out = node_type(eg, m->nodes[0]), *x = eg_class_type(eg, m->vars[0]);
  return out->dtype == x->dtype && mn_tensor_type_numel(out) == mn_tensor_type_numel(x);
}

static bool reshape_same_ok(mn_egraph *eg, const mn_match *m) {
  return eg->nodes[m->nodes[0]].type == eg->classes[eg_find(eg, m->vars[0])].type;
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
    /* The IR has no transpose op (matmul_at and matmul_bt carry the layout), so a chain of
     * reshapes is its double transpose: the copies in between are pure traffic. */
    {.name = "reshape-reshape",
     .lhs = "(reshape (reshape ?x))",
     .rhs = "(reshape ?x)",
     .cond = reshape_chain_ok},
    {.name = "reshape-same", .lhs = "(reshape ?x)", .rhs = "?x", .cond = reshape_same_ok},
    /* cuBLASLt epilogues (docs/optimizer.md): the product's output is not written and read
     * back by a second kernel. Extraction keeps the separate ops where the inner value has
     * another user and computing the product twice would cost more. */
    {.name = "matmul-bias",
     .lhs = "(bias_add (matmul ?a ?b) ?bias)",
     .rhs = "(matmul_bias_act ?a ?b ?bias)",
     .cond = bias_of_product_ok,
     .attrs = product_variant,
     .flags = MN_RULE_FULL_ONLY},
    {.name = "matmul-bt-bias",
     .lhs = "(bias_add (matmul_bt ?a ?b) ?bias)",
     .rhs = "(matmul_bias_act ?a ?b ?bias)",
     .cond = bias_of_product_ok,
     .attrs = product_variant,
     .flags = MN_RULE_FULL_ONLY},
    {.name = "matmul-bias-relu",
     .lhs = "(relu (matmul_bias_act ?a ?b ?bias))",
     .rhs = "(matmul_bias_act ?a ?b ?bias)",
     .cond = plain_inner_ok,
     .attrs = with_act,
     .flags = MN_RULE_FULL_ONLY},
    {.name = "matmul-bias-gelu",
     .lhs = "(gelu (matmul_bias_act ?a ?b ?bias))",
     .rhs = "(matmul_bias_act ?a ?b ?bias)",
     .cond = plain_inner_ok,
     .attrs = with_act,
     .flags = MN_RULE_FULL_ONLY},
    {.name = "matmul-dgelu",
     .lhs = "(gelu_grad ?pre (matmul ?a ?b))",
     .rhs = "(matmul_dgelu ?a ?b ?pre)",
     .cond = gated_product_ok,
     .attrs = gated_product_variant,
     .flags = MN_RULE_FULL_ONLY},
    {.name = "matmul-bt-dgelu",
     .lhs = "(gelu_grad ?pre (matmul_bt ?a ?b))",
     .rhs = "(matmul_dgelu ?a ?b ?pre)",
     .cond = gated_product_ok,
     .attrs = gated_product_variant,
     .flags = MN_RULE_FULL_ONLY},
    /* No cuBLASLt epilogue takes relu's gradient from x (DRELU reads a bit mask that the
     * forward would have to write): the CUDA backend folds it into its skinny products, where
     * an MLP's classifier gradient ends, and runs the two ops otherwise. */
    {.name = "matmul-drelu",
     .lhs = "(relu_grad ?x (matmul ?a ?b))",
     .rhs = "(matmul_drelu ?a ?b ?x)",
     .cond = gated_product_ok,
     .attrs = gated_product_variant,
     .flags = MN_RULE_FULL_ONLY},
    {.name = "matmul-bt-drelu",
     .lhs = "(relu_grad ?x (matmul_bt ?a ?b))",
     .rhs = "(matmul_drelu ?a ?b ?x)",
     .cond = gated_product_ok,
     .attrs = gated_product_variant,
     .flags = MN_RULE_FULL_ONLY},
    /* Pays only where nothing else reads the normalized value: in training silu_grad does,
     * and extraction then keeps group_norm and silu apart (docs/optimizer.md). */
    {.name = "group-norm-silu",
     .lhs = "(silu (group_norm ?x ?w ?b))",
     .rhs = "(group_norm ?x ?w ?b)",
     .cond = plain_inner_ok,
     .attrs = with_act,
     .flags = MN_RULE_FULL_ONLY},
    /* In training the pre-activation is read by relu and by relu_grad; reading relu's output
     * instead leaves it one user, so that matmul-bias-relu can take it into the product. */
    {.name = "relu-grad-of-output",
     .lhs = "(relu_grad ?x ?dy)",
     .rhs = "(relu_grad (relu ?x) ?dy)",
     .cond = relu_of_x_exists,
     .flags = MN_RULE_FULL_ONLY},
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
