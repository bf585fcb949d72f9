/* The generator on CUDA against the CPU generator: the same tokens greedy and seeded, for
 * GPT-2 and Llama-GQA, batch 1 and 2, one graph launch per token, and with prompts fed in
 * prefill chunks (shorter and longer than one). The decode graph's kernels also compile here
 * without a device (NVRTC). */
#include <stdio.h>
#include <string.h>

#include "tests/support/cuda_check.h"
#include "tests/support/generator_check.h"
#include "tests/support/mn_test.h"
#include "tests/support/prefill_check.h"
#include "tests/support/tmp_dir.h"

static void tokens(mn_backend be, mn_model_family f, const char *path, int64_t batch,
                   const mn_sampling *s, uint32_t *out, size_t n) {
  mn_model_config c = mn_test_gen_config(f);
  mn_generator_options o = mn_generator_options_default();
  o.session.backend = be;
  o.batch = batch;
  o.max_seq = 16;
  mn_generator *g = NULL;
  cr_assert_eq(mn_generator_new(&c, path, &o, &g), MN_OK, "%s", mn_last_error());
  const uint32_t prompt[2][3] = {{3, 17, 5}, {30, 1, 22}};
  cr_assert_eq(mn_generator_generate(g, &prompt[0][0], 3, s, out, n), MN_OK, "%s", mn_last_error());
  mn_generator_stats st;
  cr_assert_eq(mn_generator_get_stats(g, &st), MN_OK);
  cr_assert_eq(st.launches_per_token, 1u);
  mn_generator_free(g);
}

static void same_tokens(mn_model_family f) {
  mn_test_require_cuda_device();
  mn_tmp_dir dir = mn_tmp_dir_make("mn_cuda_generator");
  mn_model_config c = mn_test_gen_config(f);
  char path[512];
  snprintf(path, sizeof path, "%s", mn_tmp_path(&dir, "w.st"));
  mn_test_gen_write_weights(&c, path, 5);
  const mn_sampling seeded = {.temperature = 1.2f, .top_k = 20, .top_p = 0.95f, .seed = 7};
  const mn_sampling *modes[2] = {NULL, &seeded};
  for (int m = 0; m < 2; m++)
    for (int64_t b = 1; b <= 2; b++) {
      uint32_t cpu[24], gpu[24];
      tokens(MN_BACKEND_CPU, f, path, b, modes[m], cpu, 12);
      tokens(MN_BACKEND_CUDA, f, path, b, modes[m], gpu, 12);
      cr_assert_arr_eq(cpu, gpu, (size_t)b * 12 * sizeof *cpu, "mode %d batch %lld", m,
                       (long long)b);
    }
  mn_tmp_dir_remove(&dir);
}

Test(cuda_generator, gpt2_tokens_equal_cpu) { same_tokens(MN_MODEL_GPT2); }
Test(cuda_generator, llama_gqa_tokens_equal_cpu) { same_tokens(MN_MODEL_LLAMA); }

/* The decode graph's own ops, batched, compile in fp32 and bf16 (no device needed). */
Test(cuda_generator, decode_ops_compile) {
  mn_test_require_cuda_build();
  mn_graph *g = mn_graph_new();
  mn_node pos = mn_input_u32(g, "pos", MN_SHAPE(1)), len = mn_input_u32(g, "kv_len", MN_SHAPE(1));
  mn_node q = mn_input(g, "q", MN_SHAPE(2, 1, 24)), k = mn_input(g, "k", MN_SHAPE(2, 1, 8));
  mn_node kc = mn_cache_write(g, k, mn_input(g, "kc", MN_SHAPE(2, 300, 8)), pos);
  mn_node vc = mn_cache_write(g, k, mn_input(g, "vc", MN_SHAPE(2, 300, 8)), pos);
  mn_node att = mn_cached_attention(g, q, kc, vc, len, 3, 1, 8);
  mn_node logits = mn_matmul(g, att, mn_parameter(g, "w", MN_SHAPE(24, 5000)));
  mn_node ids =
      mn_sample(g, logits, mn_input(g, "sp", MN_SHAPE(3)), mn_input_u32(g, "sk", MN_SHAPE(3)));
  cr_assert_eq(mn_graph_status(g), MN_OK, "%s", mn_graph_error(g));
  mn_set_outputs(g, &ids, 1);
  mn_test_assert_compiles_precision(g, false, MN_PRECISION_F32);
  mn_test_assert_compiles_precision(g, false, MN_PRECISION_BF16);
  mn_graph_free(g);
}

/* Chunked prefill on CUDA: the CPU's tokens (chunked), and CUDA's own token-by-token ones. */
static void prefill_tokens_equal_cpu(mn_model_family f) {
  mn_test_require_cuda_device();
  mn_tmp_dir dir = mn_tmp_dir_make("mn_cuda_prefill");
  mn_model_config c = mn_test_prefill_config(f);
  char path[512];
  snprintf(path, sizeof path, "%s", mn_tmp_path(&dir, "w.st"));
  mn_test_gen_write_weights(&c, path, 9);
  const mn_sampling seeded = {.temperature = 1.2f, .top_k = 20, .top_p = 0.95f, .seed = 3};
  const mn_sampling *modes[2] = {NULL, &seeded};
  const size_t lengths[3] = {3, 50, 71};
  for (int m = 0; m < 2; m++)
    for (size_t li = 0; li < 3; li++)
      for (int64_t b = 1; b <= 2; b++) {
        uint32_t cpu[2 * 10], gpu[2 * 10], gpu_tokens[2 * 10];
        size_t n = (size_t)b * 10 * sizeof *cpu;
        mn_test_prefill_tokens(&c, path, MN_BACKEND_CPU, MN_PRECISION_F32, b, 96, lengths[li], 6,
                               modes[m], false, cpu);
        mn_test_prefill_tokens(&c, path, MN_BACKEND_CUDA, MN_PRECISION_F32, b, 96, lengths[li], 6,
                               modes[m], false, gpu);
        mn_test_prefill_tokens(&c, path, MN_BACKEND_CUDA, MN_PRECISION_F32, b, 96, lengths[li], 6,
                               modes[m], true, gpu_tokens);
        cr_assert_arr_eq(cpu, gpu, n, "chunks: mode %d prompt %zu batch %lld", m, lengths[li],
                         (long long)b);
        cr_assert_arr_eq(gpu_tokens, gpu, n,
                         "cuda tokens against chunks: mode %d prompt %zu "
                         "batch %lld",
                         m, lengths[li], (long long)b);
      }
  mn_tmp_dir_remove(&dir);
}

Test(cuda_generator, gpt2_prefill_chunks_equal_cpu) { prefill_tokens_equal_cpu(MN_MODEL_GPT2); }
Test(cuda_generator, llama_gqa_prefill_chunks_equal_cpu) {
  prefill_tokens_equal_cpu(MN_MODEL_LLAMA);
}
