/* mn_dropout on the reference backend: the kept fraction and the kept values, one mask per
 * micro-step drawn again for the same step, the gradient against finite differences with the
 * mask fixed, the identity in inference sessions, a checkpointed run that resumes with the
 * masks of the uninterrupted one, a fresh mask per accumulation step, and the builder's
 * errors. The micro-step counter is set by hand (s->micro_steps) to replay a step. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "session/session.h"
#include "tests/support/mn_test.h"
#include "tests/support/session_util.h"
#include "tests/support/tmp_dir.h"

/* loss = sum(dropout(x, p) * r), outputs loss then the dropout's value: x is a parameter so
 * that its gradient, the mask applied to r, can be read. */
static mn_graph *masked_sum(int64_t n, float p) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_parameter(g, "x", MN_SHAPE(n)), r = mn_input(g, "r", MN_SHAPE(n));
  mn_node y = mn_dropout(g, x, p);
  mn_set_outputs(g, (mn_node[]){mn_sum_all(g, mn_mul(g, y, r)), y}, 2);
  cr_assert_eq(mn_graph_status(g), MN_OK, "%s", mn_graph_error(g));
  return g;
}

/* A training session of masked_sum with x uniform in [0.5, 1.5) (no zeros, so a zero is a
 * dropped element) and r uniform in [-1, 1). */
static mn_session *masked_session(const mn_graph *g, size_t n, float **x) {
  mn_session *s = mn_test_session(g, MN_BACKEND_CPU, true);
  float *r = malloc(n * sizeof *r);
  *x = malloc(n * sizeof **x);
  cr_assert(r && *x);
  mn_rng rng = mn_rng_new(11);
  mn_rng_fill(&rng, *x, n, 0.5f, 1.5f);
  mn_rng_fill(&rng, r, n, -1, 1);
  cr_assert_eq(mn_session_set_parameter(s, "x", *x, n), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_set_input(s, "r", r, n), MN_OK, "%s", mn_last_error());
  free(r);
  return s;
}

/* One step at micro-step `step`; the dropout's output, malloc'd. */
static float *output_at(mn_session *s, uint64_t step, size_t n) {
  s->micro_steps = step;
  mn_test_step_loss(s);
  return mn_test_read_output(s, 1, n);
}

static void check_fraction_and_values(float p) {
  enum { N = 1 << 20 };
  mn_graph *g = masked_sum(N, p);
  float *x = NULL;
  mn_session *s = masked_session(g, N, &x);
  float *y = output_at(s, 3, N);
  size_t kept = 0, wrong = 0;
  for (size_t i = 0; i < N; i++) {
    if (y[i] == 0.0f) continue;
    kept++;
    wrong += y[i] != (float)((double)x[i] / (1.0 - (double)p));
  }
  cr_expect_eq(wrong, 0, "p %g: %zu kept values are not x / (1 - p)", (double)p, wrong);
  double frac = (double)kept / N, sigma = sqrt((double)p * (1 - p) / N);
  cr_expect(fabs(frac - (1 - p)) <= 5 * sigma, "p %g: kept %.6f, expected %.6f +- %.6f (5 sigma)",
            (double)p, frac, 1.0 - p, 5 * sigma);
  free(x);
  free(y);
  mn_session_free(s);
  mn_graph_free(g);
}

Test(dropout, keeps_one_minus_p_scaled_by_its_inverse) {
  check_fraction_and_values(0.5f);
  check_fraction_and_values(0.1f);
  check_fraction_and_values(0.75f);
}

Test(dropout, a_fresh_mask_each_step_and_the_same_for_the_same_step) {
  enum { N = 4096 };
  mn_graph *g = masked_sum(N, 0.5f);
  float *x = NULL;
  mn_session *s = masked_session(g, N, &x);
  float *a = output_at(s, 0, N), *b = output_at(s, 1, N), *again = output_at(s, 0, N);
  size_t differ = 0;
  for (size_t i = 0; i < N; i++)
    differ += (a[i] == 0.0f) != (b[i] == 0.0f);
  /* Independent masks at p = 0.5 disagree on half of the elements. */
  cr_expect_gt(differ, N / 4, "steps 0 and 1 drew nearly the same mask (%zu of %d differ)", differ,
               N);
  cr_expect_arr_eq(a, again, N * sizeof *a, "step 0 drawn twice gave two masks");
  /* Another session of the same graph draws the same mask for the same step. */
  float *x2 = NULL;
  mn_session *s2 = masked_session(g, N, &x2);
  float *other = output_at(s2, 0, N);
  cr_expect_arr_eq(a, other, N * sizeof *a, "two sessions of one graph drew different masks");
  /* mn_session_step moves the counter on by itself. */
  s->micro_steps = 0;
  mn_test_step_loss(s);
  cr_expect_eq(s->micro_steps, 1);
  free(x), free(x2), free(a), free(b), free(again), free(other);
  mn_session_free(s);
  mn_session_free(s2);
  mn_graph_free(g);
}

Test(dropout, two_dropouts_of_one_graph_draw_different_masks) {
  enum { N = 4096 };
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(N));
  mn_node a = mn_dropout(g, x, 0.5f), b = mn_dropout(g, x, 0.5f);
  mn_node w = mn_parameter(g, "w", MN_SHAPE(N));
  mn_node loss = mn_sum_all(g, mn_mul(g, mn_add(g, a, b), w));
  mn_set_outputs(g, (mn_node[]){loss, a, b}, 3);
  mn_session *s = mn_test_session(g, MN_BACKEND_CPU, true);
  float *ones = malloc(N * sizeof *ones);
  for (size_t i = 0; i < N; i++)
    ones[i] = 1.0f;
  cr_assert_eq(mn_session_set_input(s, "x", ones, N), MN_OK, "%s", mn_last_error());
  mn_test_step_loss(s);
  float *ya = mn_test_read_output(s, 1, N), *yb = mn_test_read_output(s, 2, N);
  size_t differ = 0;
  for (size_t i = 0; i < N; i++)
    differ += ya[i] != yb[i];
  cr_expect_gt(differ, N / 4, "the optimizer merged two dropouts or they share a seed");
  free(ones), free(ya), free(yb);
  mn_session_free(s);
  mn_graph_free(g);
}

/* loss = sum(dropout(tanh(x), p) * r) at a fixed micro-step. */
static double loss_at(mn_session *s, uint64_t step) {
  s->micro_steps = step;
  return (double)mn_test_step_loss(s);
}

Test(dropout, gradient_matches_finite_differences_with_the_mask_fixed) {
  enum { N = 96 };
  const uint64_t step = 5;
  const double h = 1e-2;
  mn_graph *g = mn_graph_new();
  mn_node x = mn_parameter(g, "x", MN_SHAPE(N)), r = mn_input(g, "r", MN_SHAPE(N));
  mn_set_outputs(g, (mn_node[]){mn_sum_all(g, mn_mul(g, mn_dropout(g, mn_tanh(g, x), 0.3f), r))},
                 1);
  mn_session *s = mn_test_session(g, MN_BACKEND_CPU, true);
  float xv[N], rv[N], grad[N];
  mn_rng rng = mn_rng_new(5);
  mn_rng_fill(&rng, xv, N, -1.5f, 1.5f);
  mn_rng_fill(&rng, rv, N, 0.5f, 1.5f);
  cr_assert_eq(mn_session_set_input(s, "r", rv, N), MN_OK);
  cr_assert_eq(mn_session_set_parameter(s, "x", xv, N), MN_OK);
  loss_at(s, step);
  cr_assert_eq(mn_session_read_grad(s, "x", grad, N), MN_OK, "%s", mn_last_error());
  double num = 0, den = 0;
  size_t zeros = 0;
  for (size_t i = 0; i < N; i++) {
    float saved = xv[i];
    xv[i] = (float)(saved + h);
    cr_assert_eq(mn_session_set_parameter(s, "x", xv, N), MN_OK);
    double up = loss_at(s, step);
    xv[i] = (float)(saved - h);
    cr_assert_eq(mn_session_set_parameter(s, "x", xv, N), MN_OK);
    double down = loss_at(s, step);
    xv[i] = saved;
    double fd = (up - down) / (2 * h);
    num += (grad[i] - fd) * (grad[i] - fd);
    den += fd * fd;
    zeros += grad[i] == 0.0f;
  }
  double rel = sqrt(num / den);
  cr_expect_leq(rel, 2e-3, "||ad - fd|| / ||fd|| = %g", rel);
  /* Dropped elements have no gradient, and the rest do: the backward used a mask. */
  cr_expect(zeros > N / 8 && zeros < N / 2, "%zu of %d gradients are zero at p = 0.3", zeros, N);
  mn_session_free(s);
  mn_graph_free(g);
}

/* y = dropout(x) as an inference session's output, x a parameter read back as the expected. */
static void check_identity(mn_session *s, const float *x, size_t n) {
  for (int step = 0; step < 3; step++) {
    cr_assert_eq(mn_session_step(s), MN_OK, "%s", mn_last_error());
    cr_assert_eq(mn_session_wait(s), MN_OK, "%s", mn_last_error());
    float *y = mn_test_read_output(s, 0, n);
    cr_expect_arr_eq(y, x, n * sizeof *y, "step %d of an inference session dropped values", step);
    free(y);
  }
}

Test(dropout, is_the_identity_in_inference_sessions) {
  enum { N = 1000 };
  mn_graph *g = mn_graph_new();
  mn_node x = mn_parameter(g, "x", MN_SHAPE(N));
  mn_set_outputs(g, (mn_node[]){mn_dropout(g, mn_dropout(g, x, 0.5f), 0.9f)}, 1);
  float xv[N];
  mn_rng rng = mn_rng_new(3);
  mn_rng_fill(&rng, xv, N, -2, 2);
  for (int optimize = 0; optimize < 2; optimize++) {
    mn_session_options o = mn_session_options_default();
    o.backend = MN_BACKEND_CPU;
    o.optimize = optimize;
    mn_session *s = NULL;
    cr_assert_eq(mn_build_inference_session(g, &o, &s), MN_OK, "%s", mn_last_error());
    cr_assert_eq(mn_session_set_parameter(s, "x", xv, N), MN_OK);
    check_identity(s, xv, N);
    mn_session_free(s);
  }
  /* An evaluation session reading a training session's parameters. */
  mn_graph *train = masked_sum(N, 0.5f);
  mn_session *owner = mn_test_session(train, MN_BACKEND_CPU, true);
  cr_assert_eq(mn_session_set_parameter(owner, "x", xv, N), MN_OK);
  mn_session *shared = NULL;
  cr_assert_eq(mn_build_inference_session_shared(g, NULL, owner, &shared), MN_OK, "%s",
               mn_last_error());
  check_identity(shared, xv, N);
  mn_session_free(shared);
  mn_session_free(owner);
  mn_graph_free(train);
  mn_graph_free(g);
}

enum { B = 8, IN = 6, HID = 32, OUT = 3 };

/* tanh(x w1 + b1) through dropout, then w2 + b2, against t (mean squared error). */
static mn_graph *dropout_mlp(void) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(B, IN)), t = mn_input(g, "t", MN_SHAPE(B, OUT));
  mn_node w1 = mn_parameter(g, "w1", MN_SHAPE(IN, HID)), b1 = mn_parameter(g, "b1", MN_SHAPE(HID));
  mn_node w2 = mn_parameter(g, "w2", MN_SHAPE(HID, OUT)), b2 = mn_parameter(g, "b2", MN_SHAPE(OUT));
  mn_node h = mn_dropout(g, mn_tanh(g, mn_bias_add(g, mn_matmul(g, x, w1), b1)), 0.4f);
  mn_node y = mn_bias_add(g, mn_matmul(g, h, w2), b2);
  mn_set_outputs(g, (mn_node[]){mn_mse_loss(g, y, t)}, 1);
  cr_assert_eq(mn_graph_status(g), MN_OK, "%s", mn_graph_error(g));
  return g;
}

static mn_session *mlp_session(const mn_graph *g, int accum) {
  mn_session *s = mn_test_session(g, MN_BACKEND_CPU, true);
  mn_rng w = mn_rng_new(9);
  mn_test_init_normal(g, &s, 1, &w, 0.5f, false);
  cr_assert_eq(mn_session_set_adamw(s, 1e-2f, 0.9f, 0.999f, 1e-8f, 0.01f), MN_OK);
  cr_assert_eq(mn_session_set_grad_accumulation(s, accum), MN_OK, "%s", mn_last_error());
  return s;
}

/* The same batch every step, so that only the masks (and the weights) change the loss. */
static float step_on_batch(mn_session *s) {
  float x[B * IN], t[B * OUT];
  mn_rng r = mn_rng_new(21);
  mn_rng_fill(&r, x, B * IN, -1, 1);
  mn_rng_fill(&r, t, B * OUT, -1, 1);
  cr_assert_eq(mn_session_set_input(s, "x", x, B * IN), MN_OK);
  cr_assert_eq(mn_session_set_input(s, "t", t, B * OUT), MN_OK);
  return mn_test_step_loss(s);
}

static void check_resume(int accum) {
  enum { STEPS = 12, SAVE_AT = 6 };
  mn_tmp_dir dir = mn_tmp_dir_make("mn_dropout");
  const char *path = mn_tmp_path(&dir, "ck.safetensors");
  mn_graph *g = dropout_mlp();
  mn_session *whole = mlp_session(g, accum), *first = mlp_session(g, accum);
  float want[STEPS], got[STEPS];
  for (int i = 0; i < STEPS; i++)
    want[i] = step_on_batch(whole);
  for (int i = 0; i < SAVE_AT; i++)
    got[i] = step_on_batch(first);
  cr_assert_eq(mn_session_save_checkpoint(first, path), MN_OK, "%s", mn_last_error());
  mn_session_free(first);
  mn_session *resumed = mlp_session(g, accum);
  cr_assert_eq(mn_session_load_checkpoint(resumed, path), MN_OK, "%s", mn_last_error());
  for (int i = SAVE_AT; i < STEPS; i++)
    got[i] = step_on_batch(resumed);
  for (int i = 0; i < STEPS; i++)
    cr_expect_eq(got[i], want[i], "accumulation %d: step %d: loss %.9g resumed, %.9g whole", accum,
                 i, (double)got[i], (double)want[i]);
  /* The masks matter: the same batch gives other losses under other masks. */
  cr_expect_neq(want[SAVE_AT], want[SAVE_AT + 1]);
  mn_session_free(resumed);
  mn_session_free(whole);
  mn_graph_free(g);
  mn_tmp_dir_remove(&dir);
}

Test(dropout, a_resumed_run_draws_the_masks_of_the_uninterrupted_one) {
  check_resume(1);
  check_resume(3);
}

Test(dropout, each_accumulation_step_draws_its_own_mask) {
  enum { N = 2048, K = 3 };
  mn_graph *g = masked_sum(N, 0.5f);
  float *x = NULL;
  mn_session *s = masked_session(g, N, &x);
  cr_assert_eq(mn_session_set_learning_rate(s, 0.1f), MN_OK);
  cr_assert_eq(mn_session_set_grad_accumulation(s, K), MN_OK, "%s", mn_last_error());
  float *y[K];
  for (int k = 0; k < K; k++) {
    mn_test_step_loss(s);
    y[k] = mn_test_read_output(s, 1, N);
  }
  /* No update ran between them (the parameter x is the same), yet the masks differ. */
  for (int k = 1; k < K; k++) {
    size_t differ = 0;
    for (size_t i = 0; i < N; i++)
      differ += (y[k][i] == 0.0f) != (y[0][i] == 0.0f);
    cr_expect_gt(differ, N / 4, "accumulation step %d drew the mask of step 0", k);
  }
  cr_expect_eq(s->micro_steps, K);
  cr_expect_eq(s->step_count, 1);
  for (int k = 0; k < K; k++)
    free(y[k]);
  free(x);
  mn_session_free(s);
  mn_graph_free(g);
}

Test(dropout, builder_checks_p) {
  const float bad[] = {-0.1f, 1.0f, 1.5f, NAN};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    mn_graph *g = mn_graph_new();
    mn_node x = mn_input(g, "x", MN_SHAPE(4));
    cr_expect_eq(mn_dropout(g, x, bad[i]), MN_NO_NODE);
    mn_assert_graph_error(g, MN_ERR_INVALID_ARGUMENT, "mn_dropout: p is");
    /* Sticky: later builders fail too. */
    cr_expect_eq(mn_relu(g, x), MN_NO_NODE);
    mn_graph_free(g);
  }
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(4));
  size_t before = mn_graph_num_nodes(g);
  cr_expect_eq(mn_dropout(g, x, 0.0f), x, "p = 0 is x itself");
  cr_expect_eq(mn_graph_num_nodes(g), before);
  cr_expect_eq(mn_graph_status(g), MN_OK);
  mn_graph_free(g);
}

Test(dropout, checkpoints_keep_the_micro_step) {
  mn_tmp_dir dir = mn_tmp_dir_make("mn_dropout_meta");
  const char *path = mn_tmp_path(&dir, "ck.safetensors");
  mn_graph *g = dropout_mlp();
  mn_session *s = mlp_session(g, 2);
  for (int i = 0; i < 5; i++)
    step_on_batch(s);
  cr_assert_eq(mn_session_save_checkpoint(s, path), MN_OK, "%s", mn_last_error());
  mn_safetensors *st = NULL;
  cr_assert_eq(mn_safetensors_open(path, &st), MN_OK, "%s", mn_last_error());
  cr_expect_str_eq(mn_safetensors_metadata(st, "micro_step"), "5");
  mn_safetensors_close(st);
  mn_assert_error(
      mn_session_save_checkpoint_with(s, path, &(mn_checkpoint_entry){"micro_step", "1"}, 1),
      MN_ERR_INVALID_ARGUMENT, "a key the library writes itself");
  mn_session_free(s);
  mn_graph_free(g);
  mn_tmp_dir_remove(&dir);
}

Test(dropout, a_cached_plan_keeps_the_seed) {
  enum { N = 512 };
  mn_tmp_dir dir = mn_tmp_dir_make("mn_dropout_cache");
  const char *path = mn_tmp_path(&dir, "plan.json");
  mn_graph *g = masked_sum(N, 0.5f);
  mn_session_options o = mn_session_options_default();
  o.backend = MN_BACKEND_CPU;
  float *y[2];
  for (int k = 0; k < 2; k++) {
    mn_session *s = NULL;
    cr_assert_eq(mn_build_session_cached(g, path, &o, &s), MN_OK, "%s", mn_last_error());
    float x[N];
    for (size_t i = 0; i < N; i++)
      x[i] = 1.0f;
    cr_assert_eq(mn_session_set_parameter(s, "x", x, N), MN_OK);
    y[k] = output_at(s, 2, N);
    mn_session_free(s);
  }
  cr_expect_eq(mn_tmp_dir_count(&dir, "plan.json"), 1);
  cr_expect_arr_eq(y[0], y[1], N * sizeof(float), "the session from the cache drew another mask");
  free(y[0]), free(y[1]);
  mn_graph_free(g);
  mn_tmp_dir_remove(&dir);
}
