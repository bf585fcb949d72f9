/* The public face of models/: building a family's training graph (logits, then the loss), the
 * name prefix of a weights file, the inputs a session needs set once, and transformers-style
 * initialization for training from scratch. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/error.h"
#include "models/model_internal.h"

mn_node mn_model_param(mn_graph *g, const char *prefix, const int64_t *shape, int rank,
                       const char *fmt, ...) {
  char name[MN_MODEL_NAME_CAP];
  /* mn_model_build bounds the prefix, and the rest of every name is short. */
  int w = snprintf(name, sizeof name, "%s", prefix);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(name + w, sizeof name - (size_t)w, fmt, ap);
  va_end(ap);
  return mn_parameter(g, name, shape, rank);
}

/* st with the current last error prefixed by fn (copied first: mn_fail writes the buffer
 * that mn_last_error() returns). */
static mn_status prefixed(const char *fn, mn_status st) {
  char msg[1024];
  snprintf(msg, sizeof msg, "%s", mn_last_error());
  return mn_fail(st, "%s: %s", fn, msg);
}

#define MN_MODEL_MAX_NUMEL ((int64_t)1 << 40)

static const char *default_prefix(mn_model_family f) {
  return f == MN_MODEL_GPT2 ? MN_GPT2_PREFIX : MN_LLAMA_PREFIX;
}

static bool ends_with(const char *s, const char *suffix) {
  size_t ls = strlen(s), lx = strlen(suffix);
  return ls >= lx && strcmp(s + ls - lx, suffix) == 0;
}

static bool is_adapter(const char *name) {
  return ends_with(name, ".lora_A.weight") || ends_with(name, ".lora_B.weight");
}

/* Freezes every parameter but the adapters, and refuses a target that named no layer. */
static mn_status finish_lora(const char *fn, mn_graph *g, const mn_lora_config *l) {
  mn_node_info info;
  size_t adapters = 0;
  for (size_t i = 0; i < mn_graph_num_nodes(g); i++) {
    if (mn_graph_node(g, (mn_node)i, &info) != MN_OK || strcmp(info.op, "parameter") != 0) continue;
    if (is_adapter(info.name))
      adapters++;
    else
      mn_set_trainable(g, (mn_node)i, false);
  }
  if (!adapters)
    return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: LoRA targets \"%s\" name no layer of the model",
                   fn, l->target_modules);
  return mn_graph_status(g);
}

mn_status mn_model_build(const mn_model_config *c, int64_t batch, int64_t seq,
                         const char *name_prefix, mn_graph **out) {
  mn_model_options o = {.name_prefix = name_prefix};
  return mn_model_build_with(c, batch, seq, &o, out);
}

mn_status mn_model_build_with(const mn_model_config *c, int64_t batch, int64_t seq,
                              const mn_model_options *o, mn_graph **out) {
  const char *fn = "mn_model_build";
  const mn_model_options none = {0};
  if (!o) o = &none;
  const char *name_prefix = o->name_prefix;
  if (!out) return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: out is NULL", fn);
  *out = NULL;
  if (!c) return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: config is NULL", fn);
  mn_status st = mn_model_config_check(fn, c);
  if (st != MN_OK) return st;
  if (batch < 1 || seq < 1)
    return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: batch %lld and seq %lld must both be positive", fn,
                   (long long)batch, (long long)seq);
  /* GPT-2 has a learned position table; RoPE models take any length, as transformers does. */
  if (c->family == MN_MODEL_GPT2 && seq > c->max_positions)
    return mn_fail(MN_ERR_INVALID_ARGUMENT,
                   "%s: seq %lld is longer than n_positions %lld (the rows of wpe)", fn,
                   (long long)seq, (long long)c->max_positions);
  /* The widest activation, [B, T, W], bounded like a leaf (2^40 elements) so that no size
   * computed later overflows. */
  int64_t width = c->vocab_size, qkv = 3 * c->hidden_size, q = c->num_heads * c->head_dim;
  if (c->intermediate_size > width) width = c->intermediate_size;
  if (qkv > width) width = qkv;
  if (q > width) width = q;
  if (batch > MN_MODEL_MAX_NUMEL / seq || batch * seq > MN_MODEL_MAX_NUMEL / width)
    return mn_fail(MN_ERR_INVALID_ARGUMENT,
                   "%s: batch %lld x seq %lld x %lld (the widest activation) is more than 2^40 "
                   "elements",
                   fn, (long long)batch, (long long)seq, (long long)width);
  const char *prefix = name_prefix ? name_prefix : default_prefix(c->family);
  if (strlen(prefix) > MN_MODEL_PREFIX_CAP)
    return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: name_prefix is %zu bytes long, at most %d", fn,
                   strlen(prefix), MN_MODEL_PREFIX_CAP);
  if (o->lora && (st = mn_lora_config_check(fn, c->family, o->lora)) != MN_OK) return st;
  mn_graph *g = mn_graph_new();
  if (!g) return mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
  mn_model_ctx m = {.g = g,
                    .c = c,
                    .batch = batch,
                    .seq = seq,
                    .prefix = prefix,
                    .lora = o->lora,
                    .packed = o->packed,
                    .positions = MN_NO_NODE};
  mn_node logits = c->family == MN_MODEL_GPT2 ? mn_gpt2_logits(&m) : mn_llama_logits(&m);
  mn_node labels = mn_input_u32(g, "labels", MN_SHAPE(batch, seq));
  mn_node outputs[2] = {mn_sparse_cross_entropy_loss(g, logits, labels), logits};
  if (mn_graph_status(g) == MN_OK) mn_set_outputs(g, outputs, o->loss_only ? 1 : 2);
  if (o->lora && mn_graph_status(g) == MN_OK && (st = finish_lora(fn, g, o->lora)) != MN_OK) {
    mn_graph_free(g);
    return st;
  }
  if ((st = mn_graph_status(g)) != MN_OK) {
    /* A size the builders refuse (say B * T * V past the element limit): their message. */
    mn_fail(st, "%s: %s", fn, mn_graph_error(g));
    mn_graph_free(g);
    return st;
  }
  *out = g;
  return MN_OK;
}

/* ---------------------------------------------------------------- prefix of a file */

static bool has_name(const char *const *names, size_t n, const char *prefix, const char *rest) {
  size_t lp = strlen(prefix);
  for (size_t i = 0; i < n; i++)
    if (strncmp(names[i], prefix, lp) == 0 && strcmp(names[i] + lp, rest) == 0) return true;
  return false;
}

/* The tensor names of a safetensors file, or of a sharded checkpoint's index (its weight_map
 * keys): *names points into *st or *index, which the caller frees. */
static mn_status tensor_names(const char *fn, const char *path, mn_safetensors **st, cJSON **index,
                              const char ***names, size_t *n) {
  *n = 0;
  if (ends_with(path, ".json")) {
    mn_status s = mn_model_read_json(fn, path, index);
    if (s != MN_OK) return s;
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(*index, "weight_map");
    if (!cJSON_IsObject(map))
      return mn_fail(MN_ERR_FORMAT, "%s: %s: not a safetensors index (no \"weight_map\" object)",
                     fn, path);
    size_t count = (size_t)cJSON_GetArraySize(map);
    if (!(*names = calloc(count ? count : 1, sizeof **names)))
      return mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    for (const cJSON *e = map->child; e; e = e->next)
      (*names)[(*n)++] = e->string;
    return MN_OK;
  }
  mn_status s = mn_safetensors_open(path, st);
  if (s != MN_OK) return prefixed(fn, s);
  size_t count = mn_safetensors_count(*st);
  if (!(*names = calloc(count ? count : 1, sizeof **names)))
    return mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
  for (size_t i = 0; i < count; i++)
    (*names)[(*n)++] = mn_safetensors_name(*st, i);
  return MN_OK;
}

mn_status mn_model_name_prefix(const mn_model_config *c, const char *weights_path,
                               const char **prefix) {
  const char *fn = "mn_model_name_prefix";
  if (!c || !weights_path || !prefix)
    return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn,
                   !c              ? "config"
                   : !weights_path ? "weights_path"
                                   : "prefix");
  mn_status st = mn_model_config_check(fn, c);
  if (st != MN_OK) return st;
  /* The token embedding is in every checkpoint of the family, tied head or not. */
  const char *probe = c->family == MN_MODEL_GPT2 ? "wte.weight" : "embed_tokens.weight";
  const char *candidates[2] = {default_prefix(c->family), ""};
  mn_safetensors *file = NULL;
  cJSON *index = NULL;
  const char **names = NULL;
  size_t n = 0;
  st = tensor_names(fn, weights_path, &file, &index, &names, &n);
  const char *found = NULL;
  for (int i = 0; st == MN_OK && i < 2 && !found; i++)
    if (has_name(names, n, candidates[i], probe)) found = candidates[i];
  free(names);
  mn_safetensors_close(file);
  cJSON_Delete(index);
  if (st != MN_OK) return st;
  if (!found)
    return mn_fail(MN_ERR_NOT_FOUND, "%s: %s has neither \"%s%s\" nor \"%s\": not a %s checkpoint",
                   fn, weights_path, candidates[0], probe, probe,
                   c->family == MN_MODEL_GPT2 ? "GPT-2" : "Llama");
  *prefix = found;
  return MN_OK;
}

/* ---------------------------------------------------------------- sessions */

/* The input named `name` of g, or false. */
static bool find_input(const mn_graph *g, const char *name, mn_node_info *info) {
  for (size_t i = 0; i < mn_graph_num_nodes(g); i++)
    if (mn_graph_node(g, (mn_node)i, info) == MN_OK && strcmp(info->op, "input") == 0 &&
        info->name && strcmp(info->name, name) == 0)
      return true;
  return false;
}

mn_status mn_model_prepare_session(const mn_graph *g, mn_session *s) {
  const char *fn = "mn_model_prepare_session";
  if (!g || !s)
    return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn, !g ? "graph" : "session");
  mn_node_info info;
  if (!find_input(g, "position_ids", &info)) return MN_OK; /* RoPE models: nothing to set */
  if (info.type.dtype != MN_U32 || info.type.rank != 2)
    return mn_fail(MN_ERR_INVALID_ARGUMENT,
                   "%s: input position_ids is not a U32 [batch, seq] tensor: not a graph of "
                   "mn_model_build",
                   fn);
  size_t rows = (size_t)info.type.shape[0], seq = (size_t)info.type.shape[1];
  uint32_t *ids = malloc(rows * seq * sizeof *ids);
  if (!ids) return mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
  for (size_t r = 0; r < rows; r++)
    for (size_t t = 0; t < seq; t++)
      ids[r * seq + t] = (uint32_t)t;
  mn_status st = mn_session_set_input_u32(s, "position_ids", ids, rows * seq);
  free(ids);
  return st == MN_OK ? MN_OK : prefixed(fn, st);
}

/* splitmix64: small, seedable, and the same on every platform. */
static uint64_t next_u64(uint64_t *state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* Uniform in (0, 1): never 0, so that log() below is finite. */
static double uniform01(uint64_t *state) {
  return ((double)(next_u64(state) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

/* Box-Muller pairs. */
static void fill_normal(float *w, size_t n, double std, uint64_t *state) {
  for (size_t i = 0; i < n; i += 2) {
    double r = sqrt(-2.0 * log(uniform01(state))), a = 6.283185307179586 * uniform01(state);
    w[i] = (float)(std * r * cos(a));
    if (i + 1 < n) w[i + 1] = (float)(std * r * sin(a));
  }
}

/* PEFT's lora_A: kaiming_uniform_ with a = sqrt(5), i.e. uniform(-b, b), b = 1 / sqrt(fan_in). */
static void fill_kaiming_uniform(float *w, size_t n, int64_t fan_in, uint64_t *state) {
  double bound = 1.0 / sqrt((double)fan_in);
  for (size_t i = 0; i < n; i++)
    w[i] = (float)(bound * (2.0 * uniform01(state) - 1.0));
}

/* What transformers' _init_weights gives a parameter, judged by its name: norm weights 1
 * (GPT-2's ln_1, ln_2, ln_f; Llama's *layernorm and norm), biases 0, the rest
 * normal(0, initializer_range); GPT-2 scales its residual projections (attn.c_proj and
 * mlp.c_proj) by 1/sqrt(2 * n_layer) as in the GPT-2 paper. Returns the std, or -1 / -2 for
 * the constants 1 and 0. */
static double init_std(const mn_model_config *c, const char *name) {
  if (ends_with(name, ".bias") || ends_with(name, ".lora_B.weight")) return -2;
  const char *last = strrchr(name, '.');
  if (last && strcmp(last, ".weight") == 0) {
    const char *start = last;
    while (start > name && start[-1] != '.')
      start--;
    if (strncmp(start, "ln_", 3) == 0 || ends_with(name, "norm.weight")) return -1;
  }
  if (c->family == MN_MODEL_GPT2 && ends_with(name, "c_proj.weight"))
    return c->initializer_range / sqrt(2.0 * (double)c->num_layers);
  return c->initializer_range;
}

mn_status mn_model_init_parameters(const mn_model_config *c, const mn_graph *g, mn_session *s,
                                   uint64_t seed) {
  const char *fn = "mn_model_init_parameters";
  if (!c || !g || !s)
    return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn,
                   !c   ? "config"
                   : !g ? "graph"
                        : "session");
  mn_status st = mn_model_config_check(fn, c);
  if (st != MN_OK) return st;
  uint64_t state = seed;
  mn_node_info info;
  for (size_t i = 0; i < mn_graph_num_nodes(g); i++) {
    if (mn_graph_node(g, (mn_node)i, &info) != MN_OK || strcmp(info.op, "parameter") != 0) continue;
    size_t n = (size_t)mn_tensor_type_numel(&info.type);
    float *w = malloc((n ? n : 1) * sizeof *w);
    if (!w) return mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: out of memory for %s", fn, info.name);
    double std = init_std(c, info.name);
    if (ends_with(info.name, ".lora_A.weight"))
      fill_kaiming_uniform(w, n, info.type.shape[1], &state);
    else if (std < 0)
      for (size_t k = 0; k < n; k++)
        w[k] = std == -1 ? 1.0f : 0.0f;
    else
      fill_normal(w, n, std, &state);
    st = mn_session_set_parameter(s, info.name, w, n);
    free(w);
    if (st != MN_OK) return prefixed(fn, st);
  }
  return mn_model_prepare_session(g, s);
}
