/* Frozen parameters (mn_set_trainable): no gradient, no optimizer state, no update, and no
 * backward work that only they needed; the trainable parameters train as they would with the
 * frozen ones trainable. The first layer of an MLP is frozen, as a fine-tuned base is. On CUDA
 * too (the GPU case skips without a device). */
#include <stdlib.h>
#include <string.h>

#include "host/backend.h"
#include "host/plan.h"
#include "tests/support/cuda_check.h"
#include "tests/support/mn_test.h"
#include "tests/support/session_util.h"
#include "tests/support/tmp_dir.h"

enum { B = 6, IN = 5, HID = 12, OUT = 3 };

/* tanh(x w1 + b1) w2 + b2 against t; w1 and b1 frozen unless `all_trainable`. */
static mn_graph *mlp(bool all_trainable) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(B, IN)), t = mn_input(g, "t", MN_SHAPE(B, OUT));
  mn_node w1 = mn_parameter(g, "w1", MN_SHAPE(IN, HID)), b1 = mn_parameter(g, "b1", MN_SHAPE(HID));
  mn_node w2 = mn_parameter(g, "w2", MN_SHAPE(HID, OUT)), b2 = mn_parameter(g, "b2", MN_SHAPE(OUT));
  mn_node y =
      mn_bias_add(g, mn_matmul(g, mn_tanh(g, mn_bias_add(g, mn_matmul(g, x, w1), b1)), w2), b2);
  mn_set_outputs(g, (mn_node[]){mn_mse_loss(g, y, t)}, 1);
  if (!all_trainable) {
    mn_set_trainable(g, w1, false);
    mn_set_trainable(g, b1, false);
  }
  cr_assert_eq(mn_graph_status(g), MN_OK, "%s", mn_graph_error(g));
  return g;
}

/* The same parameters and data into every session, and AdamW with weight decay (which would
 * move a frozen weight if it were updated at all). */
static void prepare(const mn_graph *g, mn_session *const *s, size_t n) {
  mn_rng r = mn_rng_new(21);
  mn_test_init_normal(g, s, n, &r, 0.5f, false);
  float x[B * IN], t[B * OUT];
  mn_rng_fill(&r, x, B * IN, -1.0f, 1.0f);
  mn_rng_fill(&r, t, B * OUT, -1.0f, 1.0f);
  for (size_t i = 0; i < n; i++) {
    cr_assert_eq(mn_session_set_input(s[i], "x", x, B * IN), MN_OK, "%s", mn_last_error());
    cr_assert_eq(mn_session_set_input(s[i], "t", t, B * OUT), MN_OK, "%s", mn_last_error());
    cr_assert_eq(mn_session_set_adamw(s[i], 1e-2f, 0.9f, 0.999f, 1e-8f, 0.1f), MN_OK);
  }
}

static void read_param(mn_session *s, const char *name, float *out, size_t n) {
  cr_assert_eq(mn_session_read_param(s, name, out, n), MN_OK, "%s", mn_last_error());
}

static void check_frozen_training(mn_backend backend) {
  mn_graph *g = mlp(false), *all = mlp(true);
  mn_session *s[2] = {mn_test_session(g, backend, true), mn_test_session(all, backend, true)};
  prepare(g, s, 2);
  float w1_before[IN * HID], b1_before[HID], w1[IN * HID], b1[HID];
  read_param(s[0], "w1", w1_before, IN * HID);
  read_param(s[0], "b1", b1_before, HID);
  /* First step: the trainable gradients are those of the all-trainable session. */
  for (int i = 0; i < 2; i++)
    mn_test_step_loss(s[i]);
  const char *names[] = {"w2", "b2"};
  const size_t sizes[] = {HID * OUT, OUT};
  for (int i = 0; i < 2; i++) {
    float a[HID * OUT], b[HID * OUT];
    cr_assert_eq(mn_session_read_grad(s[0], names[i], a, sizes[i]), MN_OK);
    cr_assert_eq(mn_session_read_grad(s[1], names[i], b, sizes[i]), MN_OK);
    cr_assert_leq(mn_test_rel_err(a, b, sizes[i]), 1e-6, "gradient of %s", names[i]);
  }
  float zeros[IN * HID] = {0}, gw1[IN * HID];
  memset(gw1, 0xff, sizeof gw1);
  cr_assert_eq(mn_session_read_grad(s[0], "w1", gw1, IN * HID), MN_OK, "%s", mn_last_error());
  cr_assert(memcmp(gw1, zeros, sizeof gw1) == 0, "a frozen parameter reads a zero gradient");
  for (int step = 0; step < 4; step++)
    mn_test_step_loss(s[0]);
  read_param(s[0], "w1", w1, IN * HID);
  read_param(s[0], "b1", b1, HID);
  cr_assert(memcmp(w1, w1_before, sizeof w1) == 0, "w1 moved after 5 AdamW steps");
  cr_assert(memcmp(b1, b1_before, sizeof b1) == 0, "b1 moved after 5 AdamW steps");
  /* No gradient buffer and no Adam moments for the frozen 72 values. */
  mn_memory_summary m = mn_session_memory_summary(s[0]), ma = mn_session_memory_summary(s[1]);
  cr_assert_lt(m.adam_state_bytes, ma.adam_state_bytes, "%zu vs %zu", m.adam_state_bytes,
               ma.adam_state_bytes);
  cr_assert_lt(m.total_buffer_bytes, ma.total_buffer_bytes);
  for (int i = 0; i < 2; i++)
    mn_session_free(s[i]);
  mn_graph_free(g);
  mn_graph_free(all);
}

Test(frozen, frozen_parameters_keep_their_values_and_the_rest_trains) {
  check_frozen_training(MN_BACKEND_CPU);
}

Test(frozen, frozen_parameters_on_cuda) {
  mn_test_require_cuda_device();
  check_frozen_training(MN_BACKEND_CUDA);
}

static size_t dispatches(const mn_graph *g) {
  mn_session *s = mn_test_session(g, MN_BACKEND_CPU, true);
  size_t n = mn_plan_num_dispatches(s->plan);
  mn_session_free(s);
  return n;
}

/* With the first layer frozen and x an input, nothing needs the gradient below the second
 * product: the plan loses the first layer's whole backward (its weight and bias gradients,
 * tanh's gradient and the product into it). */
Test(frozen, the_backward_computes_only_what_trainable_parameters_need) {
  mn_graph *g = mlp(false), *all = mlp(true);
  size_t frozen = dispatches(g), trained = dispatches(all);
  cr_assert_leq(frozen + 3, trained, "%zu dispatches frozen, %zu all trainable", frozen, trained);
  mn_graph_free(g);
  mn_graph_free(all);
}

Test(frozen, only_parameters_can_be_frozen) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(2, 2));
  mn_set_trainable(g, x, false);
  cr_assert_eq(mn_graph_status(g), MN_ERR_INVALID_ARGUMENT);
  cr_assert(strstr(mn_graph_error(g), "mn_set_trainable") && strstr(mn_graph_error(g), "parameter"),
            "%s", mn_graph_error(g));
  mn_graph_free(g);
  /* Thawing again gives a gradient back. */
  g = mlp(false);
  for (size_t i = 0; i < g->num_nodes; i++)
    if (g->nodes[i].op == MN_OP_PARAMETER) mn_set_trainable(g, (mn_node)i, true);
  mn_graph *all = mlp(true);
  cr_assert_eq(dispatches(g), dispatches(all));
  mn_graph_free(g);
  mn_graph_free(all);
}

/* A cached plan keeps the frozen parameters frozen (the plan-cache key and the cached graph
 * carry the mark). */
Test(frozen, cached_plans_keep_parameters_frozen) {
  mn_graph *g = mlp(false);
  mn_tmp_dir dir = mn_tmp_dir_make("mn_frozen");
  const char *path = mn_tmp_path(&dir, "plan.json");
  mn_session_options o = mn_session_options_default();
  o.backend = MN_BACKEND_CPU;
  mn_session *s[2];
  for (int i = 0; i < 2; i++)
    cr_assert_eq(mn_build_session_cached(g, path, &o, &s[i]), MN_OK, "%s", mn_last_error());
  prepare(g, s, 2);
  float before[IN * HID], after[IN * HID];
  read_param(s[1], "w1", before, IN * HID);
  for (int step = 0; step < 3; step++)
    mn_test_step_loss(s[1]);
  read_param(s[1], "w1", after, IN * HID);
  cr_assert(memcmp(before, after, sizeof before) == 0, "the cached plan trained w1");
  for (int i = 0; i < 2; i++)
    mn_session_free(s[i]);
  mn_tmp_dir_remove(&dir);
  mn_graph_free(g);
}
