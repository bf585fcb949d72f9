/* Llama-family decoders (transformers' LlamaForCausalLM: Llama 2, SmolLM2, TinyLlama...) up to
 * the logits, with its parameter names and layouts:
 *
 *   h = embed_tokens[input_ids]
 *   per layer i ("layers.{i}."):
 *     a  = rms_norm(h; input_layernorm)
 *     q  = rope(a @ self_attn.q_proj^T)  k = rope(a @ self_attn.k_proj^T)  v = a @ v_proj^T
 *     h += causal_attention(q, k, v; H query heads over KV heads of head_dim) @ o_proj^T
 *     m  = rms_norm(h; post_attention_layernorm)
 *     h += (silu(m @ mlp.gate_proj^T) * (m @ mlp.up_proj^T)) @ mlp.down_proj^T
 *   logits = rms_norm(h; norm) @ lm_head^T   (embed_tokens when tie_word_embeddings)
 *
 * nn.Linear weights are stored [out, in] and used through mn_matmul_bt, so loading and saving
 * never transpose. RoPE is transformers' rotate-half form with positions 0..T-1 in each row,
 * which mn_rope computes, so Llama needs no position input. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/decode_layer.h"
#include "host/quant.h"
#include "models/model_internal.h"

/* The decode graph's layers as one llama_decode_layer op each (host/decode_layer.h): plain or
 * quantized weights (widths a multiple of the format's block), no adapter, a batch and widths that
 * the op serves, and not switched off with MN_DECODE_FUSED=0 (which benchmarks use to time the
 * unfused layers). */
static bool decodes_fused(const mn_model_ctx *m) {
  const mn_model_config *c = m->c;
  size_t block = 0;
  if (!m->max_seq || m->no_head || m->lora ||
      !mn_decode_layer_quant_fits(m->quant, m->group_size, c->hidden_size,
                                  c->num_heads * c->head_dim, c->intermediate_size, &block))
    return false;
  const char *env = getenv("MN_DECODE_FUSED");
  if (env && strcmp(env, "0") == 0) return false;
  return mn_decode_layer_fits(m->batch, c->hidden_size, c->num_heads * c->head_dim,
                              c->intermediate_size) &&
         c->head_dim % 2 == 0;
}

static mn_node block(const mn_model_ctx *m, int i, mn_node h) {
  mn_graph *g = m->g;
  const mn_model_config *c = m->c;
  const char *p = m->prefix;
  int64_t d = c->hidden_size, ff = c->intermediate_size;
  int64_t q_dim = c->num_heads * c->head_dim, kv_dim = c->num_kv_heads * c->head_dim;
  /* Declared in transformers' state_dict order (attention, MLP, then the two norms), so
   * saved files list tensors as transformers does; the graph below uses them in any order. */
  mn_node wq = mn_model_linear_weight(m, false, q_dim, d, "layers.%d.self_attn.q_proj.weight", i);
  mn_node wk = mn_model_linear_weight(m, false, kv_dim, d, "layers.%d.self_attn.k_proj.weight", i);
  mn_node wv = mn_model_linear_weight(m, false, kv_dim, d, "layers.%d.self_attn.v_proj.weight", i);
  mn_node wo = mn_model_linear_weight(m, false, d, q_dim, "layers.%d.self_attn.o_proj.weight", i);
  mn_node wgate = mn_model_linear_weight(m, false, ff, d, "layers.%d.mlp.gate_proj.weight", i);
  mn_node wup = mn_model_linear_weight(m, false, ff, d, "layers.%d.mlp.up_proj.weight", i);
  mn_node wdown = mn_model_linear_weight(m, false, d, ff, "layers.%d.mlp.down_proj.weight", i);
  mn_node ln1 = mn_model_param(g, p, MN_SHAPE(d), "layers.%d.input_layernorm.weight", i);
  mn_node ln2 = mn_model_param(g, p, MN_SHAPE(d), "layers.%d.post_attention_layernorm.weight", i);

  if (decodes_fused(m)) {
    char name[32];
    snprintf(name, sizeof name, "k_cache.%d", i);
    mn_node kc = mn_input(g, name, MN_SHAPE(m->batch, m->max_seq, kv_dim));
    snprintf(name, sizeof name, "v_cache.%d", i);
    mn_node vc = mn_input(g, name, MN_SHAPE(m->batch, m->max_seq, kv_dim));
    mn_node w[9] = {ln1, wq, wk, wv, wo, ln2, wgate, wup, wdown};
    return mn_llama_decode_layer(g, h, w, kc, vc, m->pos, m->kv_len, (int)c->num_heads,
                                 (int)c->num_kv_heads, (int)c->head_dim, c->norm_eps, c->rope_theta,
                                 m->quant, m->group_size);
  }
  char mod[7][64];
  const char *what[7] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                         "self_attn.o_proj", "mlp.gate_proj",    "mlp.up_proj",
                         "mlp.down_proj"};
  for (int k = 0; k < 7; k++)
    snprintf(mod[k], sizeof mod[k], "layers.%d.%s", i, what[k]);
  mn_node a = mn_rms_norm(g, h, ln1, c->norm_eps);
  mn_node q = mn_model_rope(m, mn_model_linear(m, a, wq, MN_NO_NODE, false, mod[0]));
  mn_node k = mn_model_rope(m, mn_model_linear(m, a, wk, MN_NO_NODE, false, mod[1]));
  mn_node v = mn_model_linear(m, a, wv, MN_NO_NODE, false, mod[2]);
  mn_node att = mn_model_attention(m, i, q, k, v);
  h = mn_add(g, h, mn_model_linear(m, att, wo, MN_NO_NODE, false, mod[3]));
  mn_node x = mn_rms_norm(g, h, ln2, c->norm_eps);
  mn_node ffn = mn_swiglu(g, mn_model_linear(m, x, wgate, MN_NO_NODE, false, mod[4]),
                          mn_model_linear(m, x, wup, MN_NO_NODE, false, mod[5]));
  return mn_add(g, h, mn_model_linear(m, ffn, wdown, MN_NO_NODE, false, mod[6]));
}

mn_node mn_llama_logits(const mn_model_ctx *m0) {
  mn_model_ctx mm = *m0, *m = &mm;
  mn_graph *g = m->g;
  const mn_model_config *c = m->c;
  int64_t d = c->hidden_size;
  mn_node ids = mn_input_u32(g, "input_ids", MN_SHAPE(m->batch, m->seq));
  if (m->packed) mm.positions = mn_input_u32(g, "position_ids", MN_SHAPE(m->batch, m->seq));
  mn_node emb = mn_model_param(g, m->prefix, MN_SHAPE(c->vocab_size, d), "embed_tokens.weight");
  mn_node h = mn_embedding(g, ids, emb);
  for (int i = 0; i < (int)c->num_layers; i++)
    h = block(m, i, h);
  mn_node norm = mn_model_param(g, m->prefix, MN_SHAPE(d), "norm.weight");
  h = mn_rms_norm(g, h, norm, c->norm_eps);
  if (m->no_head) return h;
  /* The head is outside the base model: never prefixed. */
  mn_node head = c->tie_word_embeddings
                     ? emb
                     : mn_model_param(g, "", MN_SHAPE(c->vocab_size, d), "lm_head.weight");
  return mn_matmul_bt(g, h, head);
}
