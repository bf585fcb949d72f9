/* The sparse cross-entropy's ignore label (MN_IGNORE_LABEL, PyTorch's ignore_index = -100) on
 * the reference backend: the loss is the mean over the counted rows, the logits' gradient is
 * zero on the ignored rows and (softmax - onehot) / count on the others, the one-pass loss
 * gradient of a low-precision plan agrees, and a batch with no counted row fails clearly. The
 * CUDA kernels are checked against this backend by test_cuda_reduce and test_cuda_models. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "host/build_util.h"
#include "host/plan.h"
#include "host/reference/ref_kernels.h"
#include "session/session.h"
#include "tests/support/gradcheck.h"
#include "tests/support/mn_test.h"
#include "tests/support/models.h"
#include "tests/support/session_util.h"

#define IGN MN_IGNORE_LABEL

/* Six rows of 37 classes as [2, 3, 37]; rows 1 and 4 are ignored. */
enum { ROWS = 6, C = 37 };
static const uint32_t labels_some_ignored[ROWS] = {3, IGN, 36, 0, IGN, 17};

Test(ignore_label, is_minus_100_as_a_uint32) {
  cr_assert_eq(MN_IGNORE_LABEL, (uint32_t)-100);
  cr_assert_eq(MN_IGNORE_LABEL, 0xFFFFFF9Cu);
}

/* loss = scale * sparse_cross_entropy(logits, labels), logits a parameter [2, 3, C]: the scale
 * makes the loss gradient's dy differ from 1 (1 keeps the loss as the reference computes it). */
static mn_graph *sce_graph(float scale) {
  mn_graph *g = mn_graph_new();
  mn_node logits = mn_parameter(g, "logits", MN_SHAPE(2, 3, C));
  mn_node labels = mn_input_u32(g, "labels", MN_SHAPE(2, 3));
  mn_node loss = mn_sparse_cross_entropy_loss(g, logits, labels);
  if (scale != 1.0f) loss = mn_scale(g, loss, scale);
  mn_set_outputs(g, &loss, 1);
  cr_assert_eq(mn_graph_status(g), MN_OK, "%s", mn_graph_error(g));
  return g;
}

static void random_logits(float *x, uint64_t seed) {
  mn_rng r = mn_rng_new(seed);
  mn_rng_fill(&r, x, ROWS * C, -4.0f, 4.0f);
}

/* One step of s (the graph of sce_graph) on logits x and the given labels; returns the loss
 * and, when grad is not NULL, reads the logits' gradient into it. */
static float step(mn_session *s, const float *x, const uint32_t *labels, float *grad) {
  cr_assert_eq(mn_session_set_parameter(s, "logits", x, ROWS * C), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_set_input_u32(s, "labels", labels, ROWS), MN_OK, "%s", mn_last_error());
  float loss = mn_test_step_loss(s);
  if (grad)
    cr_assert_eq(mn_session_read_grad(s, "logits", grad, ROWS * C), MN_OK, "%s", mn_last_error());
  return loss;
}

/* log_softmax(x)[i] of one row, in double, through its own log-sum-exp. */
static double log_softmax(const float *x, size_t i) {
  double m = x[0], s = 0;
  for (size_t j = 1; j < C; j++)
    m = fmax(m, x[j]);
  for (size_t j = 0; j < C; j++)
    s += exp((double)x[j] - m);
  return (double)x[i] - m - log(s);
}

static size_t counted(const uint32_t *labels) {
  size_t n = 0;
  for (size_t r = 0; r < ROWS; r++)
    n += labels[r] != IGN;
  return n;
}

Test(ignore_label, the_loss_is_the_mean_over_the_counted_rows) {
  mn_graph *g = sce_graph(0.7f);
  mn_session *s = mn_test_session(g, MN_BACKEND_CPU, false);
  float x[ROWS * C];
  random_logits(x, 1);
  double want = 0;
  for (size_t r = 0; r < ROWS; r++)
    if (labels_some_ignored[r] != IGN) want -= log_softmax(x + r * C, labels_some_ignored[r]);
  want *= 0.7 / (double)counted(labels_some_ignored);
  float loss = step(s, x, labels_some_ignored, NULL);
  cr_assert_leq(fabs(loss - want), 1e-6 * fabs(want), "loss %.9g, expected %.9g", (double)loss,
                want);
  mn_session_free(s);
  mn_graph_free(g);
}

/* The logits' gradient against 0.7 / count * (softmax - onehot) in double; the ignored rows
 * exactly zero. */
Test(ignore_label, the_gradient_is_zero_on_ignored_rows) {
  mn_graph *g = sce_graph(0.7f);
  mn_session *s = mn_test_session(g, MN_BACKEND_CPU, true);
  float x[ROWS * C], grad[ROWS * C], want[ROWS * C];
  random_logits(x, 2);
  step(s, x, labels_some_ignored, grad);
  double k = 0.7 / (double)counted(labels_some_ignored);
  for (size_t r = 0; r < ROWS; r++)
    for (size_t i = 0; i < C; i++) {
      uint32_t l = labels_some_ignored[r];
      want[r * C + i] =
          l == IGN ? 0.0f : (float)(k * (exp(log_softmax(x + r * C, i)) - (i == l ? 1.0 : 0.0)));
      if (l == IGN)
        cr_assert(grad[r * C + i] == 0.0f && !signbit(grad[r * C + i]),
                  "ignored row %zu, class %zu: %g", r, i, (double)grad[r * C + i]);
    }
  double e = mn_test_rel_err(grad, want, ROWS * C);
  cr_assert_leq(e, 1e-6, "gradient: relative error %.3g", e);
  mn_session_free(s);
  mn_graph_free(g);
}

static mn_node build_sparse(mn_graph *g, const mn_node *x, void *u) {
  (void)u;
  return mn_sparse_cross_entropy_loss(g, x[0], x[1]);
}

/* Central differences: the ignored rows' logits move the loss by nothing. */
Test(ignore_label, gradient_check_with_ignored_rows) {
  static const uint32_t lab[8] = {IGN, 4, 0, IGN, IGN, 2, 5, IGN};
  mn_gc_leaf a[] = {MN_GC_LEAF("logits", -3, 3, 2, 4, 6), MN_GC_U32_LEAF("labels", lab, 2, 4)};
  const mn_gc_options o = {.h = 1e-2, .tol = 2e-3, .seed = 3};
  mn_gradcheck("sparse_cross_entropy [2,4,6], 4 of 8 ignored", a, 2, build_sparse, NULL, &o);
}

/* Ignoring rows is removing them: the loss and the counted rows' gradient are bit for bit those
 * of a batch of only the counted rows. */
Test(ignore_label, ignored_rows_count_as_if_removed) {
  mn_graph *g = sce_graph(0.7f);
  mn_graph *h = mn_graph_new();
  mn_node hl = mn_parameter(h, "logits", MN_SHAPE(4, C));
  mn_node hy = mn_input_u32(h, "labels", MN_SHAPE(4));
  mn_set_outputs(h, (mn_node[]){mn_scale(h, mn_sparse_cross_entropy_loss(h, hl, hy), 0.7f)}, 1);
  mn_session *s = mn_test_session(g, MN_BACKEND_CPU, true);
  mn_session *t = mn_test_session(h, MN_BACKEND_CPU, true);
  float x[ROWS * C], grad[ROWS * C], xs[4 * C], gs[4 * C];
  uint32_t ls[4];
  random_logits(x, 4);
  size_t k = 0;
  for (size_t r = 0; r < ROWS; r++)
    if (labels_some_ignored[r] != IGN) {
      memcpy(xs + k * C, x + r * C, sizeof(float) * C);
      ls[k++] = labels_some_ignored[r];
    }
  float loss = step(s, x, labels_some_ignored, grad);
  cr_assert_eq(mn_session_set_parameter(t, "logits", xs, 4 * C), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_set_input_u32(t, "labels", ls, 4), MN_OK, "%s", mn_last_error());
  float want = mn_test_step_loss(t);
  cr_assert_eq(mn_session_read_grad(t, "logits", gs, 4 * C), MN_OK, "%s", mn_last_error());
  cr_assert_eq(loss, want, "loss %.9g, without the ignored rows %.9g", (double)loss, (double)want);
  k = 0;
  for (size_t r = 0; r < ROWS; r++)
    if (labels_some_ignored[r] != IGN) {
      cr_assert_arr_eq(grad + r * C, gs + k * C, sizeof(float) * C, "gradient row %zu", r);
      k++;
    }
  mn_session_free(s);
  mn_session_free(t);
  mn_graph_free(g);
  mn_graph_free(h);
}

/* Without an ignored label the results are bit for bit those of the mean over every row as the
 * reference computed it before the ignore label: the row statistics in double, the loss rounded
 * once from sum / rows, each gradient element from (1 / rows) * (softmax - onehot). */
Test(ignore_label, batches_without_ignored_labels_are_unchanged) {
  static const uint32_t lab[ROWS] = {3, 11, 36, 0, 25, 17};
  mn_graph *g = sce_graph(1.0f);
  mn_session *s = mn_test_session(g, MN_BACKEND_CPU, true);
  float x[ROWS * C], grad[ROWS * C];
  random_logits(x, 5);
  float loss = step(s, x, lab, grad);
  double acc = 0, k = 1.0 / (double)ROWS;
  for (size_t r = 0; r < ROWS; r++) {
    const float *row = x + r * C;
    double m = row[0], sum = 0;
    for (size_t i = 1; i < C; i++)
      if (row[i] > m) m = row[i];
    for (size_t i = 0; i < C; i++)
      sum += exp((double)row[i] - m);
    double ls = log(sum);
    acc -= ((double)row[lab[r]] - m) - ls;
    for (size_t i = 0; i < C; i++) {
      float want = (float)(k * (exp(((double)row[i] - m) - ls) - (i == lab[r] ? 1.0 : 0.0)));
      cr_assert_eq(grad[r * C + i], want, "gradient [%zu, %zu]: %.9g, expected %.9g", r, i,
                   (double)grad[r * C + i], (double)want);
    }
  }
  cr_assert_eq(loss, (float)(acc / (double)ROWS), "loss %.9g", (double)loss);
  mn_session_free(s);
  mn_graph_free(g);
}

/* ---- the one-pass loss gradient (optimizer/loss_grad.h) of low-precision training plans */

static size_t count_op(const mn_plan *p, mn_op op) {
  size_t n = 0;
  for (size_t i = 0; i < p->graph->num_nodes; i++)
    n += p->graph->nodes[i].op == op;
  return n;
}

/* A session of the plan the full optimizer makes for bf16 (which holds the one-pass loss
 * gradient, its gradient written over the logits) computing in fp32: the ops without roundings. */
static mn_session *bf16_plan_in_fp32(const mn_graph *g) {
  mn_session_options o = mn_session_options_default();
  o.backend = MN_BACKEND_CPU;
  o.precision = MN_PRECISION_BF16;
  mn_plan *plan = NULL;
  cr_assert_eq(mn_lower_training("test", g, &o, &plan), MN_OK, "%s", mn_last_error());
  o.precision = MN_PRECISION_F32;
  mn_session *s = NULL;
  cr_assert_eq(mn_session_create("test", plan, &o, true, &s), MN_OK, "%s", mn_last_error());
  cr_assert_eq(count_op(s->plan, MN_OP_SPARSE_CROSS_ENTROPY_LOSS_GRAD), 1);
  return s;
}

static mn_session *unoptimized_fp32(const mn_graph *g) {
  mn_session_options o = mn_session_options_default();
  o.backend = MN_BACKEND_CPU;
  o.optimize = false;
  mn_session *s = NULL;
  cr_assert_eq(mn_build_session(g, &o, &s), MN_OK, "%s", mn_last_error());
  cr_assert_eq(count_op(s->plan, MN_OP_SPARSE_CROSS_ENTROPY_LOSS_GRAD), 0);
  return s;
}

/* A two-block language model whose labels ignore each sequence's first three positions (a
 * prompt) and one more: the loss and every parameter's gradient of the bf16 plan against the
 * unoptimized fp32 session at 1e-6 (the sums only run in another order). */
Test(ignore_label, a_language_model_through_the_one_pass_loss_gradient_matches_fp32) {
  enum { B = 2, T = 8, V = 11 };
  mn_graph *g = mn_test_lm(&mn_test_tiny_block, B, T, V, 2);
  cr_assert_eq(mn_graph_status(g), MN_OK, "%s", mn_graph_error(g));
  mn_session *s[2] = {bf16_plan_in_fp32(g), unoptimized_fp32(g)};
  mn_rng r = mn_rng_new(6);
  mn_test_init_normal(g, s, 2, &r, 0.3f, false);
  uint32_t tok[B * T], lab[B * T];
  mn_rng_fill_u32(&r, tok, B * T, V);
  mn_rng_fill_u32(&r, lab, B * T, V);
  for (int b = 0; b < B; b++)
    for (int t = 0; t < 3; t++)
      lab[b * T + t] = IGN;
  lab[T + 6] = IGN;
  for (int i = 0; i < 2; i++) {
    cr_assert_eq(mn_session_set_input_u32(s[i], "tokens", tok, B * T), MN_OK);
    cr_assert_eq(mn_session_set_input_u32(s[i], "labels", lab, B * T), MN_OK);
  }
  float l0 = mn_test_step_loss(s[0]), l1 = mn_test_step_loss(s[1]);
  cr_assert_leq(fabs((double)l0 - l1), 1e-6 * fabs((double)l1), "loss %.9g vs %.9g", (double)l0,
                (double)l1);
  size_t checked = 0;
  for (size_t i = 0; i < g->num_nodes; i++) {
    const mn_node_rec *n = &g->nodes[i];
    if (n->op != MN_OP_PARAMETER) continue;
    size_t count = (size_t)mn_tensor_type_numel(&n->type);
    float *a = malloc(count * sizeof *a), *b = malloc(count * sizeof *b);
    cr_assert_eq(mn_session_read_grad(s[0], n->name, a, count), MN_OK, "%s", mn_last_error());
    cr_assert_eq(mn_session_read_grad(s[1], n->name, b, count), MN_OK, "%s", mn_last_error());
    double e = mn_test_rel_err(a, b, count);
    cr_assert_leq(e, 1e-6, "gradient of %s: relative error %.3g", n->name, e);
    free(a);
    free(b);
    checked++;
  }
  cr_assert_gt(checked, 10);
  mn_session_free(s[0]);
  mn_session_free(s[1]);
  mn_graph_free(g);
}

/* x [ROWS, 16] @ w [16, C] -> the sparse loss, trained in bf16 (the CPU emulating the storage
 * table) with the full optimizer, so through the one-pass loss gradient: the rows of x whose
 * label is ignored change neither the loss nor w's gradient by a bit. */
Test(ignore_label, a_bf16_session_reads_nothing_of_ignored_rows) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(ROWS, 16));
  mn_node w = mn_parameter(g, "w", MN_SHAPE(16, C));
  mn_node labels = mn_input_u32(g, "labels", MN_SHAPE(ROWS));
  mn_set_outputs(g, (mn_node[]){mn_sparse_cross_entropy_loss(g, mn_matmul(g, x, w), labels)}, 1);
  cr_assert_eq(mn_graph_status(g), MN_OK, "%s", mn_graph_error(g));
  mn_session *s = mn_test_session_precision(g, MN_BACKEND_CPU, MN_PRECISION_BF16, true);
  cr_assert_eq(count_op(s->plan, MN_OP_SPARSE_CROSS_ENTROPY_LOSS_GRAD), 1);
  mn_rng r = mn_rng_new(7);
  float wv[16 * C], xv[ROWS * 16], ga[16 * C], gb[16 * C];
  mn_rng_fill(&r, wv, 16 * C, -0.5f, 0.5f);
  mn_rng_fill(&r, xv, ROWS * 16, -1.0f, 1.0f);
  cr_assert_eq(mn_session_set_parameter(s, "w", wv, 16 * C), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_set_input_u32(s, "labels", labels_some_ignored, ROWS), MN_OK);
  float loss[2];
  for (int pass = 0; pass < 2; pass++) {
    if (pass == 1)
      for (size_t rr = 0; rr < ROWS; rr++)
        if (labels_some_ignored[rr] == IGN)
          for (size_t j = 0; j < 16; j++)
            xv[rr * 16 + j] = 5.0f * (float)mn_rng_uniform(&r);
    cr_assert_eq(mn_session_set_input(s, "x", xv, ROWS * 16), MN_OK, "%s", mn_last_error());
    loss[pass] = mn_test_step_loss(s);
    cr_assert_eq(mn_session_read_grad(s, "w", pass ? gb : ga, 16 * C), MN_OK, "%s",
                 mn_last_error());
  }
  cr_assert(isfinite(loss[0]) && loss[0] > 0, "loss %g", (double)loss[0]);
  cr_assert_eq(loss[1], loss[0], "loss %.9g, then %.9g", (double)loss[0], (double)loss[1]);
  cr_assert_arr_eq(ga, gb, sizeof ga, "w's gradient moved with an ignored row");
  mn_session_free(s);
  mn_graph_free(g);
}

/* ---- a batch with no counted row */

/* Steps s with every label ignored and expects the clear error, then valid labels again. */
static void expect_all_ignored_error(mn_session *s, bool training) {
  float x[ROWS * C];
  random_logits(x, 8);
  const uint32_t all[ROWS] = {IGN, IGN, IGN, IGN, IGN, IGN};
  cr_assert_eq(mn_session_set_parameter(s, "logits", x, ROWS * C), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_set_input_u32(s, "labels", all, ROWS), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_step(s), MN_OK, "%s", mn_last_error());
  mn_assert_error(mn_session_wait(s), MN_ERR_INVALID_ARGUMENT,
                  "every label of labels node 1 [2,3] u32 is the ignore label");
  cr_assert(strstr(mn_last_error(), "sparse_cross_entropy"), "%s", mn_last_error());
  cr_assert(!strstr(mn_last_error(), "nan"), "%s", mn_last_error());
  if (training) {
    float after[ROWS * C];
    cr_assert_eq(mn_session_read_param(s, "logits", after, ROWS * C), MN_OK, "%s", mn_last_error());
    cr_assert_arr_eq(after, x, sizeof x, "the failed step updated the logits");
  }
  float loss = step(s, x, labels_some_ignored, NULL);
  cr_assert(isfinite(loss) && loss > 0, "loss %g after the failed step", (double)loss);
  if (training) {
    float grad[ROWS * C];
    cr_assert_eq(mn_session_read_grad(s, "logits", grad, ROWS * C), MN_OK, "%s", mn_last_error());
    cr_assert_eq(grad[C], 0.0f, "row 1 is ignored");
  }
}

Test(ignore_label, every_label_ignored_fails_the_forward) {
  mn_graph *g = sce_graph(1.0f);
  mn_session *s = mn_test_session(g, MN_BACKEND_CPU, false);
  expect_all_ignored_error(s, false);
  mn_session_free(s);
  mn_graph_free(g);
}

Test(ignore_label, every_label_ignored_fails_the_training_step) {
  mn_graph *g = sce_graph(0.7f);
  mn_session *s = mn_test_session(g, MN_BACKEND_CPU, true);
  cr_assert_eq(mn_session_set_learning_rate(s, 0.1f), MN_OK);
  expect_all_ignored_error(s, true);
  mn_session_free(s);
  mn_graph_free(g);
}

/* The one-pass loss gradient of a bf16 plan. */
Test(ignore_label, every_label_ignored_fails_the_bf16_step) {
  mn_graph *g = sce_graph(1.0f);
  mn_session *s = mn_test_session_precision(g, MN_BACKEND_CPU, MN_PRECISION_BF16, true);
  cr_assert_eq(count_op(s->plan, MN_OP_SPARSE_CROSS_ENTROPY_LOSS_GRAD), 1);
  expect_all_ignored_error(s, true);
  mn_session_free(s);
  mn_graph_free(g);
}

/* The gradient kernel is safe on its own (run without its forward): every label ignored is
 * reported, and an ignored row among counted ones is zero. */
Test(ignore_label, the_gradient_kernel_alone) {
  mn_graph *g = mn_graph_new();
  mn_node logits = mn_input(g, "logits", MN_SHAPE(2, 3));
  mn_node labels = mn_input_u32(g, "labels", MN_SHAPE(2));
  mn_node dy = mn_input(g, "dy", MN_SHAPE(1));
  mn_node id = mn_graph_append(g, MN_OP_SPARSE_CROSS_ENTROPY_GRAD, (mn_node[]){logits, labels, dy},
                               3, mn_type_of(g, logits), NULL, NULL);
  cr_assert_neq(id, MN_NO_NODE);
  float x[6] = {0, 0, 0, 1, 2, 3}, d = 2.0f, out[6];
  char err[256] = "";
  const uint32_t none[2] = {IGN, IGN}, one[2] = {IGN, 2};
  mn_ref_ctx ctx = {.g = g,
                    .id = id,
                    .node = &g->nodes[id],
                    .out = out,
                    .in = {x, none, &d},
                    .error = err,
                    .error_size = sizeof err};
  cr_assert_eq(mn_ref_kernels[MN_OP_SPARSE_CROSS_ENTROPY_GRAD](&ctx), MN_ERR_INVALID_ARGUMENT);
  cr_assert(strstr(err, "every label of labels node 1 [2] u32 is the ignore label"), "%s", err);

  /* dy / 1 counted row * (softmax - onehot) on row 1, zero on row 0. */
  ctx.in[1] = one;
  cr_assert_eq(mn_ref_kernels[MN_OP_SPARSE_CROSS_ENTROPY_GRAD](&ctx), MN_OK, "%s", err);
  double s1 = exp(1.0) + exp(2.0) + exp(3.0);
  double want[6] = {0, 0, 0, 2 * exp(1.0) / s1, 2 * exp(2.0) / s1, 2 * (exp(3.0) / s1 - 1)};
  for (int i = 0; i < 6; i++)
    cr_assert_float_eq(out[i], (float)want[i], 1e-6f, "[%d]: %g, expected %g", i, (double)out[i],
                       want[i]);
  mn_graph_free(g);
}
