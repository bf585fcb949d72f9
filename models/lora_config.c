/* adapter_config.json, the PEFT LoraConfig beside every adapter: read (mn_lora_config_load)
 * and written (mn_lora_write_config, for mn_lora_save). Options that would change what the
 * adapter computes and that these models do not implement are refused by name rather than
 * ignored, so a loaded adapter always gives PEFT's outputs. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/error.h"
#include "models/model_internal.h"

static bool absent(const cJSON *v) { return !v || cJSON_IsNull(v); }

/* An option that must be absent, null, false, an empty object or list, or `allowed`. */
static bool is_default(const cJSON *v, const char *allowed) {
  if (absent(v) || cJSON_IsFalse(v)) return true;
  if ((cJSON_IsObject(v) || cJSON_IsArray(v)) && !v->child) return true;
  return allowed && cJSON_IsString(v) && strcmp(v->valuestring, allowed) == 0;
}

static mn_status read_targets(const char *fn, const char *path, const cJSON *v, char *out,
                              size_t cap) {
  if (cJSON_IsString(v)) {
    if (strcmp(v->valuestring, "all-linear") != 0)
      return mn_fail(MN_ERR_UNSUPPORTED,
                     "%s: %s: target_modules \"%s\" is a regular expression; give a list of "
                     "module names",
                     fn, path, v->valuestring);
    snprintf(out, cap, "all-linear");
    return MN_OK;
  }
  if (!cJSON_IsArray(v) || !v->child)
    return mn_fail(MN_ERR_FORMAT, "%s: %s: target_modules is not a non-empty list of names", fn,
                   path);
  size_t len = 0;
  out[0] = '\0';
  for (const cJSON *e = v->child; e; e = e->next) {
    if (!cJSON_IsString(e) || !e->valuestring[0] || strchr(e->valuestring, ','))
      return mn_fail(MN_ERR_FORMAT, "%s: %s: target_modules holds something other than a name", fn,
                     path);
    int w = snprintf(out + len, cap - len, "%s%s", len ? "," : "", e->valuestring);
    if (w < 0 || (size_t)w >= cap - len)
      return mn_fail(MN_ERR_FORMAT, "%s: %s: target_modules is longer than %zu bytes", fn, path,
                     cap - 1);
    len += (size_t)w;
  }
  return MN_OK;
}

static mn_status parse(const char *fn, const char *path, const cJSON *root, mn_lora_config *l) {
  if (!cJSON_IsObject(root)) return mn_fail(MN_ERR_FORMAT, "%s: %s: not a JSON object", fn, path);
  const cJSON *type = cJSON_GetObjectItemCaseSensitive(root, "peft_type");
  if (!cJSON_IsString(type) || strcmp(type->valuestring, "LORA") != 0)
    return mn_fail(MN_ERR_UNSUPPORTED, "%s: %s: peft_type is not \"LORA\"", fn, path);
  static const char *const unsupported[] = {
      "use_dora",        "use_rslora",       "rank_pattern", "alpha_pattern", "layers_to_transform",
      "modules_to_save", "layer_replication"};
  for (size_t i = 0; i < sizeof unsupported / sizeof *unsupported; i++)
    if (!is_default(cJSON_GetObjectItemCaseSensitive(root, unsupported[i]), NULL))
      return mn_fail(MN_ERR_UNSUPPORTED, "%s: %s: %s is not supported", fn, path, unsupported[i]);
  if (!is_default(cJSON_GetObjectItemCaseSensitive(root, "bias"), "none"))
    return mn_fail(MN_ERR_UNSUPPORTED, "%s: %s: bias other than \"none\" is not supported", fn,
                   path);
  const cJSON *r = cJSON_GetObjectItemCaseSensitive(root, "r");
  const cJSON *alpha = cJSON_GetObjectItemCaseSensitive(root, "lora_alpha");
  const cJSON *dropout = cJSON_GetObjectItemCaseSensitive(root, "lora_dropout");
  const cJSON *base = cJSON_GetObjectItemCaseSensitive(root, "base_model_name_or_path");
  if (!cJSON_IsNumber(r) || r->valuedouble != floor(r->valuedouble) || r->valuedouble < 1 ||
      r->valuedouble > 65536)
    return mn_fail(MN_ERR_FORMAT, "%s: %s: r is not an integer in [1, 65536]", fn, path);
  if (!cJSON_IsNumber(alpha) || !(alpha->valuedouble > 0))
    return mn_fail(MN_ERR_FORMAT, "%s: %s: lora_alpha is not a positive number", fn, path);
  if (!absent(dropout) &&
      (!cJSON_IsNumber(dropout) || !(dropout->valuedouble >= 0) || !(dropout->valuedouble < 1)))
    return mn_fail(MN_ERR_FORMAT, "%s: %s: lora_dropout is not a number in [0, 1)", fn, path);
  if (!absent(base) && !cJSON_IsString(base))
    return mn_fail(MN_ERR_FORMAT, "%s: %s: base_model_name_or_path is not a string", fn, path);
  mn_lora_config out = {.rank = (int64_t)r->valuedouble,
                        .alpha = (float)alpha->valuedouble,
                        .dropout = absent(dropout) ? 0.0f : (float)dropout->valuedouble};
  mn_status st = read_targets(fn, path, cJSON_GetObjectItemCaseSensitive(root, "target_modules"),
                              out.target_modules, sizeof out.target_modules);
  if (st != MN_OK) return st;
  if (!absent(base)) snprintf(out.base_model, sizeof out.base_model, "%s", base->valuestring);
  *l = out;
  return MN_OK;
}

mn_status mn_lora_config_load(const char *adapter_dir, mn_lora_config *out) {
  const char *fn = "mn_lora_config_load";
  if (!adapter_dir || !out)
    return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn,
                   !adapter_dir ? "adapter_dir" : "out");
  char path[MN_LORA_PATH_CAP];
  mn_status st = mn_lora_path(fn, adapter_dir, "adapter_config.json", path);
  cJSON *root = NULL;
  if (st == MN_OK) st = mn_model_read_json(fn, path, &root);
  if (st == MN_OK) st = parse(fn, path, root, out);
  cJSON_Delete(root);
  return st;
}

/* The list target_modules as PEFT writes it: "all-linear" stays a string. */
static cJSON *targets_json(const char *targets) {
  if (strcmp(targets, "all-linear") == 0) return cJSON_CreateString(targets);
  cJSON *list = cJSON_CreateArray();
  char item[MN_LORA_TEXT_CAP];
  for (const char *s = targets; list && mn_lora_next_target(&s, item, sizeof item);)
    cJSON_AddItemToArray(list, cJSON_CreateString(item));
  return list;
}

/* The shortest decimal that reads back as f, so that 0.05f is written 0.05. */
static double shortest(float f) {
  char b[32];
  for (int digits = 1; digits < 10; digits++) {
    snprintf(b, sizeof b, "%.*g", digits, (double)f);
    if ((float)strtod(b, NULL) == f) break;
  }
  return strtod(b, NULL);
}

mn_status mn_lora_write_config(const char *fn, const char *path, const mn_lora_config *l,
                               bool fan_in_fan_out) {
  cJSON *root = cJSON_CreateObject();
  bool ok = root && cJSON_AddStringToObject(root, "peft_type", "LORA") &&
            cJSON_AddStringToObject(root, "task_type", "CAUSAL_LM") &&
            (l->base_model[0]
                 ? cJSON_AddStringToObject(root, "base_model_name_or_path", l->base_model) != NULL
                 : cJSON_AddNullToObject(root, "base_model_name_or_path") != NULL) &&
            cJSON_AddNumberToObject(root, "r", (double)l->rank) &&
            cJSON_AddNumberToObject(root, "lora_alpha", shortest(l->alpha)) &&
            cJSON_AddNumberToObject(root, "lora_dropout", shortest(l->dropout)) &&
            cJSON_AddStringToObject(root, "bias", "none") &&
            cJSON_AddBoolToObject(root, "fan_in_fan_out", fan_in_fan_out) &&
            cJSON_AddBoolToObject(root, "inference_mode", true) &&
            cJSON_AddBoolToObject(root, "init_lora_weights", true) &&
            cJSON_AddBoolToObject(root, "use_rslora", false) &&
            cJSON_AddBoolToObject(root, "use_dora", false) &&
            cJSON_AddNullToObject(root, "modules_to_save");
  cJSON *targets = ok ? targets_json(l->target_modules) : NULL;
  if (targets) cJSON_AddItemToObject(root, "target_modules", targets);
  char *text = targets ? cJSON_Print(root) : NULL;
  cJSON_Delete(root);
  if (!text) return mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
  FILE *f = fopen(path, "w");
  bool written = f && fputs(text, f) >= 0 && fputc('\n', f) != EOF;
  if (f && fclose(f) != 0) written = false;
  cJSON_free(text);
  if (!written) return mn_fail(MN_ERR_IO, "%s: cannot write %s", fn, path);
  return MN_OK;
}
