/* A two-layer perceptron's forward pass through the meganeura C API:
 * build a graph, build a session, set parameters and inputs, step, wait, read outputs.
 *
 *   logits = relu(x W1^T + b1) W2^T + b2      (W stored [out, in], as nn.Linear does)
 *
 * The session picks its backend (CUDA when usable, else the CPU reference; MN_BACKEND=cpu
 * forces the CPU). The logits are checked against a plain C loop, so the program doubles
 * as a smoke test: it exits non-zero on any error or mismatch. */
#include <math.h>
#include <stdio.h>

#include "meganeura.h"

enum { BATCH = 4, IN = 3, HIDDEN = 8, OUT = 2 };

/* Stops on the first failure with the library's message. */
#define CHECK(call)                                                                                \
  do {                                                                                             \
    mn_status st_ = (call);                                                                        \
    if (st_ != MN_OK) {                                                                            \
      fprintf(stderr, "%s failed: %s: %s\n", #call, mn_status_string(st_), mn_last_error());       \
      goto fail;                                                                                   \
    }                                                                                              \
  } while (0)

/* What the graph computes, for the comparison at the end. */
static void reference(const float *x, const float *w1, const float *b1, const float *w2,
                      const float *b2, float *logits) {
  for (int n = 0; n < BATCH; n++) {
    float h[HIDDEN];
    for (int j = 0; j < HIDDEN; j++) {
      double acc = b1[j];
      for (int k = 0; k < IN; k++)
        acc += (double)x[n * IN + k] * w1[j * IN + k];
      h[j] = acc > 0 ? (float)acc : 0.0f;
    }
    for (int o = 0; o < OUT; o++) {
      double acc = b2[o];
      for (int j = 0; j < HIDDEN; j++)
        acc += (double)h[j] * w2[o * HIDDEN + j];
      logits[n * OUT + o] = (float)acc;
    }
  }
}

int main(void) {
  int rc = 1;
  mn_session *s = NULL;

  /* 1. The graph. Builders never fail loudly: a mistake makes every later builder return
   *    MN_NO_NODE, and the first message is kept for mn_graph_error. */
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(BATCH, IN));
  mn_node w1 = mn_parameter(g, "fc1.weight", MN_SHAPE(HIDDEN, IN));
  mn_node b1 = mn_parameter(g, "fc1.bias", MN_SHAPE(HIDDEN));
  mn_node w2 = mn_parameter(g, "fc2.weight", MN_SHAPE(OUT, HIDDEN));
  mn_node b2 = mn_parameter(g, "fc2.bias", MN_SHAPE(OUT));
  mn_node h = mn_relu(g, mn_bias_add(g, mn_matmul_bt(g, x, w1), b1));
  mn_node logits = mn_bias_add(g, mn_matmul_bt(g, h, w2), b2);
  mn_set_outputs(g, &logits, 1);
  if (mn_graph_status(g) != MN_OK) {
    fprintf(stderr, "graph: %s\n", mn_graph_error(g));
    goto fail;
  }
  printf("graph: %zu nodes\n", mn_graph_num_nodes(g));

  /* 2. A session: NULL options mean the defaults (backend AUTO). */
  CHECK(mn_build_inference_session(g, NULL, &s));

  /* 3. Parameters (by their HuggingFace-style names) and inputs. */
  float w1d[HIDDEN * IN], b1d[HIDDEN], w2d[OUT * HIDDEN], b2d[OUT], xd[BATCH * IN];
  for (int i = 0; i < HIDDEN * IN; i++)
    w1d[i] = (float)((i * 7) % 11 - 5) / 10.0f;
  for (int i = 0; i < HIDDEN; i++)
    b1d[i] = 0.05f * (float)i;
  for (int i = 0; i < OUT * HIDDEN; i++)
    w2d[i] = (float)((i * 5) % 9 - 4) / 8.0f;
  b2d[0] = 0.1f;
  b2d[1] = -0.1f;
  for (int i = 0; i < BATCH * IN; i++)
    xd[i] = (float)i / 4.0f - 1.0f;
  CHECK(mn_session_set_parameter(s, "fc1.weight", w1d, HIDDEN * IN));
  CHECK(mn_session_set_parameter(s, "fc1.bias", b1d, HIDDEN));
  CHECK(mn_session_set_parameter(s, "fc2.weight", w2d, OUT * HIDDEN));
  CHECK(mn_session_set_parameter(s, "fc2.bias", b2d, OUT));
  CHECK(mn_session_set_input(s, "x", xd, BATCH * IN));

  /* 4. One step; wait makes its results readable and reports runtime errors. */
  CHECK(mn_session_step(s));
  CHECK(mn_session_wait(s));

  /* 5. Outputs, by index in the order given to mn_set_outputs. */
  float out[BATCH * OUT], want[BATCH * OUT];
  CHECK(mn_session_read_output_by_index(s, 0, out, BATCH * OUT));
  reference(xd, w1d, b1d, w2d, b2d, want);
  double max_diff = 0;
  for (int n = 0; n < BATCH; n++) {
    printf("x[%d] = (%5.2f, %5.2f, %5.2f) -> logits (%8.5f, %8.5f)\n", n, xd[n * IN],
           xd[n * IN + 1], xd[n * IN + 2], out[n * OUT], out[n * OUT + 1]);
    for (int o = 0; o < OUT; o++) {
      double d = fabs((double)out[n * OUT + o] - want[n * OUT + o]);
      if (!(d <= max_diff)) max_diff = d; /* NaN sticks */
    }
  }

  /* 6. What the session holds. */
  char summary[128];
  mn_memory_summary m = mn_session_memory_summary(s);
  mn_memory_summary_format(&m, summary, sizeof summary);
  printf("plan: %zu dispatches; memory: %s\n", mn_plan_num_dispatches(mn_session_plan(s)), summary);

  printf("max |logits - plain C| = %.3g\n", max_diff);
  if (!(max_diff <= 1e-5)) {
    fprintf(stderr, "mismatch against the plain C forward pass\n");
    goto fail;
  }
  rc = 0;
fail:
  mn_session_free(s);
  mn_graph_free(g);
  return rc;
}
