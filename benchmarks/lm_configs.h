/* The language models of the step benchmarks (issue 7) as transformers' config.json fields:
 * GPT-2 124M and the SmolLM2-135M shape (576 hidden, 30 layers, 9/3 heads, 1536 MLP, 49152
 * vocab, tied head). lm_step.c times them, memory_lm.c reports their memory. */
#ifndef MN_BENCH_LM_CONFIGS_H
#define MN_BENCH_LM_CONFIGS_H

static const char MN_BENCH_GPT2[] =
    "{\"model_type\":\"gpt2\",\"vocab_size\":50257,\"n_embd\":768,\"n_layer\":12,"
    "\"n_head\":12,\"n_positions\":1024,\"activation_function\":\"gelu_new\"}";
static const char MN_BENCH_SMOLLM2[] =
    "{\"model_type\":\"llama\",\"vocab_size\":49152,\"hidden_size\":576,"
    "\"num_hidden_layers\":30,\"num_attention_heads\":9,\"num_key_value_heads\":3,"
    "\"intermediate_size\":1536,\"max_position_embeddings\":8192,\"rms_norm_eps\":1e-5,"
    "\"rope_theta\":100000,\"tie_word_embeddings\":true,\"hidden_act\":\"silu\"}";

#endif
