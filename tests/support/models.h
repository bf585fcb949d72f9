/* Small models built only through the public API, shared by the whole-model gradient
 * checks and the learning checks. */
#ifndef MN_TEST_MODELS_H
#define MN_TEST_MODELS_H

#include "meganeura.h"

typedef struct mn_test_block_config {
  int64_t d_model, num_heads, num_kv_heads, head_dim, d_ff;
  float rope_theta, eps;
} mn_test_block_config;

/* The weights of one pre-norm transformer block, as nodes. */
typedef struct mn_test_block_weights {
  mn_node ln1, wq, wk, wv, wo, ln2, wgate, wup, wdown;
} mn_test_block_weights;

/* Declares the parameters of block `layer` ("layers.<i>.attn.q_proj.weight", ...). */
mn_test_block_weights mn_test_block_params(mn_graph *g, const mn_test_block_config *c, int layer);

/* h + attn(rms_norm(h)) then + swiglu-mlp(rms_norm(.)): RoPE on q and k, causal GQA
 * attention, nn.Linear weights through mn_matmul_bt. h is [T, D] or [B, T, D]. */
mn_node mn_test_block(mn_graph *g, const mn_test_block_config *c, const mn_test_block_weights *w,
                      mn_node h);

#endif
