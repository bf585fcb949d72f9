/* HuggingFace config.json files read into mn_model_config (GPT-2 and Llama/SmolLM2 configs as
 * the hub ships them, transformers' defaults for absent keys), the errors for missing keys,
 * bad types and unsupported options, mn_model_build's argument checks, and the name prefix
 * found in a weights file. */
#include <stdio.h>
#include <stdlib.h>

#include "tests/support/mn_test.h"
#include "tests/support/tmp_dir.h"

/* openai-community/gpt2's config.json. */
static const char *gpt2_json =
    "{\"activation_function\": \"gelu_new\", \"architectures\": [\"GPT2LMHeadModel\"], "
    "\"attn_pdrop\": 0.1, \"bos_token_id\": 50256, \"embd_pdrop\": 0.1, \"eos_token_id\": 50256, "
    "\"initializer_range\": 0.02, \"layer_norm_epsilon\": 1e-05, \"model_type\": \"gpt2\", "
    "\"n_ctx\": 1024, \"n_embd\": 768, \"n_head\": 12, \"n_inner\": null, \"n_layer\": 12, "
    "\"n_positions\": 1024, \"reorder_and_upcast_attn\": false, \"resid_pdrop\": 0.1, "
    "\"scale_attn_by_inverse_layer_idx\": false, \"scale_attn_weights\": true, "
    "\"summary_activation\": null, \"summary_first_dropout\": 0.1, \"summary_proj_to_labels\": "
    "true, \"summary_type\": \"cls_index\", \"summary_use_proj\": true, \"task_specific_params\": "
    "{\"text-generation\": {\"do_sample\": true, \"max_length\": 50}}, \"vocab_size\": 50257}";

/* HuggingFaceTB/SmolLM2-135M's config.json. */
static const char *smollm2_json =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"attention_bias\": false, "
    "\"attention_dropout\": 0.0, \"bos_token_id\": 0, \"eos_token_id\": 0, \"hidden_act\": "
    "\"silu\", \"hidden_size\": 576, \"initializer_range\": 0.041666666666666664, "
    "\"intermediate_size\": 1536, \"is_llama_config\": true, \"max_position_embeddings\": 8192, "
    "\"model_type\": \"llama\", \"num_attention_heads\": 9, \"num_hidden_layers\": 30, "
    "\"num_key_value_heads\": 3, \"pretraining_tp\": 1, \"rms_norm_eps\": 1e-05, "
    "\"rope_interleaved\": false, \"rope_scaling\": null, \"rope_theta\": 100000, "
    "\"tie_word_embeddings\": true, \"torch_dtype\": \"bfloat16\", \"transformers_version\": "
    "\"4.40.1\", \"use_cache\": true, \"vocab_size\": 49152}";

Test(model_config, gpt2_from_file) {
  mn_tmp_dir dir = mn_tmp_dir_make("mn_model_config");
  const char *path = mn_tmp_path(&dir, "config.json");
  mn_test_write_file(path, gpt2_json, strlen(gpt2_json));
  mn_model_config c;
  cr_assert_eq(mn_model_config_load(path, &c), MN_OK, "%s", mn_last_error());
  cr_assert_eq(c.family, MN_MODEL_GPT2);
  cr_assert_eq(c.vocab_size, 50257);
  cr_assert_eq(c.hidden_size, 768);
  cr_assert_eq(c.num_layers, 12);
  cr_assert_eq(c.num_heads, 12);
  cr_assert_eq(c.num_kv_heads, 12);
  cr_assert_eq(c.head_dim, 64);
  cr_assert_eq(c.intermediate_size, 3072); /* n_inner null: 4 * n_embd */
  cr_assert_eq(c.max_positions, 1024);
  cr_assert_eq(c.norm_eps, 1e-5f);
  cr_assert_eq(c.initializer_range, 0.02f);
  cr_assert(c.tie_word_embeddings);
  mn_tmp_dir_remove(&dir);
}

Test(model_config, smollm2_from_file) {
  mn_tmp_dir dir = mn_tmp_dir_make("mn_model_config");
  const char *path = mn_tmp_path(&dir, "config.json");
  mn_test_write_file(path, smollm2_json, strlen(smollm2_json));
  mn_model_config c;
  cr_assert_eq(mn_model_config_load(path, &c), MN_OK, "%s", mn_last_error());
  cr_assert_eq(c.family, MN_MODEL_LLAMA);
  cr_assert_eq(c.vocab_size, 49152);
  cr_assert_eq(c.hidden_size, 576);
  cr_assert_eq(c.num_layers, 30);
  cr_assert_eq(c.num_heads, 9);
  cr_assert_eq(c.num_kv_heads, 3);
  cr_assert_eq(c.head_dim, 64);
  cr_assert_eq(c.intermediate_size, 1536);
  cr_assert_eq(c.max_positions, 8192);
  cr_assert_eq(c.norm_eps, 1e-5f);
  cr_assert_eq(c.rope_theta, 100000.0f);
  cr_assert_eq(c.initializer_range, (float)(1.0 / 24));
  cr_assert(c.tie_word_embeddings);
  mn_tmp_dir_remove(&dir);
}

/* Absent optional keys take transformers' LlamaConfig defaults; head_dim may be given. */
Test(model_config, llama_defaults_and_head_dim) {
  mn_model_config c;
  cr_assert_eq(mn_model_config_parse("{\"model_type\": \"llama\", \"vocab_size\": 100, "
                                     "\"hidden_size\": 64, \"num_hidden_layers\": 2, "
                                     "\"num_attention_heads\": 4, \"intermediate_size\": 128}",
                                     &c),
               MN_OK, "%s", mn_last_error());
  cr_assert_eq(c.num_kv_heads, 4);
  cr_assert_eq(c.head_dim, 16);
  cr_assert_eq(c.norm_eps, 1e-6f);
  cr_assert_eq(c.rope_theta, 10000.0f);
  cr_assert_eq(c.max_positions, 2048);
  cr_assert_eq(c.initializer_range, 0.02f);
  cr_assert(!c.tie_word_embeddings);
  cr_assert_eq(mn_model_config_parse("{\"model_type\": \"llama\", \"vocab_size\": 100, "
                                     "\"hidden_size\": 60, \"num_hidden_layers\": 2, "
                                     "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
                                     "\"head_dim\": 32, \"intermediate_size\": 128, "
                                     "\"rope_scaling\": {\"rope_type\": \"default\"}}",
                                     &c),
               MN_OK, "%s", mn_last_error());
  cr_assert_eq(c.head_dim, 32);
  cr_assert_eq(c.num_kv_heads, 2);
  /* transformers 5 writes the base inside rope_parameters */
  cr_assert_eq(mn_model_config_parse("{\"model_type\": \"llama\", \"vocab_size\": 100, "
                                     "\"hidden_size\": 64, \"num_hidden_layers\": 2, "
                                     "\"num_attention_heads\": 4, \"intermediate_size\": 128, "
                                     "\"rope_parameters\": {\"rope_theta\": 100000.0, "
                                     "\"rope_type\": \"default\"}}",
                                     &c),
               MN_OK, "%s", mn_last_error());
  cr_assert_eq(c.rope_theta, 100000.0f);
}

/* A GPT-2 or Llama config with `edit` spliced in after the opening brace: cJSON finds the
 * first of duplicate keys, so an edit placed first replaces the base's value. Checks the
 * status, the message, and that *out is unchanged. */
static void expect_error(const char *base, const char *edit, mn_status want, const char *fragment) {
  char json[4096];
  snprintf(json, sizeof json, "{%s%s", edit, base + 1);
  mn_model_config c, before;
  memset(&c, 0x5a, sizeof c);
  before = c;
  mn_assert_error(mn_model_config_parse(json, &c), want, fragment);
  cr_assert_eq(memcmp(&c, &before, sizeof c), 0, "config changed on failure (%s)", edit);
}

#define GPT2(edit, want, fragment)  expect_error(gpt2_min, edit, want, fragment)
#define LLAMA(edit, want, fragment) expect_error(llama_min, edit, want, fragment)

static const char *gpt2_min = "{\"model_type\": \"gpt2\", \"vocab_size\": 50, \"n_embd\": 32, "
                              "\"n_layer\": 2, \"n_head\": 4, \"n_positions\": 16}";
static const char *llama_min =
    "{\"model_type\": \"llama\", \"vocab_size\": 61, \"hidden_size\": 48, "
    "\"num_hidden_layers\": 2, \"num_attention_heads\": 6, \"num_key_value_heads\": 2, "
    "\"intermediate_size\": 96}";

Test(model_config, missing_keys) {
  const char *gpt2_keys[] = {"vocab_size", "n_embd", "n_layer", "n_head", "n_positions"};
  for (int i = 0; i < 5; i++) {
    char edit[64], frag[96];
    snprintf(edit, sizeof edit, "\"%s\": null, ", gpt2_keys[i]);
    snprintf(frag, sizeof frag, "mn_model_config_parse: config: key \"%s\" is missing",
             gpt2_keys[i]);
    GPT2(edit, MN_ERR_FORMAT, frag);
  }
  const char *llama_keys[] = {"vocab_size", "hidden_size", "num_hidden_layers",
                              "num_attention_heads", "intermediate_size"};
  for (int i = 0; i < 5; i++) {
    char edit[64], frag[96];
    snprintf(edit, sizeof edit, "\"%s\": null, ", llama_keys[i]);
    snprintf(frag, sizeof frag, "key \"%s\" is missing", llama_keys[i]);
    LLAMA(edit, MN_ERR_FORMAT, frag);
  }
  mn_model_config c;
  mn_assert_error(mn_model_config_parse("{\"n_embd\": 4}", &c), MN_ERR_FORMAT,
                  "key \"model_type\" is missing");
}

Test(model_config, bad_types_and_values) {
  GPT2("\"n_head\": \"4\", ", MN_ERR_FORMAT, "\"n_head\" is a string, expected an integer");
  GPT2("\"n_layer\": 2.5, ", MN_ERR_FORMAT, "\"n_layer\" is 2.5, expected an integer in 1..");
  GPT2("\"vocab_size\": 0, ", MN_ERR_FORMAT, "\"vocab_size\" is 0, expected an integer in 1..");
  GPT2("\"n_embd\": -32, ", MN_ERR_FORMAT, "\"n_embd\" is -32");
  GPT2("\"n_positions\": 1e12, ", MN_ERR_FORMAT, "expected an integer in 1..2147483647");
  GPT2("\"n_embd\": 30, ", MN_ERR_FORMAT, "n_embd 30 is not a multiple of n_head 4");
  GPT2("\"layer_norm_epsilon\": \"1e-5\", ", MN_ERR_FORMAT,
       "\"layer_norm_epsilon\" is a string, expected a number");
  GPT2("\"layer_norm_epsilon\": 0, ", MN_ERR_FORMAT, "expected a finite number > 0");
  GPT2("\"initializer_range\": -1, ", MN_ERR_FORMAT, "expected a finite number >= 0");
  GPT2("\"tie_word_embeddings\": 1, ", MN_ERR_FORMAT,
       "\"tie_word_embeddings\" is a number, expected true or false");
  GPT2("\"model_type\": 2, ", MN_ERR_FORMAT, "\"model_type\" is a number, expected a string");
  LLAMA("\"num_key_value_heads\": 4, ", MN_ERR_FORMAT,
        "num_attention_heads 6 is not a multiple of num_key_value_heads 4");
  LLAMA("\"hidden_size\": 50, ", MN_ERR_FORMAT,
        "hidden_size 50 is not a multiple of num_attention_heads 6 (and no head_dim is given)");
  LLAMA("\"head_dim\": 5, ", MN_ERR_FORMAT, "head_dim 5 is odd");
  LLAMA("\"rms_norm_eps\": [1], ", MN_ERR_FORMAT,
        "\"rms_norm_eps\" is an array, expected a number");
  LLAMA("\"rope_theta\": {}, ", MN_ERR_FORMAT, "\"rope_theta\" is an object");
  LLAMA("\"rope_parameters\": {\"rope_type\": \"yarn\", \"factor\": 4.0}, ", MN_ERR_UNSUPPORTED,
        "\"rope_parameters\" has rope_type yarn; only plain RoPE");
  LLAMA("\"rope_parameters\": {\"rope_theta\": -2}, ", MN_ERR_FORMAT,
        "rope_parameters.rope_theta is not a positive number");
  mn_model_config c;
  mn_assert_error(mn_model_config_parse("{\"model_type\": ", &c), MN_ERR_FORMAT,
                  "mn_model_config_parse: config: not valid JSON");
  mn_assert_error(mn_model_config_parse("[1, 2]", &c), MN_ERR_FORMAT,
                  "the config is an array, expected a JSON object");
  mn_assert_error(mn_model_config_parse(NULL, &c), MN_ERR_INVALID_ARGUMENT,
                  "mn_model_config_parse: json_text is NULL");
  mn_assert_error(mn_model_config_parse(gpt2_min, NULL), MN_ERR_INVALID_ARGUMENT, "out is NULL");
}

Test(model_config, unsupported_models_and_options) {
  GPT2("\"model_type\": \"bert\", ", MN_ERR_UNSUPPORTED,
       "model_type \"bert\" is not supported (supported: \"gpt2\", \"llama\")");
  GPT2("\"activation_function\": \"relu\", ", MN_ERR_UNSUPPORTED,
       "\"activation_function\" is \"relu\", which is not supported (only \"gelu_new\")");
  GPT2("\"scale_attn_weights\": false, ", MN_ERR_UNSUPPORTED, "\"scale_attn_weights\" is false");
  GPT2("\"scale_attn_by_inverse_layer_idx\": true, ", MN_ERR_UNSUPPORTED,
       "scale_attn_by_inverse_layer_idx");
  GPT2("\"add_cross_attention\": true, ", MN_ERR_UNSUPPORTED, "add_cross_attention");
  LLAMA("\"hidden_act\": \"gelu\", ", MN_ERR_UNSUPPORTED, "\"hidden_act\" is \"gelu\"");
  LLAMA("\"attention_bias\": true, ", MN_ERR_UNSUPPORTED, "\"attention_bias\" is true");
  LLAMA("\"mlp_bias\": true, ", MN_ERR_UNSUPPORTED, "\"mlp_bias\" is true");
  LLAMA("\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0}, ", MN_ERR_UNSUPPORTED,
        "\"rope_scaling\" is set to llama3; only plain RoPE");
  /* gelu_pytorch_tanh is the same function as gelu_new. */
  mn_model_config c;
  char json[512];
  snprintf(json, sizeof json, "{\"activation_function\": \"gelu_pytorch_tanh\", %s", gpt2_min + 1);
  cr_assert_eq(mn_model_config_parse(json, &c), MN_OK, "%s", mn_last_error());
}

Test(model_config, load_errors) {
  mn_model_config c;
  mn_assert_error(mn_model_config_load("/nonexistent/config.json", &c), MN_ERR_IO,
                  "mn_model_config_load: /nonexistent/config.json: cannot open");
  mn_assert_error(mn_model_config_load(NULL, &c), MN_ERR_INVALID_ARGUMENT,
                  "config_json_path is NULL");
  mn_tmp_dir dir = mn_tmp_dir_make("mn_model_config");
  const char *path = mn_tmp_path(&dir, "config.json");
  mn_test_write_file(path, "{\"model_type\": \"gpt2\",", 22);
  mn_assert_error(mn_model_config_load(path, &c), MN_ERR_FORMAT, "not valid JSON");
  mn_assert_error(mn_model_config_load(dir.path, &c), MN_ERR_IO, "not a regular file");
  mn_tmp_dir_remove(&dir);
}

/* ---------------------------------------------------------------- build arguments */

static mn_model_config parsed(const char *json) {
  mn_model_config c;
  cr_assert_eq(mn_model_config_parse(json, &c), MN_OK, "%s", mn_last_error());
  return c;
}

Test(model_config, build_errors) {
  mn_model_config c = parsed(gpt2_min);
  mn_graph *g = (mn_graph *)&c; /* must be reset to NULL on failure */
  mn_assert_error(mn_model_build(&c, 2, 17, NULL, &g), MN_ERR_INVALID_ARGUMENT,
                  "mn_model_build: seq 17 is longer than n_positions 16 (the rows of wpe)");
  cr_assert_null(g);
  mn_assert_error(mn_model_build(&c, 0, 4, NULL, &g), MN_ERR_INVALID_ARGUMENT,
                  "batch 0 and seq 4 must both be positive");
  mn_assert_error(mn_model_build(NULL, 1, 4, NULL, &g), MN_ERR_INVALID_ARGUMENT,
                  "mn_model_build: config is NULL");
  mn_assert_error(mn_model_build(&c, 1, 4, NULL, NULL), MN_ERR_INVALID_ARGUMENT, "out is NULL");
  char long_prefix[200];
  memset(long_prefix, 'x', sizeof long_prefix - 1);
  long_prefix[sizeof long_prefix - 1] = '\0';
  mn_assert_error(mn_model_build(&c, 1, 4, long_prefix, &g), MN_ERR_INVALID_ARGUMENT,
                  "name_prefix is 199 bytes long, at most 128");
  mn_model_config bad = c;
  bad.num_heads = 0;
  mn_assert_error(mn_model_build(&bad, 1, 4, NULL, &g), MN_ERR_INVALID_ARGUMENT,
                  "mn_model_build: config num_heads is 0");
  bad = c;
  bad.family = (mn_model_family)7;
  mn_assert_error(mn_model_build(&bad, 1, 4, NULL, &g), MN_ERR_INVALID_ARGUMENT,
                  "config family is 7");
  bad = c;
  bad.head_dim = 4;
  mn_assert_error(mn_model_build(&bad, 1, 4, NULL, &g), MN_ERR_INVALID_ARGUMENT,
                  "GPT-2 needs num_kv_heads == num_heads and head_dim * num_heads == hidden_size");
  bad = parsed(llama_min);
  bad.rope_theta = -1;
  mn_assert_error(mn_model_build(&bad, 1, 4, NULL, &g), MN_ERR_INVALID_ARGUMENT,
                  "config rope_theta is -1");
  /* Activations past 2^40 elements are refused before anything is built. */
  bad = parsed(llama_min);
  bad.vocab_size = (int64_t)1 << 30;
  mn_assert_error(mn_model_build(&bad, 4096, 4096, NULL, &g), MN_ERR_INVALID_ARGUMENT,
                  "batch 4096 x seq 4096 x 1073741824 (the widest activation) is more than 2^40 "
                  "elements");
  mn_assert_error(mn_model_build(&c, INT64_MAX, 16, NULL, &g), MN_ERR_INVALID_ARGUMENT,
                  "(the widest activation) is more than 2^40 elements");
  cr_assert_null(g);
}

/* ---------------------------------------------------------------- prefix of a file */

/* A safetensors file holding one F32 [1] tensor per name. */
static void write_names(const char *path, const char *const *names, int n) {
  char header[1024];
  int w = snprintf(header, sizeof header, "{");
  for (int i = 0; i < n; i++)
    w += snprintf(header + w, sizeof header - (size_t)w,
                  "%s\"%s\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[%d,%d]}",
                  i ? "," : "", names[i], 4 * i, 4 * i + 4);
  w += snprintf(header + w, sizeof header - (size_t)w, "}");
  size_t total = 8 + (size_t)w + 4 * (size_t)n;
  unsigned char *buf = calloc(1, total);
  uint64_t len = (uint64_t)w;
  for (int i = 0; i < 8; i++)
    buf[i] = (unsigned char)(len >> (8 * i));
  memcpy(buf + 8, header, (size_t)w);
  mn_test_write_file(path, buf, total);
  free(buf);
}

Test(model_config, name_prefix_of_files) {
  mn_model_config gpt2 = parsed(gpt2_min), llama = parsed(llama_min);
  mn_tmp_dir dir = mn_tmp_dir_make("mn_model_prefix");
  char a[128], b[128], idx[128];
  snprintf(a, sizeof a, "%s", mn_tmp_path(&dir, "hf.safetensors"));
  snprintf(b, sizeof b, "%s", mn_tmp_path(&dir, "bare.safetensors"));
  snprintf(idx, sizeof idx, "%s", mn_tmp_path(&dir, "model.safetensors.index.json"));
  /* transformers' GPT2LMHeadModel file, and openai-community/gpt2's (no prefix, with the
   * attention mask buffers). */
  write_names(a, (const char *[]){"transformer.h.0.ln_1.weight", "transformer.wte.weight"}, 2);
  write_names(b, (const char *[]){"h.0.attn.bias", "wte.weight", "wpe.weight"}, 3);
  const char *p = NULL;
  cr_assert_eq(mn_model_name_prefix(&gpt2, a, &p), MN_OK, "%s", mn_last_error());
  cr_assert_str_eq(p, "transformer.");
  cr_assert_eq(mn_model_name_prefix(&gpt2, b, &p), MN_OK, "%s", mn_last_error());
  cr_assert_str_eq(p, "");
  mn_assert_error(mn_model_name_prefix(&llama, a, &p), MN_ERR_NOT_FOUND,
                  "has neither \"model.embed_tokens.weight\" nor \"embed_tokens.weight\": not a "
                  "Llama checkpoint");
  /* A sharded checkpoint's index. */
  const char *index = "{\"metadata\": {}, \"weight_map\": {\"lm_head.weight\": \"a.safetensors\", "
                      "\"model.embed_tokens.weight\": \"b.safetensors\"}}";
  mn_test_write_file(idx, index, strlen(index));
  cr_assert_eq(mn_model_name_prefix(&llama, idx, &p), MN_OK, "%s", mn_last_error());
  cr_assert_str_eq(p, "model.");
  mn_test_write_file(idx, "{\"weights\": 1}", 14);
  mn_assert_error(mn_model_name_prefix(&llama, idx, &p), MN_ERR_FORMAT, "no \"weight_map\" object");
  mn_assert_error(mn_model_name_prefix(&gpt2, "/nonexistent.safetensors", &p), MN_ERR_IO,
                  "mn_model_name_prefix: ");
  mn_assert_error(mn_model_name_prefix(&gpt2, NULL, &p), MN_ERR_INVALID_ARGUMENT,
                  "weights_path is NULL");
  mn_tmp_dir_remove(&dir);
}
