/* The decode loop on CUDA: one graph launch per token with nothing set in between and the
 * tokens read back once per 64 (the device's ring) and at the end, never per token; tokens
 * equal the CPU generator's, greedy and seeded, at batch 1 and 3, for GPT-2 and Llama-GQA,
 * across the ring's end (70 tokens); 10 then 10 equal one call of 20. The state ops also
 * compile here without a device (NVRTC). */
#include <stdio.h>
#include <string.h>

#include "tests/support/cuda_check.h"
#include "tests/support/generator_check.h"
#include "tests/support/mn_test.h"
#include "tests/support/tmp_dir.h"

#define MAX_TOKENS 70

static mn_generator *make(mn_backend be, mn_model_family f, const char *path, int64_t batch,
                          int64_t max_seq) {
  mn_model_config c = mn_test_gen_config(f);
  mn_generator_options o = mn_generator_options_default();
  o.session.backend = be;
  o.batch = batch;
  o.max_seq = max_seq;
  mn_generator *g = NULL;
  cr_assert_eq(mn_generator_new(&c, path, &o, &g), MN_OK, "%s", mn_last_error());
  return g;
}

/* n tokens per sequence after the prompt, in calls of parts[0], parts[1], ..; out [batch, n].
 * The first call's two known tokens before the last take one prefill chunk on CUDA and, on the
 * CPU, where so short a chunk does not pay, one decode launch each. */
static void generate(mn_generator *g, mn_backend be, int64_t batch, const mn_sampling *s,
                     const size_t *parts, size_t num_parts, uint32_t *out, size_t n) {
  size_t prompt_launches = be == MN_BACKEND_CUDA ? 1 : 2;
  static const uint32_t prompt[3][3] = {{3, 17, 5}, {30, 1, 22}, {8, 8, 9}};
  uint32_t part[3 * MAX_TOKENS];
  for (size_t p = 0, t0 = 0; p < num_parts; t0 += parts[p++]) {
    cr_assert_eq(mn_generator_generate(g, p ? NULL : &prompt[0][0], p ? 0 : 3, s, part, parts[p]),
                 MN_OK, "%s", mn_last_error());
    mn_generator_stats st;
    cr_assert_eq(mn_generator_get_stats(g, &st), MN_OK);
    cr_expect_eq(st.launches, parts[p] + (p ? 0 : prompt_launches), "call %zu", p);
    cr_expect_leq(st.host_reads, (parts[p] + 63) / 64, "call %zu of %zu tokens", p, parts[p]);
    for (int64_t i = 0; i < batch; i++)
      memcpy(out + (size_t)i * n + t0, part + (size_t)i * parts[p], parts[p] * sizeof *part);
  }
}

static void same_tokens(mn_model_family f, int64_t max_seq, size_t n) {
  mn_test_require_cuda_device();
  mn_tmp_dir dir = mn_tmp_dir_make("mn_cuda_decode_loop");
  mn_model_config c = mn_test_gen_config(f);
  char path[512];
  snprintf(path, sizeof path, "%s", mn_tmp_path(&dir, "w.st"));
  mn_test_gen_write_weights(&c, path, 9);
  const mn_sampling seeded = {.temperature = 1.2f, .top_k = 20, .top_p = 0.95f, .seed = 7};
  const mn_sampling *modes[2] = {NULL, &seeded};
  const size_t whole[1] = {n}, halves[2] = {n / 2, n - n / 2};
  for (int m = 0; m < 2; m++)
    for (int64_t b = 1; b <= 3; b += 2) {
      uint32_t cpu[3 * MAX_TOKENS], gpu[3 * MAX_TOKENS], split[3 * MAX_TOKENS];
      size_t bytes = (size_t)b * n * sizeof *cpu;
      mn_generator *gc = make(MN_BACKEND_CPU, f, path, b, max_seq);
      mn_generator *gg = make(MN_BACKEND_CUDA, f, path, b, max_seq);
      generate(gc, MN_BACKEND_CPU, b, modes[m], whole, 1, cpu, n);
      generate(gg, MN_BACKEND_CUDA, b, modes[m], whole, 1, gpu, n);
      cr_assert_arr_eq(cpu, gpu, bytes, "mode %d batch %lld: CUDA differs from the CPU", m,
                       (long long)b);
      cr_assert_eq(mn_generator_reset(gg), MN_OK);
      generate(gg, MN_BACKEND_CUDA, b, modes[m], halves, 2, split, n);
      cr_assert_arr_eq(gpu, split, bytes, "mode %d batch %lld: %zu + %zu differ from %zu", m,
                       (long long)b, halves[0], halves[1], n);
      mn_generator_free(gc);
      mn_generator_free(gg);
    }
  mn_tmp_dir_remove(&dir);
}

Test(cuda_decode_loop, gpt2_twelve_tokens) { same_tokens(MN_MODEL_GPT2, 16, 12); }
Test(cuda_decode_loop, llama_gqa_twenty_tokens) { same_tokens(MN_MODEL_LLAMA, 32, 20); }
Test(cuda_decode_loop, llama_gqa_past_the_ring) { same_tokens(MN_MODEL_LLAMA, 80, MAX_TOKENS); }

/* The state ops compile in fp32 and bf16 (no device needed). */
Test(cuda_decode_loop, state_ops_compile) {
  mn_test_require_cuda_build();
  mn_graph *g = mn_graph_new();
  mn_node src = mn_input_u32(g, "src", MN_SHAPE(3)), row = mn_input_u32(g, "row", MN_SHAPE(1));
  mn_node ring = mn_store_row_u32(g, src, mn_input_u32(g, "ring", MN_SHAPE(64, 3)), row);
  mn_node t = mn_increment_u32(g, ring, row, 0);
  t = mn_increment_u32(g, t, mn_input_u32(g, "key", MN_SHAPE(3)), 2);
  cr_assert_eq(mn_graph_status(g), MN_OK, "%s", mn_graph_error(g));
  mn_node outs[2] = {ring, t};
  mn_set_outputs(g, outs, 2);
  mn_test_assert_compiles_precision(g, false, MN_PRECISION_F32);
  mn_test_assert_compiles_precision(g, false, MN_PRECISION_BF16);
  mn_graph_free(g);
}
