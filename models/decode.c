/* The decode graph of a family: the training graph's layers for one new token per sequence,
 * where RoPE turns at the cache position and attention reads the KV caches, followed by
 * on-device sampling; and the prefill graph, the same layers for a chunk of rows per sequence
 * without the head. The layers are the family builders' own (models/gpt2.c, llama.c), which
 * ask mn_model_rope and mn_model_attention, so the two graphs cannot drift apart. */
#include <stdio.h>
#include <string.h>

#include "host/error.h"
#include "host/graph.h"
#include "models/model_internal.h"

mn_node mn_model_rope(const mn_model_ctx *m, mn_node x) {
  int hd = (int)m->c->head_dim;
  if (m->max_seq) return mn_rope_dynamic_offset(m->g, x, m->c->rope_theta, m->pos, hd);
  if (m->packed) return mn_rope_positions(m->g, x, m->c->rope_theta, m->positions, hd);
  return mn_rope(m->g, x, m->c->rope_theta, hd);
}

mn_node mn_model_attention(const mn_model_ctx *m, int i, mn_node q, mn_node k, mn_node v) {
  mn_graph *g = m->g;
  const mn_model_config *c = m->c;
  int heads = (int)c->num_heads, hd = (int)c->head_dim;
  int kv_heads = c->family == MN_MODEL_GPT2 ? heads : (int)c->num_kv_heads;
  if (!m->max_seq) {
    if (m->packed) return mn_causal_attention_packed(g, q, k, v, m->positions, heads, kv_heads, hd);
    return mn_causal_attention(g, q, k, v, heads, kv_heads, hd);
  }
  char name[32];
  int64_t kv_dim = (int64_t)kv_heads * hd;
  snprintf(name, sizeof name, "k_cache.%d", i);
  mn_node kc = mn_input(g, name, MN_SHAPE(m->batch, m->max_seq, kv_dim));
  snprintf(name, sizeof name, "v_cache.%d", i);
  mn_node vc = mn_input(g, name, MN_SHAPE(m->batch, m->max_seq, kv_dim));
  kc = mn_cache_write(g, k, kc, m->pos);
  vc = mn_cache_write(g, v, vc, m->pos);
  return mn_cached_attention(g, q, kc, vc, m->kv_len, heads, kv_heads, hd);
}

/* The decode graph (rows 0: one token, sampled, advancing its own state) or the prefill graph
 * (rows tokens, no head); linear weights quantized unless quant is MN_QUANT_NONE. */
static mn_status build(const char *fn, const mn_model_config *c, int64_t batch, int64_t max_seq,
                       int64_t rows, const char *name_prefix, mn_quant quant, int group_size,
                       mn_graph **out) {
  mn_status st = mn_model_config_check(fn, c);
  if (st != MN_OK) return st;
  if (batch < 1 || batch > 65535 || max_seq < 1 || max_seq > ((int64_t)1 << 31))
    return mn_fail(MN_ERR_INVALID_ARGUMENT,
                   "%s: batch %lld must be in 1..65535 and max_seq %lld in 1..2^31", fn,
                   (long long)batch, (long long)max_seq);
  if (rows < 0 || rows > max_seq)
    return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: rows %lld must be in 1..max_seq %lld", fn,
                   (long long)rows, (long long)max_seq);
  if (c->family == MN_MODEL_GPT2 && max_seq > c->max_positions)
    return mn_fail(MN_ERR_INVALID_ARGUMENT,
                   "%s: max_seq %lld is longer than n_positions %lld (the rows of wpe)", fn,
                   (long long)max_seq, (long long)c->max_positions);
  const char *prefix = name_prefix                  ? name_prefix
                       : c->family == MN_MODEL_GPT2 ? MN_GPT2_PREFIX
                                                    : MN_LLAMA_PREFIX;
  if (strlen(prefix) > MN_MODEL_PREFIX_CAP)
    return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: name_prefix is %zu bytes long, at most %d", fn,
                   strlen(prefix), MN_MODEL_PREFIX_CAP);
  mn_graph *g = mn_graph_new();
  if (!g) return mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
  mn_model_ctx m = {.g = g,
                    .c = c,
                    .batch = batch,
                    .seq = rows ? rows : 1,
                    .prefix = prefix,
                    .positions = MN_NO_NODE,
                    .max_seq = max_seq,
                    .quant = quant,
                    .group_size = group_size,
                    .no_head = rows > 0};
  m.pos = mn_input_u32(g, "pos", MN_SHAPE(1));
  m.kv_len = mn_input_u32(g, "kv_len", MN_SHAPE(1));
  mn_node y = c->family == MN_MODEL_GPT2 ? mn_gpt2_logits(&m) : mn_llama_logits(&m);
  if (rows) {
    if (mn_graph_status(g) == MN_OK) mn_set_outputs(g, &y, 1);
  } else {
    mn_node params = mn_input(g, "sample_params", MN_SHAPE(3));
    mn_node key = mn_input_u32(g, "sample_key", MN_SHAPE(3));
    mn_node ids = mn_sample(g, y, params, key);
    /* Every write below depends on the ids, which come after every reader of what it
     * overwrites. */
    mn_node in = mn_graph_find_leaf(g, MN_OP_INPUT, "input_ids");
    mn_node ring = mn_input_u32(g, "token_ring", MN_SHAPE(MN_DECODE_RING, batch));
    mn_node next = mn_store_row_u32(g, ids, in, m.pos);
    ring = mn_store_row_u32(g, next, ring, m.pos);
    mn_node last = mn_increment_u32(g, ring, m.pos, 0);
    last = mn_increment_u32(g, last, m.kv_len, 0);
    last = mn_increment_u32(g, last, key, 2);
    if (c->family == MN_MODEL_GPT2)
      last = mn_increment_u32(g, last, mn_graph_find_leaf(g, MN_OP_INPUT, "position_ids"), 0);
    mn_node outs[3] = {ids, ring, last};
    if (mn_graph_status(g) == MN_OK) mn_set_outputs(g, outs, 3);
  }
  if ((st = mn_graph_status(g)) != MN_OK) {
    mn_fail(st, "%s: %s", fn, mn_graph_error(g));
    mn_graph_free(g);
    return st;
  }
  *out = g;
  return MN_OK;
}

mn_status mn_model_build_decode(const mn_model_config *c, int64_t batch, int64_t max_seq,
                                const char *name_prefix, mn_graph **out) {
  return build("mn_model_build_decode", c, batch, max_seq, 0, name_prefix, MN_QUANT_NONE, 0, out);
}

mn_status mn_model_build_decode_quant(const mn_model_config *c, int64_t batch, int64_t max_seq,
                                      const char *name_prefix, mn_quant quant, int group_size,
                                      mn_graph **out) {
  return build("mn_model_build_decode", c, batch, max_seq, 0, name_prefix, quant, group_size, out);
}

mn_status mn_model_build_prefill(const mn_model_config *c, int64_t batch, int64_t max_seq,
                                 int64_t rows, const char *name_prefix, mn_quant quant,
                                 int group_size, mn_graph **out) {
  if (rows < 1)
    return mn_fail(MN_ERR_INVALID_ARGUMENT, "mn_model_build_prefill: rows %lld must be positive",
                   (long long)rows);
  return build("mn_model_build_prefill", c, batch, max_seq, rows, name_prefix, quant, group_size,
               out);
}
