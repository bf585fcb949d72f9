/* Reading a HuggingFace tokenizer.json into struct mn_tokenizer. What GPT-2, SmolLM2 and
 * Llama-3 style byte-level BPE files hold is read; every other component or option that would
 * change the ids is refused with MN_ERR_UNSUPPORTED naming it, rather than ignored. Ignored on
 * purpose: post_processor (it adds template tokens such as BOS only when asked for special
 * tokens, which encode does not do), truncation and padding (options of batch encoding), and
 * offsets-only options (trim_offsets). Messages: "mn_tokenizer_load: PATH: FIELD: problem". */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/error.h"
#include "io/tokenizer_internal.h"
#include "io/tokenizer_unicode.h"

#define FN "mn_tokenizer_load"

static mn_status __attribute__((format(printf, 3, 4)))
fail(const mn_tokenizer *t, mn_status st, const char *fmt, ...) {
  char msg[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return mn_fail(st, "%s: %s: %s", FN, t->label, msg);
}

static mn_status oom(const mn_tokenizer *t) {
  return fail(t, MN_ERR_OUT_OF_MEMORY, "out of memory");
}

static bool is_null(const cJSON *item) { return !item || cJSON_IsNull(item); }

/* The "type" string of a component, or "?" when it has none. */
static const char *type_of(const cJSON *obj) {
  const cJSON *ty = cJSON_GetObjectItemCaseSensitive(obj, "type");
  return cJSON_IsString(ty) ? ty->valuestring : "?";
}

/* An optional boolean field: absent or null gives `dflt`. */
static mn_status get_bool(const mn_tokenizer *t, const cJSON *obj, const char *path,
                          const char *key, bool dflt, bool *out) {
  const cJSON *item = cJSON_GetObjectItemCaseSensitive(obj, key);
  if (is_null(item)) {
    *out = dflt;
    return MN_OK;
  }
  if (!cJSON_IsBool(item))
    return fail(t, MN_ERR_FORMAT, "%s.%s: expected true or false", path, key);
  *out = cJSON_IsTrue(item);
  return MN_OK;
}

/* An id: an integer in [0, MN_TOK_MAX_ID). */
static mn_status get_id(const mn_tokenizer *t, const cJSON *item, const char *what, uint32_t *out) {
  if (!cJSON_IsNumber(item) || !(item->valuedouble >= 0) ||
      item->valuedouble >= (double)MN_TOK_MAX_ID || floor(item->valuedouble) != item->valuedouble)
    return fail(t, MN_ERR_FORMAT, "%s: the id must be an integer in [0, %u)", what, MN_TOK_MAX_ID);
  *out = (uint32_t)item->valuedouble;
  return MN_OK;
}

/* ---------------------------------------------------------------- model */

static mn_status load_merges(mn_tokenizer *t, const cJSON *merges) {
  if (!cJSON_IsArray(merges))
    return fail(t, MN_ERR_FORMAT, "model.merges: missing or not an array");
  size_t i = 0;
  mn_tok_pool scratch = {0};
  mn_status st = MN_OK;
  for (const cJSON *m = merges->child; m && st == MN_OK; m = m->next, i++) {
    const char *a, *b;
    size_t an, bn;
    if (cJSON_IsString(m)) { /* "a b": exactly one space, as the library's split(' ') wants */
      const char *sp = strchr(m->valuestring, ' ');
      if (!sp || strchr(sp + 1, ' ')) {
        st = fail(t, MN_ERR_FORMAT, "model.merges[%zu]: '%s' is not two tokens split by a space", i,
                  m->valuestring);
        break;
      }
      a = m->valuestring;
      an = (size_t)(sp - a);
      b = sp + 1;
      bn = strlen(b);
    } else if (cJSON_GetArraySize(m) == 2 && cJSON_IsString(m->child) &&
               cJSON_IsString(m->child->next)) {
      a = m->child->valuestring;
      an = strlen(a);
      b = m->child->next->valuestring;
      bn = strlen(b);
    } else {
      st = fail(t, MN_ERR_FORMAT, "model.merges[%zu]: expected \"a b\" or [\"a\", \"b\"]", i);
      break;
    }
    st = mn_tok_add_merge(t, &scratch, "model.merges", "model.vocab", i, a, an, b, bn);
  }
  free(scratch.data);
  return st;
}

/* A string option that may only be null or "" (the empty prefix or suffix of GPT-2's files). */
static mn_status no_affix(const mn_tokenizer *t, const cJSON *model, const char *key) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(model, key);
  if (is_null(v) || (cJSON_IsString(v) && v->valuestring[0] == '\0')) return MN_OK;
  return fail(t, MN_ERR_UNSUPPORTED, "model.%s: only null or \"\" is supported", key);
}

static mn_status load_model(mn_tokenizer *t, const cJSON *model) {
  if (!cJSON_IsObject(model)) return fail(t, MN_ERR_FORMAT, "model: missing or not an object");
  const cJSON *ty = cJSON_GetObjectItemCaseSensitive(model, "type");
  if (ty && !(cJSON_IsString(ty) && strcmp(ty->valuestring, "BPE") == 0))
    return fail(t, MN_ERR_UNSUPPORTED, "model.type '%s' is not supported (only BPE)",
                type_of(model));
  mn_status st;
  bool byte_fallback = false;
  if ((st = no_affix(t, model, "continuing_subword_prefix")) != MN_OK ||
      (st = no_affix(t, model, "end_of_word_suffix")) != MN_OK ||
      (st = get_bool(t, model, "model", "fuse_unk", false, &t->fuse_unk)) != MN_OK ||
      (st = get_bool(t, model, "model", "ignore_merges", false, &t->ignore_merges)) != MN_OK ||
      (st = get_bool(t, model, "model", "byte_fallback", false, &byte_fallback)) != MN_OK)
    return st;
  if (byte_fallback)
    return fail(
        t, MN_ERR_UNSUPPORTED,
        "model.byte_fallback: true is not supported (byte-level BPE has a token for every byte)");
  const cJSON *dropout = cJSON_GetObjectItemCaseSensitive(model, "dropout");
  if (!is_null(dropout) && !(cJSON_IsNumber(dropout) && dropout->valuedouble == 0))
    return fail(t, MN_ERR_UNSUPPORTED,
                "model.dropout: only null or 0 is supported (dropout makes encoding random)");

  const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
  if (!cJSON_IsObject(vocab))
    return fail(t, MN_ERR_FORMAT, "model.vocab: missing or not an object");
  for (const cJSON *e = vocab->child; e; e = e->next) {
    char what[160];
    snprintf(what, sizeof what, "model.vocab['%.120s']", e->string);
    uint32_t id = 0;
    if ((st = get_id(t, e, what, &id)) != MN_OK) return st;
    if (!mn_tok_add_token(t, e->string, strlen(e->string), id)) return oom(t);
  }
  if ((st = load_merges(t, cJSON_GetObjectItemCaseSensitive(model, "merges"))) != MN_OK) return st;

  mn_tok_set_byte_tokens(t);
  const cJSON *unk = cJSON_GetObjectItemCaseSensitive(model, "unk_token");
  t->unk_id = MN_TOK_NONE;
  if (cJSON_IsString(unk)) {
    t->has_unk = true;
    t->unk_name = mn_tok_pool_add(&t->pool, unk->valuestring, strlen(unk->valuestring));
    if (t->unk_name.off == MN_TOK_NONE) return oom(t);
    mn_tok_strmap_get(&t->vocab, unk->valuestring, strlen(unk->valuestring), &t->unk_id);
  } else if (!is_null(unk)) {
    return fail(t, MN_ERR_FORMAT, "model.unk_token: expected a string or null");
  }
  return MN_OK;
}

/* ---------------------------------------------------------------- pre-tokenizer */

#define GPT2_REGEX                                                                                 \
  "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
#define CL100K_REGEX(digits)                                                                       \
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}" digits                       \
  "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

static const struct {
  const char *regex;
  mn_tok_pattern pattern;
  int max_digits;
} known_regexes[] = {
    {GPT2_REGEX, MN_TOK_PAT_GPT2, 0},
    {CL100K_REGEX("{1,3}"), MN_TOK_PAT_CL100K, 3}, /* Llama-3, GPT-4 */
    {CL100K_REGEX(""), MN_TOK_PAT_CL100K, 1},      /* Qwen2 */
    {"\\p{N}", MN_TOK_PAT_NUMBER, 0},
};

static mn_status load_split(mn_tokenizer *t, const cJSON *pt, const char *path) {
  mn_tok_splitter sp = {.behavior = MN_TOK_ISOLATED};
  static const char *behaviors[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext",
                                    "Contiguous"};
  const cJSON *beh = cJSON_GetObjectItemCaseSensitive(pt, "behavior");
  size_t b = 0;
  while (b < 5 && !(cJSON_IsString(beh) && strcmp(beh->valuestring, behaviors[b]) == 0))
    b++;
  if (b == 5) return fail(t, MN_ERR_FORMAT, "%s.behavior: missing or unknown", path);
  sp.behavior = (mn_tok_behavior)b;
  mn_status st = get_bool(t, pt, path, "invert", false, &sp.invert);
  if (st != MN_OK) return st;
  const cJSON *pat = cJSON_GetObjectItemCaseSensitive(pt, "pattern");
  const cJSON *str = cJSON_GetObjectItemCaseSensitive(pat, "String");
  const cJSON *re = cJSON_GetObjectItemCaseSensitive(pat, "Regex");
  if (cJSON_IsString(str)) {
    if (str->valuestring[0] == '\0')
      return fail(t, MN_ERR_UNSUPPORTED, "%s.pattern: the empty string is not supported", path);
    sp.pattern = MN_TOK_PAT_LITERAL;
    sp.text = mn_tok_pool_add(&t->pool, str->valuestring, strlen(str->valuestring));
    if (sp.text.off == MN_TOK_NONE) return oom(t);
    return mn_tok_add_splitter(t, sp);
  }
  if (!cJSON_IsString(re))
    return fail(t, MN_ERR_FORMAT, "%s.pattern: expected {\"String\": ...} or {\"Regex\": ...}",
                path);
  for (size_t k = 0; k < sizeof known_regexes / sizeof known_regexes[0]; k++) {
    if (strcmp(re->valuestring, known_regexes[k].regex) == 0) {
      sp.pattern = known_regexes[k].pattern;
      sp.max_digits = known_regexes[k].max_digits;
      return mn_tok_add_splitter(t, sp);
    }
  }
  return fail(t, MN_ERR_UNSUPPORTED,
              "%s.pattern: regex '%.200s' is not supported (supported: the GPT-2, Llama-3 and "
              "Qwen2 split regexes and \\p{N})",
              path, re->valuestring);
}

static mn_status load_pretok(mn_tokenizer *t, const cJSON *pt, const char *path, int depth,
                             bool *byte_level) {
  if (!cJSON_IsObject(pt)) return fail(t, MN_ERR_FORMAT, "%s: expected an object", path);
  const char *ty = type_of(pt);
  if (*byte_level)
    return fail(t, MN_ERR_UNSUPPORTED,
                "%s: '%s' after ByteLevel is not supported (ByteLevel must come last)", path, ty);
  mn_status st;
  if (strcmp(ty, "Sequence") == 0) {
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(pt, "pretokenizers");
    if (!cJSON_IsArray(list)) return fail(t, MN_ERR_FORMAT, "%s.pretokenizers: missing", path);
    if (depth > 8) return fail(t, MN_ERR_UNSUPPORTED, "%s: Sequences nested too deep", path);
    int i = 0;
    for (const cJSON *e = list->child; e; e = e->next, i++) {
      char sub[256];
      snprintf(sub, sizeof sub, "%.200s.pretokenizers[%d]", path, i);
      if ((st = load_pretok(t, e, sub, depth + 1, byte_level)) != MN_OK) return st;
    }
    return MN_OK;
  }
  if (strcmp(ty, "ByteLevel") == 0) {
    *byte_level = true;
    if ((st = get_bool(t, pt, path, "add_prefix_space", true, &t->prefix_space)) != MN_OK)
      return st;
    return get_bool(t, pt, path, "use_regex", true, &t->use_regex);
  }
  if (strcmp(ty, "Digits") == 0) {
    bool individual = false;
    if ((st = get_bool(t, pt, path, "individual_digits", false, &individual)) != MN_OK) return st;
    mn_tok_splitter sp = {.pattern = MN_TOK_PAT_NUMERIC,
                          .behavior = individual ? MN_TOK_ISOLATED : MN_TOK_CONTIGUOUS};
    return mn_tok_add_splitter(t, sp);
  }
  if (strcmp(ty, "Split") == 0) return load_split(t, pt, path);
  return fail(t, MN_ERR_UNSUPPORTED,
              "%s: type '%s' is not supported (supported: ByteLevel, Sequence, Split, Digits)",
              path, ty);
}

/* ---------------------------------------------------------------- added tokens */

static mn_status load_added(mn_tokenizer *t, const cJSON *list) {
  if (is_null(list)) return MN_OK;
  if (!cJSON_IsArray(list)) return fail(t, MN_ERR_FORMAT, "added_tokens: not an array");
  size_t n = (size_t)cJSON_GetArraySize(list), i = 0;
  mn_status st;
  for (const cJSON *e = list->child; e; e = e->next, i++) {
    char path[64];
    snprintf(path, sizeof path, "added_tokens[%zu]", i);
    mn_tok_added added = {0}, *a = &added;
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(e, "content");
    if (!cJSON_IsObject(e) || !cJSON_IsString(content))
      return fail(t, MN_ERR_FORMAT, "%s.content: missing or not a string", path);
    char what[96];
    snprintf(what, sizeof what, "%s.id", path);
    bool single_word = false;
    if ((st = get_id(t, cJSON_GetObjectItemCaseSensitive(e, "id"), what, &a->id)) != MN_OK ||
        (st = get_bool(t, e, path, "single_word", false, &single_word)) != MN_OK ||
        (st = get_bool(t, e, path, "lstrip", false, &a->lstrip)) != MN_OK ||
        (st = get_bool(t, e, path, "rstrip", false, &a->rstrip)) != MN_OK ||
        (st = get_bool(t, e, path, "normalized", true, &a->normalized)) != MN_OK ||
        (st = get_bool(t, e, path, "special", false, &a->special)) != MN_OK)
      return st;
    if (single_word)
      return fail(t, MN_ERR_UNSUPPORTED, "%s ('%.100s'): single_word true is not supported", path,
                  content->valuestring);
    if (!mn_tok_add_added(t, a, content->valuestring, strlen(content->valuestring), n))
      return oom(t);
  }
  return MN_OK;
}

/* ---------------------------------------------------------------- the file */

static mn_status load_root(mn_tokenizer *t, const cJSON *root) {
  if (!cJSON_IsObject(root)) return fail(t, MN_ERR_FORMAT, "the top level is not a JSON object");
  const cJSON *version = cJSON_GetObjectItemCaseSensitive(root, "version");
  if (!is_null(version) && !(cJSON_IsString(version) && strcmp(version->valuestring, "1.0") == 0))
    return fail(t, MN_ERR_UNSUPPORTED, "version: only \"1.0\" is supported");
  mn_status st = load_model(t, cJSON_GetObjectItemCaseSensitive(root, "model"));
  if (st != MN_OK) return st;

  const cJSON *norm = cJSON_GetObjectItemCaseSensitive(root, "normalizer");
  if (!is_null(norm)) {
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(norm, "normalizers");
    if (!(strcmp(type_of(norm), "Sequence") == 0 && cJSON_IsArray(list) && !list->child))
      return fail(t, MN_ERR_UNSUPPORTED, "normalizer: type '%s' is not supported (only null)",
                  type_of(norm));
  }
  const cJSON *pre = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
  bool byte_level = false;
  if (is_null(pre))
    return fail(
        t, MN_ERR_UNSUPPORTED,
        "pre_tokenizer: null is not supported (byte-level BPE needs a ByteLevel pre-tokenizer)");
  if ((st = load_pretok(t, pre, "pre_tokenizer", 0, &byte_level)) != MN_OK) return st;
  if (!byte_level)
    return fail(t, MN_ERR_UNSUPPORTED,
                "pre_tokenizer: no ByteLevel step (only byte-level BPE is supported)");
  const cJSON *dec = cJSON_GetObjectItemCaseSensitive(root, "decoder");
  if (is_null(dec) || strcmp(type_of(dec), "ByteLevel") != 0)
    return fail(t, MN_ERR_UNSUPPORTED, "decoder: type '%s' is not supported (only ByteLevel)",
                is_null(dec) ? "null" : type_of(dec));
  return load_added(t, cJSON_GetObjectItemCaseSensitive(root, "added_tokens"));
}

mn_status mn_tok_load_json(mn_tokenizer *t, const char *json, size_t len) {
  const char *end = NULL;
  /* the NUL after the text is included so that trailing garbage is refused, as serde does */
  cJSON *root = cJSON_ParseWithLengthOpts(json, len + 1, &end, true);
  if (!root) {
    size_t at = end && end >= json ? (size_t)(end - json) : 0;
    return fail(t, MN_ERR_FORMAT, "not valid JSON (error near byte %zu)", at);
  }
  mn_status st = load_root(t, root);
  cJSON_Delete(root);
  return st;
}
