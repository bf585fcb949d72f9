/* The generator's prompt fed in chunks of the prefill graph gives the tokens of the prompt fed
 * one token per launch (the decode graph alone), on the CPU: GPT-2 and Llama-GQA, prompts
 * shorter than a chunk, exactly one, and longer ones that chunks do not divide, batch 1 and 2,
 * greedy and sampled, a continuation call after each, and a cache too short for a last whole
 * chunk (its tail goes token by token). */
#include <stdio.h>

#include "tests/support/generator_check.h"
#include "tests/support/mn_test.h"
#include "tests/support/prefill_check.h"
#include "tests/support/tmp_dir.h"

static mn_tmp_dir dir;
static char weights[2][512];

static void setup(void) {
  dir = mn_tmp_dir_make("mn_generator_prefill");
  mn_model_family f[2] = {MN_MODEL_GPT2, MN_MODEL_LLAMA};
  for (int i = 0; i < 2; i++) {
    mn_model_config c = mn_test_prefill_config(f[i]);
    snprintf(weights[i], sizeof weights[i], "%s", mn_tmp_path(&dir, i ? "llama.st" : "gpt2.st"));
    mn_test_gen_write_weights(&c, weights[i], 21 + (uint64_t)i);
  }
}
static void teardown(void) { mn_tmp_dir_remove(&dir); }

TestSuite(generator_prefill, .init = setup, .fini = teardown);

static void same_tokens_in(mn_model_family f, mn_precision prec, int64_t batch, int64_t max_seq,
                           size_t n_prompt, const mn_sampling *s) {
  mn_model_config c = mn_test_prefill_config(f);
  const char *path = weights[f == MN_MODEL_LLAMA];
  enum { NEW = 6 };
  uint32_t chunks[2 * (NEW + 4)], tokens[2 * (NEW + 4)];
  size_t n = (size_t)batch * (NEW + 4);
  mn_test_prefill_tokens(&c, path, MN_BACKEND_CPU, prec, batch, max_seq, n_prompt, NEW, s, false,
                         chunks);
  mn_test_prefill_tokens(&c, path, MN_BACKEND_CPU, prec, batch, max_seq, n_prompt, NEW, s, true,
                         tokens);
  for (size_t i = 0; i < n; i++)
    cr_assert_eq(chunks[i], tokens[i],
                 "family %d, batch %lld, prompt %zu: token %zu of sequence %zu is %u in chunks, %u "
                 "token by token",
                 (int)f, (long long)batch, n_prompt, i % (NEW + 4), i / (NEW + 4), chunks[i],
                 tokens[i]);
}

static void same_tokens(mn_model_family f, int64_t batch, int64_t max_seq, size_t n_prompt,
                        const mn_sampling *s) {
  same_tokens_in(f, MN_PRECISION_F32, batch, max_seq, n_prompt, s);
}

static const mn_sampling warm = {.temperature = 1.3f, .top_k = 0, .top_p = 0.95f, .seed = 5};

static void every_length(mn_model_family f) {
  /* 3: shorter than a chunk; 33: one whole chunk (the last token stays pending); 50 and 71:
   * longer, not divided by the chunk. */
  const size_t lengths[] = {3, 33, 50, 71};
  for (size_t i = 0; i < sizeof lengths / sizeof *lengths; i++)
    for (int64_t b = 1; b <= 2; b++) {
      same_tokens(f, b, 96, lengths[i], NULL);
      same_tokens(f, b, 96, lengths[i], &warm);
    }
}

Test(generator_prefill, gpt2_chunks_equal_tokens) { every_length(MN_MODEL_GPT2); }
Test(generator_prefill, llama_gqa_chunks_equal_tokens) { every_length(MN_MODEL_LLAMA); }

/* max_seq 60 and a 50-token prompt: one chunk of 32, then no room for a second whole chunk,
 * so the other 17 known tokens go one per launch. */
Test(generator_prefill, a_short_cache_finishes_token_by_token) {
  same_tokens(MN_MODEL_LLAMA, 2, 60, 50, NULL);
  same_tokens(MN_MODEL_GPT2, 1, 60, 50, &warm);
}

/* In bf16 the two sessions store the caches alike, so they share them, and the chunks still
 * give the tokens of the token-by-token path. The token-by-token path runs the decode graph,
 * whose fused Llama layers (host/decode_layer.h) keep their intermediates in fp32 where the
 * prefill's ops round each to bf16, so the comparison is made with the decode graph's layers
 * unfused, as the prefill's are. */
Test(generator_prefill, bf16_chunks_equal_tokens) {
  setenv("MN_DECODE_FUSED", "0", 1);
  same_tokens_in(MN_MODEL_LLAMA, MN_PRECISION_BF16, 2, 96, 50, NULL);
  same_tokens_in(MN_MODEL_GPT2, MN_PRECISION_BF16, 1, 96, 71, &warm);
}
