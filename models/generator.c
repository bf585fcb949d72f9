/* The generator: an inference session of the decode graph (models/decode.c) and the host
 * loop that feeds it. The cache holds every token but the last one known (the last sampled,
 * or the prompt's last when no token was asked for): that one is "pending" and goes in first
 * at the next call, so a call of 10 then a call of 10 launch exactly what one call of 20 does,
 * with the same sampling positions. Each launch writes row `pos` of every layer's caches and
 * samples the token after it. The known tokens before the last run through a second session,
 * of the prefill graph (mn_model_build_prefill), MN_PREFILL_ROWS at a time, which shares the
 * weights and the caches with the first. The decode graph advances its own position and feeds
 * its sampled ids to the next launch (models/decode.c), so the host sets them once per call and
 * reads the tokens from the device's ring every MN_DECODE_RING launches: no wait per token. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "host/decode_layer.h"
#include "host/error.h"
#include "models/model_internal.h"
#include "models/prefill_mode.h"
#include "session/session.h"

/* Prompt rows per prefill launch, the last chunk padded: docs/generation.md says why 32. */
#define MN_PREFILL_ROWS 32

struct mn_generator {
  mn_model_config cfg;
  mn_graph *g;
  mn_session *s;
  /* The prefill graph's session (NULL: none, the prompt runs token by token), its inputs
   * [batch, MN_PREFILL_ROWS] each, and how the prompt goes (prefill_mode.h). */
  mn_graph *pf_g;
  mn_session *pf;
  uint32_t *pf_ids, *pf_pos;
  mn_prefill_mode prefill_mode;
  int64_t batch, max_seq;
  size_t cache_len; /* rows written: the next launch writes row cache_len */
  bool has_pending;
  uint32_t *pending, *ids, *pos_rows; /* [batch] each */
  float *ring;                        /* [MN_DECODE_RING, batch]: output 1 read as floats */
  mn_generator_stats stats;
};

mn_generator_options mn_generator_options_default(void) {
  return (mn_generator_options){.session = mn_session_options_default(),
                                .batch = 1,
                                .quant = MN_QUANT_NONE,
                                .group_size = 64};
}

static double now_ms(void) {
  struct timespec t;
  timespec_get(&t, TIME_UTC);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static mn_status check_options(const char *fn, const mn_model_config *c,
                               const mn_generator_options *o, int64_t *max_seq) {
  if ((unsigned)o->quant > MN_QUANT_Q4_1)
    return mn_fail(MN_ERR_INVALID_ARGUMENT,
                   "%s: quant %d is not an mn_quant (none, q8_0, q4_0, q4_1, int8, int4)", fn,
                   (int)o->quant);
  if (o->group_size != 0 && o->group_size != 32 && o->group_size != 64 && o->group_size != 128)
    return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: group_size %d must be 32, 64 or 128", fn,
                   o->group_size);
  if (o->batch < 1)
    return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: batch %lld must be at least 1", fn,
                   (long long)o->batch);
  *max_seq = o->max_seq ? o->max_seq : c->max_positions;
  if (*max_seq < 1)
    return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: max_seq %lld must be at least 1", fn,
                   (long long)*max_seq);
  return MN_OK;
}

/* Zeros for every cache input, so that a fresh session holds no NaN that a bug could read. */
static mn_status zero_caches(mn_generator *g) {
  size_t kv_dim =
      (size_t)(g->cfg.family == MN_MODEL_GPT2 ? g->cfg.num_heads : g->cfg.num_kv_heads) *
      (size_t)g->cfg.head_dim;
  size_t n = (size_t)g->batch * (size_t)g->max_seq * kv_dim;
  float *z = calloc(n, sizeof *z);
  if (!z) return mn_fail(MN_ERR_OUT_OF_MEMORY, "mn_generator_new: out of memory for the cache");
  mn_status st = MN_OK;
  char name[32];
  for (int64_t i = 0; st == MN_OK && i < g->cfg.num_layers; i++)
    for (int kv = 0; st == MN_OK && kv < 2; kv++) {
      snprintf(name, sizeof name, "%s_cache.%lld", kv ? "v" : "k", (long long)i);
      st = mn_session_set_input(g->s, name, z, n);
    }
  free(z);
  return st;
}

/* Whether node id is the packed rows of a quantized linear weight: an input that a
 * matmul_quant multiplies by, or a U32 input that a decode layer reads as a Linear weight (info:
 * the node's). */
static bool packed_weight(const mn_graph *g, mn_node id, mn_node_info *info) {
  if (mn_graph_node(g, id, info) != MN_OK || strcmp(info->op, "input") != 0) return false;
  mn_node_info user;
  for (size_t i = (size_t)id + 1; i < mn_graph_num_nodes(g); i++) {
    if (mn_graph_node(g, (mn_node)i, &user) != MN_OK) continue;
    if (strcmp(user.op, "matmul_quant") == 0 && user.num_inputs > 1 && user.inputs[1] == id)
      return true;
    if (strcmp(user.op, "llama_decode_layer") == 0 && info->type.dtype == MN_U32)
      for (int k = 0; k < user.num_inputs; k++)
        if (user.inputs[k] == id && mn_dl_is_weight(k)) return true;
  }
  return false;
}

/* The prefill session: the weights and every layer's caches are the decode session's. A
 * model whose weights the sharing cannot split (derived parameters at unaligned places) keeps
 * the token-by-token prefill. */
static mn_status new_prefill(mn_generator *g, const char *prefix, const mn_generator_options *go,
                             int group) {
  const mn_session_options *o = &go->session;
  int64_t rows = g->max_seq < MN_PREFILL_ROWS ? g->max_seq : MN_PREFILL_ROWS;
  size_t n = (size_t)g->batch * (size_t)rows, layers = (size_t)g->cfg.num_layers;
  /* The caches, and the packed rows of quantized linear weights (U32 inputs of rank 2). */
  size_t shared = 2 * layers, packed = 0;
  mn_node_info info;
  for (size_t i = 0; i < mn_graph_num_nodes(g->g); i++)
    if (packed_weight(g->g, (mn_node)i, &info)) packed++;
  char(*names)[32] = calloc(2 * layers, sizeof *names);
  const char **ptrs = calloc(shared + packed, sizeof *ptrs);
  g->pf_ids = calloc(n, sizeof *g->pf_ids);
  g->pf_pos = calloc(n, sizeof *g->pf_pos);
  mn_status st = names && ptrs && g->pf_ids && g->pf_pos
                     ? MN_OK
                     : mn_fail(MN_ERR_OUT_OF_MEMORY, "mn_generator_new: out of memory");
  for (size_t i = 0; st == MN_OK && i < 2 * layers; i++) {
    snprintf(names[i], sizeof names[i], "%s_cache.%zu", i % 2 ? "v" : "k", i / 2);
    ptrs[i] = names[i];
  }
  for (size_t i = 0; st == MN_OK && i < mn_graph_num_nodes(g->g); i++)
    if (packed_weight(g->g, (mn_node)i, &info)) ptrs[shared++] = info.name;
  if (st == MN_OK)
    st = mn_model_build_prefill(&g->cfg, g->batch, g->max_seq, rows, prefix, go->quant, group,
                                &g->pf_g);
  if (st == MN_OK) st = mn_build_inference_session_sharing(g->pf_g, o, g->s, ptrs, shared, &g->pf);
  if (st == MN_ERR_UNSUPPORTED) {
    mn_graph_free(g->pf_g);
    g->pf_g = NULL;
    st = MN_OK;
  }
  free(names);
  free(ptrs);
  return st;
}

/* The parameters, and the packed rows of quantized linear weights. */
static size_t weight_bytes(const mn_graph *g) {
  size_t total = 0;
  mn_node_info info;
  for (size_t i = 0; i < mn_graph_num_nodes(g); i++)
    if (packed_weight(g, (mn_node)i, &info) ||
        (mn_graph_node(g, (mn_node)i, &info) == MN_OK && strcmp(info.op, "parameter") == 0))
      total += mn_tensor_type_bytes(&info.type);
  return total;
}

/* Whether the file starts with GGUF's magic (a name is not proof of a format). */
static bool is_gguf(const char *path) {
  FILE *f = fopen(path, "rb");
  char magic[4] = {0};
  bool yes = f && fread(magic, 1, 4, f) == 4 && memcmp(magic, "GGUF", 4) == 0;
  if (f) fclose(f);
  return yes;
}

mn_status mn_generator_new(const mn_model_config *c, const char *weights_path,
                           const mn_generator_options *o, mn_generator **out) {
  const char *fn = "mn_generator_new";
  if (!out) return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: out is NULL", fn);
  *out = NULL;
  if (!c || !weights_path)
    return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn, !c ? "config" : "weights_path");
  mn_generator_options def = mn_generator_options_default();
  if (!o) o = &def;
  int64_t max_seq = 0;
  mn_status st = check_options(fn, c, o, &max_seq);
  if (st != MN_OK) return st;
  /* A GGUF names tensors its own way and loads under either prefix: the default one. */
  bool gguf = is_gguf(weights_path);
  const char *prefix = NULL;
  if (!gguf && (st = mn_model_name_prefix(c, weights_path, &prefix)) != MN_OK) return st;
  mn_generator *g = calloc(1, sizeof *g);
  if (!g) return mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
  g->cfg = *c;
  g->batch = o->batch;
  g->max_seq = max_seq;
  size_t b = (size_t)o->batch;
  g->pending = calloc(b, sizeof *g->pending);
  g->ids = calloc(b, sizeof *g->ids);
  g->pos_rows = calloc(b, sizeof *g->pos_rows);
  g->ring = calloc(MN_DECODE_RING * b, sizeof *g->ring);
  if (!g->pending || !g->ids || !g->pos_rows || !g->ring)
    st = mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
  int group = o->group_size ? o->group_size : 64;
  if (st == MN_OK)
    st = mn_model_build_decode_quant(c, o->batch, max_seq, prefix, o->quant, group, &g->g);
  if (st == MN_OK) st = mn_build_inference_session(g->g, &o->session, &g->s);
  if (st == MN_OK && o->quant != MN_QUANT_NONE)
    st = mn_model_load_quant(c, weights_path, prefix, gguf, o->quant, group, g->g, g->s);
  else if (st == MN_OK)
    st = gguf ? mn_session_load_gguf(g->s, weights_path, MN_LOAD_STRICT)
              : mn_session_load_safetensors(g->s, weights_path, true);
  if (st == MN_OK) st = zero_caches(g);
  if (st == MN_OK) st = new_prefill(g, prefix, o, group);
  if (st != MN_OK) {
    mn_generator_free(g);
    return st;
  }
  g->stats.weight_bytes = weight_bytes(g->g);
  *out = g;
  return MN_OK;
}

void mn_generator_free(mn_generator *g) {
  if (!g) return;
  mn_session_free(g->pf); /* before the session whose memory it reads */
  mn_graph_free(g->pf_g);
  free(g->pf_ids);
  free(g->pf_pos);
  mn_session_free(g->s);
  mn_graph_free(g->g);
  free(g->pending);
  free(g->ids);
  free(g->pos_rows);
  free(g->ring);
  free(g);
}

mn_status mn_generator_reset(mn_generator *g) {
  if (!g) return mn_fail(MN_ERR_INVALID_ARGUMENT, "mn_generator_reset: generator is NULL");
  g->cache_len = 0;
  g->has_pending = false;
  return MN_OK;
}

mn_status mn_generator_get_stats(const mn_generator *g, mn_generator_stats *out) {
  if (!g || !out)
    return mn_fail(MN_ERR_INVALID_ARGUMENT, "mn_generator_get_stats: %s is NULL",
                   !g ? "generator" : "out");
  *out = g->stats;
  out->cache_len = g->cache_len;
  return MN_OK;
}

mn_session *mn_generator_decode_session(mn_generator *g) { return g ? g->s : NULL; }

static mn_status check_sampling(const char *fn, const mn_sampling *s) {
  if (!(s->temperature >= 0) || !isfinite(s->temperature))
    return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: temperature %g must be a finite number >= 0", fn,
                   (double)s->temperature);
  if (s->top_k < 0)
    return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: top_k %d must be >= 0", fn, s->top_k);
  if (!(s->top_p > 0 && s->top_p <= 1))
    return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: top_p %g must be in (0, 1]", fn, (double)s->top_p);
  return MN_OK;
}

/* The device's position state for a launch at row cache_len; the launches then advance it. */
static mn_status set_position(mn_generator *g, const mn_sampling *s) {
  uint32_t pos = (uint32_t)g->cache_len, len = pos + 1;
  uint32_t key[3] = {(uint32_t)s->seed, (uint32_t)(s->seed >> 32), pos};
  size_t b = (size_t)g->batch;
  mn_status st = mn_session_set_input_u32(g->s, "pos", &pos, 1);
  if (st == MN_OK) st = mn_session_set_input_u32(g->s, "kv_len", &len, 1);
  if (st == MN_OK) st = mn_session_set_input_u32(g->s, "sample_key", key, 3);
  if (st == MN_OK && g->cfg.family == MN_MODEL_GPT2) {
    for (size_t i = 0; i < b; i++)
      g->pos_rows[i] = pos;
    st = mn_session_set_input_u32(g->s, "position_ids", g->pos_rows, b);
  }
  return st;
}

/* One launch at row cache_len: ids[b] go in, or with NULL the ids the last launch sampled. */
static mn_status launch(mn_generator *g, const uint32_t *ids) {
  mn_status st = ids ? mn_session_set_input_u32(g->s, "input_ids", ids, (size_t)g->batch) : MN_OK;
  if (st == MN_OK) st = mn_session_step(g->s);
  if (st != MN_OK) return st;
  g->cache_len++;
  g->stats.launches++;
  return MN_OK;
}

/* Tokens t0 .. t0+n-1 of this call (n <= MN_DECODE_RING), sampled by the launches at rows
 * pos0 + t0 .. of the ring: one read, which waits for them. */
static mn_status read_ring(mn_generator *g, size_t pos0, size_t t0, size_t n, uint32_t *out,
                           size_t n_new) {
  size_t b = (size_t)g->batch;
  mn_status st = mn_session_read_output_by_index(g->s, 1, g->ring, MN_DECODE_RING * b);
  if (st != MN_OK) return st;
  g->stats.host_reads++;
  for (size_t t = t0; t < t0 + n; t++)
    for (size_t i = 0; i < b; i++)
      out[i * n_new + t] = (uint32_t)g->ring[(pos0 + t) % MN_DECODE_RING * b + i];
  return MN_OK;
}

bool mn_generator_set_prefill_mode(mn_generator *g, mn_prefill_mode mode) {
  g->prefill_mode = mode;
  return g->pf != NULL;
}

/* Whether a chunk of `real` known tokens in `rows` rows costs less than `real` decode launches.
 * On CUDA it does: one launch either way, and the launch dominates at these sizes. On the CPU
 * a row of a chunk costs about 0.6 of a decode launch (the reference's products compute each
 * element on its own, so rows share little more than the skipped head), and pad rows cost as
 * much as real ones. */
static bool prefill_pays(const mn_generator *g, size_t real, size_t rows) {
  if (g->prefill_mode == MN_PREFILL_CHUNKS || real == rows) return true;
  return g->s->backend != &mn_cpu_backend || 5 * real >= 3 * rows;
}

/* Known token j of this call for sequence i: the pending one, then the prompt's. */
static uint32_t known(const mn_generator *g, const uint32_t *prompt, size_t n_prompt, size_t i,
                      size_t j) {
  if (g->has_pending) {
    if (j == 0) return g->pending[i];
    j--;
  }
  return prompt[i * n_prompt + j];
}

/* Writes the first n known tokens into the caches through the prefill session, a chunk of
 * MN_PREFILL_ROWS per launch, while a whole chunk fits the cache and pays (prefill_pays);
 * *done counts the tokens written. A short last chunk is padded: its pad rows write cache rows past
 * the known tokens, which the next tokens overwrite, and no real row attends to them (causal). */
static mn_status prefill(mn_generator *g, const uint32_t *prompt, size_t n_prompt, size_t n,
                         size_t *done) {
  size_t rows = (size_t)(g->max_seq < MN_PREFILL_ROWS ? g->max_seq : MN_PREFILL_ROWS);
  size_t b = (size_t)g->batch;
  /* The decode session's writes to the caches (the zeros, the last launch) come first. */
  mn_status st = mn_session_wait(g->s);
  bool ran = false;
  while (st == MN_OK && *done < n && g->cache_len + rows <= (size_t)g->max_seq) {
    size_t real = n - *done < rows ? n - *done : rows;
    if (!prefill_pays(g, real, rows)) break;
    uint32_t pos = (uint32_t)g->cache_len, len = pos + (uint32_t)rows;
    for (size_t i = 0; i < b; i++)
      for (size_t r = 0; r < rows; r++) {
        g->pf_ids[i * rows + r] = r < real ? known(g, prompt, n_prompt, i, *done + r) : 0;
        g->pf_pos[i * rows + r] = pos + (uint32_t)r;
      }
    st = mn_session_set_input_u32(g->pf, "input_ids", g->pf_ids, b * rows);
    if (st == MN_OK) st = mn_session_set_input_u32(g->pf, "pos", &pos, 1);
    if (st == MN_OK) st = mn_session_set_input_u32(g->pf, "kv_len", &len, 1);
    if (st == MN_OK && g->cfg.family == MN_MODEL_GPT2)
      st = mn_session_set_input_u32(g->pf, "position_ids", g->pf_pos, b * rows);
    if (st == MN_OK) st = mn_session_step(g->pf);
    if (st == MN_OK) {
      ran = true;
      g->stats.launches++;
      g->cache_len += real;
      *done += real;
    }
  }
  /* Before the decode session reads the caches, on its own stream. */
  if (st == MN_OK && ran) st = mn_session_wait(g->pf);
  return st;
}

mn_status mn_generator_generate(mn_generator *g, const uint32_t *prompt, size_t n_prompt,
                                const mn_sampling *s, uint32_t *out, size_t n_new) {
  const char *fn = "mn_generator_generate";
  if (!g) return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: generator is NULL", fn);
  if ((n_prompt && !prompt) || (n_new && !out))
    return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn, !out ? "out" : "prompt");
  const mn_sampling greedy = {.temperature = 0, .top_p = 1};
  if (!s) s = &greedy;
  mn_status st = check_sampling(fn, s);
  if (st != MN_OK) return st;
  size_t b = (size_t)g->batch;
  for (size_t i = 0; i < b * n_prompt; i++)
    if ((int64_t)prompt[i] >= g->cfg.vocab_size)
      return mn_fail(MN_ERR_INVALID_ARGUMENT,
                     "%s: prompt id %u (sequence %zu, position %zu) is past the vocabulary of %lld",
                     fn, prompt[i], i / n_prompt, i % n_prompt, (long long)g->cfg.vocab_size);
  size_t feed = n_prompt + (g->has_pending ? 1 : 0);
  if (feed == 0) {
    if (n_new == 0) return MN_OK;
    return mn_fail(MN_ERR_INVALID_ARGUMENT,
                   "%s: no prompt and nothing to continue from (an empty cache)", fn);
  }
  /* The launches of this call, each writing one cache row; the last known token stays out. */
  size_t launches = feed - 1 + n_new;
  if (launches > (size_t)g->max_seq - g->cache_len)
    return mn_fail(MN_ERR_INVALID_ARGUMENT,
                   "%s: %zu prompt and %zu new tokens after %zu cached would pass max_seq %lld", fn,
                   n_prompt, n_new, g->cache_len + (g->has_pending ? 1 : 0), (long long)g->max_seq);
  float params[3] = {s->temperature, (float)s->top_k, s->top_p};
  st = mn_session_set_input(g->s, "sample_params", params, 3);
  g->stats.launches = g->stats.host_reads = 0;
  double t0 = now_ms();
  /* The known tokens but the last: in chunks, then (those no chunk fits) one per launch. */
  size_t done = 0;
  if (st == MN_OK && g->pf && g->prefill_mode != MN_PREFILL_TOKENS)
    st = prefill(g, prompt, n_prompt, feed - 1, &done);
  /* After the chunks, which move cache_len without the decode graph's device state. */
  if (st == MN_OK) st = set_position(g, s);
  for (; st == MN_OK && done < feed - 1; done++) {
    for (size_t i = 0; i < b; i++)
      g->ids[i] = known(g, prompt, n_prompt, i, done);
    st = launch(g, g->ids);
  }
  for (size_t i = 0; i < b; i++)
    g->ids[i] = known(g, prompt, n_prompt, i, feed - 1);
  if (st == MN_OK) st = mn_session_wait(g->s);
  double t1 = now_ms();
  /* The first launch takes the last known ids, each later one what the one before sampled. */
  size_t pos0 = g->cache_len;
  for (size_t t = 0; st == MN_OK && t < n_new; t++) {
    st = launch(g, t == 0 ? g->ids : NULL);
    size_t in_chunk = t % MN_DECODE_RING + 1;
    if (st == MN_OK && (in_chunk == MN_DECODE_RING || t + 1 == n_new))
      st = read_ring(g, pos0, t + 1 - in_chunk, in_chunk, out, n_new);
  }
  double t2 = now_ms();
  if (st != MN_OK) return st;
  for (size_t i = 0; i < b && n_new; i++)
    g->ids[i] = out[i * n_new + n_new - 1];
  memcpy(g->pending, g->ids, b * sizeof *g->ids);
  g->has_pending = true;
  g->stats.prefill_ms = t1 - t0;
  g->stats.ms_per_token = n_new ? (t2 - t1) / (double)n_new : 0;
  g->stats.launches_per_token = 1;
  return MN_OK;
}
