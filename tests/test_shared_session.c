/* mn_build_inference_session_shared: an inference session that reads a training session's
 * parameters in place sees every update without a copy, equals an inference session given
 * the same weights by copy while holding no memory for them, and refuses an owner without its
 * parameters. On CUDA too (the
 * GPU case skips without a device). */
#include <string.h>

#include "tests/support/cuda_check.h"
#include "tests/support/mn_test.h"
#include "tests/support/session_util.h"

enum { B = 6, IN = 5, HID = 12, OUT = 3 };

/* tanh(x w1 + b1) w2 + b2; with_loss adds the mse loss against t as output 0. */
static mn_graph *mlp(bool with_loss) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(B, IN));
  mn_node w1 = mn_parameter(g, "w1", MN_SHAPE(IN, HID)), b1 = mn_parameter(g, "b1", MN_SHAPE(HID));
  mn_node w2 = mn_parameter(g, "w2", MN_SHAPE(HID, OUT)), b2 = mn_parameter(g, "b2", MN_SHAPE(OUT));
  mn_node y =
      mn_bias_add(g, mn_matmul(g, mn_tanh(g, mn_bias_add(g, mn_matmul(g, x, w1), b1)), w2), b2);
  if (with_loss)
    mn_set_outputs(g, (mn_node[]){mn_mse_loss(g, y, mn_input(g, "t", MN_SHAPE(B, OUT))), y}, 2);
  else
    mn_set_outputs(g, &y, 1);
  cr_assert_eq(mn_graph_status(g), MN_OK, "%s", mn_graph_error(g));
  return g;
}

static void run(mn_session *s) {
  cr_assert_eq(mn_session_step(s), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_wait(s), MN_OK, "%s", mn_last_error());
}

static void check_sharing(mn_backend backend) {
  mn_graph *train_g = mlp(true), *eval_g = mlp(false);
  mn_session *train = mn_test_session(train_g, backend, true);
  mn_rng r = mn_rng_new(9);
  mn_test_init_normal(train_g, &train, 1, &r, 0.5f, false);
  cr_assert_eq(mn_session_set_adamw(train, 1e-2f, 0.9f, 0.999f, 1e-8f, 0.0f), MN_OK);
  float x[B * IN], t[B * OUT], shared_y[B * OUT], copied_y[B * OUT], before[B * OUT];
  mn_rng_fill(&r, x, B * IN, -1, 1);
  mn_rng_fill(&r, t, B * OUT, -1, 1);
  cr_assert_eq(mn_session_set_input(train, "x", x, B * IN), MN_OK);
  cr_assert_eq(mn_session_set_input(train, "t", t, B * OUT), MN_OK);

  mn_session *eval = NULL;
  cr_assert_eq(mn_build_inference_session_shared(eval_g, NULL, train, &eval), MN_OK, "%s",
               mn_last_error());
  cr_assert_eq(mn_session_set_input(eval, "x", x, B * IN), MN_OK);
  run(eval);
  cr_assert_eq(mn_session_read_output_by_index(eval, 0, before, B * OUT), MN_OK);
  for (int step = 0; step < 3; step++) {
    run(train);
    run(eval);
    cr_assert_eq(mn_session_read_output_by_index(eval, 0, shared_y, B * OUT), MN_OK);
    /* The reference: a fresh inference session given the trained weights by copy. */
    mn_session *copy = mn_test_session(eval_g, backend, false);
    const char *names[] = {"w1", "b1", "w2", "b2"};
    const size_t sizes[] = {IN * HID, HID, HID * OUT, OUT};
    float w[IN * HID];
    for (int k = 0; k < 4; k++) {
      cr_assert_eq(mn_session_read_param(train, names[k], w, sizes[k]), MN_OK);
      cr_assert_eq(mn_session_set_parameter(copy, names[k], w, sizes[k]), MN_OK);
    }
    cr_assert_eq(mn_session_set_input(copy, "x", x, B * IN), MN_OK);
    run(copy);
    cr_assert_eq(mn_session_read_output_by_index(copy, 0, copied_y, B * OUT), MN_OK);
    cr_expect(memcmp(shared_y, copied_y, sizeof shared_y) == 0,
              "step %d: the shared session does not see the trained weights", step);
    /* The weights it reads in the owner's memory take none of its own. */
    size_t shared_bytes = mn_session_memory_summary(eval).total_buffer_bytes;
    size_t copy_bytes = mn_session_memory_summary(copy).total_buffer_bytes;
    size_t weights = (IN * HID + HID + HID * OUT + OUT) * sizeof(float);
    cr_expect_leq(shared_bytes + weights, copy_bytes,
                  "the shared session holds %zu bytes, a copy %zu: its arena still has the weights",
                  shared_bytes, copy_bytes);
    mn_session_free(copy);
  }
  cr_expect(memcmp(before, shared_y, sizeof before) != 0, "training changed nothing");
  mn_session_stats st;
  cr_assert_eq(mn_session_get_stats(eval, &st), MN_OK);
  if (backend == MN_BACKEND_CUDA)
    cr_expect_eq(st.graph_captures, 1u, "the shared session re-captured after updates");
  mn_session_free(eval);
  mn_session_free(train);
  mn_graph_free(train_g);
  mn_graph_free(eval_g);
}

Test(shared_session, sees_every_update_without_a_copy_cpu) { check_sharing(MN_BACKEND_CPU); }

Test(shared_session, sees_every_update_without_a_copy_cuda) {
  mn_test_require_cuda_device();
  check_sharing(MN_BACKEND_CUDA);
}

Test(shared_session, refuses_an_owner_without_the_parameters) {
  mn_graph *g = mlp(false), *other = mn_graph_new();
  mn_node w1 = mn_parameter(other, "w1", MN_SHAPE(IN, HID + 1));
  mn_set_outputs(other, (mn_node[]){mn_sum_all(other, w1)}, 1);
  mn_session *owner = mn_test_session(other, MN_BACKEND_CPU, false), *s = NULL;
  cr_expect_eq(mn_build_inference_session_shared(g, NULL, owner, &s), MN_ERR_SHAPE);
  cr_expect(strstr(mn_last_error(), "\"w1\"") != NULL, "%s", mn_last_error());
  cr_expect_null(s);
  mn_graph_free(other);
  other = mn_graph_new();
  mn_node w = mn_parameter(other, "w1", MN_SHAPE(IN, HID));
  mn_set_outputs(other, (mn_node[]){mn_sum_all(other, w)}, 1);
  mn_session_free(owner);
  owner = mn_test_session(other, MN_BACKEND_CPU, false);
  cr_expect_eq(mn_build_inference_session_shared(g, NULL, owner, &s), MN_ERR_NOT_FOUND);
  cr_expect(strstr(mn_last_error(), "b1") != NULL, "%s", mn_last_error());
  cr_expect_null(s);
  cr_expect_eq(mn_build_inference_session_shared(g, NULL, NULL, &s), MN_ERR_INVALID_ARGUMENT);
  cr_expect_eq(mn_build_inference_session_shared(NULL, NULL, owner, &s), MN_ERR_INVALID_ARGUMENT);
  mn_session_free(owner);
  mn_graph_free(other);
  mn_graph_free(g);
}
