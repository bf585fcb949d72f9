/* Learning checks on the CPU backend: an MLP reaches > 95% held-out accuracy on a
 * synthetic classification task, and a 2-layer transformer language model overfits a
 * short text (loss < 0.1). Each runs in a few seconds. */
#include <stdlib.h>

#include "tests/support/mn_test.h"
#include "tests/support/models.h"
#include "tests/support/session_util.h"

enum { FEATURES = 8, CLASSES = 4, HIDDEN = 32, BATCH = 256 };

/* Class c's points scatter around a fixed random centre. */
static void make_blobs(mn_rng *r, const float *centres, float *x, uint32_t *labels, float *onehot) {
  for (int i = 0; i < BATCH; i++) {
    int c = (int)(mn_rng_uniform(r) * CLASSES);
    labels[i] = (uint32_t)c;
    for (int k = 0; k < CLASSES; k++)
      onehot[i * CLASSES + k] = k == c ? 1.0f : 0.0f;
    for (int f = 0; f < FEATURES; f++)
      x[i * FEATURES + f] = centres[c * FEATURES + f] + 0.7f * (float)mn_rng_normal(r);
  }
}

static void init_uniform(mn_session *s, mn_rng *r, const char *name, size_t n, float scale) {
  float *w = malloc(n * sizeof *w);
  mn_rng_fill(r, w, n, -scale, scale);
  cr_assert_eq(mn_session_set_parameter(s, name, w, n), MN_OK, "%s", mn_last_error());
  free(w);
}

Test(learning, mlp_classifies_blobs) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(BATCH, FEATURES));
  mn_node t = mn_input(g, "targets", MN_SHAPE(BATCH, CLASSES));
  mn_node w1 = mn_parameter(g, "fc1.weight", MN_SHAPE(HIDDEN, FEATURES));
  mn_node b1 = mn_parameter(g, "fc1.bias", MN_SHAPE(HIDDEN));
  mn_node w2 = mn_parameter(g, "fc2.weight", MN_SHAPE(CLASSES, HIDDEN));
  mn_node b2 = mn_parameter(g, "fc2.bias", MN_SHAPE(CLASSES));
  mn_node h = mn_relu(g, mn_bias_add(g, mn_matmul_bt(g, x, w1), b1));
  mn_node logits = mn_bias_add(g, mn_matmul_bt(g, h, w2), b2);
  mn_node outs[2] = {mn_cross_entropy_loss(g, logits, t), logits};
  mn_set_outputs(g, outs, 2);
  mn_session *s = mn_test_session(g, MN_BACKEND_CPU, true);

  mn_rng r = mn_rng_new(11);
  float centres[CLASSES * FEATURES];
  mn_rng_fill(&r, centres, CLASSES * FEATURES, -2, 2);
  init_uniform(s, &r, "fc1.weight", HIDDEN * FEATURES, 0.35f);
  init_uniform(s, &r, "fc1.bias", HIDDEN, 0.1f);
  init_uniform(s, &r, "fc2.weight", CLASSES * HIDDEN, 0.17f);
  init_uniform(s, &r, "fc2.bias", CLASSES, 0.1f);
  cr_assert_eq(mn_session_set_adam(s, 0.01f, 0.9f, 0.999f, 1e-8f), MN_OK);

  static float xs[BATCH * FEATURES], onehot[BATCH * CLASSES], logit_buf[BATCH * CLASSES];
  static uint32_t labels[BATCH];
  float first = 0, last = 0;
  for (int step = 0; step < 150; step++) {
    make_blobs(&r, centres, xs, labels, onehot);
    mn_session_set_input(s, "x", xs, BATCH * FEATURES);
    mn_session_set_input(s, "targets", onehot, BATCH * CLASSES);
    cr_assert_eq(mn_session_step(s), MN_OK);
    cr_assert_eq(mn_session_wait(s), MN_OK, "%s", mn_last_error());
    last = mn_session_read_loss(s);
    if (step == 0) first = last;
  }
  cr_assert_lt(last, first * 0.5f, "loss did not fall: %g -> %g", first, last);

  /* Held-out batch through an inference session carrying the trained weights. */
  mn_session *inf = mn_test_session(g, MN_BACKEND_CPU, false);
  const char *names[] = {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"};
  size_t sizes[] = {HIDDEN * FEATURES, HIDDEN, CLASSES * HIDDEN, CLASSES};
  float *buf = malloc(HIDDEN * FEATURES * sizeof *buf);
  for (int i = 0; i < 4; i++) {
    cr_assert_eq(mn_session_read_param(s, names[i], buf, sizes[i]), MN_OK);
    cr_assert_eq(mn_session_set_parameter(inf, names[i], buf, sizes[i]), MN_OK);
  }
  free(buf);
  make_blobs(&r, centres, xs, labels, onehot);
  mn_session_set_input(inf, "x", xs, BATCH * FEATURES);
  mn_session_set_input(inf, "targets", onehot, BATCH * CLASSES);
  cr_assert_eq(mn_session_step(inf), MN_OK);
  cr_assert_eq(mn_session_wait(inf), MN_OK);
  cr_assert_eq(mn_session_read_output_by_index(inf, 1, logit_buf, BATCH * CLASSES), MN_OK);
  int correct = 0;
  for (int i = 0; i < BATCH; i++) {
    int best = 0;
    for (int k = 1; k < CLASSES; k++)
      if (logit_buf[i * CLASSES + k] > logit_buf[i * CLASSES + best]) best = k;
    correct += best == (int)labels[i];
  }
  double accuracy = (double)correct / BATCH;
  cr_assert_gt(accuracy, 0.95, "held-out accuracy %.3f", accuracy);
  mn_session_free(inf);
  mn_session_free(s);
  mn_graph_free(g);
}

Test(learning, transformer_overfits_text) {
  static const char text[] = "meganeura trains transformers on gpus; the cpu checks them.";
  enum { B = 2, T = 24, LAYERS = 2 };
  /* vocabulary: the distinct bytes of the text */
  int vocab_of[256], vocab = 0;
  for (int i = 0; i < 256; i++)
    vocab_of[i] = -1;
  for (const char *p = text; *p; p++)
    if (vocab_of[(unsigned char)*p] < 0) vocab_of[(unsigned char)*p] = vocab++;
  const mn_test_block_config cfg = MN_TEST_BLOCK_CONFIG(32, 4, 2, 8, 64);
  mn_graph *g = mn_test_lm(&cfg, B, T, vocab, LAYERS);
  cr_assert_eq(mn_graph_status(g), MN_OK, "%s", mn_graph_error(g));
  mn_session *s = mn_test_session(g, MN_BACKEND_CPU, true);

  /* Norm weights (the rank-1 parameters) at 1, the others normal(0, 0.08). */
  mn_rng r = mn_rng_new(5);
  mn_test_init_normal(g, &s, 1, &r, 0.08f, true);
  uint32_t tok[B * T], lab[B * T];
  int len = (int)sizeof text - 1;
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++) {
      int start = b * (len - T - 1);
      tok[b * T + t] = (uint32_t)vocab_of[(unsigned char)text[start + t]];
      lab[b * T + t] = (uint32_t)vocab_of[(unsigned char)text[start + t + 1]];
    }
  mn_session_set_input_u32(s, "tokens", tok, B * T);
  mn_session_set_input_u32(s, "labels", lab, B * T);
  cr_assert_eq(mn_session_set_adamw(s, 1e-2f, 0.9f, 0.99f, 1e-8f, 0.0f), MN_OK);
  float loss_value = 0, first = 0;
  for (int step = 0; step < 300 && (step == 0 || loss_value >= 0.05f); step++) {
    cr_assert_eq(mn_session_step(s), MN_OK);
    cr_assert_eq(mn_session_wait(s), MN_OK, "%s", mn_last_error());
    loss_value = mn_session_read_loss(s);
    if (step == 0) first = loss_value;
  }
  cr_log_info("transformer: loss %g -> %g", first, loss_value);
  cr_assert_lt(loss_value, 0.1f, "loss %g (from %g) did not get below 0.1", loss_value, first);
  mn_session_free(s);
  mn_graph_free(g);
}
