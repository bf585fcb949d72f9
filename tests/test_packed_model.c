/* Packed rows in the model builders (mn_model_options.packed): examples packed into one row
 * with position ids that restart at 0 train exactly as the same examples one per row, padded
 * with ignored labels: the same loss and the same gradient of every parameter, for GPT-2
 * (learned positions) and Llama (RoPE at the position ids). CPU backend. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/mn_test.h"
#include "tests/support/session_util.h"

enum { T = 16, NEX = 3 };
static const int LEN[NEX] = {5, 3, 8}; /* 16 tokens: one packed row, or 3 rows of 8 */

static mn_model_config tiny(mn_model_family f) {
  mn_model_config c = {.family = f,
                       .vocab_size = 40,
                       .hidden_size = 32,
                       .num_layers = 2,
                       .num_heads = 4,
                       .num_kv_heads = f == MN_MODEL_GPT2 ? 4 : 2,
                       .head_dim = 8,
                       .intermediate_size = 64,
                       .max_positions = 16,
                       .norm_eps = 1e-5f,
                       .rope_theta = 10000.0f,
                       .initializer_range = 0.3f,
                       .tie_word_embeddings = f == MN_MODEL_GPT2};
  return c;
}

static mn_session *session(const mn_model_config *c, int64_t b, int64_t t, bool packed,
                           mn_graph **g) {
  mn_model_options o = {.packed = packed};
  cr_assert_eq(mn_model_build_with(c, b, t, &o, g), MN_OK, "%s", mn_last_error());
  mn_session *s = mn_test_session(*g, MN_BACKEND_CPU, true);
  cr_assert_eq(mn_model_init_parameters(c, *g, s, 17), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_set_learning_rate(s, 0.0f), MN_OK);
  return s;
}

static void set(mn_session *s, const char *name, const uint32_t *v, size_t n) {
  cr_assert_eq(mn_session_set_input_u32(s, name, v, n), MN_OK, "%s", mn_last_error());
}

static void check(mn_model_family f) {
  mn_model_config c = tiny(f);
  uint32_t tok[T];
  for (int i = 0; i < T; i++)
    tok[i] = (uint32_t)((i * 7 + 3) % c.vocab_size);
  /* Packed: one row; each example's last token predicts nothing. */
  uint32_t ids[T], labels[T], pos[T];
  for (int e = 0, at = 0; e < NEX; at += LEN[e++])
    for (int t = 0; t < LEN[e]; t++) {
      ids[at + t] = tok[at + t];
      labels[at + t] = t + 1 < LEN[e] ? tok[at + t + 1] : MN_IGNORE_LABEL;
      pos[at + t] = (uint32_t)t;
    }
  mn_graph *gp = NULL, *gu = NULL;
  mn_session *p = session(&c, 1, T, true, &gp);
  set(p, "input_ids", ids, T);
  set(p, "labels", labels, T);
  set(p, "position_ids", pos, T);
  /* Unpacked: one example per row of 8, padded with ignored labels. */
  uint32_t uids[NEX * 8], ulabels[NEX * 8];
  for (int i = 0; i < NEX * 8; i++)
    uids[i] = 0, ulabels[i] = MN_IGNORE_LABEL;
  for (int e = 0, at = 0; e < NEX; at += LEN[e++])
    for (int t = 0; t < LEN[e]; t++) {
      uids[e * 8 + t] = ids[at + t];
      ulabels[e * 8 + t] = labels[at + t];
    }
  mn_session *u = session(&c, NEX, 8, false, &gu);
  cr_assert_eq(mn_model_prepare_session(gu, u), MN_OK);
  set(u, "input_ids", uids, NEX * 8);
  set(u, "labels", ulabels, NEX * 8);
  float lp = mn_test_step_loss(p), lu = mn_test_step_loss(u);
  cr_log_info("packed loss %.7f, unpacked %.7f", lp, lu);
  cr_assert_lt(fabs(lp - lu), 1e-6 * fabs(lu), "packed loss %g, unpacked %g", lp, lu);
  mn_node_info info;
  size_t checked = 0;
  for (size_t i = 0; i < mn_graph_num_nodes(gp); i++) {
    if (mn_graph_node(gp, (mn_node)i, &info) != MN_OK || strcmp(info.op, "parameter")) continue;
    size_t n = (size_t)mn_tensor_type_numel(&info.type);
    float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
    cr_assert_eq(mn_session_read_grad(p, info.name, a, n), MN_OK);
    cr_assert_eq(mn_session_read_grad(u, info.name, b, n), MN_OK);
    double rel = mn_test_rel_err(a, b, n);
    cr_assert_lt(rel, 1e-5, "gradient of %s: packed and unpacked differ by %g", info.name, rel);
    checked++;
    free(a);
    free(b);
  }
  cr_assert_gt(checked, 10);
  mn_session_free(p);
  mn_session_free(u);
  mn_graph_free(gp);
  mn_graph_free(gu);
}

Test(packed_model, llama_packed_row_equals_its_examples_one_per_row) { check(MN_MODEL_LLAMA); }

Test(packed_model, gpt2_packed_row_equals_its_examples_one_per_row) { check(MN_MODEL_GPT2); }

Test(packed_model, llama_packed_declares_position_ids) {
  mn_model_config c = tiny(MN_MODEL_LLAMA);
  mn_graph *g = NULL;
  mn_model_options o = {.packed = true};
  cr_assert_eq(mn_model_build_with(&c, 2, 8, &o, &g), MN_OK, "%s", mn_last_error());
  size_t attention = 0, inputs = 0;
  mn_node_info info;
  for (size_t i = 0; i < mn_graph_num_nodes(g); i++) {
    cr_assert_eq(mn_graph_node(g, (mn_node)i, &info), MN_OK);
    attention += strcmp(info.op, "causal_attention_packed") == 0;
    inputs += strcmp(info.op, "input") == 0 && strcmp(info.name, "position_ids") == 0;
  }
  cr_assert_eq(attention, 2);
  cr_assert_eq(inputs, 1);
  mn_graph_free(g);
}
