/* Small models built only through the public API, shared by the whole-model gradient
 * checks and the learning checks. */
#ifndef MN_TEST_MODELS_H
#define MN_TEST_MODELS_H

#include "meganeura.h"

typedef struct mn_test_block_config {
  int64_t d_model, num_heads, num_kv_heads, head_dim, d_ff;
  float rope_theta, eps;
} mn_test_block_config;

/* A block config with the RoPE theta and norm epsilon that every test and benchmark block uses
 * (10000, 1e-5). A brace initializer, so that it also initializes static objects. */
#define MN_TEST_BLOCK_CONFIG(d_model_, heads_, kv_heads_, head_dim_, d_ff_)                        \
  {                                                                                                \
    .d_model = (d_model_), .num_heads = (heads_), .num_kv_heads = (kv_heads_),                     \
    .head_dim = (head_dim_), .d_ff = (d_ff_), .rope_theta = 10000.0f, .eps = 1e-5f                 \
  }

/* The small block of the plan-cache and memory-planner suites: D 16, 4 query heads over 2 kv
 * heads of 4, feed-forward 24, so a whole training step takes milliseconds on the CPU. */
extern const mn_test_block_config mn_test_tiny_block;

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

/* The HF-config models of the model-builder suites (mn_model_build): a GPT-2 of 2 layers of
 * width 32, 4 heads, vocabulary 50, 16 positions, tied head; a Llama of 2 layers of width 48,
 * 6 query heads over 2 kv heads of 8, MLP 96, vocabulary 61, untied head. */
mn_model_config mn_test_tiny_gpt2(void);
mn_model_config mn_test_tiny_llama(void);

/* The tiny GPT-2 at width 256 (4 heads of 64), MLP 4096 and 128 positions: at 128 tokens wide
 * enough that gelu_grad stays a kernel of its own (the cost model prices cuBLASLt's DGELU
 * epilogue out), so the bias gradient and the recomputed GELU ride on it (gelu_grad_bgrad). */
mn_model_config mn_test_wide_mlp_gpt2(void);

/* A language model of `layers` blocks: u32 inputs "tokens" and "labels" [batch, seq], an
 * embedding "embed_tokens.weight" [vocab, D] that is also the (tied) output head, a final
 * rms_norm "norm.weight", and the sparse cross-entropy of the logits as the one output. Check
 * mn_graph_status: this file builds for the benchmarks too, without Criterion. */
mn_graph *mn_test_lm(const mn_test_block_config *c, int64_t batch, int64_t seq, int64_t vocab,
                     int layers);

/* The LM the CUDA training suites run: two blocks of width 96 (6 heads of 16, 2 KV heads,
 * SwiGLU 160), batch MN_TEST_TB_B x MN_TEST_TB_T tokens of a vocabulary of MN_TEST_TB_V. */
enum { MN_TEST_TB_B = 2, MN_TEST_TB_T = 40, MN_TEST_TB_V = 97 };
mn_graph *mn_test_two_block_lm(void);

/* An MLP classifier in-hidden-hidden-out with biases and ReLU, the benchmarks' graph
 * (benchmarks/mlp_graph.h): input "x" [batch, in], u32 "labels" [batch], parameters
 * "<2l>.weight" [fan_in, fan_out] and "<2l>.bias", softmax cross-entropy. */
mn_graph *mn_test_relu_mlp(int64_t batch, int64_t in, int64_t hidden, int64_t out);

#endif
