/* Parsing and validating a safetensors header against the rules of the reference (Rust)
 * implementation, each violation with its own message:
 *   8-byte little-endian header length, at most 100,000,000 and inside the file;
 *   the header is UTF-8 JSON, an object (it starts with '{'), trailing whitespace allowed;
 *   `__metadata__` (at most once) maps strings to strings;
 *   every other entry is a tensor with exactly one dtype, shape and data_offsets;
 *   the dtype is known; shape and offsets are non-negative integers; data_offsets has 2;
 *   element count x dtype size does not overflow and equals end - begin, end >= begin;
 *   names are unique; sorted by begin, the tensors tile the data section from 0 without
 *   gaps or overlaps, and the data section ends exactly where the last tensor ends.
 * Where the reference reader is laxer than the format description, we follow the description:
 * it requires the header to start with '{' (the reference also takes leading whitespace) and
 * forbids duplicate keys (the reference silently keeps one of two tensors or metadata keys of
 * the same name, and only rejects duplicated fields inside an entry). Deliberate
 * extra strictness: \u0000 escapes are refused because names are C strings here. Like the
 * reference, we accept any JSON whitespace after the object (the writer pads with spaces),
 * unknown members in a tensor entry, and a null __metadata__. */
#include <cjson/cJSON.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/error.h"
#include "io/safetensors_internal.h"

#define FN "mn_safetensors_open"

/* cJSON keeps numbers only as doubles, which cannot tell 1 from 1.0 and lose integers beyond
 * 2^53, so every number is also classified from its text before cJSON sees it. */
typedef enum num_kind { NUM_UINT, NUM_TOO_BIG, NUM_NEGATIVE, NUM_NOT_INTEGER } num_kind;

typedef struct num_token {
  num_kind kind;
  uint64_t value;
  size_t offset, len; /* in the header text */
} num_token;

/* Which token a cJSON number item came from; sorted by item address for lookup. */
typedef struct num_ref {
  const cJSON *item;
  size_t token;
} num_ref;

typedef struct parser {
  const char *label;
  const char *text; /* the header, copied and NUL-terminated for cJSON */
  size_t len;
  num_token *tokens;
  size_t ntokens, cap;
  num_ref *refs;
  size_t nrefs;
} parser;

/* ---------------------------------------------------------------- messages */

static mn_status vfail_prefixed(const parser *p, const char *tensor, const char *fmt, va_list ap) {
  char msg[1024];
  vsnprintf(msg, sizeof msg, fmt, ap);
  if (tensor) return mn_fail(MN_ERR_FORMAT, "%s: %s: tensor '%s': %s", FN, p->label, tensor, msg);
  return mn_fail(MN_ERR_FORMAT, "%s: %s: %s", FN, p->label, msg);
}

static mn_status __attribute__((format(printf, 2, 3))) fail(const parser *p, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  mn_status st = vfail_prefixed(p, NULL, fmt, ap);
  va_end(ap);
  return st;
}

static mn_status __attribute__((format(printf, 3, 4)))
fail_tensor(const parser *p, const char *name, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  mn_status st = vfail_prefixed(p, name, fmt, ap);
  va_end(ap);
  return st;
}

/* ---------------------------------------------------------------- lexical scan */

static bool is_digit(char c) { return c >= '0' && c <= '9'; }
static bool is_json_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
static bool is_number_char(char c) {
  return is_digit(c) || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E';
}

static size_t skip_digits(const char *s, size_t k, size_t end) {
  while (k < end && is_digit(s[k]))
    k++;
  return k;
}

/* Whether s[0..n) is exactly one number of the JSON grammar (cJSON also takes "01", "1."). */
static bool json_number_ok(const char *s, size_t n) {
  size_t k = 0;
  if (k < n && s[k] == '-') k++;
  if (k >= n || !is_digit(s[k])) return false;
  k = s[k] == '0' ? k + 1 : skip_digits(s, k, n);
  if (k < n && s[k] == '.') {
    if (++k >= n || !is_digit(s[k])) return false;
    k = skip_digits(s, k, n);
  }
  if (k < n && (s[k] == 'e' || s[k] == 'E')) {
    if (++k < n && (s[k] == '+' || s[k] == '-')) k++;
    if (k >= n || !is_digit(s[k])) return false;
    k = skip_digits(s, k, n);
  }
  return k == n;
}

static num_token classify_number(const char *s, size_t offset, size_t n) {
  num_token t = {.kind = NUM_UINT, .value = 0, .offset = offset, .len = n};
  if (s[0] == '-') {
    t.kind = NUM_NEGATIVE;
    return t;
  }
  for (size_t i = 0; i < n; i++) {
    if (!is_digit(s[i])) {
      t.kind = NUM_NOT_INTEGER;
      return t;
    }
    unsigned d = (unsigned)(s[i] - '0');
    if (t.value > (UINT64_MAX - d) / 10) {
      t.kind = NUM_TOO_BIG;
      return t;
    }
    t.value = t.value * 10 + d;
  }
  return t;
}

static mn_status push_number(parser *p, size_t start, size_t end) {
  const char *s = p->text + start;
  if (!json_number_ok(s, end - start))
    return fail(p, "header is not valid JSON: malformed number '%.*s' at header offset %zu",
                (int)(end - start > 40 ? 40 : end - start), s, start);
  if (p->ntokens == p->cap) {
    size_t cap = p->cap ? 2 * p->cap : 64;
    num_token *grown = realloc(p->tokens, cap * sizeof *grown);
    if (!grown) return mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: %s: out of memory", FN, p->label);
    p->tokens = grown;
    p->cap = cap;
  }
  p->tokens[p->ntokens++] = classify_number(s, start, end - start);
  return MN_OK;
}

/* Inside a string: refuses raw control characters (JSON forbids them, cJSON does not) and
 * \u0000. Returns the number of bytes consumed, 0 after setting an error. */
static size_t scan_string_byte(const parser *p, size_t i, bool *in_string, mn_status *st) {
  const char *s = p->text;
  unsigned char c = (unsigned char)s[i];
  if (c < 0x20) {
    *st = fail(p, "header has control character 0x%02x inside a string at header offset %zu", c, i);
    return 0;
  }
  if (c == '"') *in_string = false;
  if (c != '\\' || i + 1 >= p->len || (unsigned char)s[i + 1] >= 0x80) return 1;
  if (s[i + 1] == 'u' && i + 5 < p->len && strncmp(s + i + 2, "0000", 4) == 0) {
    *st = fail(
        p, "header has a \\u0000 escape at header offset %zu (NUL in names is not supported)", i);
    return 0;
  }
  return 2;
}

/* One pass over the header before cJSON: UTF-8 validity (cJSON does not check it), control
 * characters, and the text of every number. */
static mn_status scan_header(parser *p) {
  const unsigned char *u = (const unsigned char *)p->text;
  bool in_string = false;
  size_t i = 0;
  mn_status st = MN_OK;
  while (i < p->len) {
    if (u[i] >= 0x80) {
      size_t n = mn_st_utf8_seq(u + i, p->len - i);
      if (n == 0)
        return fail(p, "header is not valid UTF-8 (byte 0x%02x at header offset %zu)", u[i], i);
      i += n;
    } else if (in_string) {
      size_t n = scan_string_byte(p, i, &in_string, &st);
      if (n == 0) return st;
      i += n;
    } else if (u[i] == '"') {
      in_string = true;
      i++;
    } else if (u[i] == '-' || is_digit((char)u[i])) {
      size_t end = i;
      while (end < p->len && is_number_char(p->text[end]))
        end++;
      if ((st = push_number(p, i, end)) != MN_OK) return st;
      i = end;
    } else if (u[i] < 0x20 && !is_json_space((char)u[i])) {
      return fail(p, "header has control character 0x%02x at header offset %zu", u[i], i);
    } else {
      i++;
    }
  }
  return MN_OK;
}

/* ---------------------------------------------------------------- cJSON numbers -> tokens */

/* cJSON keeps members in text order, so a depth-first walk meets the numbers in the order the
 * scan found them. */
static bool collect_numbers(parser *p, const cJSON *node) {
  for (const cJSON *c = node->child; c; c = c->next) {
    if (cJSON_IsNumber(c)) {
      if (p->nrefs == p->ntokens) return false;
      p->refs[p->nrefs] = (num_ref){.item = c, .token = p->nrefs};
      p->nrefs++;
    } else if (c->child && !collect_numbers(p, c)) {
      return false;
    }
  }
  return true;
}

static int cmp_ref(const void *a, const void *b) {
  uintptr_t x = (uintptr_t)((const num_ref *)a)->item, y = (uintptr_t)((const num_ref *)b)->item;
  return (x > y) - (x < y);
}

static mn_status map_numbers(parser *p, const cJSON *root) {
  p->refs = malloc((p->ntokens ? p->ntokens : 1) * sizeof *p->refs);
  if (!p->refs) return mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: %s: out of memory", FN, p->label);
  if (!collect_numbers(p, root) || p->nrefs != p->ntokens)
    return fail(p, "header numbers do not match its JSON structure");
  qsort(p->refs, p->nrefs, sizeof *p->refs, cmp_ref);
  return MN_OK;
}

static const num_token *token_of(const parser *p, const cJSON *item) {
  num_ref key = {.item = item, .token = 0};
  const num_ref *r = bsearch(&key, p->refs, p->nrefs, sizeof *p->refs, cmp_ref);
  return r ? &p->tokens[r->token] : NULL;
}

/* ---------------------------------------------------------------- tensor entries */

static const char *json_type_name(const cJSON *v) {
  if (cJSON_IsString(v)) return "a string";
  if (cJSON_IsBool(v)) return "a boolean";
  if (cJSON_IsNull(v)) return "null";
  if (cJSON_IsArray(v)) return "an array";
  if (cJSON_IsObject(v)) return "an object";
  return "a number";
}

/* A shape dimension or an offset: what[index] must be a non-negative integer below 2^64. */
static mn_status get_uint(const parser *p, const char *name, const cJSON *v, const char *what,
                          int index, uint64_t *out) {
  if (!cJSON_IsNumber(v))
    return fail_tensor(p, name, "%s[%d] is %s, not an integer", what, index, json_type_name(v));
  const num_token *t = token_of(p, v);
  if (!t) return fail_tensor(p, name, "%s[%d] has no number text", what, index);
  int shown = (int)(t->len > 40 ? 40 : t->len);
  const char *text = p->text + t->offset;
  switch (t->kind) {
  case NUM_UINT: *out = t->value; return MN_OK;
  case NUM_NEGATIVE:
    return fail_tensor(p, name, "%s[%d] is negative (%.*s)", what, index, shown, text);
  case NUM_NOT_INTEGER:
    return fail_tensor(p, name, "%s[%d] is not an integer (%.*s)", what, index, shown, text);
  case NUM_TOO_BIG:
    return fail_tensor(p, name, "%s[%d] does not fit in 64 bits (%.*s)", what, index, shown, text);
  }
  return fail_tensor(p, name, "%s[%d] is not an integer", what, index);
}

typedef struct entry_fields {
  const cJSON *dtype, *shape, *offsets;
} entry_fields;

static mn_status find_fields(const parser *p, const cJSON *entry, entry_fields *f) {
  const char *name = entry->string;
  static const char *const keys[3] = {"dtype", "shape", "data_offsets"};
  const cJSON **slots[3] = {&f->dtype, &f->shape, &f->offsets};
  *f = (entry_fields){0};
  if (!cJSON_IsObject(entry))
    return fail_tensor(p, name, "entry is %s, not an object", json_type_name(entry));
  /* Unknown members are ignored, as the reference does. */
  for (const cJSON *c = entry->child; c; c = c->next)
    for (int k = 0; k < 3; k++)
      if (strcmp(c->string, keys[k]) == 0) {
        if (*slots[k]) return fail_tensor(p, name, "duplicate field \"%s\"", keys[k]);
        *slots[k] = c;
      }
  for (int k = 0; k < 3; k++)
    if (!*slots[k]) return fail_tensor(p, name, "missing field \"%s\"", keys[k]);
  return MN_OK;
}

static mn_status parse_dtype(const parser *p, const char *name, const cJSON *v,
                             const mn_st_dtype_desc **out) {
  if (!cJSON_IsString(v))
    return fail_tensor(p, name, "dtype is %s, not a string", json_type_name(v));
  const mn_st_dtype_desc *d = mn_st_dtype_find(v->valuestring);
  if (!d) return fail_tensor(p, name, "unknown dtype '%s'", v->valuestring);
  if (d->size == 0)
    return fail_tensor(p, name, "dtype '%s' packs several elements per byte; not supported",
                       d->name);
  *out = d;
  return MN_OK;
}

static mn_status parse_shape(const parser *p, const char *name, const cJSON *v, mn_st_entry *e) {
  if (!cJSON_IsArray(v))
    return fail_tensor(p, name, "shape is %s, not an array", json_type_name(v));
  e->rank = 0;
  e->numel = 1;
  e->shape_fits = true;
  bool overflow = false;
  for (const cJSON *c = v->child; c; c = c->next, e->rank++) {
    uint64_t d;
    mn_status st = get_uint(p, name, c, "shape", e->rank, &d);
    if (st != MN_OK) return st;
    /* Multiplying in order and stopping at the first overflow is what the reference does,
     * so [2^63, 4, 0] is an error although its count is 0. */
    if (!overflow && d != 0 && e->numel > UINT64_MAX / d) overflow = true;
    e->numel *= d;
    if (e->rank < MN_MAX_RANK) e->shape[e->rank] = (int64_t)d;
    if (e->rank >= MN_MAX_RANK || d > (uint64_t)INT64_MAX) e->shape_fits = false;
  }
  if (overflow) return fail_tensor(p, name, "shape element count overflows 64 bits");
  return MN_OK;
}

static mn_status parse_offsets(const parser *p, const char *name, const cJSON *v, mn_st_entry *e) {
  if (!cJSON_IsArray(v))
    return fail_tensor(p, name, "data_offsets is %s, not an array", json_type_name(v));
  int n = cJSON_GetArraySize(v);
  if (n != 2) return fail_tensor(p, name, "data_offsets has %d entries, expected 2", n);
  mn_status st = get_uint(p, name, v->child, "data_offsets", 0, &e->begin);
  if (st == MN_OK) st = get_uint(p, name, v->child->next, "data_offsets", 1, &e->end);
  return st;
}

static mn_status check_extent(const parser *p, const char *name, const mn_st_entry *e) {
  if (e->end < e->begin)
    return fail_tensor(p, name, "data_offsets end %" PRIu64 " < begin %" PRIu64, e->end, e->begin);
  if (e->numel > UINT64_MAX / e->dtype->size)
    return fail_tensor(p, name, "byte size (%" PRIu64 " elements of %s) overflows 64 bits",
                       e->numel, e->dtype->name);
  uint64_t bytes = e->numel * e->dtype->size;
  if (e->end - e->begin != bytes)
    return fail_tensor(p, name,
                       "data_offsets [%" PRIu64 ", %" PRIu64 "] span %" PRIu64 " bytes but %" PRIu64
                       " elements of %s need %" PRIu64,
                       e->begin, e->end, e->end - e->begin, e->numel, e->dtype->name, bytes);
  return MN_OK;
}

static mn_status parse_entry(const parser *p, const cJSON *entry, size_t index, mn_st_entry *e) {
  const char *name = entry->string;
  entry_fields f;
  mn_status st = find_fields(p, entry, &f);
  if (st == MN_OK) st = parse_dtype(p, name, f.dtype, &e->dtype);
  if (st == MN_OK) st = parse_shape(p, name, f.shape, e);
  if (st == MN_OK) st = parse_offsets(p, name, f.offsets, e);
  if (st == MN_OK) st = check_extent(p, name, e);
  if (st != MN_OK) return st;
  e->header_index = index;
  if (!(e->name = strdup(name)))
    return mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: %s: out of memory", FN, p->label);
  return MN_OK;
}

/* ---------------------------------------------------------------- metadata */

static int cmp_kv(const void *a, const void *b) {
  return strcmp(((const mn_st_kv *)a)->key, ((const mn_st_kv *)b)->key);
}

static mn_status parse_metadata(const parser *p, const cJSON *v, mn_st_header *h) {
  if (cJSON_IsNull(v)) return MN_OK; /* the reference reads null as "no metadata" */
  if (!cJSON_IsObject(v)) return fail(p, "__metadata__ is %s, not an object", json_type_name(v));
  size_t n = (size_t)cJSON_GetArraySize(v);
  if (!(h->meta = calloc(n ? n : 1, sizeof *h->meta)))
    return mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: %s: out of memory", FN, p->label);
  for (const cJSON *c = v->child; c; c = c->next) {
    if (!cJSON_IsString(c))
      return fail(p, "__metadata__ value of '%s' is %s, not a string", c->string,
                  json_type_name(c));
    mn_st_kv *kv = &h->meta[h->nmeta++];
    kv->key = strdup(c->string);
    kv->value = strdup(c->valuestring);
    if (!kv->key || !kv->value)
      return mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: %s: out of memory", FN, p->label);
  }
  qsort(h->meta, h->nmeta, sizeof *h->meta, cmp_kv);
  for (size_t i = 1; i < h->nmeta; i++)
    if (strcmp(h->meta[i - 1].key, h->meta[i].key) == 0)
      return fail(p, "duplicate __metadata__ key '%s'", h->meta[i].key);
  return MN_OK;
}

/* ---------------------------------------------------------------- the whole header */

static mn_status parse_members(const parser *p, const cJSON *root, mn_st_header *h) {
  size_t members = (size_t)cJSON_GetArraySize(root);
  if (!(h->tensors = calloc(members ? members : 1, sizeof *h->tensors)))
    return mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: %s: out of memory", FN, p->label);
  bool have_meta = false;
  for (const cJSON *c = root->child; c; c = c->next) {
    mn_status st;
    if (strcmp(c->string, "__metadata__") == 0) {
      if (have_meta) return fail(p, "duplicate __metadata__ entry");
      have_meta = true;
      st = parse_metadata(p, c, h);
    } else {
      st = parse_entry(p, c, h->count, &h->tensors[h->count]);
      if (st == MN_OK) h->count++;
    }
    if (st != MN_OK) return st;
  }
  return MN_OK;
}

static int cmp_entry_name(const void *a, const void *b) {
  return strcmp((*(const mn_st_entry *const *)a)->name, (*(const mn_st_entry *const *)b)->name);
}

/* cJSON keeps both members of a duplicated key; the format forbids them. */
static mn_status check_unique_names(const parser *p, const mn_st_header *h) {
  const mn_st_entry **sorted = malloc((h->count ? h->count : 1) * sizeof *sorted);
  if (!sorted) return mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: %s: out of memory", FN, p->label);
  for (size_t i = 0; i < h->count; i++)
    sorted[i] = &h->tensors[i];
  qsort(sorted, h->count, sizeof *sorted, cmp_entry_name);
  mn_status st = MN_OK;
  for (size_t i = 1; i < h->count && st == MN_OK; i++)
    if (strcmp(sorted[i - 1]->name, sorted[i]->name) == 0)
      st = fail(p, "duplicate tensor name '%s'", sorted[i]->name);
  free(sorted);
  return st;
}

static int cmp_u64(uint64_t a, uint64_t b) { return (a > b) - (a < b); }

static int cmp_entry_offsets(const void *a, const void *b) {
  const mn_st_entry *x = a, *y = b;
  int c = cmp_u64(x->begin, y->begin);
  if (!c) c = cmp_u64(x->end, y->end);
  if (!c) c = cmp_u64(x->header_index, y->header_index);
  return c;
}

static mn_status check_layout(const parser *p, mn_st_header *h, uint64_t data_bytes) {
  qsort(h->tensors, h->count, sizeof *h->tensors, cmp_entry_offsets);
  uint64_t pos = 0;
  for (size_t i = 0; i < h->count; i++) {
    const mn_st_entry *e = &h->tensors[i];
    if (e->begin > pos)
      return fail_tensor(p, e->name,
                         "data_offsets begin %" PRIu64 " leaves a gap after offset %" PRIu64,
                         e->begin, pos);
    if (e->begin < pos)
      return fail_tensor(p, e->name,
                         "data_offsets begin %" PRIu64
                         " overlaps the previous tensor, which ends at %" PRIu64,
                         e->begin, pos);
    pos = e->end;
  }
  if (pos < data_bytes)
    return fail(p,
                "%" PRIu64 " bytes after the last tensor (data section %" PRIu64
                " bytes, tensors end at %" PRIu64 ")",
                data_bytes - pos, data_bytes, pos);
  if (pos > data_bytes)
    return fail(
        p, "file truncated: tensors end at %" PRIu64 " but the data section is %" PRIu64 " bytes",
        pos, data_bytes);
  return MN_OK;
}

static mn_status parse_json(parser *p, mn_st_header *h, uint64_t data_bytes) {
  if (p->len == 0 || p->text[0] != '{')
    return fail(p, "header is not a JSON object (it must start with '{')");
  const char *end = NULL;
  cJSON *root = cJSON_ParseWithLengthOpts(p->text, p->len, &end, false);
  if (!root)
    return fail(p, "header is not valid JSON (error near header offset %zu)",
                end ? (size_t)(end - p->text) : (size_t)0);
  mn_status st = MN_OK;
  for (size_t i = (size_t)(end - p->text); i < p->len && st == MN_OK; i++)
    if (!is_json_space(p->text[i]))
      st = fail(p, "header has data after the JSON object at header offset %zu", i);
  if (st == MN_OK) st = map_numbers(p, root);
  if (st == MN_OK) st = parse_members(p, root, h);
  if (st == MN_OK) st = check_unique_names(p, h);
  if (st == MN_OK) st = check_layout(p, h, data_bytes);
  cJSON_Delete(root);
  return st;
}

static uint64_t read_u64_le(const unsigned char *b) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--)
    v = v << 8 | b[i];
  return v;
}

void mn_st_header_free(mn_st_header *h) {
  if (!h) return;
  for (size_t i = 0; i < h->count; i++)
    free(h->tensors[i].name);
  for (size_t i = 0; i < h->nmeta; i++) {
    free(h->meta[i].key);
    free(h->meta[i].value);
  }
  free(h->tensors);
  free(h->meta);
  memset(h, 0, sizeof *h);
}

mn_status mn_st_parse(const unsigned char *file, size_t size, const char *label,
                      mn_st_header *out) {
  parser p = {.label = label ? label : "<memory>"};
  memset(out, 0, sizeof *out);
  if (size < 8) return fail(&p, "file is %zu bytes, too short for the 8-byte header length", size);
  uint64_t n = read_u64_le(file);
  if (n > MN_ST_MAX_HEADER)
    return fail(&p, "header length %" PRIu64 " exceeds the limit of %u bytes", n, MN_ST_MAX_HEADER);
  if (n > size - 8)
    return fail(&p, "header length %" PRIu64 " runs past the end of the file (%zu bytes follow)", n,
                size - 8);
  /* A private NUL-terminated copy: cJSON then cannot read past the header, whatever bugs it
   * has, and tensor data never doubles as JSON text. */
  char *text = malloc((size_t)n + 1);
  if (!text) return mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: %s: out of memory", FN, p.label);
  memcpy(text, file + 8, (size_t)n);
  text[n] = '\0';
  p.text = text;
  p.len = (size_t)n;
  mn_status st = scan_header(&p);
  if (st == MN_OK) st = parse_json(&p, out, (uint64_t)size - 8 - n);
  free(text);
  free(p.tokens);
  free(p.refs);
  if (st != MN_OK) {
    mn_st_header_free(out);
    return st;
  }
  out->data_start = 8 + n;
  return MN_OK;
}
