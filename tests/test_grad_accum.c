/* Gradient accumulation (mn_session_set_grad_accumulation): k steps of batch B update as one
 * step of batch k*B, for SGD and AdamW, with and without clipping; the steps between updates
 * change nothing; the setter's error paths. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "session/session.h"
#include "tests/support/mn_test.h"
#include "tests/support/session_util.h"
#include "tests/support/tmp_dir.h"

enum { K = 4, MICRO = 3, IN = 5, HID = 16, OUT = 3 };

/* tanh(x w1 + b1) w2 + b2 against t, mean squared error over `batch` rows. */
static mn_graph *mlp(int64_t batch) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(batch, IN)), t = mn_input(g, "t", MN_SHAPE(batch, OUT));
  mn_node w1 = mn_parameter(g, "w1", MN_SHAPE(IN, HID)), b1 = mn_parameter(g, "b1", MN_SHAPE(HID));
  mn_node w2 = mn_parameter(g, "w2", MN_SHAPE(HID, OUT)), b2 = mn_parameter(g, "b2", MN_SHAPE(OUT));
  mn_node h = mn_tanh(g, mn_bias_add(g, mn_matmul(g, x, w1), b1));
  mn_node y = mn_bias_add(g, mn_matmul(g, h, w2), b2);
  mn_set_outputs(g, (mn_node[]){mn_mse_loss(g, y, t)}, 1);
  cr_assert_eq(mn_graph_status(g), MN_OK, "%s", mn_graph_error(g));
  return g;
}

typedef enum variant { SGD, ADAMW, ADAMW_CLIP } variant;

static void configure(mn_session *s, variant v) {
  if (v == SGD) {
    cr_assert_eq(mn_session_set_learning_rate(s, 0.1f), MN_OK);
    return;
  }
  cr_assert_eq(mn_session_set_adamw(s, 1e-2f, 0.9f, 0.999f, 1e-8f, 0.05f), MN_OK);
  if (v == ADAMW_CLIP) cr_assert_eq(mn_session_set_grad_clip(s, 0.05f), MN_OK);
}

/* Rows [first, first + n) of round r's data: K * MICRO rows of x and t. */
static void feed(mn_session *s, int round, int first, int n) {
  float x[K * MICRO * IN], t[K * MICRO * OUT];
  mn_rng r = mn_rng_new(40 + (uint64_t)round);
  mn_rng_fill(&r, x, K * MICRO * IN, -1, 1);
  mn_rng_fill(&r, t, K * MICRO * OUT, -1, 1);
  cr_assert_eq(mn_session_set_input(s, "x", x + first * IN, (size_t)(n * IN)), MN_OK);
  cr_assert_eq(mn_session_set_input(s, "t", t + first * OUT, (size_t)(n * OUT)), MN_OK);
}

static void run(mn_session *s) {
  cr_assert_eq(mn_session_step(s), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_wait(s), MN_OK, "%s", mn_last_error());
}

static void check_equivalence(variant v) {
  mn_graph *small = mlp(MICRO), *big = mlp(K * MICRO);
  mn_session *acc = mn_test_session(small, MN_BACKEND_CPU, true);
  mn_session *one = mn_test_session(big, MN_BACKEND_CPU, true);
  mn_rng w = mn_rng_new(7);
  mn_test_init_normal(small, (mn_session *[]){acc, one}, 2, &w, 0.5f, false);
  configure(acc, v);
  configure(one, v);
  cr_assert_eq(mn_session_set_grad_accumulation(acc, K), MN_OK, "%s", mn_last_error());
  for (int round = 0; round < 3; round++) {
    float *before = mn_test_read_params(small, acc);
    for (int m = 0; m < K; m++) {
      feed(acc, round, m * MICRO, MICRO);
      run(acc);
      float *now = mn_test_read_params(small, acc);
      bool same = memcmp(before, now, mn_test_param_count(small) * sizeof(float)) == 0;
      if (m < K - 1)
        cr_expect(same, "round %d: step %d of %d changed the parameters", round, m + 1, K);
      else
        cr_expect(!same, "round %d: the %d-th step did not update", round, K);
      free(now);
    }
    free(before);
    feed(one, round, 0, K * MICRO);
    run(one);
    /* Same updates; only the order of the fp32 sums differs (K means vs one mean). */
    mn_test_assert_same_params(small, acc, one, 2e-6, "after an accumulated update");
  }
  mn_session_free(acc);
  mn_session_free(one);
  mn_graph_free(small);
  mn_graph_free(big);
}

Test(grad_accum, k_steps_of_batch_b_update_as_one_step_of_batch_kb_sgd) { check_equivalence(SGD); }
Test(grad_accum, k_steps_of_batch_b_update_as_one_step_of_batch_kb_adamw) {
  check_equivalence(ADAMW);
}
Test(grad_accum, clipping_applies_to_the_accumulated_mean) { check_equivalence(ADAMW_CLIP); }

/* Back to k = 1: every step updates again, as without accumulation. */
Test(grad_accum, k_of_one_updates_every_step) {
  mn_graph *g = mlp(MICRO);
  mn_session *s = mn_test_session(g, MN_BACKEND_CPU, true);
  mn_rng w = mn_rng_new(3);
  mn_test_init_normal(g, &s, 1, &w, 0.5f, false);
  configure(s, SGD);
  cr_assert_eq(mn_session_set_grad_accumulation(s, 3), MN_OK);
  cr_assert_eq(mn_session_set_grad_accumulation(s, 1), MN_OK);
  for (int i = 0; i < 2; i++) {
    float *before = mn_test_read_params(g, s);
    feed(s, i, 0, MICRO);
    run(s);
    float *after = mn_test_read_params(g, s);
    cr_expect(memcmp(before, after, mn_test_param_count(g) * sizeof(float)) != 0, "step %d", i);
    free(before);
    free(after);
  }
  mn_session_free(s);
  mn_graph_free(g);
}

Test(grad_accum, bad_arguments_change_nothing) {
  cr_expect_eq(mn_session_set_grad_accumulation(NULL, 2), MN_ERR_INVALID_ARGUMENT);
  mn_graph *g = mlp(MICRO);
  mn_session *s = mn_test_session(g, MN_BACKEND_CPU, true);
  cr_assert_eq(mn_session_set_grad_accumulation(s, 2), MN_OK);
  cr_expect_eq(mn_session_set_grad_accumulation(s, 0), MN_ERR_INVALID_ARGUMENT);
  cr_expect(strstr(mn_last_error(), "k = 0") != NULL, "%s", mn_last_error());
  cr_expect_eq(mn_session_set_grad_accumulation(s, -3), MN_ERR_INVALID_ARGUMENT);
  cr_expect_eq(s->grad_accum, 2u, "a refused k changed the setting");
  mn_session *inf = mn_test_session(g, MN_BACKEND_CPU, false);
  cr_expect_eq(mn_session_set_grad_accumulation(inf, 2), MN_ERR_STATE);
  cr_expect(strstr(mn_last_error(), "mn_session_set_grad_accumulation") != NULL, "%s",
            mn_last_error());
  mn_session_free(inf);
  mn_session_free(s);
  mn_graph_free(g);
}

/* Loading a checkpoint starts a new round: a partial sum from before the load is dropped. */
Test(grad_accum, loading_a_checkpoint_starts_a_new_round) {
  mn_tmp_dir t = mn_tmp_dir_make("mn_grad_accum");
  const char *path = mn_tmp_path(&t, "ck.safetensors");
  mn_graph *g = mlp(MICRO);
  mn_session *s = mn_test_session(g, MN_BACKEND_CPU, true);
  mn_rng w = mn_rng_new(3);
  mn_test_init_normal(g, &s, 1, &w, 0.5f, false);
  configure(s, SGD);
  cr_assert_eq(mn_session_save_checkpoint(s, path), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_set_grad_accumulation(s, 2), MN_OK);
  feed(s, 0, 0, MICRO);
  run(s); /* half a round */
  cr_assert_eq(mn_session_load_checkpoint(s, path), MN_OK, "%s", mn_last_error());
  float *before = mn_test_read_params(g, s);
  run(s); /* the first step of a new round: no update */
  float *after = mn_test_read_params(g, s);
  cr_expect(memcmp(before, after, mn_test_param_count(g) * sizeof(float)) == 0,
            "the step after loading applied a stale partial sum");
  free(before);
  free(after);
  mn_session_free(s);
  mn_graph_free(g);
  mn_tmp_dir_remove(&t);
}
