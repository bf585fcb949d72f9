/* The GPT-2-style training graph of the planning benchmarks (memplan_gpt2, plan_cache,
 * optimize_gpt2): learned token and position embeddings, pre-norm blocks of causal attention
 * and a GELU MLP with GPT-2's parameter names, a final layer norm, and a head tied to the token
 * embedding. Static functions in a header because CMake builds every .c file in benchmarks/
 * as its own program. */
#ifndef MN_BENCH_GPT_GRAPH_H
#define MN_BENCH_GPT_GRAPH_H

#include <stdio.h>

#include "meganeura.h"

typedef struct gpt_config {
  int layers, heads;
  int64_t d_model, d_ff, vocab, batch, seq;
} gpt_config;

/* GPT-2 small: 12 layers of width 768 with 12 heads, MLP 3072, vocabulary 50257. */
static inline gpt_config gpt2_small(int64_t batch, int64_t seq) {
  return (gpt_config){.layers = 12,
                      .heads = 12,
                      .d_model = 768,
                      .d_ff = 3072,
                      .vocab = 50257,
                      .batch = batch,
                      .seq = seq};
}

/* x @ W + b with W [in, out]: GPT-2's Conv1D stores weights that way, so plain mn_matmul. */
static inline mn_node gpt_linear(mn_graph *g, mn_node x, int layer, const char *what, int64_t in,
                                 int64_t out) {
  char w[96], b[96];
  snprintf(w, sizeof w, "transformer.h.%d.%s.weight", layer, what);
  snprintf(b, sizeof b, "transformer.h.%d.%s.bias", layer, what);
  return mn_bias_add(g, mn_matmul(g, x, mn_parameter(g, w, MN_SHAPE(in, out))),
                     mn_parameter(g, b, MN_SHAPE(out)));
}

static inline mn_node gpt_norm(mn_graph *g, mn_node x, int layer, const char *what, int64_t d) {
  char w[96], b[96];
  snprintf(w, sizeof w, "transformer.h.%d.%s.weight", layer, what);
  snprintf(b, sizeof b, "transformer.h.%d.%s.bias", layer, what);
  return mn_layer_norm(g, x, mn_parameter(g, w, MN_SHAPE(d)), mn_parameter(g, b, MN_SHAPE(d)),
                       1e-5f);
}

/* The graph, whose one output is the loss; check mn_graph_status before using it. */
static inline mn_graph *gpt_graph(const gpt_config *c) {
  int64_t d = c->d_model;
  mn_graph *g = mn_graph_new();
  mn_node tokens = mn_input_u32(g, "tokens", MN_SHAPE(c->batch, c->seq));
  mn_node positions = mn_input_u32(g, "positions", MN_SHAPE(c->batch, c->seq));
  mn_node labels = mn_input_u32(g, "labels", MN_SHAPE(c->batch, c->seq));
  mn_node wte = mn_parameter(g, "transformer.wte.weight", MN_SHAPE(c->vocab, d));
  mn_node wpe = mn_parameter(g, "transformer.wpe.weight", MN_SHAPE(c->seq, d));
  mn_node h = mn_add(g, mn_embedding(g, tokens, wte), mn_embedding(g, positions, wpe));
  for (int l = 0; l < c->layers; l++) {
    mn_node a = gpt_norm(g, h, l, "ln_1", d);
    mn_node q = gpt_linear(g, a, l, "attn.q", d, d), k = gpt_linear(g, a, l, "attn.k", d, d);
    mn_node v = gpt_linear(g, a, l, "attn.v", d, d);
    mn_node att = mn_causal_attention(g, q, k, v, c->heads, c->heads, (int)(d / c->heads));
    h = mn_add(g, h, gpt_linear(g, att, l, "attn.c_proj", d, d));
    mn_node m = mn_gelu(g, gpt_linear(g, gpt_norm(g, h, l, "ln_2", d), l, "mlp.c_fc", d, c->d_ff));
    h = mn_add(g, h, gpt_linear(g, m, l, "mlp.c_proj", c->d_ff, d));
  }
  mn_node ln_f = mn_layer_norm(g, h, mn_parameter(g, "transformer.ln_f.weight", MN_SHAPE(d)),
                               mn_parameter(g, "transformer.ln_f.bias", MN_SHAPE(d)), 1e-5f);
  mn_node loss = mn_sparse_cross_entropy_loss(g, mn_matmul_bt(g, ln_f, wte), labels);
  mn_set_outputs(g, &loss, 1);
  return g;
}

#endif
