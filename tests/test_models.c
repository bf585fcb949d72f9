/* The models of models/ built from configs: parameter names and shapes exactly as
 * transformers has them (with and without the base-model prefix, tied and untied heads),
 * a tiny GPT-2 and a tiny Llama trained on the CPU until the loss clearly falls, gradients of
 * the whole models against finite differences, a save / load round trip with identical
 * logits, and the CUDA kernels of both training graphs (NVRTC compile here, a comparison
 * with the reference backend on a GPU). Config parsing is in test_model_config.c. */
#include <stdio.h>
#include <stdlib.h>

#include "tests/support/cuda_check.h"
#include "tests/support/mn_test.h"
#include "tests/support/models.h"
#include "tests/support/session_util.h"
#include "tests/support/tmp_dir.h"

static mn_graph *build(const mn_model_config *c, int64_t b, int64_t t, const char *prefix) {
  mn_graph *g = NULL;
  cr_assert_eq(mn_model_build(c, b, t, prefix, &g), MN_OK, "%s", mn_last_error());
  return g;
}

/* ---------------------------------------------------------------- structure */

typedef struct expect_param {
  const char *name;
  int rank;
  int64_t shape[2];
} expect_param;

/* Asserts that g's parameters are exactly `want`, in order, with their shapes. */
static void assert_params(const mn_graph *g, const expect_param *want, size_t n) {
  size_t k = 0;
  mn_node_info info;
  for (size_t i = 0; i < mn_graph_num_nodes(g); i++) {
    cr_assert_eq(mn_graph_node(g, (mn_node)i, &info), MN_OK);
    if (strcmp(info.op, "parameter") != 0) continue;
    cr_assert_lt(k, n, "extra parameter %s", info.name);
    cr_assert_str_eq(info.name, want[k].name);
    cr_assert_eq(info.type.rank, want[k].rank, "%s", info.name);
    for (int d = 0; d < want[k].rank; d++)
      cr_assert_eq(info.type.shape[d], want[k].shape[d], "%s dim %d", info.name, d);
    k++;
  }
  cr_assert_eq(k, n, "%zu parameters, expected %zu", k, n);
}

/* HF GPT-2 names under prefix p for tiny_gpt2 (D 32, I 128, V 50, P 16). */
static size_t gpt2_names(const char *p, char names[][64], expect_param *out) {
  static const struct {
    const char *what;
    int rank;
    int64_t a, b;
  } block[] = {{"ln_1.weight", 1, 32, 0},         {"ln_1.bias", 1, 32, 0},
               {"attn.c_attn.weight", 2, 32, 96}, {"attn.c_attn.bias", 1, 96, 0},
               {"attn.c_proj.weight", 2, 32, 32}, {"attn.c_proj.bias", 1, 32, 0},
               {"ln_2.weight", 1, 32, 0},         {"ln_2.bias", 1, 32, 0},
               {"mlp.c_fc.weight", 2, 32, 128},   {"mlp.c_fc.bias", 1, 128, 0},
               {"mlp.c_proj.weight", 2, 128, 32}, {"mlp.c_proj.bias", 1, 32, 0}};
  size_t n = 0;
#define ADD(rank_, a_, b_, ...)                                                                    \
  do {                                                                                             \
    snprintf(names[n], 64, __VA_ARGS__);                                                           \
    out[n] = (expect_param){names[n], rank_, {a_, b_}};                                            \
    n++;                                                                                           \
  } while (0)
  ADD(2, 50, 32, "%swte.weight", p);
  ADD(2, 16, 32, "%swpe.weight", p);
  for (int i = 0; i < 2; i++)
    for (size_t k = 0; k < sizeof block / sizeof block[0]; k++)
      ADD(block[k].rank, block[k].a, block[k].b, "%sh.%d.%s", p, i, block[k].what);
  ADD(1, 32, 0, "%sln_f.weight", p);
  ADD(1, 32, 0, "%sln_f.bias", p);
  return n;
}

Test(models, gpt2_parameters_have_hf_names_and_layouts) {
  const char *prefixes[] = {"transformer.", "", NULL};
  for (int i = 0; i < 3; i++) {
    mn_model_config c = mn_test_tiny_gpt2();
    mn_graph *g = build(&c, 2, 8, prefixes[i]);
    char names[40][64];
    expect_param want[40];
    size_t n = gpt2_names(prefixes[i] ? prefixes[i] : "transformer.", names, want);
    assert_params(g, want, n);
    mn_graph_free(g);
    /* An untied head adds lm_head.weight [V, D], never prefixed. */
    c.tie_word_embeddings = false;
    g = build(&c, 2, 8, prefixes[i]);
    want[n++] = (expect_param){"lm_head.weight", 2, {50, 32}};
    assert_params(g, want, n);
    mn_graph_free(g);
  }
}

static size_t llama_names(const char *p, bool tied, char names[][64], expect_param *out) {
  static const struct {
    const char *what;
    int rank;
    int64_t a, b;
  } block[] = {{"self_attn.q_proj.weight", 2, 48, 48},       {"self_attn.k_proj.weight", 2, 16, 48},
               {"self_attn.v_proj.weight", 2, 16, 48},       {"self_attn.o_proj.weight", 2, 48, 48},
               {"mlp.gate_proj.weight", 2, 96, 48},          {"mlp.up_proj.weight", 2, 96, 48},
               {"mlp.down_proj.weight", 2, 48, 96},          {"input_layernorm.weight", 1, 48, 0},
               {"post_attention_layernorm.weight", 1, 48, 0}};
  size_t n = 0;
  ADD(2, 61, 48, "%sembed_tokens.weight", p);
  for (int i = 0; i < 2; i++)
    for (size_t k = 0; k < sizeof block / sizeof block[0]; k++)
      ADD(block[k].rank, block[k].a, block[k].b, "%slayers.%d.%s", p, i, block[k].what);
  ADD(1, 48, 0, "%snorm.weight", p);
  if (!tied) ADD(2, 61, 48, "lm_head.weight");
  return n;
}

Test(models, llama_parameters_have_hf_names_and_layouts) {
  const char *prefixes[] = {"model.", "", NULL};
  for (int i = 0; i < 3; i++)
    for (int tied = 0; tied < 2; tied++) {
      mn_model_config c = mn_test_tiny_llama();
      c.tie_word_embeddings = tied;
      mn_graph *g = build(&c, 3, 5, prefixes[i]);
      char names[40][64];
      expect_param want[40];
      size_t n = llama_names(prefixes[i] ? prefixes[i] : "model.", tied, names, want);
      assert_params(g, want, n);
      mn_graph_free(g);
    }
}

/* Inputs and outputs: input_ids, labels (and GPT-2's position_ids) U32 [B, T]; the loss [1]
 * then the logits [B, T, V]. */
Test(models, inputs_and_outputs) {
  mn_model_config cs[2] = {mn_test_tiny_gpt2(), mn_test_tiny_llama()};
  for (int m = 0; m < 2; m++) {
    mn_graph *g = build(&cs[m], 3, 5, NULL);
    int inputs = 0;
    mn_node_info info;
    for (size_t i = 0; i < mn_graph_num_nodes(g); i++) {
      cr_assert_eq(mn_graph_node(g, (mn_node)i, &info), MN_OK);
      if (strcmp(info.op, "input") != 0) continue;
      inputs++;
      cr_assert(strcmp(info.name, "input_ids") == 0 || strcmp(info.name, "labels") == 0 ||
                    (m == 0 && strcmp(info.name, "position_ids") == 0),
                "unexpected input %s", info.name);
      cr_assert_eq(info.type.dtype, MN_U32);
      cr_assert(info.type.rank == 2 && info.type.shape[0] == 3 && info.type.shape[1] == 5);
    }
    cr_assert_eq(inputs, m == 0 ? 3 : 2);
    const mn_node *outs = NULL;
    cr_assert_eq(mn_graph_outputs(g, &outs), 2u);
    cr_assert_eq(mn_graph_node(g, outs[0], &info), MN_OK);
    cr_assert_str_eq(info.op, "sparse_cross_entropy_loss");
    cr_assert_eq(mn_graph_node(g, outs[1], &info), MN_OK);
    cr_assert(info.type.rank == 3 && info.type.shape[0] == 3 && info.type.shape[1] == 5 &&
              info.type.shape[2] == cs[m].vocab_size);
    mn_graph_free(g);
  }
}

/* ---------------------------------------------------------------- sessions */

static mn_session *cpu_session(const mn_graph *g, bool training) {
  return mn_test_session(g, MN_BACKEND_CPU, training);
}

/* A repeated pattern: row b is the cycle 3, 17, 29, 41, 8 (mod vocab) from phase b; the
 * label of each position is the next token of the cycle. */
static void pattern(int64_t vocab, int64_t b, int64_t t, uint32_t *ids, uint32_t *labels) {
  static const uint32_t cycle[5] = {3, 17, 29, 41, 8};
  for (int64_t r = 0; r < b; r++)
    for (int64_t i = 0; i < t; i++) {
      ids[r * t + i] = cycle[(r + i) % 5] % (uint32_t)vocab;
      labels[r * t + i] = cycle[(r + i + 1) % 5] % (uint32_t)vocab;
    }
}

static void set_pattern(mn_session *s, int64_t vocab, int64_t b, int64_t t) {
  uint32_t ids[64], labels[64];
  cr_assert_leq(b * t, 64);
  pattern(vocab, b, t, ids, labels);
  cr_assert_eq(mn_session_set_input_u32(s, "input_ids", ids, (size_t)(b * t)), MN_OK, "%s",
               mn_last_error());
  cr_assert_eq(mn_session_set_input_u32(s, "labels", labels, (size_t)(b * t)), MN_OK, "%s",
               mn_last_error());
}

static float step(mn_session *s) {
  cr_assert_eq(mn_session_step(s), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_wait(s), MN_OK, "%s", mn_last_error());
  return mn_session_read_loss(s);
}

/* 30 AdamW steps from transformers' initialization: the loss starts near ln(V) (uniform
 * predictions) and must end below a third of that. */
static void train(const char *what, const mn_model_config *c) {
  mn_graph *g = build(c, 2, 8, NULL);
  mn_session *s = cpu_session(g, true);
  cr_assert_eq(mn_model_init_parameters(c, g, s, 1234), MN_OK, "%s", mn_last_error());
  set_pattern(s, c->vocab_size, 2, 8);
  cr_assert_eq(mn_session_set_adamw(s, 1e-2f, 0.9f, 0.999f, 1e-8f, 0.01f), MN_OK);
  float curve[30];
  char line[512];
  int w = snprintf(line, sizeof line, "%s loss:", what);
  for (int i = 0; i < 30; i++) {
    curve[i] = step(s);
    if (i % 3 == 0 || i == 29) w += snprintf(line + w, sizeof line - (size_t)w, " %.3f", curve[i]);
  }
  cr_log_info("%s", line);
  double uniform = log((double)c->vocab_size);
  cr_assert(fabs(curve[0] - uniform) < 0.1, "%s: first loss %g, expected about ln(V) = %g", what,
            curve[0], uniform);
  cr_assert_lt(curve[29], uniform / 3, "%s: loss %g -> %g did not fall clearly", what, curve[0],
               curve[29]);
  mn_session_free(s);
  mn_graph_free(g);
}

Test(models, tiny_gpt2_trains, .timeout = 120) {
  mn_model_config c = mn_test_tiny_gpt2();
  train("gpt2", &c);
}

Test(models, tiny_llama_trains, .timeout = 120) {
  mn_model_config c = mn_test_tiny_llama();
  train("llama", &c);
}

/* ---------------------------------------------------------------- gradients */

/* The whole model's loss against central differences, for `probes` elements spread over
 * each named parameter. Parameters are drawn with a larger spread than the init (std 0.3,
 * norms near 1) so that gradients stand well above the float32 rounding of the loss. */
static void gradcheck_model(const mn_model_config *c0, const char *const *names, size_t num) {
  mn_model_config c = *c0;
  c.initializer_range = 0.3f;
  mn_graph *g = build(&c, 2, 4, NULL);
  mn_session *s = cpu_session(g, true);
  cr_assert_eq(mn_model_init_parameters(&c, g, s, 99), MN_OK, "%s", mn_last_error());
  set_pattern(s, c.vocab_size, 2, 4);
  step(s);
  const double h = 1e-2;
  for (size_t i = 0; i < num; i++) {
    mn_node_info info = {0};
    for (size_t k = 0; k < mn_graph_num_nodes(g); k++)
      if (mn_graph_node(g, (mn_node)k, &info) == MN_OK && info.name &&
          strcmp(info.name, names[i]) == 0)
        break;
    size_t n = (size_t)mn_tensor_type_numel(&info.type);
    size_t probes = n < 12 ? n : 12, at[12];
    /* Embedding tables: probe the row of token 17, which the batch uses (unused rows have
     * zero gradients, which say nothing). */
    bool table = strstr(names[i], "embed_tokens") || strstr(names[i], "wte");
    size_t base = table ? 17 * (size_t)info.type.shape[1] : 0, span = table ? 12 : n;
    for (size_t j = 0; j < probes; j++)
      at[j] = base + j * (span / probes) + (table ? 0 : j % 3);
    double rel = mn_test_fd_gradient_error(s, names[i], n, at, probes, h);
    cr_log_info("gradient of %s: relative error %.3g over %zu probes", names[i], rel, probes);
    cr_assert_lt(rel, 5e-3, "gradient of %s: relative error %g", names[i], rel);
  }
  mn_session_free(s);
  mn_graph_free(g);
}

Test(models, tiny_gpt2_gradients_match_finite_differences, .timeout = 120) {
  mn_model_config c = mn_test_tiny_gpt2();
  const char *names[] = {"transformer.wte.weight",
                         "transformer.wpe.weight",
                         "transformer.h.0.attn.c_attn.weight",
                         "transformer.h.0.attn.c_attn.bias",
                         "transformer.h.1.ln_2.weight",
                         "transformer.h.1.mlp.c_proj.weight",
                         "transformer.ln_f.bias"};
  gradcheck_model(&c, names, sizeof names / sizeof names[0]);
}

Test(models, tiny_llama_gradients_match_finite_differences, .timeout = 120) {
  mn_model_config c = mn_test_tiny_llama();
  const char *names[] = {"model.embed_tokens.weight",
                         "model.layers.0.self_attn.k_proj.weight",
                         "model.layers.0.input_layernorm.weight",
                         "model.layers.1.mlp.gate_proj.weight",
                         "model.norm.weight",
                         "lm_head.weight"};
  gradcheck_model(&c, names, sizeof names / sizeof names[0]);
}

/* ---------------------------------------------------------------- init and positions */

Test(models, init_is_hf_like_and_seeded) {
  mn_model_config c = mn_test_tiny_gpt2();
  c.intermediate_size = 512; /* enough c_proj elements for a tight std estimate */
  mn_graph *g = build(&c, 1, 4, "");
  mn_session *a = cpu_session(g, false), *b = cpu_session(g, false);
  cr_assert_eq(mn_model_init_parameters(&c, g, a, 7), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_model_init_parameters(&c, g, b, 7), MN_OK, "%s", mn_last_error());
  mn_test_assert_same_params(g, a, b, 0, "with the same seed");
  float w[512 * 32];
  cr_assert_eq(mn_session_read_param(a, "h.1.ln_2.weight", w, 32), MN_OK);
  for (int i = 0; i < 32; i++)
    cr_assert_eq(w[i], 1.0f);
  cr_assert_eq(mn_session_read_param(a, "h.0.mlp.c_fc.bias", w, 512), MN_OK);
  for (int i = 0; i < 512; i++)
    cr_assert_eq(w[i], 0.0f);
  /* normal(0, 0.02), and c_proj at 0.02 / sqrt(2 * n_layer) = 0.01. */
  const struct {
    const char *name;
    size_t n;
    double std;
  } cases[] = {{"wte.weight", 50 * 32, 0.02},
               {"h.0.mlp.c_fc.weight", 32 * 512, 0.02},
               {"h.1.mlp.c_proj.weight", 512 * 32, 0.01}};
  for (int k = 0; k < 3; k++) {
    cr_assert_eq(mn_session_read_param(a, cases[k].name, w, cases[k].n), MN_OK);
    double s1 = 0, s2 = 0;
    for (size_t i = 0; i < cases[k].n; i++)
      s1 += w[i], s2 += (double)w[i] * w[i];
    double mean = s1 / (double)cases[k].n, std = sqrt(s2 / (double)cases[k].n - mean * mean);
    cr_assert_lt(fabs(mean), 3 * cases[k].std / sqrt((double)cases[k].n) + 1e-4, "%s mean %g",
                 cases[k].name, mean);
    cr_assert_lt(fabs(std / cases[k].std - 1), 0.05, "%s std %g, expected %g", cases[k].name, std,
                 cases[k].std);
  }
  /* Another seed, other values. */
  cr_assert_eq(mn_model_init_parameters(&c, g, b, 8), MN_OK);
  float x[50 * 32], y[50 * 32];
  mn_session_read_param(a, "wte.weight", x, 50 * 32);
  mn_session_read_param(b, "wte.weight", y, 50 * 32);
  cr_assert_neq(memcmp(x, y, sizeof x), 0);
  mn_session_free(a);
  mn_session_free(b);
  mn_graph_free(g);
}

/* With every token equal, the positions are what tells GPT-2's rows apart: prepared, the
 * logits differ along T; on an unprepared session (position_ids all 0) they do not. */
Test(models, gpt2_positions_come_from_prepare_session) {
  mn_model_config c = mn_test_tiny_gpt2();
  mn_graph *g = build(&c, 1, 6, NULL);
  mn_session *s = cpu_session(g, false);
  cr_assert_eq(mn_model_init_parameters(&c, g, s, 3), MN_OK);
  uint32_t ids[6] = {5, 5, 5, 5, 5, 5};
  mn_session_set_input_u32(s, "input_ids", ids, 6);
  mn_session_set_input_u32(s, "labels", ids, 6);
  step(s);
  float logits[6 * 50];
  cr_assert_eq(mn_session_read_output_by_index(s, 1, logits, 6 * 50), MN_OK);
  cr_assert_gt(mn_test_max_abs_diff(logits, logits + 5 * 50, 50), 1e-4);
  uint32_t zeros[6] = {0};
  mn_session_set_input_u32(s, "position_ids", zeros, 6);
  step(s);
  cr_assert_eq(mn_session_read_output_by_index(s, 1, logits, 6 * 50), MN_OK);
  cr_assert_eq(mn_test_max_abs_diff(logits, logits + 5 * 50, 50), 0.0);
  /* Llama graphs have nothing to prepare. */
  mn_model_config l = mn_test_tiny_llama();
  mn_graph *gl = build(&l, 1, 6, NULL);
  mn_session *sl = cpu_session(gl, false);
  cr_assert_eq(mn_model_prepare_session(gl, sl), MN_OK, "%s", mn_last_error());
  mn_assert_error(mn_model_prepare_session(NULL, sl), MN_ERR_INVALID_ARGUMENT,
                  "mn_model_prepare_session: graph is NULL");
  mn_session_free(sl);
  mn_graph_free(gl);
  mn_session_free(s);
  mn_graph_free(g);
}

/* ---------------------------------------------------------------- save and load */

/* Trains a few steps, saves with mn_session_save_safetensors, loads into a fresh inference
 * session: the logits are identical to those of the trained parameters, and the file's prefix
 * is found again. */
static void round_trip(const mn_model_config *c, const char *prefix, const char *want_prefix) {
  mn_graph *g = build(c, 2, 8, prefix);
  mn_session *s = cpu_session(g, true);
  cr_assert_eq(mn_model_init_parameters(c, g, s, 5), MN_OK);
  set_pattern(s, c->vocab_size, 2, 8);
  cr_assert_eq(mn_session_set_adamw(s, 1e-2f, 0.9f, 0.999f, 1e-8f, 0.01f), MN_OK);
  for (int i = 0; i < 3; i++)
    step(s);
  mn_tmp_dir dir = mn_tmp_dir_make("mn_models");
  char path[128];
  snprintf(path, sizeof path, "%s", mn_tmp_path(&dir, "model.safetensors"));
  cr_assert_eq(mn_session_save_safetensors(s, path), MN_OK, "%s", mn_last_error());

  /* Reference: the trained parameters copied by name into an inference session. */
  mn_session *ref = cpu_session(g, false), *loaded = cpu_session(g, false);
  size_t np = mn_test_param_count(g);
  float *all = mn_test_read_params(g, s);
  size_t off = 0;
  mn_node_info info;
  for (size_t i = 0; i < mn_graph_num_nodes(g); i++) {
    mn_graph_node(g, (mn_node)i, &info);
    if (strcmp(info.op, "parameter") != 0) continue;
    size_t n = (size_t)mn_tensor_type_numel(&info.type);
    cr_assert_eq(mn_session_set_parameter(ref, info.name, all + off, n), MN_OK);
    off += n;
  }
  cr_assert_eq(off, np);
  free(all);
  cr_assert_eq(mn_model_prepare_session(g, ref), MN_OK);
  cr_assert_eq(mn_session_load_safetensors(loaded, path, true), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_model_prepare_session(g, loaded), MN_OK);
  set_pattern(ref, c->vocab_size, 2, 8);
  set_pattern(loaded, c->vocab_size, 2, 8);
  size_t nl = (size_t)(2 * 8 * c->vocab_size);
  float *a = malloc(nl * sizeof *a), *b = malloc(nl * sizeof *b);
  float la = step(ref), lb = step(loaded);
  mn_session_read_output_by_index(ref, 1, a, nl);
  mn_session_read_output_by_index(loaded, 1, b, nl);
  cr_assert_eq(memcmp(a, b, nl * sizeof *a), 0, "logits differ after the round trip");
  cr_assert_eq(la, lb);

  const char *found = NULL;
  cr_assert_eq(mn_model_name_prefix(c, path, &found), MN_OK, "%s", mn_last_error());
  cr_assert_str_eq(found, want_prefix);
  free(a);
  free(b);
  mn_session_free(ref);
  mn_session_free(loaded);
  mn_session_free(s);
  mn_graph_free(g);
  mn_tmp_dir_remove(&dir);
}

Test(models, gpt2_save_load_round_trip) {
  mn_model_config c = mn_test_tiny_gpt2();
  round_trip(&c, NULL, "transformer.");
  round_trip(&c, "", "");
}

Test(models, llama_save_load_round_trip) {
  mn_model_config c = mn_test_tiny_llama();
  round_trip(&c, NULL, "model.");
  c.tie_word_embeddings = true;
  round_trip(&c, "", "");
}

/* The plan of a GPT-2 graph (slice_last's start included) read back from the plan cache
 * trains exactly like a fresh build. */
Test(models, gpt2_plan_cache_round_trip) {
  mn_model_config c = mn_test_tiny_gpt2();
  mn_graph *g = build(&c, 2, 8, NULL);
  mn_tmp_dir dir = mn_tmp_dir_make("mn_models_cache");
  char cache[128];
  snprintf(cache, sizeof cache, "%s", mn_tmp_path(&dir, "plan.json"));
  mn_session_options o = mn_session_options_default();
  o.backend = MN_BACKEND_CPU;
  float losses[3][4];
  for (int run = 0; run < 3; run++) {
    mn_session *s = NULL;
    /* Run 0: no cache; run 1 writes the cache; run 2 reads it. */
    mn_status st =
        run == 0 ? mn_build_session(g, &o, &s) : mn_build_session_cached(g, cache, &o, &s);
    cr_assert_eq(st, MN_OK, "%s", mn_last_error());
    cr_assert_eq(mn_model_init_parameters(&c, g, s, 21), MN_OK);
    set_pattern(s, c.vocab_size, 2, 8);
    cr_assert_eq(mn_session_set_adamw(s, 1e-2f, 0.9f, 0.999f, 1e-8f, 0.01f), MN_OK);
    for (int i = 0; i < 4; i++)
      losses[run][i] = step(s);
    mn_session_free(s);
  }
  cr_assert_eq(memcmp(losses[0], losses[1], sizeof losses[0]), 0);
  cr_assert_eq(memcmp(losses[0], losses[2], sizeof losses[0]), 0);
  mn_graph_free(g);
  cr_assert_eq(mn_tmp_dir_remove(&dir), 1u, "the plan cache was not written");
}

/* ---------------------------------------------------------------- CUDA */

static void check_cuda(const mn_model_config *c) {
  mn_test_require_cuda_build();
  mn_graph *g = build(c, 2, 8, NULL);
  mn_test_assert_compiles(g, true);
  mn_test_assert_compiles(g, false);
  if (mn_test_cuda_device_present()) {
    double v = (double)c->vocab_size;
    const mn_test_range ranges[] = {
        {"input_ids", 0, v}, {"labels", 0, v}, {"position_ids", 0, 8}, {NULL, 0, 0}};
    double err = mn_test_compare_cuda(g, true, 1e-4, ranges, 11);
    cr_log_info("largest relative error %.3g", err);
  }
  mn_graph_free(g);
  mn_test_require_cuda_device(); /* reports the GPU comparison as skipped */
}

Test(models_cuda, tiny_gpt2_training_graph, .timeout = 240) {
  mn_model_config c = mn_test_tiny_gpt2();
  check_cuda(&c);
}

Test(models_cuda, tiny_llama_training_graph, .timeout = 240) {
  mn_model_config c = mn_test_tiny_llama();
  check_cuda(&c);
}
