#include "tests/support/models.h"

#include "benchmarks/mlp_graph.h"

#include <stdio.h>

const mn_test_block_config mn_test_tiny_block = MN_TEST_BLOCK_CONFIG(16, 4, 2, 4, 24);

static mn_node param2(mn_graph *g, int layer, const char *what, int64_t rows, int64_t cols) {
  char name[96];
  snprintf(name, sizeof name, "layers.%d.%s", layer, what);
  return cols ? mn_parameter(g, name, MN_SHAPE(rows, cols)) : mn_parameter(g, name, MN_SHAPE(rows));
}

mn_test_block_weights mn_test_block_params(mn_graph *g, const mn_test_block_config *c, int layer) {
  int64_t d = c->d_model, q = c->num_heads * c->head_dim, kv = c->num_kv_heads * c->head_dim;
  mn_test_block_weights w;
  w.ln1 = param2(g, layer, "input_layernorm.weight", d, 0);
  w.wq = param2(g, layer, "self_attn.q_proj.weight", q, d);
  w.wk = param2(g, layer, "self_attn.k_proj.weight", kv, d);
  w.wv = param2(g, layer, "self_attn.v_proj.weight", kv, d);
  w.wo = param2(g, layer, "self_attn.o_proj.weight", d, q);
  w.ln2 = param2(g, layer, "post_attention_layernorm.weight", d, 0);
  w.wgate = param2(g, layer, "mlp.gate_proj.weight", c->d_ff, d);
  w.wup = param2(g, layer, "mlp.up_proj.weight", c->d_ff, d);
  w.wdown = param2(g, layer, "mlp.down_proj.weight", d, c->d_ff);
  return w;
}

mn_node mn_test_block(mn_graph *g, const mn_test_block_config *c, const mn_test_block_weights *w,
                      mn_node h) {
  int hd = (int)c->head_dim;
  mn_node a = mn_rms_norm(g, h, w->ln1, c->eps);
  mn_node q = mn_rope(g, mn_matmul_bt(g, a, w->wq), c->rope_theta, hd);
  mn_node k = mn_rope(g, mn_matmul_bt(g, a, w->wk), c->rope_theta, hd);
  mn_node v = mn_matmul_bt(g, a, w->wv);
  mn_node att = mn_causal_attention(g, q, k, v, (int)c->num_heads, (int)c->num_kv_heads, hd);
  h = mn_add(g, h, mn_matmul_bt(g, att, w->wo));
  mn_node m = mn_rms_norm(g, h, w->ln2, c->eps);
  mn_node ff = mn_swiglu(g, mn_matmul_bt(g, m, w->wgate), mn_matmul_bt(g, m, w->wup));
  return mn_add(g, h, mn_matmul_bt(g, ff, w->wdown));
}

mn_graph *mn_test_lm(const mn_test_block_config *c, int64_t batch, int64_t seq, int64_t vocab,
                     int layers) {
  mn_graph *g = mn_graph_new();
  mn_node tokens = mn_input_u32(g, "tokens", MN_SHAPE(batch, seq));
  mn_node labels = mn_input_u32(g, "labels", MN_SHAPE(batch, seq));
  mn_node emb = mn_parameter(g, "embed_tokens.weight", MN_SHAPE(vocab, c->d_model));
  mn_node h = mn_embedding(g, tokens, emb);
  for (int l = 0; l < layers; l++) {
    mn_test_block_weights w = mn_test_block_params(g, c, l);
    h = mn_test_block(g, c, &w, h);
  }
  mn_node norm = mn_parameter(g, "norm.weight", MN_SHAPE(c->d_model));
  mn_node logits = mn_matmul_bt(g, mn_rms_norm(g, h, norm, c->eps), emb);
  mn_node loss = mn_sparse_cross_entropy_loss(g, logits, labels);
  mn_set_outputs(g, &loss, 1);
  return g;
}

mn_graph *mn_test_relu_mlp(int64_t batch, int64_t in, int64_t hidden, int64_t out) {
  return bench_relu_mlp(batch, in, hidden, out);
}

mn_graph *mn_test_two_block_lm(void) {
  const mn_test_block_config cfg = MN_TEST_BLOCK_CONFIG(96, 6, 2, 16, 160);
  return mn_test_lm(&cfg, MN_TEST_TB_B, MN_TEST_TB_T, MN_TEST_TB_V, 2);
}

mn_model_config mn_test_tiny_gpt2(void) {
  return (mn_model_config){.family = MN_MODEL_GPT2,
                           .vocab_size = 50,
                           .hidden_size = 32,
                           .num_layers = 2,
                           .num_heads = 4,
                           .num_kv_heads = 4,
                           .head_dim = 8,
                           .intermediate_size = 128,
                           .max_positions = 16,
                           .norm_eps = 1e-5f,
                           .initializer_range = 0.02f,
                           .tie_word_embeddings = true};
}

mn_model_config mn_test_wide_mlp_gpt2(void) {
  mn_model_config c = mn_test_tiny_gpt2();
  c.hidden_size = 256;
  c.head_dim = 64;
  c.intermediate_size = 4096;
  c.max_positions = 128;
  return c;
}

mn_model_config mn_test_tiny_llama(void) {
  return (mn_model_config){.family = MN_MODEL_LLAMA,
                           .vocab_size = 61,
                           .hidden_size = 48,
                           .num_layers = 2,
                           .num_heads = 6,
                           .num_kv_heads = 2,
                           .head_dim = 8,
                           .intermediate_size = 96,
                           .max_positions = 64,
                           .norm_eps = 1e-6f,
                           .rope_theta = 10000.0f,
                           .initializer_range = 0.02f,
                           .tie_word_embeddings = false};
}
