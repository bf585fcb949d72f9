/* GPT-2 (transformers' GPT2LMHeadModel) up to the logits, with its parameter names and
 * layouts:
 *
 *   h = wte[input_ids] + wpe[position_ids]
 *   per block i ("h.{i}."):
 *     a   = layer_norm(h; ln_1)
 *     qkv = a @ attn.c_attn.weight [D, 3D] + attn.c_attn.bias   (Conv1D: weight [in, out])
 *     q, k, v = columns [0, D), [D, 2D), [2D, 3D) of qkv         (mn_slice_last)
 *     h  += causal_attention(q, k, v; n_head heads of D / n_head) @ attn.c_proj + bias
 *     h  += gelu_tanh(layer_norm(h; ln_2) @ mlp.c_fc [D, I] + bias) @ mlp.c_proj [I, D] + bias
 *   logits = layer_norm(h; ln_f) @ wte^T   (or lm_head.weight [V, D] when untied)
 *
 * Conv1D weights are used as stored, through mn_matmul, so loading and saving never transpose.
 * The attention scale is 1/sqrt(head_dim), GPT-2's scale_attn_weights. Positions are an input
 * (as position_ids is in transformers) because the graph has no U32 constants; callers fill
 * it with mn_model_prepare_session. */
#include <stdio.h>

#include "models/model_internal.h"

/* x @ W + b for the Conv1D "{prefix}h.{layer}.{what}" with weight [in, out], and its
 * adapter. */
static mn_node conv1d(const mn_model_ctx *m, int layer, const char *what, mn_node x, int64_t in,
                      int64_t out) {
  mn_node w = mn_model_linear_weight(m, true, out, in, "h.%d.%s.weight", layer, what);
  mn_node b = mn_model_param(m->g, m->prefix, MN_SHAPE(out), "h.%d.%s.bias", layer, what);
  char module[64];
  snprintf(module, sizeof module, "h.%d.%s", layer, what);
  return mn_model_linear(m, x, w, b, true, module);
}

static mn_node layer_norm(const mn_model_ctx *m, const char *what, mn_node x) {
  int64_t d = m->c->hidden_size;
  mn_node w = mn_model_param(m->g, m->prefix, MN_SHAPE(d), "%s.weight", what);
  mn_node b = mn_model_param(m->g, m->prefix, MN_SHAPE(d), "%s.bias", what);
  return mn_layer_norm(m->g, x, w, b, m->c->norm_eps);
}

static mn_node block(const mn_model_ctx *m, int i, mn_node h) {
  mn_graph *g = m->g;
  const mn_model_config *c = m->c;
  int64_t d = c->hidden_size;
  char ln[32];
  snprintf(ln, sizeof ln, "h.%d.ln_1", i);
  mn_node a = layer_norm(m, ln, h);
  mn_node qkv = conv1d(m, i, "attn.c_attn", a, d, 3 * d);
  mn_node q = mn_slice_last(g, qkv, 0, d), k = mn_slice_last(g, qkv, d, d);
  mn_node v = mn_slice_last(g, qkv, 2 * d, d);
  mn_node att = mn_model_attention(m, i, q, k, v);
  h = mn_add(g, h, conv1d(m, i, "attn.c_proj", att, d, d));
  snprintf(ln, sizeof ln, "h.%d.ln_2", i);
  mn_node x = layer_norm(m, ln, h);
  mn_node f = mn_gelu(g, conv1d(m, i, "mlp.c_fc", x, d, c->intermediate_size));
  return mn_add(g, h, conv1d(m, i, "mlp.c_proj", f, c->intermediate_size, d));
}

mn_node mn_gpt2_logits(const mn_model_ctx *m0) {
  mn_model_ctx mm = *m0, *m = &mm;
  mn_graph *g = m->g;
  const mn_model_config *c = m->c;
  const char *p = m->prefix;
  int64_t d = c->hidden_size;
  mn_node ids = mn_input_u32(g, "input_ids", MN_SHAPE(m->batch, m->seq));
  mn_node pos = mn_input_u32(g, "position_ids", MN_SHAPE(m->batch, m->seq));
  mm.positions = pos;
  mn_node wte = mn_model_param(g, p, MN_SHAPE(c->vocab_size, d), "wte.weight");
  mn_node wpe = mn_model_param(g, p, MN_SHAPE(c->max_positions, d), "wpe.weight");
  mn_node h = mn_add(g, mn_embedding(g, ids, wte), mn_embedding(g, pos, wpe));
  for (int i = 0; i < (int)c->num_layers; i++)
    h = block(m, i, h);
  h = layer_norm(m, "ln_f", h);
  if (m->no_head) return h;
  /* The head is outside the base model: never prefixed. */
  mn_node head = c->tie_word_embeddings
                     ? wte
                     : mn_model_param(g, "", MN_SHAPE(c->vocab_size, d), "lm_head.weight");
  return mn_matmul_bt(g, h, head);
}
