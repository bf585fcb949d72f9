/* LoRA on the family builders' linear layers: which modules a target list names, the check of
 * a configuration, and the adapted layer y = base + (alpha / r) (x A^T) B^T. The scale goes on
 * the [.., r] product, the narrowest value of the adapter path, rather than on its output. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "host/error.h"
#include "host/quant.h"
#include "models/model_internal.h"

mn_status mn_lora_path(const char *fn, const char *dir, const char *file, char *out) {
  int n = snprintf(out, MN_LORA_PATH_CAP, "%s/%s", dir, file);
  if (n < 0 || n >= MN_LORA_PATH_CAP)
    return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: the path %s/%s is too long", fn, dir, file);
  return MN_OK;
}

mn_lora_config mn_lora_config_default(void) {
  mn_lora_config l = {.rank = 8, .alpha = 8.0f, .dropout = 0.0f};
  snprintf(l.target_modules, sizeof l.target_modules, "all-linear");
  return l;
}

bool mn_lora_next_target(const char **list, char *item, size_t cap) {
  const char *s = *list;
  while (*s == ' ' || *s == ',')
    s++;
  if (!*s) return false;
  const char *end = s;
  while (*end && *end != ',')
    end++;
  const char *last = end;
  while (last > s && last[-1] == ' ')
    last--;
  size_t n = (size_t)(last - s) < cap - 1 ? (size_t)(last - s) : cap - 1;
  memcpy(item, s, n);
  item[n] = '\0';
  *list = end;
  return true;
}

static bool is_all_linear(const char *targets) {
  const char *s = targets;
  char item[MN_LORA_TEXT_CAP];
  return mn_lora_next_target(&s, item, sizeof item) && strcmp(item, "all-linear") == 0;
}

/* PEFT's rule: the module's name is the target, or ends with "." and the target. */
static bool matches(const char *target, const char *module) {
  size_t lt = strlen(target), lm = strlen(module);
  if (lt == 0 || lt > lm) return false;
  if (strcmp(module + lm - lt, target) != 0) return false;
  return lt == lm || module[lm - lt - 1] == '.';
}

bool mn_lora_targets_module(const char *targets, const char *module) {
  if (is_all_linear(targets)) return true;
  char item[MN_LORA_TEXT_CAP];
  for (const char *s = targets; mn_lora_next_target(&s, item, sizeof item);)
    if (matches(item, module)) return true;
  return false;
}

/* The linear layers of a family's block 0, as transformers names them without the prefix. */
static const char *const llama_modules[] = {
    "layers.0.self_attn.q_proj", "layers.0.self_attn.k_proj", "layers.0.self_attn.v_proj",
    "layers.0.self_attn.o_proj", "layers.0.mlp.gate_proj",    "layers.0.mlp.up_proj",
    "layers.0.mlp.down_proj"};
static const char *const gpt2_modules[] = {"h.0.attn.c_attn", "h.0.attn.c_proj", "h.0.mlp.c_fc",
                                           "h.0.mlp.c_proj"};

/* Whether a target can name a layer of the family: it matches block 0's layer of that kind
 * once the block index in it, if any, is replaced by 0 ("layers.7.mlp.up_proj"). */
static bool names_a_layer(mn_model_family f, const char *target) {
  const char *const *mods = f == MN_MODEL_GPT2 ? gpt2_modules : llama_modules;
  size_t n = f == MN_MODEL_GPT2 ? sizeof gpt2_modules / sizeof *gpt2_modules
                                : sizeof llama_modules / sizeof *llama_modules;
  char canon[MN_LORA_TEXT_CAP + 8];
  size_t k = 0;
  for (const char *s = target; *s && k + 2 < sizeof canon;) {
    bool at_index = (s == target || s[-1] == '.') && *s >= '0' && *s <= '9';
    if (at_index) {
      while (*s >= '0' && *s <= '9')
        s++;
      canon[k++] = '0';
    } else {
      canon[k++] = *s++;
    }
  }
  canon[k] = '\0';
  for (size_t i = 0; i < n; i++)
    if (matches(canon, mods[i])) return true;
  return false;
}

mn_status mn_lora_config_check(const char *fn, mn_model_family f, const mn_lora_config *l) {
  if (l->rank < 1 || l->rank > 65536)
    return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: LoRA rank %lld is not in [1, 65536]", fn,
                   (long long)l->rank);
  if (!(l->alpha > 0.0f) || !isfinite(l->alpha))
    return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: lora_alpha %g is not a positive number", fn,
                   (double)l->alpha);
  if (!(l->dropout >= 0.0f && l->dropout < 1.0f))
    return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: lora_dropout %g is not in [0, 1)", fn,
                   (double)l->dropout);
  if (!memchr(l->target_modules, '\0', sizeof l->target_modules))
    return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: target_modules is not NUL-terminated", fn);
  if (is_all_linear(l->target_modules)) return MN_OK;
  char item[MN_LORA_TEXT_CAP];
  size_t count = 0;
  for (const char *s = l->target_modules; mn_lora_next_target(&s, item, sizeof item); count++)
    if (!names_a_layer(f, item))
      return mn_fail(MN_ERR_INVALID_ARGUMENT,
                     "%s: LoRA target \"%s\" matches no linear layer of %s (%s)", fn, item,
                     f == MN_MODEL_GPT2 ? "GPT-2" : "Llama",
                     f == MN_MODEL_GPT2 ? "c_attn, c_proj, c_fc"
                                        : "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, "
                                          "down_proj");
  if (!count) return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: target_modules is empty", fn);
  return MN_OK;
}

mn_node mn_model_linear_weight(const mn_model_ctx *m, bool conv1d, int64_t out, int64_t in,
                               const char *fmt, ...) {
  char name[MN_MODEL_NAME_CAP];
  int n = snprintf(name, sizeof name, "%s", m->prefix);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(name + n, sizeof name - (size_t)n, fmt, ap);
  va_end(ap);
  if (m->quant == MN_QUANT_NONE) {
    int64_t shape[2] = {conv1d ? in : out, conv1d ? out : in};
    return mn_parameter(m->g, name, shape, 2);
  }
  /* A group size that does not divide the row is refused by mn_matmul_quant by name. */
  size_t words = mn_quant_row_words(m->quant, m->group_size, in);
  return mn_input_u32(m->g, name, MN_SHAPE(out, words ? (int64_t)words : 1));
}

mn_node mn_model_linear(const mn_model_ctx *m, mn_node x, mn_node w, mn_node bias, bool conv1d,
                        const char *module) {
  mn_graph *g = m->g;
  mn_node_info info;
  mn_node_info xi;
  if (m->quant != MN_QUANT_NONE && mn_graph_node(g, w, &info) == MN_OK &&
      mn_graph_node(g, x, &xi) == MN_OK) {
    mn_node y = mn_matmul_quant(g, x, w, m->quant, m->group_size, info.type.shape[0],
                                xi.type.shape[xi.type.rank - 1]);
    return bias != MN_NO_NODE ? mn_bias_add(g, y, bias) : y;
  }
  mn_node y = conv1d ? mn_matmul(g, x, w) : mn_matmul_bt(g, x, w);
  if (bias != MN_NO_NODE) y = mn_bias_add(g, y, bias);
  char full[MN_MODEL_NAME_CAP];
  snprintf(full, sizeof full, "%s%s", m->prefix, module);
  if (!m->lora || !mn_lora_targets_module(m->lora->target_modules, full) ||
      mn_graph_node(g, w, &info) != MN_OK)
    return y;
  int64_t r = m->lora->rank;
  int64_t in = info.type.shape[conv1d ? 0 : 1], out = info.type.shape[conv1d ? 1 : 0];
  mn_node a = mn_model_param(g, m->prefix, MN_SHAPE(r, in), "%s.lora_A.weight", module);
  mn_node b = mn_model_param(g, m->prefix, MN_SHAPE(out, r), "%s.lora_B.weight", module);
  /* PEFT gives each adapter its own dropout, so q, k and v see different masks of x. */
  mn_node down = mn_matmul_bt(g, mn_dropout(g, x, m->lora->dropout), a);
  down = mn_scale(g, down, m->lora->alpha / (float)r);
  return mn_add(g, y, mn_matmul_bt(g, down, b));
}
