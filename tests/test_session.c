/* The inference session front end: building (backends, MN_BACKEND), feeding inputs and
 * parameters, stepping, reading outputs and the loss, the plan and memory views. Every
 * error path asserts the status, a fragment of the message, and that nothing changed.
 * Criterion runs each test in its own process, so setenv here does not leak. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L /* setenv, unsetenv */
#endif
#include <stdio.h>
#include <stdlib.h>

#include "tests/support/mn_test.h"

#define LEN(a) (sizeof(a) / sizeof((a)[0]))

/* y = x[2,3] w[3,2] + b[2]; idx is a U32 input nobody reads (the interface keeps it). */
static mn_graph *small_graph(void) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(2, 3));
  mn_input_u32(g, "idx", MN_SHAPE(4));
  mn_node w = mn_parameter(g, "w", MN_SHAPE(3, 2));
  mn_node b = mn_parameter(g, "b", MN_SHAPE(2));
  mn_node y = mn_bias_add(g, mn_matmul(g, x, w), b);
  mn_set_outputs(g, &y, 1);
  cr_assert_eq(mn_graph_status(g), MN_OK, "%s", mn_graph_error(g));
  return g;
}

static const float X0[6] = {1, 2, 3, 4, 5, 6};
static const float W0[6] = {1, 0, 0, 1, 1, 1};
static const float B0[2] = {0.5f, -1};
/* X0 W0 + B0 */
static const float Y0[4] = {4.5f, 4, 10.5f, 10};

static mn_session *cpu_session(const mn_graph *g) {
  mn_session_options o = mn_session_options_default();
  o.backend = MN_BACKEND_CPU;
  mn_session *s = NULL;
  cr_assert_eq(mn_build_inference_session(g, &o, &s), MN_OK, "%s", mn_last_error());
  cr_assert_not_null(s);
  return s;
}

/* A CPU session of small_graph() fed with X0, W0, B0 and stepped once. */
static mn_session *fed_session(mn_graph **g_out) {
  mn_graph *g = small_graph();
  mn_session *s = cpu_session(g);
  cr_assert_eq(mn_session_set_input(s, "x", X0, 6), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_set_parameter(s, "w", W0, 6), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_set_parameter(s, "b", B0, 2), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_step(s), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_wait(s), MN_OK, "%s", mn_last_error());
  *g_out = g;
  return s;
}

static void assert_output(mn_session *s, const float *want) {
  float out[4] = {0};
  cr_assert_eq(mn_session_read_output_by_index(s, 0, out, 4), MN_OK, "%s", mn_last_error());
  mn_assert_close(out, want, 4, 0);
}

/* Steps and checks that output 0 is `want`: a failed call must not have changed the
 * session's inputs or parameters. */
static void assert_step_gives(mn_session *s, const float *want) {
  cr_assert_eq(mn_session_step(s), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_wait(s), MN_OK, "%s", mn_last_error());
  assert_output(s, want);
}

/* ---------------------------------------------------------------- building */

Test(session, options_default) {
  mn_session_options o = mn_session_options_default();
  cr_assert_eq(o.backend, MN_BACKEND_AUTO);
  cr_assert_eq(o.device, 0);
  cr_assert_not(o.allow_tf32);
  cr_assert(o.optimize);
}

Test(session, build_null_arguments) {
  mn_graph *g = small_graph();
  mn_assert_error(mn_build_inference_session(g, NULL, NULL), MN_ERR_INVALID_ARGUMENT,
                  "mn_build_inference_session: out is NULL");
  mn_session *s = (mn_session *)&s;
  mn_assert_error(mn_build_inference_session(NULL, NULL, &s), MN_ERR_INVALID_ARGUMENT,
                  "mn_build_inference_session: graph is NULL");
  cr_assert_null(s);
  mn_graph_free(g);
}

Test(session, build_refuses_a_graph_in_error) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(2, 3));
  mn_node w = mn_input(g, "w", MN_SHAPE(2, 3));
  mn_node y = mn_matmul(g, x, w);
  mn_set_outputs(g, &y, 1);
  mn_session *s = (mn_session *)&s;
  mn_assert_error(mn_build_inference_session(g, NULL, &s), MN_ERR_SHAPE,
                  "mn_build_inference_session: graph is in error: mn_matmul: node 0 [2,3] x "
                  "node 1 [2,3]: inner dimensions 3 and 2 differ");
  cr_assert_null(s);
  mn_graph_free(g);
}

Test(session, build_needs_outputs) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(3));
  mn_relu(g, x);
  mn_session *s = (mn_session *)&s;
  mn_assert_error(mn_build_inference_session(g, NULL, &s), MN_ERR_INVALID_ARGUMENT,
                  "graph has no outputs (call mn_set_outputs)");
  cr_assert_null(s);
  mn_graph_free(g);
}

Test(session, build_unknown_backend) {
  mn_graph *g = small_graph();
  mn_session_options o = mn_session_options_default();
  o.backend = (mn_backend)42;
  mn_session *s = (mn_session *)&s;
  mn_assert_error(mn_build_inference_session(g, &o, &s), MN_ERR_INVALID_ARGUMENT,
                  "mn_build_inference_session: unknown backend 42");
  cr_assert_null(s);
  mn_graph_free(g);
}

Test(session, env_backend_invalid_value) {
  setenv("MN_BACKEND", "gpu", 1);
  mn_graph *g = small_graph();
  mn_session *s = (mn_session *)&s;
  mn_assert_error(mn_build_inference_session(g, NULL, &s), MN_ERR_INVALID_ARGUMENT,
                  "MN_BACKEND=\"gpu\", expected cpu, cuda or auto");
  cr_assert_null(s);
  /* An explicit backend in the options wins over the environment. */
  s = cpu_session(g);
  mn_session_free(s);
  mn_graph_free(g);
}

Test(session, env_backend_cpu_and_auto_work) {
  mn_graph *g = small_graph();
  const char *values[] = {"cpu", "auto", ""};
  for (size_t i = 0; i < LEN(values); i++) {
    setenv("MN_BACKEND", values[i], 1);
    mn_session *s = NULL;
    cr_assert_eq(mn_build_inference_session(g, NULL, &s), MN_OK, "MN_BACKEND=%s: %s", values[i],
                 mn_last_error());
    cr_assert_not_null(s);
    mn_session_free(s);
  }
  mn_graph_free(g);
}

/* On a machine where CUDA is usable these requests succeed, and the test has nothing to
 * check. */
static bool cuda_usable(const mn_graph *g) {
  mn_session_options o = mn_session_options_default();
  o.backend = MN_BACKEND_CUDA;
  mn_session *s = NULL;
  if (mn_build_inference_session(g, &o, &s) != MN_OK) return false;
  mn_session_free(s);
  return true;
}

Test(session, explicit_cuda_without_a_device_fails_clearly) {
  unsetenv("MN_BACKEND");
  mn_graph *g = small_graph();
  if (cuda_usable(g)) {
    mn_graph_free(g);
    cr_skip_test("a CUDA device is usable here");
  }
  mn_session_options o = mn_session_options_default();
  o.backend = MN_BACKEND_CUDA;
  o.device = 3;
  mn_session *s = (mn_session *)&s;
  mn_assert_error(mn_build_inference_session(g, &o, &s), MN_ERR_DEVICE,
                  "mn_build_inference_session: CUDA backend requested (device 3)");
  mn_assert_error(MN_ERR_DEVICE, MN_ERR_DEVICE, "no CUDA device is usable");
  cr_assert_null(s);

  /* MN_BACKEND=cuda is an explicit request too. */
  setenv("MN_BACKEND", "cuda", 1);
  mn_assert_error(mn_build_inference_session(g, NULL, &s), MN_ERR_DEVICE, "CUDA");
  cr_assert_null(s);
  mn_graph_free(g);
}

Test(session, auto_falls_back_to_cpu) {
  unsetenv("MN_BACKEND");
  mn_graph *g = small_graph();
  mn_session *s = NULL;
  cr_assert_eq(mn_build_inference_session(g, NULL, &s), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_set_input(s, "x", X0, 6), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_set_parameter(s, "w", W0, 6), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_set_parameter(s, "b", B0, 2), MN_OK, "%s", mn_last_error());
  assert_step_gives(s, Y0);
  mn_session_free(s);
  mn_graph_free(g);
}

Test(session, build_does_not_keep_the_graph) {
  mn_graph *g = small_graph();
  mn_session *s = cpu_session(g);
  mn_graph_free(g);
  cr_assert_eq(mn_session_set_input(s, "x", X0, 6), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_set_parameter(s, "w", W0, 6), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_set_parameter(s, "b", B0, 2), MN_OK, "%s", mn_last_error());
  assert_step_gives(s, Y0);
  mn_session_free(s);
  mn_session_free(NULL);
}

/* ---------------------------------------------------------------- inputs and parameters */

Test(session, set_input_errors) {
  mn_graph *g;
  mn_session *s = fed_session(&g);
  float other[6] = {9, 9, 9, 9, 9, 9};
  uint32_t idx[4] = {1, 2, 3, 4};
  mn_assert_error(mn_session_set_input(NULL, "x", other, 6), MN_ERR_INVALID_ARGUMENT,
                  "mn_session_set_input: session is NULL");
  mn_assert_error(mn_session_set_input(s, NULL, other, 6), MN_ERR_INVALID_ARGUMENT,
                  "mn_session_set_input: name is NULL");
  mn_assert_error(mn_session_set_input(s, "x", NULL, 6), MN_ERR_INVALID_ARGUMENT,
                  "mn_session_set_input: \"x\": data is NULL");
  mn_assert_error(mn_session_set_input(s, "nope", other, 6), MN_ERR_NOT_FOUND,
                  "mn_session_set_input: no input named \"nope\"");
  mn_assert_error(mn_session_set_input(s, "x", other, 5), MN_ERR_SHAPE,
                  "mn_session_set_input: \"x\" [2,3] has 6 elements, n is 5");
  mn_assert_error(mn_session_set_input(s, "x", other, 7), MN_ERR_SHAPE, "n is 7");
  mn_assert_error(mn_session_set_input(s, "w", other, 6), MN_ERR_NOT_FOUND, "no input named \"w\"");
  mn_assert_error(mn_session_set_input(s, "idx", other, 4), MN_ERR_INVALID_ARGUMENT,
                  "mn_session_set_input: input \"idx\" [4] u32 is u32; use "
                  "mn_session_set_input_u32");
  mn_assert_error(mn_session_set_input_u32(NULL, "idx", idx, 4), MN_ERR_INVALID_ARGUMENT,
                  "mn_session_set_input_u32: session is NULL");
  mn_assert_error(mn_session_set_input_u32(s, NULL, idx, 4), MN_ERR_INVALID_ARGUMENT,
                  "name is NULL");
  mn_assert_error(mn_session_set_input_u32(s, "idx", NULL, 4), MN_ERR_INVALID_ARGUMENT,
                  "\"idx\": data is NULL");
  mn_assert_error(mn_session_set_input_u32(s, "ids", idx, 4), MN_ERR_NOT_FOUND,
                  "no input named \"ids\"");
  mn_assert_error(mn_session_set_input_u32(s, "idx", idx, 3), MN_ERR_SHAPE,
                  "\"idx\" [4] u32 has 4 elements, n is 3");
  mn_assert_error(mn_session_set_input_u32(s, "x", idx, 6), MN_ERR_INVALID_ARGUMENT,
                  "mn_session_set_input_u32: input \"x\" [2,3] is f32; use mn_session_set_input");
  cr_assert_eq(mn_session_set_input_u32(s, "idx", idx, 4), MN_OK, "%s", mn_last_error());
  /* None of the failures reached x, w or b. */
  assert_step_gives(s, Y0);
  mn_session_free(s);
  mn_graph_free(g);
}

Test(session, set_parameter_errors) {
  mn_graph *g;
  mn_session *s = fed_session(&g);
  float other[6] = {9, 9, 9, 9, 9, 9};
  mn_assert_error(mn_session_set_parameter(NULL, "w", other, 6), MN_ERR_INVALID_ARGUMENT,
                  "mn_session_set_parameter: session is NULL");
  mn_assert_error(mn_session_set_parameter(s, NULL, other, 6), MN_ERR_INVALID_ARGUMENT,
                  "mn_session_set_parameter: name is NULL");
  mn_assert_error(mn_session_set_parameter(s, "w", NULL, 6), MN_ERR_INVALID_ARGUMENT,
                  "\"w\": data is NULL");
  mn_assert_error(mn_session_set_parameter(s, "layer.weight", other, 6), MN_ERR_NOT_FOUND,
                  "mn_session_set_parameter: no parameter named \"layer.weight\"");
  mn_assert_error(mn_session_set_parameter(s, "x", other, 6), MN_ERR_NOT_FOUND,
                  "no parameter named \"x\"");
  mn_assert_error(mn_session_set_parameter(s, "w", other, 5), MN_ERR_SHAPE,
                  "mn_session_set_parameter: \"w\" [3,2] has 6 elements, n is 5");
  mn_assert_error(mn_session_set_parameter(s, "b", other, 0), MN_ERR_SHAPE, "n is 0");
  float w[6] = {0};
  cr_assert_eq(mn_session_read_param(s, "w", w, 6), MN_OK, "%s", mn_last_error());
  mn_assert_close(w, W0, 6, 0);
  assert_step_gives(s, Y0);
  mn_session_free(s);
  mn_graph_free(g);
}

Test(session, read_param_errors_leave_out_untouched) {
  mn_graph *g;
  mn_session *s = fed_session(&g);
  float out[6] = {7, 7, 7, 7, 7, 7}, sevens[6] = {7, 7, 7, 7, 7, 7};
  mn_assert_error(mn_session_read_param(NULL, "w", out, 6), MN_ERR_INVALID_ARGUMENT,
                  "mn_session_read_param: session is NULL");
  mn_assert_error(mn_session_read_param(s, NULL, out, 6), MN_ERR_INVALID_ARGUMENT,
                  "mn_session_read_param: name is NULL");
  mn_assert_error(mn_session_read_param(s, "w", NULL, 6), MN_ERR_INVALID_ARGUMENT,
                  "mn_session_read_param: \"w\"");
  mn_assert_error(mn_session_read_param(s, "v", out, 6), MN_ERR_NOT_FOUND,
                  "mn_session_read_param: no parameter named \"v\"");
  mn_assert_error(mn_session_read_param(s, "x", out, 6), MN_ERR_NOT_FOUND,
                  "no parameter named \"x\"");
  mn_assert_error(mn_session_read_param(s, "w", out, 4), MN_ERR_SHAPE,
                  "\"w\" [3,2] has 6 elements, n is 4");
  mn_assert_close(out, sevens, 6, 0);
  cr_assert_eq(mn_session_read_param(s, "b", out, 2), MN_OK, "%s", mn_last_error());
  mn_assert_close(out, B0, 2, 0);
  mn_session_free(s);
  mn_graph_free(g);
}

Test(session, failed_set_input_keeps_the_old_values) {
  mn_graph *g;
  mn_session *s = fed_session(&g);
  float bad[6] = {100, 100, 100, 100, 100, 100};
  mn_assert_error(mn_session_set_input(s, "x", bad, 5), MN_ERR_SHAPE, "n is 5");
  mn_assert_error(mn_session_set_parameter(s, "w", bad, 7), MN_ERR_SHAPE, "n is 7");
  mn_assert_error(mn_session_set_parameter(s, "x", bad, 6), MN_ERR_NOT_FOUND, "\"x\"");
  assert_step_gives(s, Y0);
  float w[6];
  cr_assert_eq(mn_session_read_param(s, "w", w, 6), MN_OK);
  mn_assert_close(w, W0, 6, 0);
  mn_session_free(s);
  mn_graph_free(g);
}

Test(session, inputs_and_parameters_persist_across_steps) {
  mn_graph *g;
  mn_session *s = fed_session(&g);
  assert_output(s, Y0);
  assert_step_gives(s, Y0);
  assert_step_gives(s, Y0);
  /* A new input keeps the parameters; a new parameter keeps the input. */
  float x1[6] = {0, 0, 1, 1, 0, 0};
  cr_assert_eq(mn_session_set_input(s, "x", x1, 6), MN_OK);
  const float y1[4] = {1.5f, 0, 1.5f, -1};
  assert_step_gives(s, y1);
  float b1[2] = {0, 0};
  cr_assert_eq(mn_session_set_parameter(s, "b", b1, 2), MN_OK);
  const float y2[4] = {1, 1, 1, 0};
  assert_step_gives(s, y2);
  assert_step_gives(s, y2);
  mn_session_free(s);
  mn_graph_free(g);
}

Test(session, parameters_start_at_zero) {
  mn_graph *g = small_graph();
  mn_session *s = cpu_session(g);
  float w[6] = {1, 1, 1, 1, 1, 1}, zeros[6] = {0};
  cr_assert_eq(mn_session_read_param(s, "w", w, 6), MN_OK, "%s", mn_last_error());
  mn_assert_close(w, zeros, 6, 0);
  mn_session_free(s);
  mn_graph_free(g);
}

Test(session, u32_input_passed_through_reads_as_floats) {
  mn_graph *g = mn_graph_new();
  mn_node idx = mn_input_u32(g, "idx", MN_SHAPE(3));
  mn_set_outputs(g, &idx, 1);
  mn_session *s = cpu_session(g);
  uint32_t ids[3] = {0, 7, 65536};
  cr_assert_eq(mn_session_set_input_u32(s, "idx", ids, 3), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_step(s), MN_OK);
  cr_assert_eq(mn_session_wait(s), MN_OK);
  float out[3];
  cr_assert_eq(mn_session_read_output_by_index(s, 0, out, 3), MN_OK, "%s", mn_last_error());
  float want[3] = {0, 7, 65536};
  mn_assert_close(out, want, 3, 0);
  mn_session_free(s);
  mn_graph_free(g);
}

/* ---------------------------------------------------------------- stepping and outputs */

Test(session, step_and_wait_on_null) {
  mn_assert_error(mn_session_step(NULL), MN_ERR_INVALID_ARGUMENT,
                  "mn_session_step: session is NULL");
  mn_assert_error(mn_session_wait(NULL), MN_ERR_INVALID_ARGUMENT,
                  "mn_session_wait: session is NULL");
}

Test(session, read_output_errors_leave_out_untouched) {
  mn_graph *g;
  mn_session *s = fed_session(&g);
  float out[5] = {3, 3, 3, 3, 3}, threes[5] = {3, 3, 3, 3, 3};
  mn_assert_error(mn_session_read_output_by_index(NULL, 0, out, 4), MN_ERR_INVALID_ARGUMENT,
                  "mn_session_read_output_by_index: session is NULL");
  mn_assert_error(mn_session_read_output_by_index(s, 0, NULL, 4), MN_ERR_INVALID_ARGUMENT,
                  "mn_session_read_output_by_index: out is NULL");
  mn_assert_error(mn_session_read_output_by_index(s, 1, out, 4), MN_ERR_INVALID_ARGUMENT,
                  "mn_session_read_output_by_index: index 1 out of range (1 outputs)");
  mn_assert_error(mn_session_read_output_by_index(s, (size_t)-1, out, 4), MN_ERR_INVALID_ARGUMENT,
                  "out of range");
  mn_assert_error(mn_session_read_output_by_index(s, 0, out, 3), MN_ERR_SHAPE,
                  "output 0 (node 5 [2,2]) has 4 elements, n is 3");
  mn_assert_error(mn_session_read_output_by_index(s, 0, out, 5), MN_ERR_SHAPE, "n is 5");
  mn_assert_close(out, threes, 5, 0);
  mn_session_free(s);
  mn_graph_free(g);
}

Test(session, num_outputs_and_several_outputs) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(3));
  mn_node outs[] = {mn_relu(g, x), mn_neg(g, x), x};
  mn_set_outputs(g, outs, 3);
  mn_session *s = cpu_session(g);
  cr_assert_eq(mn_session_num_outputs(s), 3);
  cr_assert_eq(mn_session_num_outputs(NULL), 0);
  float xd[3] = {-1, 0, 2};
  cr_assert_eq(mn_session_set_input(s, "x", xd, 3), MN_OK);
  cr_assert_eq(mn_session_step(s), MN_OK);
  cr_assert_eq(mn_session_wait(s), MN_OK);
  float want[3][3] = {{0, 0, 2}, {1, 0, -2}, {-1, 0, 2}};
  for (size_t i = 0; i < 3; i++) {
    float out[3];
    cr_assert_eq(mn_session_read_output_by_index(s, i, out, 3), MN_OK, "%s", mn_last_error());
    mn_assert_close(out, want[i], 3, 0);
  }
  mn_assert_error(mn_session_read_output_by_index(s, 3, want[0], 3), MN_ERR_INVALID_ARGUMENT,
                  "index 3 out of range (3 outputs)");
  mn_session_free(s);
  mn_graph_free(g);
}

Test(session, read_loss) {
  cr_assert_eq(mn_session_read_loss(NULL), 0.0f);

  /* Output 0 is [2,2], not a loss. */
  mn_graph *g;
  mn_session *s = fed_session(&g);
  cr_assert_eq(mn_session_read_loss(s), 0.0f);
  mn_session_free(s);
  mn_graph_free(g);

  /* Output 0 is [1]: its value is the loss. Output 1 ([1] too) is not. */
  g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(1));
  mn_node outs[] = {mn_add(g, x, mn_scalar(g, 0.5f)), mn_scale(g, x, 10)};
  mn_set_outputs(g, outs, 2);
  s = cpu_session(g);
  float xd[1] = {2.25f};
  cr_assert_eq(mn_session_set_input(s, "x", xd, 1), MN_OK);
  cr_assert_eq(mn_session_step(s), MN_OK);
  cr_assert_eq(mn_session_wait(s), MN_OK);
  cr_assert_eq(mn_session_read_loss(s), 2.75f);
  xd[0] = -1;
  cr_assert_eq(mn_session_set_input(s, "x", xd, 1), MN_OK);
  cr_assert_eq(mn_session_step(s), MN_OK);
  cr_assert_eq(mn_session_wait(s), MN_OK);
  cr_assert_eq(mn_session_read_loss(s), -0.5f);
  mn_session_free(s);
  mn_graph_free(g);

  /* [1,1] is not a loss either. */
  g = mn_graph_new();
  x = mn_input(g, "x", MN_SHAPE(1, 1));
  mn_node y = mn_neg(g, x);
  mn_set_outputs(g, &y, 1);
  s = cpu_session(g);
  cr_assert_eq(mn_session_set_input(s, "x", xd, 1), MN_OK);
  cr_assert_eq(mn_session_step(s), MN_OK);
  cr_assert_eq(mn_session_wait(s), MN_OK);
  cr_assert_eq(mn_session_read_loss(s), 0.0f);
  mn_session_free(s);
  mn_graph_free(g);
}

/* ---------------------------------------------------------------- plan and memory */

Test(session, plan_of_a_small_graph) {
  mn_graph *g = small_graph();
  /* Unoptimized: one dispatch per op node (matmul, bias_add) and one buffer per node
   * (x, idx, w, b, matmul, bias_add). The optimizer may fuse, so it stays off here. */
  mn_session_options o = mn_session_options_default();
  o.backend = MN_BACKEND_CPU;
  o.optimize = false;
  mn_session *s = NULL;
  cr_assert_eq(mn_build_inference_session(g, &o, &s), MN_OK, "%s", mn_last_error());
  const mn_plan *p = mn_session_plan(s);
  cr_assert_not_null(p);
  cr_assert_eq(mn_plan_num_dispatches(p), 2);
  cr_assert_eq(mn_plan_num_buffers(p), 6);
  cr_assert_null(mn_session_plan(NULL));
  cr_assert_eq(mn_plan_num_dispatches(NULL), 0);
  cr_assert_eq(mn_plan_num_buffers(NULL), 0);

  mn_memory_summary m = mn_session_memory_summary(s);
  cr_assert_eq(m.num_buffers, 6);
  cr_assert_eq(m.largest_buffer_bytes, 24); /* x and w: 6 floats */
  cr_assert_eq(m.adam_state_bytes, 0);
  cr_assert_geq(m.total_buffer_bytes, 24 + 16 + 24 + 8 + 16 + 16);
  char buf[128], want[128];
  snprintf(want, sizeof want, "6 buffers, %.1f MB total (0.0 MB adam state), largest 0.0 MB",
           (double)m.total_buffer_bytes / 1e6);
  int len = mn_memory_summary_format(&m, buf, sizeof buf);
  cr_assert_str_eq(buf, want);
  cr_assert_eq(len, (int)strlen(want));

  mn_memory_summary none = mn_session_memory_summary(NULL);
  cr_assert(none.num_buffers == 0 && none.total_buffer_bytes == 0 && none.adam_state_bytes == 0 &&
            none.largest_buffer_bytes == 0);
  mn_session_free(s);
  mn_graph_free(g);
}

Test(session, memory_summary_format) {
  mn_memory_summary m = {.total_buffer_bytes = 12300000,
                         .adam_state_bytes = 8200000,
                         .num_buffers = 4,
                         .largest_buffer_bytes = 4100000};
  const char *want = "4 buffers, 12.3 MB total (8.2 MB adam state), largest 4.1 MB";
  char buf[128];
  int len = mn_memory_summary_format(&m, buf, sizeof buf);
  cr_assert_str_eq(buf, want);
  cr_assert_eq(len, (int)strlen(want));

  /* Size 0 with a NULL buffer measures; a short buffer truncates and still counts. */
  cr_assert_eq(mn_memory_summary_format(&m, NULL, 0), (int)strlen(want));
  char small[10];
  memset(small, 'x', sizeof small);
  cr_assert_eq(mn_memory_summary_format(&m, small, sizeof small), (int)strlen(want));
  cr_assert_str_eq(small, "4 buffers");

  mn_memory_summary one = {.total_buffer_bytes = 256,
                           .adam_state_bytes = 0,
                           .num_buffers = 1,
                           .largest_buffer_bytes = 256};
  mn_memory_summary_format(&one, buf, sizeof buf);
  cr_assert_str_eq(buf, "1 buffer, 0.0 MB total (0.0 MB adam state), largest 0.0 MB");

  /* One decimal, rounded: 1,250,001 bytes is 1.3 MB; 49,999 bytes 0.0 MB. */
  mn_memory_summary round = {.total_buffer_bytes = 1250001,
                             .adam_state_bytes = 49999,
                             .num_buffers = 0,
                             .largest_buffer_bytes = 1060000};
  mn_memory_summary_format(&round, buf, sizeof buf);
  cr_assert_str_eq(buf, "0 buffers, 1.3 MB total (0.0 MB adam state), largest 1.1 MB");
}

Test(session, stats_count_steps_and_report_the_backend) {
  mn_graph *g = small_graph();
  mn_session_options o = mn_session_options_default();
  o.backend = MN_BACKEND_CPU;
  mn_session *s = NULL;
  cr_assert_eq(mn_build_inference_session(g, &o, &s), MN_OK, "%s", mn_last_error());
  mn_session_stats st;
  mn_assert_error(mn_session_get_stats(NULL, &st), MN_ERR_INVALID_ARGUMENT,
                  "mn_session_get_stats: session is NULL");
  mn_assert_error(mn_session_get_stats(s, NULL), MN_ERR_INVALID_ARGUMENT,
                  "mn_session_get_stats: out is NULL");
  cr_assert_eq(mn_session_get_stats(s, &st), MN_OK);
  cr_assert_str_eq(st.backend, "cpu");
  cr_assert_eq(st.steps, 0u);
  for (int i = 0; i < 3; i++) {
    cr_assert_eq(mn_session_step(s), MN_OK);
    cr_assert_eq(mn_session_wait(s), MN_OK);
  }
  cr_assert_eq(mn_session_get_stats(s, &st), MN_OK);
  cr_assert_eq(st.steps, 3u);
  cr_assert_eq(st.graph_launches, 0u, "the CPU backend launches no graphs");
  cr_assert_eq(st.graph_overlapped_edges, 0u);
  cr_assert_eq(st.submissions, 0u);
  mn_session_free(s);
  mn_graph_free(g);
}
