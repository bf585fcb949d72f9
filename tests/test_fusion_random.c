/* Fusion property test: 200 random graphs of pointwise ops (chains, shared values, several
 * outputs, sizes around the float4 and tile boundaries) with a few row ops (rms_norm,
 * layer_norm: fused with their prologues and epilogues) and softmaxes among them (which read
 * values of a group from outside and feed others back into it: multi-output groups, and
 * groups that a path leaves and re-enters), each run as an inference graph and trained one
 * step, give bit for bit the same outputs, losses, gradients and parameters fused and
 * optimized without fusion. The baseline is the optimized graph, not the unoptimized one: in
 * backward graphs the rewrite rules (silu, swiglu) replace ops by others that round
 * differently, which is no part of fusion. Their kernels compile for the GPU. */
#include <stdio.h>
#include <stdlib.h>

#include "tests/support/cuda_check.h"
#include "tests/support/fusion_check.h"
#include "tests/support/mn_test.h"

enum { GRAPHS = 200, MAX_VALUES = 32 };

typedef enum kind { UNARY, BINARY, SCALE, OUTSIDE, ROW } kind;
typedef struct op_row {
  mn_op op;
  kind k;
  mn_node (*unary)(mn_graph *, mn_node);
  mn_node (*binary)(mn_graph *, mn_node, mn_node);
} op_row;

static mn_node scale_any(mn_graph *g, mn_node x) { return mn_scale(g, x, 0.75f); }

static const op_row ops[] = {
    {MN_OP_ADD, BINARY, NULL, mn_add},          {MN_OP_MUL, BINARY, NULL, mn_mul},
    {MN_OP_DIV, BINARY, NULL, mn_div},          {MN_OP_GREATER, BINARY, NULL, mn_greater},
    {MN_OP_SWIGLU, BINARY, NULL, mn_swiglu},    {MN_OP_SCALE, SCALE, scale_any, NULL},
    {MN_OP_RELU, UNARY, mn_relu, NULL},         {MN_OP_SIGMOID, UNARY, mn_sigmoid, NULL},
    {MN_OP_TANH, UNARY, mn_tanh, NULL},         {MN_OP_NEG, UNARY, mn_neg, NULL},
    {MN_OP_ABS, UNARY, mn_abs, NULL},           {MN_OP_LOG, UNARY, mn_log, NULL},
    {MN_OP_EXP, UNARY, mn_exp, NULL},           {MN_OP_RECIP, UNARY, mn_recip, NULL},
    {MN_OP_SILU, UNARY, mn_silu, NULL},         {MN_OP_GELU, UNARY, mn_gelu, NULL},
    {MN_OP_SOFTMAX, OUTSIDE, mn_softmax, NULL}, {MN_OP_RMS_NORM, ROW, NULL, NULL},
    {MN_OP_LAYER_NORM, ROW, NULL, NULL},
};

typedef struct gen {
  mn_rng r;
  mn_graph *g;
  mn_node v[MAX_VALUES];
  mn_op op[MAX_VALUES]; /* MN_OP_INPUT / PARAMETER for leaves */
  int n, leaves;
} gen;

static int pick(gen *s, int below) { return (int)(mn_rng_uniform(&s->r) * below); }

/* A recent value most of the time, so that chains form; any value otherwise. */
static int operand(gen *s) {
  int recent = s->n < 3 ? s->n : 3;
  return mn_rng_uniform(&s->r) < 0.7 ? s->n - 1 - pick(s, recent) : pick(s, s->n);
}

/* Patterns that the rewrite rules turn into ops that round differently (scale-scale, silu,
 * swiglu) are left out of forward graphs, so that inference graphs also agree with the
 * unoptimized session. */
static bool rewritten(const gen *s, const op_row *row, int a, int b) {
  if (row->op == MN_OP_SCALE) return s->op[a] == MN_OP_SCALE;
  if (row->op != MN_OP_MUL) return false;
  return s->op[a] == MN_OP_SIGMOID || s->op[a] == MN_OP_SILU || s->op[b] == MN_OP_SIGMOID ||
         s->op[b] == MN_OP_SILU;
}

static void add_value(gen *s, mn_node v, mn_op op) {
  s->v[s->n] = v;
  s->op[s->n++] = op;
}

/* A norm of x with a fresh weight (and bias) of the last axis, named <prefix>n<k>w / b:
 * parameters when training. */
static mn_node random_norm(gen *s, const op_row *row, mn_node x, const char *prefix, bool training,
                           const int64_t *shape, int rank) {
  char w[32], b[32];
  snprintf(w, sizeof w, "%sn%dw", prefix, s->n);
  snprintf(b, sizeof b, "%sn%db", prefix, s->n);
  const int64_t *n = &shape[rank - 1];
  mn_node wn = training ? mn_parameter(s->g, w, n, 1) : mn_input(s->g, w, n, 1);
  if (row->op == MN_OP_RMS_NORM) return mn_rms_norm(s->g, x, wn, 1e-5f);
  mn_node bn = training ? mn_parameter(s->g, b, n, 1) : mn_input(s->g, b, n, 1);
  return mn_layer_norm(s->g, x, wn, bn, 1e-5f);
}

/* Leaves named <prefix>x<i> (inputs) or <prefix>p<i> (parameters), then 2 to 20 ops (a row op
 * or a softmax one time in eight). Returns the index of the last value. */
static int random_body(gen *s, const char *prefix, bool training, const int64_t *shape, int rank) {
  s->leaves = 1 + pick(s, 4);
  for (int i = 0; i < s->leaves; i++) {
    char name[32];
    bool param = training && (i == 0 || mn_rng_uniform(&s->r) < 0.5);
    snprintf(name, sizeof name, "%s%c%d", prefix, param ? 'p' : 'x', i);
    add_value(s, param ? mn_parameter(s->g, name, shape, rank) : mn_input(s->g, name, shape, rank),
              param ? MN_OP_PARAMETER : MN_OP_INPUT);
  }
  enum { SPECIAL = 3 }; /* rows of ops at the end of the table: softmax and the norms */
  int pointwise = (int)(sizeof ops / sizeof ops[0]) - SPECIAL;
  for (int count = 2 + pick(s, 19); count > 0 && s->n < MAX_VALUES;) {
    const op_row *row = &ops[pick(s, 8) ? pick(s, pointwise) : pointwise + pick(s, SPECIAL)];
    int a = operand(s), b = operand(s);
    if (rewritten(s, row, a, b)) continue;
    mn_node v = row->k == BINARY ? row->binary(s->g, s->v[a], s->v[b])
                : row->k == ROW  ? random_norm(s, row, s->v[a], prefix, training, shape, rank)
                                 : row->unary(s->g, s->v[a]);
    add_value(s, v, row->op);
    count--;
  }
  return s->n - 1;
}

static void random_shape(gen *s, int64_t *shape, int *rank) {
  static const int64_t sizes[] = {1, 3, 4, 6, 7, 8, 33, 64, 257, 300};
  int64_t n = sizes[pick(s, (int)(sizeof sizes / sizeof sizes[0]))];
  *rank = n % 2 == 0 && pick(s, 2) ? 2 : 1;
  shape[0] = *rank == 2 ? 2 : n;
  shape[1] = n / 2;
}

/* Outputs: the last value, then up to two more values (an intermediate that is an output
 * ends a group there); for training the first output is mse(last, t). */
static mn_graph *random_graph(uint64_t seed, bool training) {
  gen s = {.r = mn_rng_new(seed), .g = mn_graph_new()};
  int64_t shape[2];
  int rank;
  random_shape(&s, shape, &rank);
  int last = random_body(&s, "", training, shape, rank);
  mn_node outs[3];
  size_t n = 0;
  outs[n++] = training ? mn_mse_loss(s.g, s.v[last], mn_input(s.g, "t", shape, rank)) : s.v[last];
  for (int extra = pick(&s, 3); extra > 0; extra--) {
    int k = s.leaves + pick(&s, s.n - s.leaves);
    bool dup = false;
    for (size_t j = 0; j < n; j++)
      dup |= outs[j] == s.v[k];
    if (!dup) outs[n++] = s.v[k];
  }
  mn_set_outputs(s.g, outs, n);
  cr_assert_eq(mn_graph_status(s.g), MN_OK, "%s", mn_graph_error(s.g));
  return s.g;
}

Test(fusion_random, random_pointwise_graphs_agree_bitwise) {
  size_t fused = 0, rows = 0, extras = 0;
  for (uint64_t seed = 1; seed <= GRAPHS; seed++) {
    for (int training = 0; training < 2; training++) {
      mn_graph *g = random_graph(seed, training);
      mn_plan *p = mn_fz_lower(g, training);
      fused += mn_fz_count_op(p->graph, MN_OP_FUSED);
      for (size_t i = 0; i < p->graph->num_nodes; i++) {
        const mn_node_rec *n = &p->graph->nodes[i];
        rows += n->op == MN_OP_FUSED && mn_fused_prog_row(n->fused) >= 0;
        extras += n->op == MN_OP_EXTRA_OUTPUT && p->graph->nodes[n->inputs[0]].op == MN_OP_FUSED;
      }
      mn_plan_free(p);
      if (training)
        mn_fz_agree_training(g, MN_FZ_OPTIMIZED_UNFUSED, 1, seed, -2, 2);
      else
        mn_fz_agree_inference(g, MN_FZ_UNOPTIMIZED, seed, -2, 2);
      mn_graph_free(g);
    }
  }
  cr_assert_gt(fused, GRAPHS, "only %zu fused nodes in %d graphs", fused, 2 * GRAPHS);
  cr_assert_gt(rows, GRAPHS / 10, "only %zu fused row ops", rows);
  cr_assert_gt(extras, GRAPHS / 2, "only %zu extra values of fused nodes", extras);
  cr_log_info("%zu fused nodes, %zu with a row op, %zu extra values", fused, rows, extras);
}

/* Twenty random bodies side by side in one graph, so that one NVRTC run compiles them. */
Test(fusion_random, random_fused_kernels_compile) {
  mn_test_require_cuda_build();
  for (int training = 0; training < 2; training++) {
    gen s = {.r = mn_rng_new(99 + (uint64_t)training), .g = mn_graph_new()};
    mn_node outs[21];
    size_t n = 0;
    mn_node loss_terms = MN_NO_NODE;
    for (int k = 0; k < 20; k++) {
      char prefix[16];
      snprintf(prefix, sizeof prefix, "g%d.", k);
      int64_t shape[2];
      int rank;
      random_shape(&s, shape, &rank);
      s.n = 0;
      int last = random_body(&s, prefix, training, shape, rank);
      if (!training) {
        outs[n++] = s.v[last];
        continue;
      }
      char t[24];
      snprintf(t, sizeof t, "%st", prefix);
      mn_node l = mn_mse_loss(s.g, s.v[last], mn_input(s.g, t, shape, rank));
      loss_terms = loss_terms == MN_NO_NODE ? l : mn_add(s.g, loss_terms, l);
    }
    if (training) outs[n++] = loss_terms;
    mn_set_outputs(s.g, outs, n);
    cr_assert_eq(mn_graph_status(s.g), MN_OK, "%s", mn_graph_error(s.g));
    mn_test_assert_compiles(s.g, training);
    mn_graph_free(s.g);
  }
}
