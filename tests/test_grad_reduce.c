/* Gradient checks of softmax, log_softmax and the five losses, and the structure their
 * VJP rules build: which backward nodes exist for which differentiable inputs. */
#include <stdlib.h>

#include "autodiff/autodiff.h"
#include "host/build_util.h"
#include "host/reference/ref_kernels.h"
#include "tests/support/gradcheck.h"

/* MSE is quadratic and L1 linear in each element away from the kink, so their central
 * differences have no truncation error and a larger step only shrinks the float32
 * rounding of the loss (about 6e-8 / 2h per probe) relative to the small per-element
 * gradients (about 1/n). */
static const mn_gc_options exact_fd = {.h = 1e-2};

/* Softmax-family ops and losses over C classes: the loss is about sum_c t * log C while each
 * logit's gradient is about 1/C of it, so the float32 rounding of the loss (6e-8
 * relative per evaluation) costs about C log C * 6e-8 / h relative: 1.7% for C = 37 at
 * h = 1e-3. Their third derivatives are small (at most 0.1 per unit of sum t for
 * log-sum-exp and for log(sigmoid)), so the truncation error h^2 c^2 / 6 * f3 / f1 stays
 * near 1e-4 at h = 2e-2 (c <= 1.5 being the harness's scale of the parameter) while the
 * rounding term drops to about 0.1%. */
static const mn_gc_options smooth_fd = {.h = 2e-2};

/* ---- softmax and log_softmax ---------------------------------------------------- */

/* Each output feeds a further op (scale), so dy reaching the rule is not the loss seed. */
static mn_node build_softmax(mn_graph *g, const mn_node *x, void *u) {
  (void)u;
  return mn_scale(g, mn_softmax(g, x[0]), 0.7f);
}
static mn_node build_log_softmax(mn_graph *g, const mn_node *x, void *u) {
  (void)u;
  return mn_scale(g, mn_log_softmax(g, x[0]), 0.7f);
}

Test(grad_reduce, softmax) {
  mn_gc_leaf a[] = {MN_GC_LEAF("x", -3, 3, 3, 7)};
  mn_gradcheck("softmax [3,7]", a, 1, build_softmax, NULL, &smooth_fd);
  mn_gc_leaf b[] = {MN_GC_LEAF("x", -3, 3, 2, 3, 5)};
  mn_gradcheck("softmax [2,3,5]", b, 1, build_softmax, NULL, &smooth_fd);
  mn_gc_leaf c[] = {MN_GC_LEAF("x", -3, 3, 4, 1)};
  mn_gradcheck("softmax [4,1]", c, 1, build_softmax, NULL, &smooth_fd);
  mn_gc_leaf d[] = {MN_GC_LEAF("x", -3, 3, 2, 33)};
  mn_gradcheck("softmax [2,33]", d, 1, build_softmax, NULL, &smooth_fd);
}

Test(grad_reduce, log_softmax) {
  mn_gc_leaf a[] = {MN_GC_LEAF("x", -3, 3, 3, 7)};
  mn_gradcheck("log_softmax [3,7]", a, 1, build_log_softmax, NULL, &smooth_fd);
  mn_gc_leaf b[] = {MN_GC_LEAF("x", -3, 3, 2, 3, 5)};
  mn_gradcheck("log_softmax [2,3,5]", b, 1, build_log_softmax, NULL, &smooth_fd);
  mn_gc_leaf c[] = {MN_GC_LEAF("x", -3, 3, 4, 1)};
  mn_gradcheck("log_softmax [4,1]", c, 1, build_log_softmax, NULL, &smooth_fd);
  mn_gc_leaf d[] = {MN_GC_LEAF("x", -3, 3, 2, 33)};
  mn_gradcheck("log_softmax [2,33]", d, 1, build_log_softmax, NULL, &smooth_fd);
}

/* softmax followed by log: both rules chained, each receiving a non-trivial dy. */
static mn_node build_softmax_chain(mn_graph *g, const mn_node *x, void *u) {
  (void)u;
  return mn_log_softmax(g, mn_softmax(g, x[0]));
}
Test(grad_reduce, softmax_chain) {
  mn_gc_leaf a[] = {MN_GC_LEAF("x", -2, 2, 3, 6)};
  mn_gradcheck("log_softmax(softmax) [3,6]", a, 1, build_softmax_chain, NULL, &smooth_fd);
}

/* ---- losses ----------------------------------------------------------------------- */

typedef mn_node (*loss_fn)(mn_graph *g, mn_node a, mn_node b);

static mn_node build_loss(mn_graph *g, const mn_node *x, void *u) {
  loss_fn f = *(loss_fn *)u;
  return mn_scale(g, f(g, x[0], x[1]), 0.7f);
}

/* Targets drawn from [0, 1] independently, so rows do not sum to 1: this exercises the
 * general form softmax * sum_c t - t. */
Test(grad_reduce, cross_entropy) {
  loss_fn f = mn_cross_entropy_loss;
  mn_gc_leaf a[] = {MN_GC_LEAF("logits", -3, 3, 4, 37), MN_GC_LEAF("t", 0, 1, 4, 37)};
  mn_gradcheck("cross_entropy [4,37]", a, 2, build_loss, &f, &smooth_fd);
  mn_gc_leaf b[] = {MN_GC_LEAF("logits", -3, 3, 5, 1), MN_GC_LEAF("t", 0, 1, 5, 1)};
  mn_gradcheck("cross_entropy [5,1]", b, 2, build_loss, &f, &smooth_fd);
  mn_gc_leaf c[] = {MN_GC_LEAF("logits", -3, 3, 2, 3, 5), MN_GC_LEAF("t", 0, 1, 2, 3, 5)};
  mn_gradcheck("cross_entropy [2,3,5]", c, 2, build_loss, &f, &smooth_fd);
  mn_gc_leaf d[] = {MN_GC_LEAF("logits", -3, 3, 6), MN_GC_LEAF("t", 0, 1, 6)};
  mn_gradcheck("cross_entropy [6]", d, 2, build_loss, &f, &smooth_fd);
}

/* Logits reach the loss twice (loss + 0.5 * sum of softmax): the gradient through the
 * loss accumulates with another path's. */
static mn_node build_ce_shared(mn_graph *g, const mn_node *x, void *u) {
  (void)u;
  mn_node loss = mn_cross_entropy_loss(g, x[0], mn_softmax(g, x[1]));
  return mn_add(g, loss, mn_scale(g, mn_sum_all(g, mn_softmax(g, x[0])), 0.5f));
}
Test(grad_reduce, cross_entropy_shared_inputs) {
  mn_gc_leaf a[] = {MN_GC_LEAF("logits", -2, 2, 3, 9), MN_GC_LEAF("z", -2, 2, 3, 9)};
  mn_gradcheck("cross_entropy(logits, softmax(z)) + sum(softmax(logits))", a, 2, build_ce_shared,
               NULL, &smooth_fd);
}

static mn_node build_sparse(mn_graph *g, const mn_node *x, void *u) {
  (void)u;
  return mn_scale(g, mn_sparse_cross_entropy_loss(g, x[0], x[1]), 0.7f);
}
Test(grad_reduce, sparse_cross_entropy) {
  mn_gc_leaf a[] = {MN_GC_LEAF("logits", -3, 3, 4, 37), MN_GC_LABELS("labels", 37, 4)};
  mn_gradcheck("sparse_cross_entropy [4,37]", a, 2, build_sparse, NULL, &smooth_fd);
  mn_gc_leaf b[] = {MN_GC_LEAF("logits", -3, 3, 5, 1), MN_GC_LABELS("labels", 1, 5)};
  mn_gradcheck("sparse_cross_entropy [5,1]", b, 2, build_sparse, NULL, &smooth_fd);
  mn_gc_leaf c[] = {MN_GC_LEAF("logits", -3, 3, 2, 3, 5), MN_GC_LABELS("labels", 5, 2, 3)};
  mn_gradcheck("sparse_cross_entropy [2,3,5]", c, 2, build_sparse, NULL, &smooth_fd);
  mn_gc_leaf d[] = {MN_GC_LEAF("logits", -3, 3, 6), MN_GC_LABELS("labels", 6, 1)};
  mn_gradcheck("sparse_cross_entropy [6]", d, 2, build_sparse, NULL, &smooth_fd);
}

/* Probabilities kept in [0.1, 0.9], away from the clamped logs and from 1/(p(1-p))
 * blowing up, where the finite difference would be dominated by truncation error. */
Test(grad_reduce, bce) {
  loss_fn f = mn_bce_loss;
  mn_gc_leaf a[] = {MN_GC_LEAF("p", 0.1f, 0.9f, 3, 7), MN_GC_LEAF("t", 0, 1, 3, 7)};
  mn_gradcheck("bce [3,7]", a, 2, build_loss, &f, NULL);
  mn_gc_leaf b[] = {MN_GC_LEAF("p", 0.1f, 0.9f, 2, 3, 5), MN_GC_LEAF("t", 0, 1, 2, 3, 5)};
  mn_gradcheck("bce [2,3,5]", b, 2, build_loss, &f, NULL);
  /* A single element: p and t from disjoint ranges keep both partial derivatives away
   * from 0, where a relative error is meaningless. */
  mn_gc_leaf c[] = {MN_GC_LEAF("p", 0.6f, 0.9f, 1), MN_GC_LEAF("t", 0, 0.4f, 1)};
  mn_gradcheck("bce [1]", c, 2, build_loss, &f, NULL);
}

/* BCE on a sigmoid, the usual pairing: the chain p(1-p) cancels analytically, but here
 * both rules run separately. */
static mn_node build_bce_sigmoid(mn_graph *g, const mn_node *x, void *u) {
  (void)u;
  return mn_bce_loss(g, mn_sigmoid(g, x[0]), x[1]);
}
Test(grad_reduce, bce_of_sigmoid) {
  mn_gc_leaf a[] = {MN_GC_LEAF("z", -2, 2, 4, 9), MN_GC_LEAF("t", 0, 1, 4, 9)};
  mn_gradcheck("bce(sigmoid) [4,9]", a, 2, build_bce_sigmoid, NULL, &smooth_fd);
}

Test(grad_reduce, mse) {
  loss_fn f = mn_mse_loss;
  mn_gc_leaf a[] = {MN_GC_LEAF("p", -1, 1, 3, 7), MN_GC_LEAF("t", -1, 1, 3, 7)};
  mn_gradcheck("mse [3,7]", a, 2, build_loss, &f, &exact_fd);
  mn_gc_leaf b[] = {MN_GC_LEAF("p", -1, 1, 2, 3, 5), MN_GC_LEAF("t", -1, 1, 2, 3, 5)};
  mn_gradcheck("mse [2,3,5]", b, 2, build_loss, &f, &exact_fd);
  mn_gc_leaf c[] = {MN_GC_LEAF("p", -1, 1, 1), MN_GC_LEAF("t", -1, 1, 1)};
  mn_gradcheck("mse [1]", c, 2, build_loss, &f, &exact_fd);
  mn_gc_leaf d[] = {MN_GC_LEAF("p", -1, 1, 33), MN_GC_LEAF("t", -1, 1, 33)};
  mn_gradcheck("mse [33]", d, 2, build_loss, &f, &exact_fd);
}

/* p and t from disjoint ranges: |p - t| >= 1, far from the kink even after a step. */
Test(grad_reduce, l1) {
  loss_fn f = mn_l1_loss;
  mn_gc_leaf a[] = {MN_GC_LEAF("p", 0.5f, 1, 3, 7), MN_GC_LEAF("t", -1, -0.5f, 3, 7)};
  mn_gradcheck("l1 [3,7]", a, 2, build_loss, &f, &exact_fd);
  mn_gc_leaf b[] = {MN_GC_LEAF("p", -1, -0.5f, 2, 3, 5), MN_GC_LEAF("t", 0.5f, 1, 2, 3, 5)};
  mn_gradcheck("l1 [2,3,5] (p < t)", b, 2, build_loss, &f, &exact_fd);
  mn_gc_leaf c[] = {MN_GC_LEAF("p", 0.5f, 1, 1), MN_GC_LEAF("t", -1, -0.5f, 1)};
  mn_gradcheck("l1 [1]", c, 2, build_loss, &f, &exact_fd);
  mn_gc_leaf d[] = {MN_GC_LEAF("p", 0.5f, 1, 33), MN_GC_LEAF("t", -1, -0.5f, 33)};
  mn_gradcheck("l1 [33]", d, 2, build_loss, &f, &exact_fd);
}

/* ---- structure: which backward nodes the rules build -------------------------------- */

/* Differentiates g (output 0: the loss) and counts the backward nodes of each op,
 * constants (the loss seed) aside. */
typedef struct bwd_counts {
  int n[MN_OP_COUNT];
  int total;
} bwd_counts;

static bwd_counts differentiate(mn_graph *g, mn_node loss, mn_graph **out, int32_t **grads) {
  mn_set_outputs(g, &loss, 1);
  cr_assert_eq(mn_graph_status(g), MN_OK, "%s", mn_graph_error(g));
  *grads = malloc(g->num_nodes * sizeof **grads);
  cr_assert_eq(mn_autodiff("test", g, out, *grads), MN_OK, "%s", mn_last_error());
  bwd_counts c = {0};
  for (size_t i = g->num_nodes; i < (*out)->num_nodes; i++) {
    mn_op op = (*out)->nodes[i].op;
    if (op == MN_OP_CONSTANT) continue;
    c.n[op]++;
    c.total++;
  }
  return c;
}

/* The first backward node of op `op`, for inspecting its inputs and attrs. */
static const mn_node_rec *first_of(const mn_graph *fwd, const mn_graph *full, mn_op op) {
  for (size_t i = fwd->num_nodes; i < full->num_nodes; i++)
    if (full->nodes[i].op == op) return &full->nodes[i];
  cr_assert_fail("no %s node", mn_op_name(op));
  return NULL;
}

Test(grad_reduce, softmax_uses_forward_output) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_parameter(g, "x", MN_SHAPE(2, 5)), in = mn_input(g, "in", MN_SHAPE(2, 5));
  mn_node sx = mn_softmax(g, x), ls = mn_log_softmax(g, x);
  /* softmax of an input: no parameter reaches it, so it gets no backward node. */
  mn_node si = mn_softmax(g, in);
  mn_node loss = mn_sum_all(g, mn_add(g, mn_mul(g, sx, si), ls));
  mn_graph *full;
  int32_t *grads;
  bwd_counts c = differentiate(g, loss, &full, &grads);
  cr_assert_eq(c.n[MN_OP_SOFTMAX_GRAD], 1);
  cr_assert_eq(c.n[MN_OP_LOG_SOFTMAX_GRAD], 1);
  cr_assert_eq(c.n[MN_OP_SOFTMAX], 0, "the softmax is read from y, not recomputed");
  cr_assert_eq(c.n[MN_OP_EXP], 0, "exp(log_softmax) is taken inside the kernel");
  cr_assert_eq(first_of(g, full, MN_OP_SOFTMAX_GRAD)->inputs[0], sx);
  cr_assert_eq(first_of(g, full, MN_OP_LOG_SOFTMAX_GRAD)->inputs[0], ls);
  cr_assert_geq(grads[x], 0);
  free(grads);
  mn_graph_free(full);
  mn_graph_free(g);
}

Test(grad_reduce, cross_entropy_builds_only_wanted_inputs) {
  /* Target an input: only the logits' kernel. */
  mn_graph *g = mn_graph_new();
  mn_node logits = mn_parameter(g, "logits", MN_SHAPE(3, 4));
  mn_node t = mn_input(g, "t", MN_SHAPE(3, 4));
  mn_graph *full;
  int32_t *grads;
  bwd_counts c = differentiate(g, mn_cross_entropy_loss(g, logits, t), &full, &grads);
  cr_assert_eq(c.n[MN_OP_CROSS_ENTROPY_GRAD], 1);
  cr_assert_eq(c.total, 1, "%d backward nodes, expected only cross_entropy_grad", c.total);
  free(grads);
  mn_graph_free(full);
  mn_graph_free(g);

  /* Logits an input, target a parameter: only the target's composed gradient,
   * -log_softmax(logits) * dy / R with R = 3 rows. */
  g = mn_graph_new();
  logits = mn_input(g, "logits", MN_SHAPE(3, 4));
  t = mn_parameter(g, "t", MN_SHAPE(3, 4));
  c = differentiate(g, mn_cross_entropy_loss(g, logits, t), &full, &grads);
  cr_assert_eq(c.n[MN_OP_CROSS_ENTROPY_GRAD], 0);
  cr_assert_eq(c.n[MN_OP_LOG_SOFTMAX], 1);
  cr_assert_eq(c.n[MN_OP_EXPAND_SCALAR], 1);
  cr_assert_eq(c.n[MN_OP_MUL], 1);
  cr_assert_eq(c.total, 3);
  cr_assert_float_eq(first_of(g, full, MN_OP_EXPAND_SCALAR)->attrs.scale, -1.0f / 3.0f, 1e-7f);
  free(grads);
  mn_graph_free(full);
  mn_graph_free(g);
}

Test(grad_reduce, sparse_labels_get_no_gradient) {
  mn_graph *g = mn_graph_new();
  mn_node logits = mn_parameter(g, "logits", MN_SHAPE(2, 3, 5));
  mn_node labels = mn_input_u32(g, "labels", MN_SHAPE(2, 3));
  mn_graph *full;
  int32_t *grads;
  bwd_counts c = differentiate(g, mn_sparse_cross_entropy_loss(g, logits, labels), &full, &grads);
  cr_assert_eq(c.total, 1, "%d backward nodes, expected only the logits' gradient", c.total);
  const mn_node_rec *gr = first_of(g, full, MN_OP_SPARSE_CROSS_ENTROPY_GRAD);
  cr_assert_eq(gr->inputs[0], logits);
  cr_assert_eq(gr->inputs[1], labels);
  cr_assert(mn_type_same_shape(&gr->type, mn_type_of(g, logits)));
  cr_assert_eq(grads[labels], -1);
  cr_assert_geq(grads[logits], 0);
  free(grads);
  mn_graph_free(full);
  mn_graph_free(g);
}

Test(grad_reduce, bce_variants) {
  /* Prediction only. */
  mn_graph *g = mn_graph_new();
  mn_node p = mn_parameter(g, "p", MN_SHAPE(4)), t = mn_input(g, "t", MN_SHAPE(4));
  mn_graph *full;
  int32_t *grads;
  bwd_counts c = differentiate(g, mn_bce_loss(g, p, t), &full, &grads);
  cr_assert_eq(c.total, 1);
  cr_assert_eq(first_of(g, full, MN_OP_BCE_GRAD)->attrs.variant, 0);
  free(grads);
  mn_graph_free(full);
  mn_graph_free(g);

  /* Target only. */
  g = mn_graph_new();
  p = mn_input(g, "p", MN_SHAPE(4));
  t = mn_parameter(g, "t", MN_SHAPE(4));
  c = differentiate(g, mn_bce_loss(g, p, t), &full, &grads);
  cr_assert_eq(c.total, 1);
  cr_assert_eq(first_of(g, full, MN_OP_BCE_GRAD)->attrs.variant, 1);
  free(grads);
  mn_graph_free(full);
  mn_graph_free(g);
}

static void check_difference_loss(loss_fn f, mn_op grad_op) {
  /* Prediction only: no negation. */
  mn_graph *g = mn_graph_new();
  mn_node p = mn_parameter(g, "p", MN_SHAPE(2, 3)), t = mn_input(g, "t", MN_SHAPE(2, 3));
  mn_graph *full;
  int32_t *grads;
  bwd_counts c = differentiate(g, f(g, p, t), &full, &grads);
  cr_assert_eq(c.n[grad_op], 1);
  cr_assert_eq(c.total, 1, "%s: %d backward nodes", mn_op_name(grad_op), c.total);
  free(grads);
  mn_graph_free(full);
  mn_graph_free(g);

  /* Both: one kernel node, its negation for the target. */
  g = mn_graph_new();
  p = mn_parameter(g, "p", MN_SHAPE(2, 3));
  t = mn_parameter(g, "t", MN_SHAPE(2, 3));
  c = differentiate(g, f(g, p, t), &full, &grads);
  cr_assert_eq(c.n[grad_op], 1);
  cr_assert_eq(c.n[MN_OP_NEG], 1);
  cr_assert_geq(grads[p], 0);
  cr_assert_geq(grads[t], 0);
  free(grads);
  mn_graph_free(full);
  mn_graph_free(g);

  /* Neither input reached by a parameter: the loss has no backward node at all. */
  g = mn_graph_new();
  mn_node w = mn_parameter(g, "w", MN_SHAPE(1));
  p = mn_input(g, "p", MN_SHAPE(2, 3));
  t = mn_input(g, "t", MN_SHAPE(2, 3));
  c = differentiate(g, mn_add(g, f(g, p, t), w), &full, &grads);
  cr_assert_eq(c.n[grad_op], 0);
  cr_assert_eq(c.n[MN_OP_NEG], 0);
  free(grads);
  mn_graph_free(full);
  mn_graph_free(g);
}

Test(grad_reduce, mse_and_l1_share_one_kernel) {
  check_difference_loss(mn_mse_loss, MN_OP_MSE_GRAD);
  check_difference_loss(mn_l1_loss, MN_OP_L1_GRAD);
}

/* ---- kernels run directly -------------------------------------------------------- */

/* Runs the reference kernel of a 3-input backward node on host buffers. */
static mn_status run_kernel(mn_graph *g, mn_node id, const void *a, const void *b, const void *dy,
                            float *out, char *err, size_t err_size) {
  mn_ref_ctx ctx = {.g = g,
                    .id = id,
                    .node = &g->nodes[id],
                    .out = out,
                    .in = {a, b, dy},
                    .error = err,
                    .error_size = err_size};
  err[0] = '\0';
  return mn_ref_kernels[g->nodes[id].op](&ctx);
}

/* The backward kernel is safe on its own: a label >= C is reported, never read past
 * its row, and the output holds no uninitialised values. */
Test(grad_reduce, sparse_grad_kernel_rejects_bad_label) {
  mn_graph *g = mn_graph_new();
  mn_node logits = mn_input(g, "logits", MN_SHAPE(2, 3));
  mn_node labels = mn_input_u32(g, "labels", MN_SHAPE(2));
  mn_node dy = mn_input(g, "dy", MN_SHAPE(1));
  mn_node ins[3] = {logits, labels, dy};
  mn_node id = mn_graph_append(g, MN_OP_SPARSE_CROSS_ENTROPY_GRAD, ins, 3, mn_type_of(g, logits),
                               NULL, NULL);
  cr_assert_neq(id, MN_NO_NODE);
  float x[6] = {0, 0, 0, 1, 2, 3}, d = 2.0f, out[6];
  char err[256];
  uint32_t bad[2] = {1, 3};
  mn_status st = run_kernel(g, id, x, bad, &d, out, err, sizeof err);
  cr_assert_eq(st, MN_ERR_INVALID_ARGUMENT);
  cr_assert(strstr(err, "label 3 at position 1") && strstr(err, "C = 3"), "message: %s", err);
  for (int i = 0; i < 6; i++)
    cr_assert(isnan(out[i]));

  /* Valid labels: dy/R * (softmax - onehot), R = 2 rows. */
  uint32_t good[2] = {1, 2};
  cr_assert_eq(run_kernel(g, id, x, good, &d, out, err, sizeof err), MN_OK, "%s", err);
  double s1 = exp(1.0) + exp(2.0) + exp(3.0);
  double want[6] = {1.0 / 3, 1.0 / 3 - 1, 1.0 / 3, exp(1.0) / s1, exp(2.0) / s1, exp(3.0) / s1 - 1};
  for (int i = 0; i < 6; i++)
    cr_assert_float_eq(out[i], (float)want[i], 1e-6f, "[%d]: %g, expected %g", i, (double)out[i],
                       want[i]);
  mn_graph_free(g);
}

/* Targets that are not distributions: d logits = dy/R * (softmax * sum t - t). */
Test(grad_reduce, cross_entropy_grad_kernel_general_targets) {
  mn_graph *g = mn_graph_new();
  mn_node logits = mn_input(g, "logits", MN_SHAPE(1, 2));
  mn_node t = mn_input(g, "t", MN_SHAPE(1, 2));
  mn_node dy = mn_input(g, "dy", MN_SHAPE(1));
  mn_node ins[3] = {logits, t, dy};
  mn_node id =
      mn_graph_append(g, MN_OP_CROSS_ENTROPY_GRAD, ins, 3, mn_type_of(g, logits), NULL, NULL);
  float x[2] = {0, 0}, tv[2] = {1.0f, 0.5f}, d = 2.0f, out[2];
  char err[256];
  cr_assert_eq(run_kernel(g, id, x, tv, &d, out, err, sizeof err), MN_OK, "%s", err);
  cr_assert_float_eq(out[0], -0.5f, 1e-6f);
  cr_assert_float_eq(out[1], 0.5f, 1e-6f);
  mn_graph_free(g);
}

/* p at 0 or 1 gives finite gradients (the denominator is floored, the logs clamped). */
Test(grad_reduce, bce_grad_kernel_is_finite_at_the_edges) {
  mn_graph *g = mn_graph_new();
  mn_node p = mn_input(g, "p", MN_SHAPE(2)), t = mn_input(g, "t", MN_SHAPE(2));
  mn_node dy = mn_input(g, "dy", MN_SHAPE(1));
  mn_node ins[3] = {p, t, dy};
  mn_op_attrs v0 = {.variant = 0}, v1 = {.variant = 1};
  mn_node dp = mn_graph_append(g, MN_OP_BCE_GRAD, ins, 3, mn_type_of(g, p), &v0, NULL);
  mn_node dt = mn_graph_append(g, MN_OP_BCE_GRAD, ins, 3, mn_type_of(g, t), &v1, NULL);
  float pv[2] = {0.0f, 1.0f}, tv[2] = {1.0f, 0.0f}, d = 1.0f, out[2];
  char err[256];
  cr_assert_eq(run_kernel(g, dp, pv, tv, &d, out, err, sizeof err), MN_OK, "%s", err);
  cr_assert(isfinite(out[0]) && out[0] < 0 && isfinite(out[1]) && out[1] > 0);
  cr_assert_eq(run_kernel(g, dt, pv, tv, &d, out, err, sizeof err), MN_OK, "%s", err);
  cr_assert_float_eq(out[0], 50.0f, 1e-4f); /* (0 - (-100)) / 2 */
  cr_assert_float_eq(out[1], -50.0f, 1e-4f);
  mn_graph_free(g);
}
