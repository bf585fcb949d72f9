/* Training an MLP with meganeura: a 2-16-2 network learns XOR-like quadrants with
 * AdamW, then reports its accuracy. Runs on the GPU when one is usable, else on the
 * CPU reference backend. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "meganeura.h"

#define BATCH  64
#define HIDDEN 16

static float uniform(unsigned *state) {
  *state = *state * 1664525u + 1013904223u;
  return (float)(*state >> 8) / 16777216.0f * 2.0f - 1.0f;
}

static int check(mn_status st, const char *what) {
  if (st == MN_OK) return 0;
  fprintf(stderr, "%s failed: %s (%s)\n", what, mn_last_error(), mn_status_string(st));
  return 1;
}

int main(void) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(BATCH, 2));
  mn_node labels = mn_input_u32(g, "labels", MN_SHAPE(BATCH));
  mn_node w1 = mn_parameter(g, "fc1.weight", MN_SHAPE(HIDDEN, 2));
  mn_node b1 = mn_parameter(g, "fc1.bias", MN_SHAPE(HIDDEN));
  mn_node w2 = mn_parameter(g, "fc2.weight", MN_SHAPE(2, HIDDEN));
  mn_node b2 = mn_parameter(g, "fc2.bias", MN_SHAPE(2));
  mn_node h = mn_tanh(g, mn_bias_add(g, mn_matmul_bt(g, x, w1), b1));
  mn_node logits = mn_bias_add(g, mn_matmul_bt(g, h, w2), b2);
  mn_node outputs[2] = {mn_sparse_cross_entropy_loss(g, logits, labels), logits};
  mn_set_outputs(g, outputs, 2);

  mn_session *s = NULL;
  if (check(mn_build_session(g, NULL, &s), "mn_build_session")) return 1;
  unsigned seed = 1;
  float w1v[HIDDEN * 2], b1v[HIDDEN] = {0}, w2v[2 * HIDDEN], b2v[2] = {0};
  for (int i = 0; i < HIDDEN * 2; i++)
    w1v[i] = uniform(&seed);
  for (int i = 0; i < 2 * HIDDEN; i++)
    w2v[i] = 0.25f * uniform(&seed);
  int bad = check(mn_session_set_parameter(s, "fc1.weight", w1v, HIDDEN * 2), "set fc1.weight") ||
            check(mn_session_set_parameter(s, "fc1.bias", b1v, HIDDEN), "set fc1.bias") ||
            check(mn_session_set_parameter(s, "fc2.weight", w2v, 2 * HIDDEN), "set fc2.weight") ||
            check(mn_session_set_parameter(s, "fc2.bias", b2v, 2), "set fc2.bias") ||
            check(mn_session_set_adamw(s, 0.03f, 0.9f, 0.999f, 1e-8f, 0.01f), "set_adamw");

  float xs[BATCH * 2], out[BATCH * 2];
  uint32_t ys[BATCH];
  int correct = 0;
  for (int step = 0; step < 300 && !bad; step++) {
    for (int i = 0; i < BATCH; i++) {
      xs[2 * i] = uniform(&seed);
      xs[2 * i + 1] = uniform(&seed);
      ys[i] = (xs[2 * i] > 0) != (xs[2 * i + 1] > 0); /* 1 in the 2nd and 4th quadrants */
    }
    bad = check(mn_session_set_input(s, "x", xs, BATCH * 2), "set_input") ||
          check(mn_session_set_input_u32(s, "labels", ys, BATCH), "set_input_u32") ||
          check(mn_session_step(s), "step") || check(mn_session_wait(s), "wait");
    if (!bad && step % 50 == 0) printf("step %3d  loss %.4f\n", step, mn_session_read_loss(s));
    if (!bad && step == 299) {
      bad = check(mn_session_read_output_by_index(s, 1, out, BATCH * 2), "read_output");
      for (int i = 0; i < BATCH; i++)
        correct += (out[2 * i + 1] > out[2 * i]) == (ys[i] == 1);
    }
  }
  if (!bad) {
    char summary[128];
    mn_memory_summary m = mn_session_memory_summary(s);
    mn_memory_summary_format(&m, summary, sizeof summary);
    printf("final loss %.4f, accuracy on the last batch %d/%d\nmemory: %s\n",
           mn_session_read_loss(s), correct, BATCH, summary);
  }
  mn_session_free(s);
  mn_graph_free(g);
  return bad || correct < BATCH * 9 / 10;
}
