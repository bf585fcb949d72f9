/* The optimizer update of a small step in two parts (cuda/update_split.h): the last layers'
 * weights are updated beside the rest of the backward pass, the first layer's at the end. The
 * parts do the arithmetic of the one update, so the weights after a few steps are bitwise
 * those of a session with MN_CUDA_SPLIT_UPDATE=0, with SGD and with AdamW, after a step that
 * failed (neither part updates) and against the CPU; steps that need every gradient before
 * any update (clipping) keep one. */
#include <math.h>
#include <stdlib.h>

#include "tests/support/cuda_check.h"
#include "tests/support/mn_test.h"
#include "tests/support/models.h"
#include "tests/support/session_util.h"

enum { BATCH = 64, IN = 96, HIDDEN = 80, OUT = 10 };

/* 96-80-80-10 with biases and ReLU, softmax cross-entropy. */
static mn_graph *mlp(void) { return mn_test_relu_mlp(BATCH, IN, HIDDEN, OUT); }

typedef enum optim { SGD, ADAMW, SGD_CLIPPED } optim;

typedef struct run {
  float *params;
  size_t nodes;
} run;

/* Four steps of backend b (the split on or off), the second one failing when `fail` (a label
 * out of range): the weights after them and the step graph's node count. */
static run four_steps(const mn_graph *g, mn_backend b, bool split, optim opt, bool fail) {
  if (split)
    unsetenv("MN_CUDA_SPLIT_UPDATE");
  else
    setenv("MN_CUDA_SPLIT_UPDATE", "0", 1);
  mn_session *s = mn_test_session(g, b, true);
  unsetenv("MN_CUDA_SPLIT_UPDATE");
  mn_rng r = mn_rng_new(5);
  mn_test_init_normal(g, &s, 1, &r, 0.1f, false);
  static float x[BATCH * IN];
  uint32_t labels[BATCH], bad[BATCH];
  mn_rng_fill(&r, x, BATCH * IN, -1, 1);
  for (int i = 0; i < BATCH; i++)
    labels[i] = bad[i] = (uint32_t)(i * 7 % OUT);
  bad[BATCH / 2] = OUT;
  cr_assert_eq(mn_session_set_input(s, "x", x, BATCH * IN), MN_OK, "%s", mn_last_error());
  if (opt == ADAMW)
    cr_assert_eq(mn_session_set_adamw(s, 0.01f, 0.9f, 0.999f, 1e-8f, 0.1f), MN_OK);
  else
    cr_assert_eq(mn_session_set_learning_rate(s, 0.2f), MN_OK);
  if (opt == SGD_CLIPPED) cr_assert_eq(mn_session_set_grad_clip(s, 0.5f), MN_OK);
  for (int step = 0; step < 4; step++) {
    bool failing = fail && step == 1;
    cr_assert_eq(mn_session_set_input_u32(s, "labels", failing ? bad : labels, BATCH), MN_OK);
    mn_status st = mn_session_step(s);
    if (st == MN_OK) st = mn_session_wait(s);
    if (failing)
      mn_assert_error(st, MN_ERR_INVALID_ARGUMENT, "label");
    else
      cr_assert_eq(st, MN_OK, "step %d: %s", step, mn_last_error());
  }
  mn_session_stats stats = {0};
  cr_assert_eq(mn_session_get_stats(s, &stats), MN_OK);
  run out = {mn_test_read_params(g, s), stats.graph_nodes};
  mn_session_free(s);
  return out;
}

/* The split session against one update and against the CPU; `parts`: whether the step
 * splits (one node more). */
static void compare(optim opt, bool fail, bool parts) {
  mn_test_require_cuda_build();
  mn_test_require_cuda_device();
  mn_graph *g = mlp();
  size_t n = mn_test_param_count(g);
  run split = four_steps(g, MN_BACKEND_CUDA, true, opt, fail);
  run whole = four_steps(g, MN_BACKEND_CUDA, false, opt, fail);
  run cpu = four_steps(g, MN_BACKEND_CPU, true, opt, fail);
  cr_assert_eq(split.nodes, whole.nodes + (parts ? 1u : 0u), "step graph of %zu nodes against %zu",
               split.nodes, whole.nodes);
  for (size_t i = 0; i < n; i++) {
    cr_assert_eq(split.params[i], whole.params[i], "weight %zu: %.9g split, %.9g whole", i,
                 (double)split.params[i], (double)whole.params[i]);
    cr_assert_float_eq(split.params[i], cpu.params[i], 2e-3f * (1.0f + fabsf(cpu.params[i])),
                       "weight %zu: %.9g CUDA, %.9g CPU", i, (double)split.params[i],
                       (double)cpu.params[i]);
  }
  free(split.params);
  free(whole.params);
  free(cpu.params);
  mn_graph_free(g);
}

Test(cuda_update_split, sgd_steps_split_as_one_update) { compare(SGD, false, true); }

Test(cuda_update_split, adamw_steps_split_as_one_update) { compare(ADAMW, false, true); }

Test(cuda_update_split, a_failed_step_updates_neither_part) { compare(ADAMW, true, true); }

Test(cuda_update_split, clipping_keeps_one_update) { compare(SGD_CLIPPED, false, false); }

/* With the readback on the session's stream after the late part (MN_CUDA_SIDE=0). */
Test(cuda_update_split, a_failed_step_with_the_readback_on_the_main_chain) {
  setenv("MN_CUDA_SIDE", "0", 1);
  compare(ADAMW, true, true);
  unsetenv("MN_CUDA_SIDE");
}
