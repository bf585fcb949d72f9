#include "models.h"

#include <stdio.h>

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
