/* Bad input refused early and cheaply: leaf lookups by name are hashed, so building a model is
 * linear in its layers (counted in name comparisons, and timed); configs past the layer and
 * parameter limits are refused before anything is allocated, naming the key; weights holding
 * a NaN or an infinity are refused at load, naming the tensor, unless the caller allows them. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "host/graph.h"
#include "io/safetensors.h"
#include "models/model_internal.h"
#include "tests/support/mn_test.h"
#include "tests/support/session_util.h"
#include "tests/support/tmp_dir.h"

static double seconds_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static mn_model_config tiny_gpt2(long layers) {
  char json[256];
  snprintf(json, sizeof json,
           "{\"model_type\": \"gpt2\", \"vocab_size\": 16, \"n_embd\": 8, \"n_layer\": %ld, "
           "\"n_head\": 2, \"n_positions\": 8}",
           layers);
  mn_model_config c;
  cr_assert_eq(mn_model_config_parse(json, &c), MN_OK, "%s", mn_last_error());
  return c;
}

static size_t count_parameters(const mn_graph *g, size_t *elements) {
  size_t n = 0;
  *elements = 0;
  mn_node_info info;
  for (size_t i = 0; i < mn_graph_num_nodes(g); i++)
    if (mn_graph_node(g, (mn_node)i, &info) == MN_OK && strcmp(info.op, "parameter") == 0) {
      n++;
      *elements += (size_t)mn_tensor_type_numel(&info.type);
    }
  return n;
}

/* Name comparisons mn_model_build makes for a tiny GPT-2 of `layers` layers; its parameter
 * count goes to *params. */
static size_t build_compares(long layers, size_t *params) {
  mn_model_config c = tiny_gpt2(layers);
  mn_graph *g = NULL;
  size_t before = mn_graph_name_compares();
  cr_assert_eq(mn_model_build(&c, 1, 4, NULL, &g), MN_OK, "%s", mn_last_error());
  size_t compares = mn_graph_name_compares() - before, elements;
  *params = count_parameters(g, &elements);
  mn_graph_free(g);
  return compares;
}

/* ---------------------------------------------------------------- hashed lookups */

Test(bad_input, model_build_is_linear_in_layers) {
  size_t p1, p2;
  size_t c1 = build_compares(1000, &p1), c2 = build_compares(2000, &p2);
  /* A scan compared every earlier name (millions here); the hash about one per leaf. */
  cr_assert_leq(c1, 4 * p1, "1000 layers: %zu name comparisons for %zu parameters", c1, p1);
  cr_assert_leq(c2, 4 * p2, "2000 layers: %zu name comparisons for %zu parameters", c2, p2);
  cr_assert_leq((double)c2, 2.5 * (double)c1, "comparisons grow superlinearly: %zu -> %zu", c1, c2);
}

Test(bad_input, thousand_layer_config_builds_in_well_under_a_second) {
  mn_model_config c = tiny_gpt2(1000);
  mn_graph *g = NULL;
  double t0 = seconds_now();
  cr_assert_eq(mn_model_build(&c, 1, 4, NULL, &g), MN_OK, "%s", mn_last_error());
  double took = seconds_now() - t0;
  /* ~10 ms unsanitized; the bound leaves room for sanitizers and a loaded machine. */
  cr_assert_lt(took, 1.0, "building 1000 layers took %.3f s", took);
  mn_graph_free(g);
}

Test(bad_input, lookup_finds_the_first_leaf_of_its_op) {
  mn_graph *g = mn_graph_new();
  char name[32];
  for (int i = 0; i < 1000; i++) { /* several reallocations of the node array */
    snprintf(name, sizeof name, "p.%d", i);
    mn_parameter(g, name, MN_SHAPE(2));
    mn_relu(g, (mn_node)(mn_graph_num_nodes(g) - 1));
  }
  mn_input(g, "x", MN_SHAPE(2));
  cr_assert_eq(mn_graph_status(g), MN_OK, "%s", mn_graph_error(g));
  for (int i = 0; i < 1000; i++) {
    snprintf(name, sizeof name, "p.%d", i);
    cr_assert_eq(mn_graph_find_leaf(g, MN_OP_PARAMETER, name), (mn_node)(2 * i));
    cr_assert_eq(mn_graph_find_leaf(g, MN_OP_INPUT, name), MN_NO_NODE);
  }
  cr_assert_eq(mn_graph_find_leaf(g, MN_OP_INPUT, "x"), 2000);
  cr_assert_eq(mn_graph_find_leaf(g, MN_OP_PARAMETER, "x"), MN_NO_NODE);
  cr_assert_eq(mn_graph_find_leaf(g, MN_OP_PARAMETER, "p.1000"), MN_NO_NODE);
  cr_assert_eq(mn_graph_find_leaf(g, MN_OP_PARAMETER, NULL), MN_NO_NODE);
  cr_assert_eq(mn_graph_find_leaf(NULL, MN_OP_PARAMETER, "x"), MN_NO_NODE);
  /* A duplicate leaf the builders refuse: the first stays the answer. */
  mn_parameter(g, "p.7", MN_SHAPE(2));
  mn_assert_graph_error(g, MN_ERR_INVALID_ARGUMENT, "name \"p.7\" is already used by node 14");
  mn_graph_free(g);
}

Test(bad_input, lookup_follows_nodes_written_by_hand) {
  /* As the plan-cache reader and toposort fill graphs: the array and names set directly. */
  mn_graph *g = mn_graph_new();
  cr_assert_eq(mn_graph_find_leaf(g, MN_OP_PARAMETER, "a"), MN_NO_NODE);
  g->nodes = calloc(3, sizeof *g->nodes);
  g->num_nodes = g->cap_nodes = 3;
  const char *names[3] = {"a", "b", "a"};
  for (int i = 0; i < 3; i++) {
    g->nodes[i].op = MN_OP_PARAMETER;
    g->nodes[i].name = strdup(names[i]);
  }
  cr_assert_eq(mn_graph_find_leaf(g, MN_OP_PARAMETER, "a"), 0); /* duplicates: the first */
  cr_assert_eq(mn_graph_find_leaf(g, MN_OP_PARAMETER, "b"), 1);
  /* An op rewritten in place keeps its slot: the probe compares ops. */
  g->nodes[0].op = MN_OP_INPUT;
  cr_assert_eq(mn_graph_find_leaf(g, MN_OP_PARAMETER, "a"), 2);
  cr_assert_eq(mn_graph_find_leaf(g, MN_OP_INPUT, "a"), 0);
  /* Cut back by hand and appended again: indexed anew. */
  free(g->nodes[2].name);
  g->nodes[2].name = NULL;
  g->num_nodes = 2;
  cr_assert_eq(mn_graph_find_leaf(g, MN_OP_PARAMETER, "a"), MN_NO_NODE);
  mn_parameter(g, "c", MN_SHAPE(1));
  cr_assert_eq(mn_graph_find_leaf(g, MN_OP_PARAMETER, "c"), 2);
  /* A name cleared by hand, then enough names appended to grow the index: it is dropped. */
  free(g->nodes[1].name);
  g->nodes[1].name = NULL;
  char name[32];
  for (int i = 0; i < 100; i++) {
    snprintf(name, sizeof name, "grow.%d", i);
    cr_assert_eq(mn_parameter(g, name, MN_SHAPE(1)), (mn_node)(3 + i), "%s", mn_graph_error(g));
  }
  cr_assert_eq(mn_graph_find_leaf(g, MN_OP_PARAMETER, "b"), MN_NO_NODE);
  cr_assert_eq(mn_graph_find_leaf(g, MN_OP_PARAMETER, "grow.99"), 102);
  mn_graph *copy = mn_graph_clone(g);
  cr_assert_eq(mn_graph_find_leaf(copy, MN_OP_PARAMETER, "c"), 2);
  cr_assert_eq(mn_graph_find_leaf(copy, MN_OP_INPUT, "a"), 0);
  mn_graph_free(copy);
  mn_graph_free(g);
}

/* ---------------------------------------------------------------- config limits */

Test(bad_input, config_with_two_billion_layers_is_refused_at_once) {
  mn_model_config c;
  memset(&c, 0, sizeof c);
  double t0 = seconds_now();
  mn_assert_error(mn_model_config_parse("{\"model_type\": \"gpt2\", \"vocab_size\": 16, "
                                        "\"n_embd\": 8, \"n_layer\": 2e9, \"n_head\": 2, "
                                        "\"n_positions\": 8}",
                                        &c),
                  MN_ERR_FORMAT, "\"n_layer\" is 2000000000, more than the limit of 65536 layers");
  cr_assert_lt(seconds_now() - t0, 0.5);
  cr_assert_eq(c.num_layers, 0, "*out changed on failure");
  mn_assert_error(mn_model_config_parse("{\"model_type\": \"llama\", \"vocab_size\": 16, "
                                        "\"hidden_size\": 8, \"num_hidden_layers\": 65537, "
                                        "\"num_attention_heads\": 2, \"intermediate_size\": 16}",
                                        &c),
                  MN_ERR_FORMAT, "\"num_hidden_layers\" is 65537, more than the limit");
  /* The limit itself is accepted. */
  cr_assert_eq(mn_model_config_parse("{\"model_type\": \"llama\", \"vocab_size\": 16, "
                                     "\"hidden_size\": 8, \"num_hidden_layers\": 65536, "
                                     "\"num_attention_heads\": 2, \"intermediate_size\": 16}",
                                     &c),
               MN_OK, "%s", mn_last_error());
}

Test(bad_input, config_past_the_parameter_limit_is_refused) {
  mn_model_config c;
  /* Each size is in range; together 2e9 x 2e9 embeddings are ~4e18 parameters. */
  mn_assert_error(mn_model_config_parse("{\"model_type\": \"gpt2\", \"vocab_size\": 2000000000, "
                                        "\"n_embd\": 2000000000, \"n_layer\": 1, \"n_head\": 1, "
                                        "\"n_positions\": 8}",
                                        &c),
                  MN_ERR_FORMAT, "\"n_embd\" 2000000000");
  cr_assert(strstr(mn_last_error(), "more than the limit of 2^40") != NULL, "%s", mn_last_error());
  /* 4096 layers of a 4096-wide Llama: ~8e11 parameters fit; 8192 of them do not. */
  const char *fmt = "{\"model_type\": \"llama\", \"vocab_size\": 32000, \"hidden_size\": 4096, "
                    "\"num_hidden_layers\": %d, \"num_attention_heads\": 32, "
                    "\"intermediate_size\": 11008}";
  char json[256];
  snprintf(json, sizeof json, fmt, 4096);
  cr_assert_eq(mn_model_config_parse(json, &c), MN_OK, "%s", mn_last_error());
  snprintf(json, sizeof json, fmt, 8192);
  mn_assert_error(mn_model_config_parse(json, &c), MN_ERR_FORMAT, "\"num_hidden_layers\" 8192");
}

Test(bad_input, hand_filled_config_past_the_limits_is_refused_by_build) {
  mn_model_config c = tiny_gpt2(1);
  c.num_layers = 2000000000;
  mn_graph *g = (mn_graph *)1;
  mn_assert_error(mn_model_build(&c, 1, 4, NULL, &g), MN_ERR_INVALID_ARGUMENT,
                  "\"num_layers\" is 2000000000, more than the limit of 65536 layers");
  cr_assert_null(g);
  c = tiny_gpt2(1);
  c.vocab_size = c.hidden_size = 2000000000;
  c.num_heads = c.num_kv_heads = 1;
  c.head_dim = c.hidden_size;
  mn_assert_error(mn_model_build(&c, 1, 4, NULL, &g), MN_ERR_INVALID_ARGUMENT,
                  "\"hidden_size\" 2000000000");
}

Test(bad_input, parameter_count_matches_the_built_graph) {
  const char *configs[] = {
      "{\"model_type\": \"gpt2\", \"vocab_size\": 16, \"n_embd\": 8, \"n_layer\": 3, "
      "\"n_head\": 2, \"n_positions\": 8, \"n_inner\": 12}",
      "{\"model_type\": \"gpt2\", \"vocab_size\": 16, \"n_embd\": 8, \"n_layer\": 2, "
      "\"n_head\": 2, \"n_positions\": 8, \"tie_word_embeddings\": false}",
      "{\"model_type\": \"llama\", \"vocab_size\": 20, \"hidden_size\": 12, "
      "\"num_hidden_layers\": 2, \"num_attention_heads\": 3, \"num_key_value_heads\": 1, "
      "\"intermediate_size\": 24}",
      "{\"model_type\": \"llama\", \"vocab_size\": 20, \"hidden_size\": 12, "
      "\"num_hidden_layers\": 2, \"num_attention_heads\": 2, \"head_dim\": 4, "
      "\"intermediate_size\": 24, \"tie_word_embeddings\": true}",
  };
  for (size_t i = 0; i < sizeof configs / sizeof configs[0]; i++) {
    mn_model_config c;
    cr_assert_eq(mn_model_config_parse(configs[i], &c), MN_OK, "%s", mn_last_error());
    mn_graph *g = NULL;
    cr_assert_eq(mn_model_build(&c, 1, 4, NULL, &g), MN_OK, "%s", mn_last_error());
    size_t elements;
    count_parameters(g, &elements);
    cr_assert_eq((size_t)mn_model_parameter_count(&c), elements, "config %zu", i);
    mn_graph_free(g);
  }
}

/* ---------------------------------------------------------------- non-finite weights */

static mn_graph *two_param_graph(void) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(3));
  mn_node w = mn_parameter(g, "w", MN_SHAPE(3));
  mn_node b = mn_parameter(g, "layers.1.b", MN_SHAPE(3));
  mn_node loss = mn_mean_all(g, mn_add(g, mn_mul(g, x, w), b));
  mn_set_outputs(g, &loss, 1);
  cr_assert_eq(mn_graph_status(g), MN_OK, "%s", mn_graph_error(g));
  return g;
}

/* A file with w = {1, 2, 3} and layers.1.b = `b` in `dtype` (F32 or F64). */
static void write_weights(const char *path, const char *dtype, const double b[3]) {
  float w32[3] = {1, 2, 3}, b32[3];
  double b64[3];
  for (int i = 0; i < 3; i++) {
    b32[i] = (float)b[i];
    b64[i] = b[i];
  }
  bool f64 = strcmp(dtype, "F64") == 0;
  mn_st_tensor t[2] = {
      {.name = "w", .dtype = "F32", .rank = 1, .shape = {3}, .data = w32, .bytes = sizeof w32},
      {.name = "layers.1.b",
       .dtype = dtype,
       .rank = 1,
       .shape = {3},
       .data = f64 ? (const void *)b64 : (const void *)b32,
       .bytes = f64 ? sizeof b64 : sizeof b32},
  };
  cr_assert_eq(mn_safetensors_write(path, t, 2, NULL, 0), MN_OK, "%s", mn_last_error());
}

static void assert_param(mn_session *s, const char *name, float want0) {
  float v[3];
  cr_assert_eq(mn_session_read_param(s, name, v, 3), MN_OK, "%s", mn_last_error());
  cr_assert_eq(v[0], want0, "%s[0] is %g, expected %g", name, (double)v[0], (double)want0);
}

Test(bad_input, non_finite_weights_are_refused_naming_the_tensor) {
  mn_tmp_dir dir = mn_tmp_dir_make("mn_bad_input");
  mn_graph *g = two_param_graph();
  mn_session *s = mn_test_session(g, MN_BACKEND_CPU, true);
  const float seven[3] = {7, 7, 7};
  cr_assert_eq(mn_session_set_parameter(s, "w", seven, 3), MN_OK);
  cr_assert_eq(mn_session_set_parameter(s, "layers.1.b", seven, 3), MN_OK);

  const char *nan_file = mn_tmp_path(&dir, "nan.safetensors");
  write_weights(nan_file, "F32", (const double[3]){0, NAN, 0});
  mn_assert_error(mn_session_load_safetensors(s, nan_file, true), MN_ERR_FORMAT,
                  "tensor \"layers.1.b\" holds a non-finite value (nan at element 1)");
  assert_param(s, "w", 7); /* nothing loaded, not even the good tensor before it */
  assert_param(s, "layers.1.b", 7);

  const char *inf_file = mn_tmp_path(&dir, "inf.safetensors");
  write_weights(inf_file, "F32", (const double[3]){-INFINITY, 0, 0});
  mn_assert_error(mn_session_load_safetensors_flags(s, inf_file, 0), MN_ERR_FORMAT,
                  "tensor \"layers.1.b\" holds a non-finite value (-inf at element 0)");

  /* Finite in the file, but past float's range once converted. */
  const char *big_file = mn_tmp_path(&dir, "f64.safetensors");
  write_weights(big_file, "F64", (const double[3]){0, 0, 1e300});
  mn_assert_error(mn_session_load_safetensors(s, big_file, false), MN_ERR_FORMAT,
                  "tensor \"layers.1.b\" holds a non-finite value (inf at element 2)");
  assert_param(s, "w", 7);

  /* The escape loads it as it is. */
  cr_assert_eq(
      mn_session_load_safetensors_flags(s, nan_file, MN_LOAD_STRICT | MN_LOAD_ALLOW_NONFINITE),
      MN_OK, "%s", mn_last_error());
  assert_param(s, "w", 1);
  float b[3];
  cr_assert_eq(mn_session_read_param(s, "layers.1.b", b, 3), MN_OK);
  cr_assert(isnan(b[1]));

  mn_assert_error(mn_session_load_safetensors_flags(s, nan_file, 8), MN_ERR_INVALID_ARGUMENT,
                  "mn_session_load_safetensors_flags: unknown flags 0x8");
  mn_assert_error(mn_session_load_safetensors_flags(NULL, nan_file, 0), MN_ERR_INVALID_ARGUMENT,
                  "mn_session_load_safetensors_flags: session is NULL");
  mn_session_free(s);
  mn_graph_free(g);
  mn_tmp_dir_remove(&dir);
}
