/* Adapters in and out of a session in PEFT's layout: adapter_model.safetensors under
 * "base_model.model.{module}.lora_A.weight" (PeftModel wraps the LM class, whose modules keep
 * transformers' names), and the merged export that transformers loads alone. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "host/error.h"
#include "models/model_internal.h"

#define PEFT_PREFIX "base_model.model."
#define A_SUFFIX    ".lora_A.weight"
#define B_SUFFIX    ".lora_B.weight"

/* One adapted layer of a graph: its parameters' names, sizes and base layout. */
typedef struct adapter {
  char module[MN_MODEL_NAME_CAP];
  char a[MN_MODEL_NAME_CAP + 16], b[MN_MODEL_NAME_CAP + 16], w[MN_MODEL_NAME_CAP + 16];
  char key_a[MN_MODEL_NAME_CAP + 48], key_b[MN_MODEL_NAME_CAP + 48];
  int64_t rank, in, out;
  bool conv1d; /* the base weight is [in, out] and used through mn_matmul */
} adapter;

static bool ends_with(const char *s, const char *suffix) {
  size_t ls = strlen(s), lx = strlen(suffix);
  return ls >= lx && strcmp(s + ls - lx, suffix) == 0;
}

static bool find_param(const mn_graph *g, const char *name, mn_node *id, mn_node_info *info) {
  for (size_t i = 0; i < mn_graph_num_nodes(g); i++)
    if (mn_graph_node(g, (mn_node)i, info) == MN_OK && strcmp(info->op, "parameter") == 0 &&
        strcmp(info->name, name) == 0) {
      *id = (mn_node)i;
      return true;
    }
  return false;
}

/* Whether w is multiplied as stored (Conv1D, "matmul") rather than transposed. */
static bool used_by_matmul(const mn_graph *g, mn_node w) {
  mn_node_info info;
  for (size_t i = 0; i < mn_graph_num_nodes(g); i++)
    if (mn_graph_node(g, (mn_node)i, &info) == MN_OK && strcmp(info.op, "matmul") == 0 &&
        info.num_inputs == 2 && info.inputs[1] == w)
      return true;
  return false;
}

/* The module's name in transformers' LM class: graphs built with name prefix "" lack the
 * base model's ("transformer." for GPT-2's Conv1D layers, "model." for Llama). */
static void peft_key(const adapter *ad, const char *suffix, char *out, size_t cap) {
  const char *base = ad->conv1d ? "transformer." : "model.";
  bool has = strncmp(ad->module, base, strlen(base)) == 0;
  snprintf(out, cap, PEFT_PREFIX "%s%s%s", has ? "" : base, ad->module, suffix);
}

/* Every adapter of g, in node order. *out is malloc'd; MN_ERR_INVALID_ARGUMENT when g has
 * none or an adapter is incomplete. */
static mn_status adapters_of(const char *fn, const mn_graph *g, adapter **out, size_t *n) {
  *out = NULL;
  *n = 0;
  size_t count = 0;
  mn_node_info info;
  for (size_t i = 0; i < mn_graph_num_nodes(g); i++)
    count += mn_graph_node(g, (mn_node)i, &info) == MN_OK && strcmp(info.op, "parameter") == 0 &&
             ends_with(info.name, A_SUFFIX);
  if (!count) return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: the graph has no LoRA adapters", fn);
  adapter *list = calloc(count, sizeof *list);
  if (!list) return mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
  size_t k = 0;
  for (size_t i = 0; i < mn_graph_num_nodes(g); i++) {
    if (mn_graph_node(g, (mn_node)i, &info) != MN_OK || strcmp(info.op, "parameter") != 0 ||
        !ends_with(info.name, A_SUFFIX))
      continue;
    adapter *ad = &list[k++];
    size_t len = strlen(info.name) - strlen(A_SUFFIX);
    snprintf(ad->module, sizeof ad->module, "%.*s", (int)len, info.name);
    snprintf(ad->a, sizeof ad->a, "%s", info.name);
    snprintf(ad->b, sizeof ad->b, "%s" B_SUFFIX, ad->module);
    snprintf(ad->w, sizeof ad->w, "%s.weight", ad->module);
    ad->rank = info.type.shape[0];
    ad->in = info.type.shape[1];
    mn_node b_id, w_id;
    mn_node_info b_info, w_info;
    bool has_b = find_param(g, ad->b, &b_id, &b_info);
    if (!has_b || !find_param(g, ad->w, &w_id, &w_info)) {
      mn_status st = mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: adapter %s has no %s", fn, ad->a,
                             !has_b ? ad->b : ad->w);
      free(list);
      return st;
    }
    ad->out = b_info.type.shape[0];
    ad->conv1d = used_by_matmul(g, w_id);
    peft_key(ad, A_SUFFIX, ad->key_a, sizeof ad->key_a);
    peft_key(ad, B_SUFFIX, ad->key_b, sizeof ad->key_b);
  }
  *out = list;
  *n = k;
  return MN_OK;
}

static mn_status make_dir(const char *fn, const char *dir) {
  if (mkdir(dir, 0777) == 0 || errno == EEXIST) {
    struct stat sb;
    if (stat(dir, &sb) == 0 && S_ISDIR(sb.st_mode)) return MN_OK;
  }
  return mn_fail(MN_ERR_IO, "%s: cannot create the folder %s", fn, dir);
}

mn_status mn_lora_save(mn_session *s, const mn_graph *g, const mn_lora_config *lora,
                       const char *adapter_dir) {
  const char *fn = "mn_lora_save";
  if (!s || !g || !lora || !adapter_dir)
    return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn,
                   !s      ? "session"
                   : !g    ? "graph"
                   : !lora ? "lora"
                           : "adapter_dir");
  adapter *ads = NULL;
  size_t n = 0;
  const char **names = NULL, **keys = NULL;
  char path[MN_LORA_PATH_CAP];
  mn_status st = adapters_of(fn, g, &ads, &n);
  if (st == MN_OK &&
      (!(names = malloc(2 * n * sizeof *names)) || !(keys = malloc(2 * n * sizeof *keys))))
    st = mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
  for (size_t i = 0; st == MN_OK && i < n; i++) {
    names[2 * i] = ads[i].a, keys[2 * i] = ads[i].key_a;
    names[2 * i + 1] = ads[i].b, keys[2 * i + 1] = ads[i].key_b;
  }
  if (st == MN_OK) st = make_dir(fn, adapter_dir);
  if (st == MN_OK) st = mn_lora_path(fn, adapter_dir, "adapter_model.safetensors", path);
  if (st == MN_OK && mn_session_save_parameters(s, path, names, keys, 2 * n) != MN_OK) {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", mn_last_error());
    st = mn_fail(MN_ERR_IO, "%s: %s", fn, msg);
  }
  if (st == MN_OK) st = mn_lora_path(fn, adapter_dir, "adapter_config.json", path);
  if (st == MN_OK) st = mn_lora_write_config(fn, path, lora, ads[0].conv1d);
  free(names);
  free(keys);
  free(ads);
  return st;
}

/* Checks that the file holds `key` with shape [rows, cols]. */
static mn_status check_tensor(const char *fn, const char *path, const mn_safetensors *file,
                              const char *key, int64_t rows, int64_t cols) {
  mn_safetensors_info info;
  if (mn_safetensors_info_of(file, key, &info) != MN_OK)
    return mn_fail(MN_ERR_NOT_FOUND, "%s: %s has no tensor %s", fn, path, key);
  if (info.rank != 2 || info.shape[0] != rows || info.shape[1] != cols)
    return mn_fail(MN_ERR_SHAPE, "%s: %s: %s is not [%lld, %lld] as the graph's adapter is", fn,
                   path, key, (long long)rows, (long long)cols);
  return MN_OK;
}

/* Reads `key` into the parameter `name`. */
static mn_status copy_tensor(const char *fn, mn_session *s, const mn_safetensors *file,
                             const char *key, const char *name, float *buf, size_t numel) {
  if (mn_safetensors_read_f32(file, key, buf, numel) != MN_OK ||
      mn_session_set_parameter(s, name, buf, numel) != MN_OK) {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", mn_last_error());
    return mn_fail(MN_ERR_FORMAT, "%s: %s", fn, msg);
  }
  return MN_OK;
}

mn_status mn_lora_load(mn_session *s, const mn_graph *g, const char *adapter_dir) {
  const char *fn = "mn_lora_load";
  if (!s || !g || !adapter_dir)
    return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn,
                   !s   ? "session"
                   : !g ? "graph"
                        : "adapter_dir");
  adapter *ads = NULL;
  size_t n = 0;
  char path[MN_LORA_PATH_CAP];
  mn_safetensors *file = NULL;
  float *buf = NULL;
  mn_status st = adapters_of(fn, g, &ads, &n);
  if (st == MN_OK) st = mn_lora_path(fn, adapter_dir, "adapter_model.safetensors", path);
  if (st == MN_OK && mn_safetensors_open(path, &file) != MN_OK) {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", mn_last_error());
    st = mn_fail(MN_ERR_IO, "%s: %s", fn, msg);
  }
  size_t most = 1;
  for (size_t i = 0; st == MN_OK && i < n; i++) {
    st = check_tensor(fn, path, file, ads[i].key_a, ads[i].rank, ads[i].in);
    if (st == MN_OK) st = check_tensor(fn, path, file, ads[i].key_b, ads[i].out, ads[i].rank);
    size_t big = (size_t)(ads[i].rank * (ads[i].in > ads[i].out ? ads[i].in : ads[i].out));
    if (big > most) most = big;
  }
  /* Every tensor of the file must land somewhere: an adapter trained on other modules would
   * otherwise load partly and silently. */
  for (size_t t = 0; st == MN_OK && t < mn_safetensors_count(file); t++) {
    const char *name = mn_safetensors_name(file, t);
    bool known = false;
    for (size_t i = 0; i < n && !known; i++)
      known = strcmp(name, ads[i].key_a) == 0 || strcmp(name, ads[i].key_b) == 0;
    if (!known)
      st = mn_fail(MN_ERR_NOT_FOUND, "%s: %s: tensor %s is not an adapter of this graph", fn, path,
                   name);
  }
  if (st == MN_OK && !(buf = malloc(most * sizeof *buf)))
    st = mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
  for (size_t i = 0; st == MN_OK && i < n; i++) {
    st = copy_tensor(fn, s, file, ads[i].key_a, ads[i].a, buf, (size_t)(ads[i].rank * ads[i].in));
    if (st == MN_OK)
      st =
          copy_tensor(fn, s, file, ads[i].key_b, ads[i].b, buf, (size_t)(ads[i].out * ads[i].rank));
  }
  free(buf);
  mn_safetensors_close(file);
  free(ads);
  return st;
}

/* w += scale * B A for a Linear weight [out, in], or its transpose for Conv1D [in, out]. */
static void merge_into(const adapter *ad, float scale, const float *a, const float *b, float *w) {
  for (int64_t o = 0; o < ad->out; o++)
    for (int64_t i = 0; i < ad->in; i++) {
      double acc = 0;
      for (int64_t k = 0; k < ad->rank; k++)
        acc += (double)b[o * ad->rank + k] * (double)a[k * ad->in + i];
      float *at = ad->conv1d ? &w[i * ad->out + o] : &w[o * ad->in + i];
      *at = (float)((double)*at + scale * acc);
    }
}

static mn_status lib_fail(const char *fn, mn_status st) {
  char msg[1024];
  snprintf(msg, sizeof msg, "%s", mn_last_error());
  return mn_fail(st, "%s: %s", fn, msg);
}

/* The base model's parameter names of g, in node order. */
static mn_status base_names(const char *fn, const mn_graph *g, const char ***out, size_t *n) {
  size_t count = 0;
  mn_node_info info;
  const char **names = malloc((mn_graph_num_nodes(g) + 1) * sizeof *names);
  if (!names) return mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
  for (size_t i = 0; i < mn_graph_num_nodes(g); i++)
    if (mn_graph_node(g, (mn_node)i, &info) == MN_OK && strcmp(info.op, "parameter") == 0 &&
        !ends_with(info.name, A_SUFFIX) && !ends_with(info.name, B_SUFFIX))
      names[count++] = info.name;
  *out = names;
  *n = count;
  return MN_OK;
}

mn_status mn_lora_save_merged(mn_session *s, const mn_graph *g, const mn_lora_config *lora,
                              const char *path) {
  const char *fn = "mn_lora_save_merged";
  if (!s || !g || !lora || !path)
    return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn,
                   !s      ? "session"
                   : !g    ? "graph"
                   : !lora ? "lora"
                           : "path");
  adapter *ads = NULL;
  size_t n = 0, nb = 0;
  const char **names = NULL;
  float **saved = NULL, *a = NULL, *b = NULL;
  mn_status st = adapters_of(fn, g, &ads, &n);
  if (st == MN_OK && !(saved = calloc(n, sizeof *saved)))
    st = mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
  /* Merge in place, save, then put the base weights back exactly as they were. */
  size_t merged = 0;
  for (; st == MN_OK && merged < n; merged++) {
    const adapter *ad = &ads[merged];
    size_t nw = (size_t)(ad->in * ad->out);
    float *w = malloc(nw * sizeof *w), *orig = malloc(nw * sizeof *orig);
    a = malloc((size_t)(ad->rank * ad->in) * sizeof *a);
    b = malloc((size_t)(ad->out * ad->rank) * sizeof *b);
    if (!w || !orig || !a || !b) {
      free(w), free(orig);
      st = mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
      break;
    }
    mn_status r = mn_session_read_param(s, ad->w, orig, nw);
    if (r == MN_OK) r = mn_session_read_param(s, ad->a, a, (size_t)(ad->rank * ad->in));
    if (r == MN_OK) r = mn_session_read_param(s, ad->b, b, (size_t)(ad->out * ad->rank));
    if (r == MN_OK) {
      memcpy(w, orig, nw * sizeof *w);
      merge_into(ad, lora->alpha / (float)ad->rank, a, b, w);
      r = mn_session_set_parameter(s, ad->w, w, nw);
    }
    free(w), free(a), free(b);
    a = b = NULL;
    if (r != MN_OK) {
      free(orig);
      st = lib_fail(fn, r);
      break;
    }
    saved[merged] = orig;
  }
  if (st == MN_OK) st = base_names(fn, g, &names, &nb);
  if (st == MN_OK) {
    mn_status r = mn_session_save_parameters(s, path, names, NULL, nb);
    if (r != MN_OK) st = lib_fail(fn, r);
  }
  for (size_t i = 0; i < merged; i++) {
    if (saved[i] &&
        mn_session_set_parameter(s, ads[i].w, saved[i], (size_t)(ads[i].in * ads[i].out)) !=
            MN_OK &&
        st == MN_OK)
      st = lib_fail(fn, MN_ERR_STATE);
    free(saved[i]);
  }
  free(saved);
  free(names);
  free(ads);
  return st;
}
