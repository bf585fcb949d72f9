/* Instruction data: JSON Lines records rendered by a chat template into token ids with a
 * counted flag per token, then laid out in rows (one example each, or packed). Pieces are
 * tokenized one by one (a role header, a content, an end token), so the boundary between
 * prompt and completion is a token boundary, as TRL's completion-only training makes it. */
#include "tools/cli_instruct.h"

#include "tools/cli_train.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

static const char *const TEMPLATES[] = {"chatml", "plain"};

const char *cli_chat_template(const char *name) {
  for (size_t i = 0; i < sizeof TEMPLATES / sizeof *TEMPLATES; i++)
    if (name && strcmp(name, TEMPLATES[i]) == 0) return TEMPLATES[i];
  return NULL;
}

/* One rendered example: ids and whether each is a token the loss counts. */
typedef struct piece_list {
  uint32_t *id;
  bool *counted;
  size_t n, cap;
} piece_list;

typedef struct renderer {
  const char *cmd, *path, *tmpl;
  const mn_tokenizer *tok;
  int64_t im_start, im_end, eos;
  size_t line;
} renderer;

static int grow(piece_list *p, size_t more) {
  if (p->n + more <= p->cap) return CLI_OK;
  size_t cap = p->cap ? p->cap : 256;
  while (cap < p->n + more)
    cap *= 2;
  uint32_t *id = realloc(p->id, cap * sizeof *id);
  if (id) p->id = id;
  bool *counted = id ? realloc(p->counted, cap * sizeof *counted) : NULL;
  if (counted) p->counted = counted;
  if (!id || !counted) return CLI_FAIL;
  p->cap = cap;
  return CLI_OK;
}

static int push_id(const renderer *r, piece_list *p, int64_t id, bool counted) {
  if (grow(p, 1)) return fprintf(stderr, "%s: out of memory\n", r->cmd), CLI_FAIL;
  p->id[p->n] = (uint32_t)id;
  p->counted[p->n++] = counted;
  return CLI_OK;
}

static int push_text(const renderer *r, piece_list *p, const char *text, bool counted) {
  size_t len = strlen(text), n = 0;
  if (!len) return CLI_OK;
  if (mn_tokenizer_encode(r->tok, text, len, NULL, 0, &n) != MN_OK)
    return cli_lib_fail(r->cmd, "cannot tokenize");
  if (grow(p, n)) return fprintf(stderr, "%s: out of memory\n", r->cmd), CLI_FAIL;
  if (mn_tokenizer_encode(r->tok, text, len, p->id + p->n, n, &n) != MN_OK)
    return cli_lib_fail(r->cmd, "cannot tokenize");
  for (size_t i = 0; i < n; i++)
    p->counted[p->n + i] = counted;
  p->n += n;
  return CLI_OK;
}

static int bad_record(const renderer *r, const char *why) {
  fprintf(stderr, "%s: '%s' line %zu: %s\n", r->cmd, r->path, r->line, why);
  return CLI_FAIL;
}

static int render_message(const renderer *r, piece_list *p, const char *role, const char *content) {
  bool assistant = strcmp(role, "assistant") == 0;
  if (strcmp(r->tmpl, "chatml") == 0) {
    char header[64];
    snprintf(header, sizeof header, "%.40s\n", role);
    return push_id(r, p, r->im_start, false) || push_text(r, p, header, false) ||
           push_text(r, p, content, assistant) || push_id(r, p, r->im_end, assistant) ||
           push_text(r, p, "\n", false);
  }
  if (assistant) return push_text(r, p, content, true) || push_id(r, p, r->eos, true);
  return push_text(r, p, content, false) || push_text(r, p, "\n", false);
}

static int render(const renderer *r, const cJSON *rec, piece_list *p) {
  p->n = 0;
  if (!cJSON_IsObject(rec)) return bad_record(r, "not a JSON object");
  const cJSON *messages = cJSON_GetObjectItemCaseSensitive(rec, "messages");
  const cJSON *prompt = cJSON_GetObjectItemCaseSensitive(rec, "prompt");
  const cJSON *completion = cJSON_GetObjectItemCaseSensitive(rec, "completion");
  if (cJSON_IsArray(messages)) {
    for (const cJSON *m = messages->child; m; m = m->next) {
      const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
      const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
      if (!cJSON_IsString(role) || !cJSON_IsString(content))
        return bad_record(r, "a message without a string \"role\" and \"content\"");
      if (render_message(r, p, role->valuestring, content->valuestring)) return CLI_FAIL;
    }
    return CLI_OK;
  }
  if (!cJSON_IsString(prompt) || !cJSON_IsString(completion))
    return bad_record(r, "neither \"messages\" nor string \"prompt\" and \"completion\"");
  if (strcmp(r->tmpl, "chatml") == 0)
    return render_message(r, p, "user", prompt->valuestring) ||
           render_message(r, p, "assistant", completion->valuestring);
  return push_text(r, p, prompt->valuestring, false) ||
         push_text(r, p, completion->valuestring, true) || push_id(r, p, r->eos, true);
}

/* The examples of a file, flat: ids and labels of example e at [start[e], start[e + 1]). */
typedef struct examples {
  uint32_t *ids, *labels;
  size_t *start, n, len, cap, cap_start;
} examples;

static int add_example(const char *cmd, examples *x, const piece_list *p, size_t seq,
                       cli_rows *out) {
  size_t len = p->n < seq ? p->n : seq;
  out->truncated += p->n > seq;
  size_t counted = 0;
  for (size_t t = 0; t + 1 < len; t++)
    counted += p->counted[t + 1];
  if (!counted) {
    out->dropped++;
    return CLI_OK;
  }
  if (x->len + len > x->cap) {
    size_t cap = x->cap ? x->cap * 2 : 1 << 16;
    while (cap < x->len + len)
      cap *= 2;
    uint32_t *ids = realloc(x->ids, cap * sizeof *ids);
    if (ids) x->ids = ids;
    uint32_t *labels = ids ? realloc(x->labels, cap * sizeof *labels) : NULL;
    if (labels) x->labels = labels;
    if (!ids || !labels) return fprintf(stderr, "%s: out of memory\n", cmd), CLI_FAIL;
    x->cap = cap;
  }
  if (x->n + 2 > x->cap_start) {
    size_t cap = x->cap_start ? x->cap_start * 2 : 1024;
    size_t *start = realloc(x->start, cap * sizeof *start);
    if (!start) return fprintf(stderr, "%s: out of memory\n", cmd), CLI_FAIL;
    x->start = start;
    x->cap_start = cap;
  }
  if (x->n == 0) x->start[0] = 0;
  for (size_t t = 0; t < len; t++) {
    x->ids[x->len + t] = p->id[t];
    x->labels[x->len + t] = t + 1 < len && p->counted[t + 1] ? p->id[t + 1] : MN_IGNORE_LABEL;
  }
  x->len += len;
  x->start[++x->n] = x->len;
  out->counted += counted;
  return CLI_OK;
}

static int special_ids(renderer *r) {
  r->im_start = mn_tokenizer_token_id(r->tok, "<|im_start|>");
  r->im_end = mn_tokenizer_token_id(r->tok, "<|im_end|>");
  if (strcmp(r->tmpl, "chatml") == 0) {
    if (r->im_start < 0 || r->im_end < 0) {
      fprintf(stderr,
              "%s: the tokenizer has no <|im_start|> and <|im_end|> tokens for "
              "--chat-template chatml; use --chat-template plain\n",
              r->cmd);
      return CLI_FAIL;
    }
    r->eos = r->im_end;
    return CLI_OK;
  }
  static const char *const eos[] = {"<|endoftext|>", "</s>", "<|end_of_text|>", "<|im_end|>",
                                    "<eos>"};
  for (size_t i = 0; i < sizeof eos / sizeof *eos; i++)
    if ((r->eos = mn_tokenizer_token_id(r->tok, eos[i])) >= 0) return CLI_OK;
  fprintf(stderr, "%s: the tokenizer has no end-of-text token (<|endoftext|>, </s>, ...)\n",
          r->cmd);
  return CLI_FAIL;
}

static int read_examples(renderer *r, const unsigned char *text, size_t n, size_t seq, examples *x,
                         cli_rows *out) {
  piece_list p = {0};
  int rc = CLI_OK;
  for (size_t at = 0; !rc && at < n;) {
    const unsigned char *nl = memchr(text + at, '\n', n - at);
    size_t end = nl ? (size_t)(nl - text) : n;
    r->line++;
    size_t s = at;
    while (s < end && (text[s] == ' ' || text[s] == '\t' || text[s] == '\r'))
      s++;
    if (s < end) {
      cJSON *rec = cJSON_ParseWithLength((const char *)text + at, end - at);
      if (!rec)
        rc = bad_record(r, "not JSON");
      else {
        out->examples++;
        rc = render(r, rec, &p);
        if (!rc) rc = add_example(r->cmd, x, &p, seq, out);
      }
      cJSON_Delete(rec);
    }
    at = end + 1;
  }
  free(p.id);
  free(p.counted);
  return rc;
}

/* Fills rows from the examples in `order`. */
static int lay_out(const char *cmd, const examples *x, const size_t *order, size_t seq, bool pack,
                   uint32_t pad, cli_rows *out) {
  size_t rows = 0, used = seq;
  for (size_t k = 0; k < x->n; k++) {
    size_t len = x->start[order[k] + 1] - x->start[order[k]];
    if (!pack || used + len > seq) rows++, used = 0;
    used += len;
  }
  out->n = rows;
  out->seq = seq;
  out->ids = malloc(rows * seq * sizeof *out->ids);
  out->labels = malloc(rows * seq * sizeof *out->labels);
  out->positions = pack ? malloc(rows * seq * sizeof *out->positions) : NULL;
  if (!out->ids || !out->labels || (pack && !out->positions))
    return fprintf(stderr, "%s: out of memory\n", cmd), CLI_FAIL;
  for (size_t i = 0; i < rows * seq; i++) {
    out->ids[i] = pad;
    out->labels[i] = MN_IGNORE_LABEL;
  }
  size_t row = 0;
  used = seq;
  for (size_t k = 0; k < x->n; k++) {
    size_t from = x->start[order[k]], len = x->start[order[k] + 1] - from;
    if (!pack || used + len > seq) {
      if (k) row++;
      used = 0;
    }
    size_t at = row * seq + used;
    memcpy(out->ids + at, x->ids + from, len * sizeof *out->ids);
    memcpy(out->labels + at, x->labels + from, len * sizeof *out->labels);
    for (size_t t = 0; pack && t < len; t++)
      out->positions[at + t] = (uint32_t)t;
    used += len;
    out->tokens += len;
    /* Padding after the last example of a row is a segment of its own. */
    for (size_t t = used; pack && t < seq; t++)
      out->positions[row * seq + t] = (uint32_t)(t - used);
  }
  return CLI_OK;
}

int cli_rows_load(const char *cmd, const char *path, const mn_tokenizer *tok, const char *tmpl,
                  long seq, bool pack, uint64_t seed, cli_rows *out) {
  *out = (cli_rows){0};
  if (!tok) {
    fprintf(stderr, "%s: instruction data '%s' needs --tokenizer\n", cmd, path);
    return CLI_USAGE;
  }
  renderer r = {.cmd = cmd, .path = path, .tmpl = tmpl, .tok = tok};
  if (special_ids(&r)) return CLI_FAIL;
  unsigned char *text = NULL;
  size_t n = 0;
  examples x = {0};
  size_t *order = NULL;
  int rc = cli_read_file(cmd, path, &text, &n);
  if (!rc) rc = read_examples(&r, text, n, (size_t)seq, &x, out);
  if (!rc && x.n == 0) {
    fprintf(stderr, "%s: '%s' holds no example with a counted token (%zu records, %zu dropped)\n",
            cmd, path, out->examples, out->dropped);
    rc = CLI_FAIL;
  }
  if (!rc && !(order = malloc(x.n * sizeof *order))) {
    fprintf(stderr, "%s: out of memory\n", cmd);
    rc = CLI_FAIL;
  }
  for (size_t i = 0; !rc && i < x.n; i++)
    order[i] = i;
  uint64_t rng = seed * 0x9E3779B97F4A7C15ull + 0x5eed;
  for (size_t i = x.n; !rc && pack && i > 1; i--) {
    size_t j = (size_t)(cli_rand(&rng) % i);
    size_t t = order[i - 1];
    order[i - 1] = order[j];
    order[j] = t;
  }
  if (!rc) rc = lay_out(cmd, &x, order, (size_t)seq, pack, (uint32_t)r.eos, out);
  free(order);
  free(x.ids);
  free(x.labels);
  free(x.start);
  free(text);
  if (rc) cli_rows_free(out);
  return rc;
}

int cli_rows_split(const char *cmd, cli_rows *r, double fraction, cli_rows *held) {
  size_t k = (size_t)((double)r->n * fraction);
  if (k < 1) k = 1;
  if (k >= r->n) {
    fprintf(stderr, "%s: %zu rows of instruction data are too few to hold out a fraction %g\n", cmd,
            r->n, fraction);
    return CLI_FAIL;
  }
  *held = (cli_rows){.n = k, .seq = r->seq};
  size_t from = (r->n - k) * r->seq, len = k * r->seq;
  held->ids = malloc(len * sizeof *held->ids);
  held->labels = malloc(len * sizeof *held->labels);
  held->positions = r->positions ? malloc(len * sizeof *held->positions) : NULL;
  if (!held->ids || !held->labels || (r->positions && !held->positions))
    return fprintf(stderr, "%s: out of memory\n", cmd), CLI_FAIL;
  memcpy(held->ids, r->ids + from, len * sizeof *held->ids);
  memcpy(held->labels, r->labels + from, len * sizeof *held->labels);
  if (r->positions) memcpy(held->positions, r->positions + from, len * sizeof *held->positions);
  r->n -= k;
  return CLI_OK;
}

void cli_rows_copy(const cli_rows *r, size_t i, uint32_t *ids, uint32_t *labels,
                   uint32_t *positions) {
  memcpy(ids, r->ids + i * r->seq, r->seq * sizeof *ids);
  memcpy(labels, r->labels + i * r->seq, r->seq * sizeof *labels);
  if (!positions) return;
  for (size_t t = 0; t < r->seq; t++)
    positions[t] = r->positions ? r->positions[i * r->seq + t] : (uint32_t)t;
}

uint64_t cli_rows_hash(const cli_rows *r) {
  size_t len = r->n * r->seq;
  uint64_t h = cli_fnv1a(CLI_FNV_OFFSET, r->ids, len * sizeof *r->ids);
  h = cli_fnv1a(h, r->labels, len * sizeof *r->labels);
  if (r->positions) h = cli_fnv1a(h, r->positions, len * sizeof *r->positions);
  return h;
}

void cli_rows_free(cli_rows *r) {
  free(r->ids);
  free(r->labels);
  free(r->positions);
  *r = (cli_rows){0};
}
