/* HuggingFace config.json -> mn_model_config, for the two families the builders implement.
 *
 * Keys that shape the graph are required (a config without them would be built with guesses);
 * numeric options that transformers' config classes default (epsilons, RoPE theta,
 * initializer_range, tie_word_embeddings, ...) take those same defaults, so a file means what
 * it means to transformers. Options that change the computation in ways the builders do not
 * implement are refused with MN_ERR_UNSUPPORTED rather than ignored, since ignoring them
 * would give a model that loads and silently computes something else. A JSON null counts as
 * absent, as transformers writes null for unset options (n_inner, rope_scaling). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "host/error.h"
#include "io/gguf.h"
#include "models/model_internal.h"

#define MAX_JSON_BYTES ((size_t)64 << 20)
/* Sizes must fit the builders' int arguments (heads, head_dim) and U32 token ids. */
#define MAX_SIZE ((int64_t)INT32_MAX)

/* The config's keys, as messages name them: config.json's for each family, and the struct's
 * fields for a config filled by hand. */
typedef struct key_names {
  const char *vocab, *hidden, *layers, *inner;
} key_names;

static const key_names GPT2_KEYS = {"vocab_size", "n_embd", "n_layer", "n_inner"};
static const key_names LLAMA_KEYS = {"vocab_size", "hidden_size", "num_hidden_layers",
                                     "intermediate_size"};
static const key_names FIELD_NAMES = {"vocab_size", "hidden_size", "num_layers",
                                      "intermediate_size"};

typedef struct reader {
  const char *fn, *where; /* the public function, and the file (or "config") in messages */
  const cJSON *root;
} reader;

static const char *type_name(const cJSON *v) {
  if (cJSON_IsBool(v)) return "a boolean";
  if (cJSON_IsNumber(v)) return "a number";
  if (cJSON_IsString(v)) return "a string";
  if (cJSON_IsArray(v)) return "an array";
  if (cJSON_IsObject(v)) return "an object";
  return "null";
}

static const cJSON *get(const reader *r, const char *key) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(r->root, key);
  return cJSON_IsNull(v) ? NULL : v;
}

static mn_status missing(const reader *r, const char *key) {
  return mn_fail(MN_ERR_FORMAT, "%s: %s: key \"%s\" is missing", r->fn, r->where, key);
}

/* An integer in [lo, MAX_SIZE]; `def` when absent unless required. */
static mn_status int_key(const reader *r, const char *key, bool required, int64_t def, int64_t lo,
                         int64_t *out) {
  const cJSON *v = get(r, key);
  if (!v) return required ? missing(r, key) : (*out = def, MN_OK);
  if (!cJSON_IsNumber(v))
    return mn_fail(MN_ERR_FORMAT, "%s: %s: \"%s\" is %s, expected an integer", r->fn, r->where, key,
                   type_name(v));
  double d = v->valuedouble;
  if (!(d >= (double)lo && d <= (double)MAX_SIZE) || d != floor(d))
    return mn_fail(MN_ERR_FORMAT, "%s: %s: \"%s\" is %.17g, expected an integer in %lld..%lld",
                   r->fn, r->where, key, d, (long long)lo, (long long)MAX_SIZE);
  *out = (int64_t)d;
  return MN_OK;
}

/* A finite number > 0 (epsilons, theta) or >= 0 (initializer_range). */
static mn_status float_key(const reader *r, const char *key, double def, bool zero_ok, float *out) {
  const cJSON *v = get(r, key);
  if (!v) return (*out = (float)def, MN_OK);
  if (!cJSON_IsNumber(v))
    return mn_fail(MN_ERR_FORMAT, "%s: %s: \"%s\" is %s, expected a number", r->fn, r->where, key,
                   type_name(v));
  double d = v->valuedouble;
  float f = (float)d;
  if (!isfinite(f) || f < 0 || (f == 0 && !zero_ok))
    return mn_fail(MN_ERR_FORMAT, "%s: %s: \"%s\" is %g, expected a finite number %s 0", r->fn,
                   r->where, key, d, zero_ok ? ">=" : ">");
  *out = f;
  return MN_OK;
}

static mn_status bool_key(const reader *r, const char *key, bool def, bool *out) {
  const cJSON *v = get(r, key);
  if (!v) return (*out = def, MN_OK);
  if (!cJSON_IsBool(v))
    return mn_fail(MN_ERR_FORMAT, "%s: %s: \"%s\" is %s, expected true or false", r->fn, r->where,
                   key, type_name(v));
  *out = cJSON_IsTrue(v);
  return MN_OK;
}

/* An option that must keep the value the builders implement when it is present. */
static mn_status require_bool(const reader *r, const char *key, bool want, const char *why) {
  bool have = want;
  mn_status st = bool_key(r, key, want, &have);
  if (st != MN_OK || have == want) return st;
  return mn_fail(MN_ERR_UNSUPPORTED, "%s: %s: \"%s\" is %s; only %s is supported (%s)", r->fn,
                 r->where, key, have ? "true" : "false", want ? "true" : "false", why);
}

/* A string option that must be one of `allowed` (NULL-terminated) when present. */
static mn_status require_string(const reader *r, const char *key, const char *const *allowed) {
  const cJSON *v = get(r, key);
  if (!v) return MN_OK;
  if (!cJSON_IsString(v))
    return mn_fail(MN_ERR_FORMAT, "%s: %s: \"%s\" is %s, expected a string", r->fn, r->where, key,
                   type_name(v));
  for (size_t i = 0; allowed[i]; i++)
    if (strcmp(v->valuestring, allowed[i]) == 0) return MN_OK;
  return mn_fail(MN_ERR_UNSUPPORTED,
                 "%s: %s: \"%s\" is \"%s\", which is not supported (only \"%s\")", r->fn, r->where,
                 key, v->valuestring, allowed[0]);
}

#define TRY(call)                                                                                  \
  do {                                                                                             \
    mn_status st_ = (call);                                                                        \
    if (st_ != MN_OK) return st_;                                                                  \
  } while (0)

static mn_status parse_gpt2(const reader *r, mn_model_config *c) {
  static const char *const acts[] = {"gelu_new", "gelu_pytorch_tanh", NULL};
  c->family = MN_MODEL_GPT2;
  TRY(int_key(r, "vocab_size", true, 0, 1, &c->vocab_size));
  TRY(int_key(r, "n_embd", true, 0, 1, &c->hidden_size));
  TRY(int_key(r, "n_layer", true, 0, 1, &c->num_layers));
  TRY(int_key(r, "n_head", true, 0, 1, &c->num_heads));
  TRY(int_key(r, "n_positions", true, 0, 1, &c->max_positions));
  TRY(int_key(r, "n_inner", false, 4 * c->hidden_size, 1, &c->intermediate_size));
  TRY(float_key(r, "layer_norm_epsilon", 1e-5, false, &c->norm_eps));
  TRY(float_key(r, "initializer_range", 0.02, true, &c->initializer_range));
  TRY(bool_key(r, "tie_word_embeddings", true, &c->tie_word_embeddings));
  /* gelu_new and gelu_pytorch_tanh are both the tanh approximation that mn_gelu computes. */
  TRY(require_string(r, "activation_function", acts));
  TRY(require_bool(r, "scale_attn_weights", true, "attention scores are scaled by 1/sqrt(d)"));
  TRY(require_bool(r, "scale_attn_by_inverse_layer_idx", false, "no per-layer score scaling"));
  TRY(require_bool(r, "add_cross_attention", false, "decoder-only blocks"));
  if (c->hidden_size % c->num_heads)
    return mn_fail(MN_ERR_FORMAT, "%s: %s: n_embd %lld is not a multiple of n_head %lld", r->fn,
                   r->where, (long long)c->hidden_size, (long long)c->num_heads);
  c->num_kv_heads = c->num_heads;
  c->head_dim = c->hidden_size / c->num_heads;
  c->rope_theta = 0.0f;
  return MN_OK;
}

/* rope_scaling: absent, null or {"rope_type": "default"} (what transformers writes for plain
 * RoPE); scaled variants (linear, dynamic, llama3, yarn) change the angles. */
static mn_status check_rope_scaling(const reader *r) {
  const cJSON *v = get(r, "rope_scaling");
  if (!v) return MN_OK;
  const cJSON *type = cJSON_IsObject(v) ? cJSON_GetObjectItemCaseSensitive(v, "rope_type") : NULL;
  if (!type && cJSON_IsObject(v)) type = cJSON_GetObjectItemCaseSensitive(v, "type");
  if (cJSON_IsString(type) && strcmp(type->valuestring, "default") == 0) return MN_OK;
  return mn_fail(MN_ERR_UNSUPPORTED,
                 "%s: %s: \"rope_scaling\" is set%s%s; only plain RoPE (rope_scaling null) is "
                 "supported",
                 r->fn, r->where, cJSON_IsString(type) ? " to " : "",
                 cJSON_IsString(type) ? type->valuestring : "");
}

/* rope_parameters, transformers 5's form of rope_theta and rope_scaling: absent or null, or an
 * object with rope_type "default" (or none) whose rope_theta, when given, is the base. */
static mn_status read_rope_parameters(const reader *r, mn_model_config *c) {
  const cJSON *v = get(r, "rope_parameters");
  if (!v) return MN_OK;
  if (!cJSON_IsObject(v))
    return mn_fail(MN_ERR_FORMAT, "%s: %s: \"rope_parameters\" is not an object", r->fn, r->where);
  const cJSON *type = cJSON_GetObjectItemCaseSensitive(v, "rope_type");
  if (type && !cJSON_IsNull(type) &&
      !(cJSON_IsString(type) && strcmp(type->valuestring, "default") == 0))
    return mn_fail(MN_ERR_UNSUPPORTED,
                   "%s: %s: \"rope_parameters\" has rope_type %s; only plain RoPE (\"default\") "
                   "is supported",
                   r->fn, r->where, cJSON_IsString(type) ? type->valuestring : "(not a string)");
  const cJSON *theta = cJSON_GetObjectItemCaseSensitive(v, "rope_theta");
  if (!theta || cJSON_IsNull(theta)) return MN_OK;
  if (!cJSON_IsNumber(theta) || !(theta->valuedouble > 0))
    return mn_fail(MN_ERR_FORMAT, "%s: %s: rope_parameters.rope_theta is not a positive number",
                   r->fn, r->where);
  c->rope_theta = (float)theta->valuedouble;
  return MN_OK;
}

static mn_status parse_llama(const reader *r, mn_model_config *c) {
  static const char *const acts[] = {"silu", NULL};
  c->family = MN_MODEL_LLAMA;
  TRY(int_key(r, "vocab_size", true, 0, 1, &c->vocab_size));
  TRY(int_key(r, "hidden_size", true, 0, 1, &c->hidden_size));
  TRY(int_key(r, "num_hidden_layers", true, 0, 1, &c->num_layers));
  TRY(int_key(r, "num_attention_heads", true, 0, 1, &c->num_heads));
  TRY(int_key(r, "intermediate_size", true, 0, 1, &c->intermediate_size));
  TRY(int_key(r, "num_key_value_heads", false, c->num_heads, 1, &c->num_kv_heads));
  TRY(int_key(r, "max_position_embeddings", false, 2048, 1, &c->max_positions));
  if (c->num_heads % c->num_kv_heads)
    return mn_fail(MN_ERR_FORMAT,
                   "%s: %s: num_attention_heads %lld is not a multiple of num_key_value_heads %lld",
                   r->fn, r->where, (long long)c->num_heads, (long long)c->num_kv_heads);
  /* transformers: head_dim defaults to hidden_size // num_attention_heads. */
  if (!get(r, "head_dim") && c->hidden_size % c->num_heads)
    return mn_fail(MN_ERR_FORMAT,
                   "%s: %s: hidden_size %lld is not a multiple of num_attention_heads %lld (and "
                   "no head_dim is given)",
                   r->fn, r->where, (long long)c->hidden_size, (long long)c->num_heads);
  TRY(int_key(r, "head_dim", false, c->hidden_size / c->num_heads, 1, &c->head_dim));
  if (c->head_dim % 2)
    return mn_fail(MN_ERR_FORMAT, "%s: %s: head_dim %lld is odd; RoPE rotates pairs of dims", r->fn,
                   r->where, (long long)c->head_dim);
  TRY(float_key(r, "rms_norm_eps", 1e-6, false, &c->norm_eps));
  TRY(float_key(r, "rope_theta", 10000.0, false, &c->rope_theta));
  TRY(read_rope_parameters(r, c));
  TRY(float_key(r, "initializer_range", 0.02, true, &c->initializer_range));
  TRY(bool_key(r, "tie_word_embeddings", false, &c->tie_word_embeddings));
  TRY(require_string(r, "hidden_act", acts));
  TRY(require_bool(r, "attention_bias", false, "q, k, v and o projections have no bias"));
  TRY(require_bool(r, "mlp_bias", false, "the MLP projections have no bias"));
  return check_rope_scaling(r);
}

static mn_status size_check(const char *fn, const char *where, const mn_model_config *c,
                            const key_names *keys, mn_status status);

static mn_status parse_root(const char *fn, const char *where, const cJSON *root,
                            mn_model_config *out) {
  reader r = {fn, where, root};
  if (!cJSON_IsObject(root))
    return mn_fail(MN_ERR_FORMAT, "%s: %s: the config is %s, expected a JSON object", fn, where,
                   type_name(root));
  const cJSON *type = get(&r, "model_type");
  if (!type) return missing(&r, "model_type");
  if (!cJSON_IsString(type))
    return mn_fail(MN_ERR_FORMAT, "%s: %s: \"model_type\" is %s, expected a string", fn, where,
                   type_name(type));
  mn_model_config c;
  memset(&c, 0, sizeof c);
  mn_status st;
  if (strcmp(type->valuestring, "gpt2") == 0)
    st = parse_gpt2(&r, &c);
  else if (strcmp(type->valuestring, "llama") == 0)
    st = parse_llama(&r, &c);
  else
    return mn_fail(MN_ERR_UNSUPPORTED,
                   "%s: %s: model_type \"%s\" is not supported (supported: \"gpt2\", \"llama\")",
                   fn, where, type->valuestring);
  if (st != MN_OK) return st;
  st = size_check(fn, where, &c, c.family == MN_MODEL_GPT2 ? &GPT2_KEYS : &LLAMA_KEYS,
                  MN_ERR_FORMAT);
  if (st != MN_OK) return st;
  if ((st = mn_model_config_check(fn, &c)) != MN_OK) return st;
  *out = c;
  return MN_OK;
}

mn_status mn_model_config_parse(const char *json_text, mn_model_config *out) {
  const char *fn = "mn_model_config_parse";
  if (!json_text || !out)
    return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn, json_text ? "out" : "json_text");
  cJSON *root = cJSON_Parse(json_text);
  if (!root) return mn_fail(MN_ERR_FORMAT, "%s: config: not valid JSON", fn);
  mn_status st = parse_root(fn, "config", root, out);
  cJSON_Delete(root);
  return st;
}

mn_status mn_model_read_json(const char *fn, const char *path, cJSON **out) {
  FILE *fp = fopen(path, "rb");
  if (!fp) return mn_fail(MN_ERR_IO, "%s: %s: cannot open: %s", fn, path, strerror(errno));
  struct stat sb;
  if (fstat(fileno(fp), &sb) != 0 || !S_ISREG(sb.st_mode) || (size_t)sb.st_size > MAX_JSON_BYTES) {
    fclose(fp);
    return mn_fail(MN_ERR_IO, "%s: %s: not a regular file of at most %zu bytes", fn, path,
                   MAX_JSON_BYTES);
  }
  char *buf = malloc((size_t)sb.st_size + 1);
  size_t got = buf ? fread(buf, 1, (size_t)sb.st_size, fp) : 0;
  fclose(fp);
  if (!buf) return mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: %s: out of memory", fn, path);
  *out = cJSON_ParseWithLength(buf, got);
  free(buf);
  if (!*out) return mn_fail(MN_ERR_FORMAT, "%s: %s: not valid JSON", fn, path);
  return MN_OK;
}

mn_status mn_model_config_load(const char *config_json_path, mn_model_config *out) {
  const char *fn = "mn_model_config_load";
  if (!config_json_path || !out)
    return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn,
                   config_json_path ? "out" : "config_json_path");
  if (mn_gguf_is_gguf(config_json_path))
    return mn_model_config_load_gguf(fn, config_json_path, out);
  cJSON *root = NULL;
  mn_status st = mn_model_read_json(fn, config_json_path, &root);
  if (st != MN_OK) return st;
  st = parse_root(fn, config_json_path, root, out);
  cJSON_Delete(root);
  return st;
}

double mn_model_parameter_count(const mn_model_config *c) {
  double v = (double)c->vocab_size, d = (double)c->hidden_size, i = (double)c->intermediate_size;
  double head = c->tie_word_embeddings ? 0 : v * d, per_layer;
  if (c->family == MN_MODEL_GPT2) {
    /* ln_1, ln_2 (weight and bias); c_attn, c_proj, c_fc, mlp c_proj (weight and bias) */
    per_layer = 4 * d + (3 * d * d + 3 * d) + (d * d + d) + (d * i + i) + (i * d + d);
    return v * d + (double)c->max_positions * d + (double)c->num_layers * per_layer + 2 * d + head;
  }
  double q = (double)(c->num_heads * c->head_dim), kv = (double)(c->num_kv_heads * c->head_dim);
  /* q, k, v, o; gate, up, down; the two norms */
  per_layer = q * d + 2 * kv * d + d * q + 3 * i * d + 2 * d;
  return v * d + (double)c->num_layers * per_layer + d + head;
}

/* Refused before anything is allocated: more layers than MN_MODEL_MAX_LAYERS, or more
 * parameters than MN_MODEL_MAX_PARAMETERS (the sizes are named by `keys`). */
static mn_status size_check(const char *fn, const char *where, const mn_model_config *c,
                            const key_names *keys, mn_status status) {
  if (c->num_layers > MN_MODEL_MAX_LAYERS)
    return mn_fail(status, "%s: %s: \"%s\" is %lld, more than the limit of %d layers", fn, where,
                   keys->layers, (long long)c->num_layers, MN_MODEL_MAX_LAYERS);
  double n = mn_model_parameter_count(c);
  if (n > (double)MN_MODEL_MAX_PARAMETERS)
    return mn_fail(status,
                   "%s: %s: %.3g parameters (\"%s\" %lld, \"%s\" %lld, \"%s\" %lld, \"%s\" "
                   "%lld), more than the limit of 2^40 (%lld)",
                   fn, where, n, keys->vocab, (long long)c->vocab_size, keys->hidden,
                   (long long)c->hidden_size, keys->layers, (long long)c->num_layers, keys->inner,
                   (long long)c->intermediate_size, (long long)MN_MODEL_MAX_PARAMETERS);
  return MN_OK;
}

static mn_status bad_field(const char *fn, const char *field, long long v, const char *want) {
  return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: config %s is %lld, %s", fn, field, v, want);
}

mn_status mn_model_config_check(const char *fn, const mn_model_config *c) {
  if (c->family != MN_MODEL_GPT2 && c->family != MN_MODEL_LLAMA)
    return bad_field(fn, "family", (long long)c->family,
                     "expected MN_MODEL_GPT2 or MN_MODEL_LLAMA");
  const struct {
    const char *name;
    int64_t v;
  } sizes[] = {{"vocab_size", c->vocab_size},
               {"hidden_size", c->hidden_size},
               {"num_layers", c->num_layers},
               {"num_heads", c->num_heads},
               {"num_kv_heads", c->num_kv_heads},
               {"head_dim", c->head_dim},
               {"intermediate_size", c->intermediate_size},
               {"max_positions", c->max_positions}};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
    if (sizes[i].v < 1 || sizes[i].v > MAX_SIZE)
      return bad_field(fn, sizes[i].name, (long long)sizes[i].v, "expected 1..2147483647");
  mn_status st = size_check(fn, "config", c, &FIELD_NAMES, MN_ERR_INVALID_ARGUMENT);
  if (st != MN_OK) return st;
  if (c->num_heads % c->num_kv_heads)
    return bad_field(fn, "num_heads", (long long)c->num_heads, "not a multiple of num_kv_heads");
  if (c->family == MN_MODEL_GPT2 &&
      (c->num_kv_heads != c->num_heads || c->head_dim * c->num_heads != c->hidden_size))
    return bad_field(fn, "head_dim", (long long)c->head_dim,
                     "GPT-2 needs num_kv_heads == num_heads and head_dim * num_heads == "
                     "hidden_size");
  if (c->family == MN_MODEL_LLAMA && c->head_dim % 2)
    return bad_field(fn, "head_dim", (long long)c->head_dim, "must be even for RoPE");
  if (!(isfinite(c->norm_eps) && c->norm_eps > 0))
    return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: config norm_eps is %g, must be finite and > 0", fn,
                   (double)c->norm_eps);
  if (c->family == MN_MODEL_LLAMA && !(isfinite(c->rope_theta) && c->rope_theta > 0))
    return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: config rope_theta is %g, must be finite and > 0",
                   fn, (double)c->rope_theta);
  if (!(isfinite(c->initializer_range) && c->initializer_range >= 0))
    return mn_fail(MN_ERR_INVALID_ARGUMENT,
                   "%s: config initializer_range is %g, must be finite and >= 0", fn,
                   (double)c->initializer_range);
  return MN_OK;
}
