/* LoRA adapters on the model builders (mn_model_build_with, mn_lora_*): which layers get
 * adapters and what is frozen, the adapter path's gradients against finite differences, a
 * LoRA run whose loss falls while the base stays bitwise unchanged, and PEFT's files: the
 * adapter saved and loaded back, and the merged export that gives the adapted model's
 * logits through a plain model. All on the CPU backend. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/mn_test.h"
#include "tests/support/models.h"
#include "tests/support/session_util.h"
#include "tests/support/tmp_dir.h"

enum { BATCH = 2, SEQ = 8 };

static mn_lora_config lora(int64_t rank, float alpha, const char *targets) {
  mn_lora_config l = mn_lora_config_default();
  l.rank = rank;
  l.alpha = alpha;
  snprintf(l.target_modules, sizeof l.target_modules, "%s", targets);
  return l;
}

static mn_graph *build(const mn_model_config *c, const mn_lora_config *l) {
  mn_model_options o = {.lora = l};
  mn_graph *g = NULL;
  cr_assert_eq(mn_model_build_with(c, BATCH, SEQ, &o, &g), MN_OK, "%s", mn_last_error());
  return g;
}

static bool has_param(const mn_graph *g, const char *name, mn_node_info *info) {
  for (size_t i = 0; i < mn_graph_num_nodes(g); i++)
    if (mn_graph_node(g, (mn_node)i, info) == MN_OK && info->name && strcmp(info->name, name) == 0)
      return true;
  return false;
}

static size_t count_params(const mn_graph *g, const char *suffix) {
  size_t n = 0;
  mn_node_info info;
  for (size_t i = 0; i < mn_graph_num_nodes(g); i++)
    if (mn_graph_node(g, (mn_node)i, &info) == MN_OK && strcmp(info.op, "parameter") == 0) {
      size_t ln = strlen(info.name), ls = strlen(suffix);
      n += ln >= ls && strcmp(info.name + ln - ls, suffix) == 0;
    }
  return n;
}

/* input_ids, labels (and GPT-2's positions) from a repeating cycle, as test_models does. */
static void set_batch(mn_session *s, const mn_graph *g, int64_t vocab) {
  static const uint32_t cycle[5] = {3, 17, 29, 41, 8};
  uint32_t ids[BATCH * SEQ], labels[BATCH * SEQ];
  for (int r = 0; r < BATCH; r++)
    for (int t = 0; t < SEQ; t++) {
      ids[r * SEQ + t] = cycle[(r + t) % 5] % (uint32_t)vocab;
      labels[r * SEQ + t] = cycle[(r + t + 1) % 5] % (uint32_t)vocab;
    }
  cr_assert_eq(mn_session_set_input_u32(s, "input_ids", ids, BATCH * SEQ), MN_OK);
  cr_assert_eq(mn_session_set_input_u32(s, "labels", labels, BATCH * SEQ), MN_OK);
  cr_assert_eq(mn_model_prepare_session(g, s), MN_OK, "%s", mn_last_error());
}

static float step(mn_session *s) {
  cr_assert_eq(mn_session_step(s), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_wait(s), MN_OK, "%s", mn_last_error());
  return mn_session_read_loss(s);
}

/* Every lora_B gets values too (PEFT starts them at zero, which would hide A's gradient and
 * make every adapted model equal its base). */
static void randomize_b(const mn_graph *g, mn_session *s, uint64_t seed) {
  mn_rng r = mn_rng_new(seed);
  mn_node_info info;
  for (size_t i = 0; i < mn_graph_num_nodes(g); i++) {
    if (mn_graph_node(g, (mn_node)i, &info) != MN_OK || !info.name ||
        !strstr(info.name, ".lora_B.weight"))
      continue;
    size_t n = (size_t)mn_tensor_type_numel(&info.type);
    float *w = malloc(n * sizeof *w);
    mn_rng_fill(&r, w, n, -0.3f, 0.3f);
    cr_assert_eq(mn_session_set_parameter(s, info.name, w, n), MN_OK);
    free(w);
  }
}

/* ---------------------------------------------------------------- structure */

Test(lora, llama_targets_get_adapters_and_the_rest_is_frozen) {
  mn_model_config c = mn_test_tiny_llama();
  mn_lora_config l = lora(4, 8.0f, "q_proj, v_proj");
  mn_graph *g = build(&c, &l);
  mn_node_info info;
  cr_assert(has_param(g, "model.layers.1.self_attn.q_proj.lora_A.weight", &info));
  cr_assert(info.type.rank == 2 && info.type.shape[0] == 4 && info.type.shape[1] == 48);
  cr_assert(has_param(g, "model.layers.1.self_attn.v_proj.lora_B.weight", &info));
  cr_assert(info.type.shape[0] == 16 && info.type.shape[1] == 4, "v_proj's B is [kv_dim, r]");
  cr_assert(!has_param(g, "model.layers.0.self_attn.k_proj.lora_A.weight", &info));
  cr_assert_eq(count_params(g, ".lora_A.weight"), 4);
  cr_assert_eq(count_params(g, ".lora_B.weight"), 4);
  /* Optimizer state only for the adapters: 2 moments of 4 * (4*48 + 48*4 + 4*48 + 16*4). */
  mn_session *s = mn_test_session(g, MN_BACKEND_CPU, true);
  cr_assert_eq(mn_session_set_adamw(s, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f), MN_OK);
  size_t adapter_floats = 2 * (4 * 48 + 48 * 4) + 2 * (4 * 48 + 16 * 4);
  size_t adam = mn_session_memory_summary(s).adam_state_bytes;
  cr_assert_eq(adam, 2 * adapter_floats * sizeof(float), "adam state %zu bytes", adam);
  mn_session_free(s);
  mn_graph_free(g);
}

Test(lora, gpt2_all_linear_adapts_every_conv1d) {
  mn_model_config c = mn_test_tiny_gpt2();
  mn_lora_config l = lora(2, 4.0f, "all-linear");
  mn_graph *g = build(&c, &l);
  mn_node_info info;
  cr_assert_eq(count_params(g, ".lora_A.weight"), 8, "c_attn, attn.c_proj, c_fc, mlp.c_proj x 2");
  cr_assert(has_param(g, "transformer.h.0.attn.c_attn.lora_B.weight", &info));
  cr_assert(info.type.shape[0] == 96 && info.type.shape[1] == 2, "c_attn's B is [3D, r]");
  cr_assert(has_param(g, "transformer.h.1.mlp.c_proj.lora_A.weight", &info));
  cr_assert(info.type.shape[0] == 2 && info.type.shape[1] == 128, "mlp.c_proj's A is [r, I]");
  mn_graph_free(g);
  l = lora(2, 4.0f, "mlp.c_proj");
  g = build(&c, &l);
  cr_assert_eq(count_params(g, ".lora_A.weight"), 2, "a qualified target names one kind");
  mn_graph_free(g);
}

static void expect_refused(const mn_model_config *c, const mn_lora_config *l, const char *says) {
  mn_model_options o = {.lora = l};
  mn_graph *g = (mn_graph *)1;
  cr_assert_eq(mn_model_build_with(c, BATCH, SEQ, &o, &g), MN_ERR_INVALID_ARGUMENT);
  cr_assert_null(g);
  cr_assert(strstr(mn_last_error(), says), "\"%s\" should name %s", mn_last_error(), says);
}

Test(lora, bad_configurations_are_refused_by_name) {
  mn_model_config c = mn_test_tiny_llama();
  mn_lora_config l = lora(0, 8.0f, "q_proj");
  expect_refused(&c, &l, "rank 0");
  l = lora(4, 0.0f, "q_proj");
  expect_refused(&c, &l, "lora_alpha");
  l = lora(4, 8.0f, "q_proj,lm_head");
  expect_refused(&c, &l, "\"lm_head\"");
  l = lora(4, 8.0f, "c_attn");
  expect_refused(&c, &l, "\"c_attn\" matches no linear layer of Llama");
  l = lora(4, 8.0f, "layers.7.self_attn.q_proj");
  expect_refused(&c, &l, "name no layer");
  l = lora(4, 8.0f, " , ");
  expect_refused(&c, &l, "empty");
}

/* ---------------------------------------------------------------- gradients */

/* The adapters' gradients against central differences of the loss, 8 probes each. */
static void gradcheck(const mn_model_config *c0, const char *const *names, size_t num) {
  mn_model_config c = *c0;
  c.initializer_range = 0.3f;
  mn_lora_config l = lora(3, 6.0f, "all-linear");
  mn_graph *g = build(&c, &l);
  mn_session *s = mn_test_session(g, MN_BACKEND_CPU, true);
  cr_assert_eq(mn_model_init_parameters(&c, g, s, 5), MN_OK, "%s", mn_last_error());
  randomize_b(g, s, 6);
  set_batch(s, g, c.vocab_size);
  cr_assert_eq(mn_session_set_learning_rate(s, 0.0f), MN_OK);
  for (size_t i = 0; i < num; i++) {
    mn_node_info info;
    cr_assert(has_param(g, names[i], &info), "%s", names[i]);
    size_t n = (size_t)mn_tensor_type_numel(&info.type), at[8];
    for (size_t j = 0; j < 8; j++)
      at[j] = (j * 7919) % n;
    double rel = mn_test_fd_gradient_error(s, names[i], n, at, 8, 1e-2);
    cr_log_info("gradient of %s: relative error %.3g", names[i], rel);
    cr_assert_lt(rel, 5e-3, "gradient of %s: relative error %g", names[i], rel);
  }
  mn_session_free(s);
  mn_graph_free(g);
}

Test(lora, llama_adapter_gradients_match_finite_differences, .timeout = 120) {
  mn_model_config c = mn_test_tiny_llama();
  const char *names[] = {"model.layers.0.self_attn.q_proj.lora_A.weight",
                         "model.layers.0.self_attn.v_proj.lora_B.weight",
                         "model.layers.1.mlp.gate_proj.lora_A.weight",
                         "model.layers.1.mlp.down_proj.lora_B.weight"};
  gradcheck(&c, names, 4);
}

Test(lora, gpt2_adapter_gradients_match_finite_differences, .timeout = 120) {
  mn_model_config c = mn_test_tiny_gpt2();
  const char *names[] = {
      "transformer.h.0.attn.c_attn.lora_A.weight", "transformer.h.0.attn.c_attn.lora_B.weight",
      "transformer.h.1.mlp.c_fc.lora_B.weight", "transformer.h.1.mlp.c_proj.lora_A.weight"};
  gradcheck(&c, names, 4);
}

/* ---------------------------------------------------------------- training */

Test(lora, llama_lora_run_learns_and_leaves_the_base_bitwise_unchanged, .timeout = 120) {
  mn_model_config c = mn_test_tiny_llama();
  mn_lora_config l = lora(8, 16.0f, "all-linear");
  mn_graph *g = build(&c, &l);
  mn_session *s = mn_test_session(g, MN_BACKEND_CPU, true);
  /* A random base (std 0.3) that predicts the pattern badly, as a pretrained base predicts a
   * new task badly. */
  c.initializer_range = 0.3f;
  cr_assert_eq(mn_model_init_parameters(&c, g, s, 7), MN_OK, "%s", mn_last_error());
  set_batch(s, g, c.vocab_size);
  cr_assert_eq(mn_session_set_adamw(s, 1e-2f, 0.9f, 0.999f, 1e-8f, 0.01f), MN_OK);
  const char *base = "model.layers.1.mlp.up_proj.weight";
  size_t nw = 96 * 48;
  float *before = malloc(nw * sizeof *before), *after = malloc(nw * sizeof *after);
  cr_assert_eq(mn_session_read_param(s, base, before, nw), MN_OK);
  float first = step(s), last = first;
  for (int i = 1; i < 40; i++)
    last = step(s);
  cr_log_info("LoRA loss %.3f -> %.3f", first, last);
  cr_assert_lt(last, first / 3, "LoRA loss %g -> %g did not fall clearly", first, last);
  cr_assert_eq(mn_session_read_param(s, base, after, nw), MN_OK);
  cr_assert(memcmp(before, after, nw * sizeof *after) == 0, "the frozen base moved");
  free(before);
  free(after);
  mn_session_free(s);
  mn_graph_free(g);
}

/* ---------------------------------------------------------------- files */

static float *logits(mn_session *s, const mn_model_config *c) {
  size_t n = (size_t)(BATCH * SEQ * c->vocab_size);
  float *out = malloc(n * sizeof *out);
  cr_assert_eq(mn_session_step(s), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_wait(s), MN_OK);
  cr_assert_eq(mn_session_read_output_by_index(s, 1, out, n), MN_OK, "%s", mn_last_error());
  return out;
}

/* An adapted model with every adapter non-zero, as an inference session. */
static mn_session *adapted(const mn_model_config *c, const mn_graph *g) {
  mn_session *s = mn_test_session(g, MN_BACKEND_CPU, false);
  cr_assert_eq(mn_model_init_parameters(c, g, s, 11), MN_OK, "%s", mn_last_error());
  randomize_b(g, s, 12);
  set_batch(s, g, c->vocab_size);
  return s;
}

static void save_load_round_trip(const mn_model_config *c, const char *targets, const char *key) {
  mn_lora_config l = lora(4, 32.0f, targets);
  l.dropout = 0.0f;
  snprintf(l.base_model, sizeof l.base_model, "HuggingFaceTB/SmolLM2-135M");
  mn_graph *g = build(c, &l);
  mn_session *s = adapted(c, g);
  float *want = logits(s, c);
  mn_tmp_dir t = mn_tmp_dir_make("mn_lora");
  cr_assert_eq(mn_lora_save(s, g, &l, t.path), MN_OK, "%s", mn_last_error());
  mn_safetensors *st = NULL;
  cr_assert_eq(mn_safetensors_open(mn_tmp_path(&t, "adapter_model.safetensors"), &st), MN_OK);
  mn_safetensors_info info;
  cr_assert_eq(mn_safetensors_info_of(st, key, &info), MN_OK, "the file has no %s", key);
  cr_assert_eq(mn_safetensors_count(st), 2 * count_params(g, ".lora_A.weight"),
               "adapters only, nothing of the base");
  mn_safetensors_close(st);
  mn_lora_config back;
  cr_assert_eq(mn_lora_config_load(t.path, &back), MN_OK, "%s", mn_last_error());
  cr_assert(back.rank == 4 && back.alpha == 32.0f && back.dropout == 0.0f);
  cr_assert_str_eq(back.target_modules, l.target_modules);
  cr_assert_str_eq(back.base_model, "HuggingFaceTB/SmolLM2-135M");
  /* A fresh session with the same base and fresh adapters: loading gives back the logits. */
  mn_session *fresh = mn_test_session(g, MN_BACKEND_CPU, false);
  cr_assert_eq(mn_model_init_parameters(c, g, fresh, 11), MN_OK);
  set_batch(fresh, g, c->vocab_size);
  cr_assert_eq(mn_lora_load(fresh, g, t.path), MN_OK, "%s", mn_last_error());
  float *got = logits(fresh, c);
  size_t n = (size_t)(BATCH * SEQ * c->vocab_size);
  cr_assert(memcmp(got, want, n * sizeof *got) == 0, "the loaded adapter gives other logits");
  free(got);
  /* Onto a graph with other targets, the file does not fit: refused, naming a tensor. */
  mn_lora_config other = lora(4, 32.0f, c->family == MN_MODEL_GPT2 ? "c_fc" : "k_proj");
  mn_graph *g2 = build(c, &other);
  mn_session *s2 = mn_test_session(g2, MN_BACKEND_CPU, false);
  cr_assert_eq(mn_lora_load(s2, g2, t.path), MN_ERR_NOT_FOUND);
  mn_session_free(s2);
  mn_graph_free(g2);
  /* Another rank: a shape error. */
  other = lora(2, 32.0f, targets);
  g2 = build(c, &other);
  s2 = mn_test_session(g2, MN_BACKEND_CPU, false);
  cr_assert_eq(mn_lora_load(s2, g2, t.path), MN_ERR_SHAPE);
  cr_assert(strstr(mn_last_error(), "lora_"), "%s", mn_last_error());
  mn_session_free(s2);
  mn_graph_free(g2);
  mn_tmp_dir_remove(&t);
  free(want);
  mn_session_free(fresh);
  mn_session_free(s);
  mn_graph_free(g);
}

Test(lora, llama_adapter_saves_in_peft_layout_and_loads_back) {
  mn_model_config c = mn_test_tiny_llama();
  save_load_round_trip(&c, "q_proj,v_proj,down_proj",
                       "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight");
}

Test(lora, gpt2_adapter_saves_in_peft_layout_and_loads_back) {
  mn_model_config c = mn_test_tiny_gpt2();
  save_load_round_trip(&c, "c_attn,c_proj",
                       "base_model.model.transformer.h.0.attn.c_proj.lora_A.weight");
}

/* The merged export through a plain model (no adapters) gives the adapted model's logits. */
static void merged_equals_adapted(const mn_model_config *c) {
  mn_lora_config l = lora(4, 8.0f, "all-linear");
  mn_graph *g = build(c, &l);
  mn_session *s = adapted(c, g);
  float *want = logits(s, c);
  mn_tmp_dir t = mn_tmp_dir_make("mn_lora_merge");
  const char *path = mn_tmp_path(&t, "model.safetensors");
  cr_assert_eq(mn_lora_save_merged(s, g, &l, path), MN_OK, "%s", mn_last_error());
  float *again = logits(s, c);
  size_t n = (size_t)(BATCH * SEQ * c->vocab_size);
  cr_assert(memcmp(again, want, n * sizeof *again) == 0, "merging changed the session");
  mn_graph *plain = build(c, NULL);
  mn_session *p = mn_test_session(plain, MN_BACKEND_CPU, false);
  cr_assert_eq(mn_session_load_safetensors_flags(p, path, MN_LOAD_STRICT), MN_OK, "%s",
               mn_last_error());
  set_batch(p, plain, c->vocab_size);
  float *got = logits(p, c);
  double rel = mn_test_rel_err(got, want, n);
  cr_log_info("merged against adapted logits: relative error %.3g", rel);
  cr_assert_lt(rel, 1e-5, "merged logits differ by %g", rel);
  /* and the adapters do matter: the base alone is far from them */
  mn_session *base = mn_test_session(plain, MN_BACKEND_CPU, false);
  cr_assert_eq(mn_model_init_parameters(c, plain, base, 11), MN_OK);
  set_batch(base, plain, c->vocab_size);
  float *base_logits = logits(base, c);
  cr_assert_gt(mn_test_rel_err(base_logits, want, n), 1e-2);
  free(base_logits);
  free(got);
  free(again);
  free(want);
  mn_tmp_dir_remove(&t);
  mn_session_free(base);
  mn_session_free(p);
  mn_graph_free(plain);
  mn_session_free(s);
  mn_graph_free(g);
}

Test(lora, llama_merged_export_gives_the_adapted_logits) {
  mn_model_config c = mn_test_tiny_llama();
  merged_equals_adapted(&c);
}

Test(lora, gpt2_merged_export_transposes_for_conv1d) {
  mn_model_config c = mn_test_tiny_gpt2();
  merged_equals_adapted(&c);
}

Test(lora, base_checkpoint_loads_under_adapters_with_strict_frozen) {
  mn_model_config c = mn_test_tiny_llama();
  mn_graph *plain = build(&c, NULL);
  mn_session *p = mn_test_session(plain, MN_BACKEND_CPU, false);
  cr_assert_eq(mn_model_init_parameters(&c, plain, p, 3), MN_OK);
  mn_tmp_dir t = mn_tmp_dir_make("mn_lora_base");
  const char *path = mn_tmp_path(&t, "model.safetensors");
  cr_assert_eq(mn_session_save_safetensors(p, path), MN_OK, "%s", mn_last_error());
  mn_lora_config l = lora(4, 8.0f, "q_proj");
  mn_graph *g = build(&c, &l);
  mn_session *s = mn_test_session(g, MN_BACKEND_CPU, true);
  cr_assert_eq(mn_session_load_safetensors_flags(s, path, MN_LOAD_STRICT), MN_ERR_NOT_FOUND);
  cr_assert_eq(mn_session_load_safetensors_flags(s, path, MN_LOAD_STRICT_FROZEN), MN_OK, "%s",
               mn_last_error());
  /* A base file missing a frozen weight is still refused. */
  mn_graph *g2 = build(&c, &l);
  const char *names[] = {"model.embed_tokens.weight"};
  const char *small = mn_tmp_path(&t, "partial.safetensors");
  cr_assert_eq(mn_session_save_parameters(p, small, names, NULL, 1), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_load_safetensors_flags(s, small, MN_LOAD_STRICT_FROZEN),
               MN_ERR_NOT_FOUND);
  cr_assert(strstr(mn_last_error(), "frozen"), "%s", mn_last_error());
  mn_graph_free(g2);
  mn_tmp_dir_remove(&t);
  mn_session_free(s);
  mn_graph_free(g);
  mn_session_free(p);
  mn_graph_free(plain);
}

Test(lora, dropout_masks_the_adapter_input_in_training_only) {
  mn_model_config c = mn_test_tiny_llama();
  mn_lora_config with = lora(4, 8.0f, "q_proj,up_proj"), without = with;
  with.dropout = 0.5f;
  mn_graph *g = build(&c, &with), *plain = build(&c, &without);
  /* Inference: the identity, so the logits are those of the adapter without dropout. */
  mn_session *s = adapted(&c, g), *p = adapted(&c, plain);
  float *got = logits(s, &c), *want = logits(p, &c);
  size_t n = (size_t)(BATCH * SEQ * c.vocab_size);
  cr_assert(memcmp(got, want, n * sizeof *got) == 0, "dropout changed an inference session");
  free(got);
  free(want);
  mn_session_free(s);
  mn_session_free(p);
  /* Training with the learning rate at 0: each step draws new masks, so the losses differ. */
  mn_session *t = mn_test_session(g, MN_BACKEND_CPU, true);
  cr_assert_eq(mn_model_init_parameters(&c, g, t, 11), MN_OK);
  randomize_b(g, t, 12);
  set_batch(t, g, c.vocab_size);
  cr_assert_eq(mn_session_set_learning_rate(t, 0.0f), MN_OK);
  float l1 = step(t), l2 = step(t);
  cr_assert_neq(l1, l2, "two training steps drew the same dropout masks");
  mn_session_free(t);
  mn_graph_free(plain);
  mn_graph_free(g);
}

/* ---------------------------------------------------------------- error paths */

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  cr_assert_not_null(f);
  fputs(text, f);
  fclose(f);
}

Test(lora, adapter_config_errors_name_the_key) {
  mn_tmp_dir t = mn_tmp_dir_make("mn_lora_cfg");
  const char *cfg = mn_tmp_path(&t, "adapter_config.json");
  mn_lora_config l = lora(4, 8.0f, "q_proj");
  mn_assert_error(mn_lora_config_load(t.path, &l), MN_ERR_IO, "adapter_config.json");
  struct {
    const char *json, *says;
    mn_status st;
  } bad[] = {
      {"{\"peft_type\": \"PREFIX_TUNING\"}", "peft_type is not \"LORA\"", MN_ERR_UNSUPPORTED},
      {"{\"peft_type\": \"LORA\", \"r\": 8, \"lora_alpha\": 16, \"use_dora\": true, "
       "\"target_modules\": [\"q_proj\"]}",
       "use_dora is not supported", MN_ERR_UNSUPPORTED},
      {"{\"peft_type\": \"LORA\", \"r\": 8, \"lora_alpha\": 16, \"bias\": \"all\", "
       "\"target_modules\": [\"q_proj\"]}",
       "bias other than \"none\"", MN_ERR_UNSUPPORTED},
      {"{\"peft_type\": \"LORA\", \"r\": 8, \"lora_alpha\": 16, \"target_modules\": \".*q\"}",
       "is a regular expression", MN_ERR_UNSUPPORTED},
      {"{\"peft_type\": \"LORA\", \"r\": 0.5, \"lora_alpha\": 16, \"target_modules\": [\"q\"]}",
       "r is not an integer", MN_ERR_FORMAT},
      {"{\"peft_type\": \"LORA\", \"r\": 8, \"target_modules\": [\"q_proj\"]}",
       "lora_alpha is not a positive number", MN_ERR_FORMAT},
      {"{\"peft_type\": \"LORA\", \"r\": 8, \"lora_alpha\": 16, \"lora_dropout\": 1.5, "
       "\"target_modules\": [\"q_proj\"]}",
       "lora_dropout is not a number in [0, 1)", MN_ERR_FORMAT},
      {"{\"peft_type\": \"LORA\", \"r\": 8, \"lora_alpha\": 16, \"target_modules\": []}",
       "target_modules is not a non-empty list", MN_ERR_FORMAT},
      {"{\"peft_type\": \"LORA\"", "", MN_ERR_FORMAT},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    write_file(cfg, bad[i].json);
    mn_lora_config before = l;
    cr_assert_eq(mn_lora_config_load(t.path, &l), bad[i].st, "case %zu: %s", i, mn_last_error());
    cr_assert(strstr(mn_last_error(), bad[i].says), "case %zu: %s", i, mn_last_error());
    cr_assert(memcmp(&before, &l, sizeof l) == 0, "case %zu changed the config", i);
  }
  mn_tmp_dir_remove(&t);
}

Test(lora, save_and_load_refuse_graphs_without_adapters_and_null_arguments) {
  mn_model_config c = mn_test_tiny_llama();
  mn_lora_config l = lora(4, 8.0f, "q_proj");
  mn_graph *plain = build(&c, NULL);
  mn_session *s = mn_test_session(plain, MN_BACKEND_CPU, false);
  mn_tmp_dir t = mn_tmp_dir_make("mn_lora_err");
  mn_assert_error(mn_lora_save(s, plain, &l, t.path), MN_ERR_INVALID_ARGUMENT,
                  "the graph has no LoRA adapters");
  mn_assert_error(mn_lora_load(s, plain, t.path), MN_ERR_INVALID_ARGUMENT,
                  "the graph has no LoRA adapters");
  mn_assert_error(mn_lora_save_merged(s, plain, &l, mn_tmp_path(&t, "m.safetensors")),
                  MN_ERR_INVALID_ARGUMENT, "the graph has no LoRA adapters");
  mn_assert_error(mn_lora_save(NULL, plain, &l, t.path), MN_ERR_INVALID_ARGUMENT,
                  "session is NULL");
  mn_assert_error(mn_lora_save_merged(s, plain, NULL, "x"), MN_ERR_INVALID_ARGUMENT,
                  "lora is NULL");
  mn_graph *g = build(&c, &l);
  mn_session *a = mn_test_session(g, MN_BACKEND_CPU, false);
  mn_assert_error(mn_lora_load(a, g, t.path), MN_ERR_IO, "adapter_model.safetensors");
  mn_tmp_dir_remove(&t);
  mn_session_free(a);
  mn_graph_free(g);
  mn_session_free(s);
  mn_graph_free(plain);
}

Test(lora, save_parameters_refuses_unknown_names_and_bad_keys) {
  mn_model_config c = mn_test_tiny_llama();
  mn_graph *g = build(&c, NULL);
  mn_session *s = mn_test_session(g, MN_BACKEND_CPU, false);
  mn_tmp_dir t = mn_tmp_dir_make("mn_save_params");
  const char *path = mn_tmp_path(&t, "p.safetensors");
  const char *names[] = {"model.norm.weight", "model.embed_tokens.weight"};
  const char *dup[] = {"a", "a"}, *empty[] = {"a", ""};
  const char *unknown[] = {"model.nope.weight"};
  mn_assert_error(mn_session_save_parameters(s, path, unknown, NULL, 1), MN_ERR_NOT_FOUND,
                  "no parameter \"model.nope.weight\"");
  mn_assert_error(mn_session_save_parameters(s, path, names, dup, 2), MN_ERR_INVALID_ARGUMENT,
                  "the key \"a\" is given twice");
  mn_assert_error(mn_session_save_parameters(s, path, names, empty, 2), MN_ERR_INVALID_ARGUMENT,
                  "is empty");
  mn_assert_error(mn_session_save_parameters(s, NULL, names, NULL, 2), MN_ERR_INVALID_ARGUMENT,
                  "path is NULL");
  cr_assert_eq(mn_tmp_dir_count(&t, NULL), 0, "a refused save wrote a file");
  const char *keys[] = {"norm", "embed"};
  cr_assert_eq(mn_session_save_parameters(s, path, names, keys, 2), MN_OK, "%s", mn_last_error());
  mn_safetensors *st = NULL;
  cr_assert_eq(mn_safetensors_open(path, &st), MN_OK);
  cr_assert_eq(mn_safetensors_count(st), 2);
  mn_safetensors_info info;
  cr_assert_eq(mn_safetensors_info_of(st, "embed", &info), MN_OK);
  cr_assert(info.shape[0] == c.vocab_size && info.shape[1] == c.hidden_size);
  mn_safetensors_close(st);
  mn_tmp_dir_remove(&t);
  mn_session_free(s);
  mn_graph_free(g);
}
