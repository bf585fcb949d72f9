/* The KV-cache generator on the CPU: greedy tokens against the argmax of a full recomputation
 * of the window at every step (GPT-2 and Llama-GQA), continuing a call against one longer
 * call, seeded sampling, top-k 1 and a tiny top-p against greedy, a batch of two prompts
 * against each alone, and the refused calls that must leave the generator as it was. */
#include <stdio.h>
#include <string.h>

#include "tests/support/generator_check.h"
#include "tests/support/mn_test.h"
#include "tests/support/tmp_dir.h"

static mn_tmp_dir dir;
static char weights[2][512];

static void setup(void) {
  dir = mn_tmp_dir_make("mn_generator");
  mn_model_family f[2] = {MN_MODEL_GPT2, MN_MODEL_LLAMA};
  for (int i = 0; i < 2; i++) {
    mn_model_config c = mn_test_gen_config(f[i]);
    snprintf(weights[i], sizeof weights[i], "%s", mn_tmp_path(&dir, i ? "llama.st" : "gpt2.st"));
    mn_test_gen_write_weights(&c, weights[i], 11 + (uint64_t)i);
  }
}
static void teardown(void) { mn_tmp_dir_remove(&dir); }

TestSuite(generator, .init = setup, .fini = teardown);

static const char *path_of(mn_model_family f) { return weights[f == MN_MODEL_LLAMA]; }

static mn_generator *make(mn_model_family f, int64_t batch, int64_t max_seq) {
  mn_model_config c = mn_test_gen_config(f);
  mn_generator_options o = mn_generator_options_default();
  o.session.backend = MN_BACKEND_CPU;
  o.batch = batch;
  o.max_seq = max_seq;
  mn_generator *g = NULL;
  cr_assert_eq(mn_generator_new(&c, path_of(f), &o, &g), MN_OK, "%s", mn_last_error());
  return g;
}

static void gen(mn_generator *g, const uint32_t *prompt, size_t np, const mn_sampling *s,
                uint32_t *out, size_t n) {
  cr_assert_eq(mn_generator_generate(g, prompt, np, s, out, n), MN_OK, "%s", mn_last_error());
}

static void greedy_matches_recompute(mn_model_family f, size_t n_new) {
  mn_model_config c = mn_test_gen_config(f);
  int64_t window = c.max_positions;
  mn_generator *g = make(f, 1, window);
  uint32_t ctx[64] = {3, 17, 5};
  size_t np = 3;
  gen(g, ctx, np, NULL, ctx + np, n_new);
  mn_test_oracle *o = mn_test_oracle_new(&c, path_of(f), window);
  size_t distinct = 0;
  for (size_t t = 0; t < n_new; t++) {
    uint32_t want = mn_test_oracle_next(o, ctx, np + t);
    cr_assert_eq(ctx[np + t], want, "token %zu: generator %u, recomputed argmax %u", t, ctx[np + t],
                 want);
    distinct += t == 0 || ctx[np + t] != ctx[np + t - 1];
  }
  cr_assert_gt(distinct, 2, "the tokens barely change: logits too flat for a test");
  mn_generator_stats st;
  cr_assert_eq(mn_generator_get_stats(g, &st), MN_OK);
  cr_assert_eq(st.cache_len, np + n_new - 1);
  cr_assert_eq(st.launches_per_token, 1u);
  cr_assert_gt(st.weight_bytes, 0u);
  mn_test_oracle_free(o);
  mn_generator_free(g);
}

Test(generator, greedy_gpt2_matches_recomputation) { greedy_matches_recompute(MN_MODEL_GPT2, 12); }
Test(generator, greedy_llama_gqa_matches_recomputation) {
  greedy_matches_recompute(MN_MODEL_LLAMA, 24);
}

static const mn_sampling warm = {.temperature = 1.5f, .top_k = 0, .top_p = 1, .seed = 42};

Test(generator, ten_then_ten_equals_twenty) {
  const uint32_t prompt[4] = {9, 2, 40, 7};
  const mn_sampling *modes[2] = {NULL, &warm};
  for (int m = 0; m < 2; m++) {
    uint32_t one[20], split[20];
    mn_generator *a = make(MN_MODEL_LLAMA, 1, 64), *b = make(MN_MODEL_LLAMA, 1, 64);
    gen(a, prompt, 4, modes[m], one, 20);
    gen(b, prompt, 4, modes[m], split, 10);
    gen(b, NULL, 0, modes[m], split + 10, 10);
    cr_assert_arr_eq(one, split, sizeof one, "mode %d: 10 + 10 differs from 20", m);
    mn_generator_free(a);
    mn_generator_free(b);
  }
}

static void sampled(const mn_sampling *s, uint32_t *out, size_t n) {
  const uint32_t prompt[2] = {1, 2};
  mn_generator *g = make(MN_MODEL_LLAMA, 1, 64);
  gen(g, prompt, 2, s, out, n);
  mn_generator_free(g);
}

Test(generator, seeds) {
  uint32_t a[30], b[30], c[30];
  mn_sampling other = warm;
  other.seed = 43;
  sampled(&warm, a, 30);
  sampled(&warm, b, 30);
  sampled(&other, c, 30);
  cr_assert_arr_eq(a, b, sizeof a, "the same seed gave other tokens");
  cr_assert(memcmp(a, c, sizeof a) != 0, "seeds 42 and 43 gave the same 30 tokens");
  uint32_t greedy[30];
  sampled(NULL, greedy, 30);
  cr_assert(memcmp(a, greedy, sizeof a) != 0, "temperature 1.5 sampled the greedy tokens");
}

Test(generator, top_k_one_and_tiny_top_p_are_greedy) {
  uint32_t greedy[20], k1[20], p0[20];
  sampled(NULL, greedy, 20);
  mn_sampling s = warm;
  s.top_k = 1;
  sampled(&s, k1, 20);
  s.top_k = 0;
  s.top_p = 1e-6f;
  sampled(&s, p0, 20);
  cr_assert_arr_eq(k1, greedy, sizeof k1, "top-k 1 differs from greedy");
  cr_assert_arr_eq(p0, greedy, sizeof p0, "top-p 1e-6 differs from greedy");
}

Test(generator, top_k_keeps_the_k_largest) {
  /* With top-k 2 every token is one of the two largest logits of its step. */
  mn_model_config c = mn_test_gen_config(MN_MODEL_LLAMA);
  uint32_t ctx[40] = {4, 8};
  mn_sampling s = warm;
  s.temperature = 5.0f;
  s.top_k = 2;
  mn_generator *g = make(MN_MODEL_LLAMA, 1, 64);
  gen(g, ctx, 2, &s, ctx + 2, 20);
  mn_generator_free(g);
  mn_test_oracle *o = mn_test_oracle_new(&c, path_of(MN_MODEL_LLAMA), 64);
  size_t second = 0;
  for (size_t t = 0; t < 20; t++) {
    uint32_t best = mn_test_oracle_next(o, ctx, 2 + t);
    second += ctx[2 + t] != best;
  }
  cr_assert_gt(second, 0u, "temperature 5 with top-k 2 never took the second token");
  mn_test_oracle_free(o);
}

Test(generator, batch_of_two_equals_each_alone) {
  mn_model_family fams[2] = {MN_MODEL_GPT2, MN_MODEL_LLAMA};
  for (int fi = 0; fi < 2; fi++) {
    const uint32_t prompts[2][3] = {{3, 17, 5}, {30, 1, 22}};
    uint32_t both[2 * 10], alone[2][10];
    mn_generator *g = make(fams[fi], 2, 16);
    gen(g, &prompts[0][0], 3, NULL, both, 10);
    mn_generator_free(g);
    for (int b = 0; b < 2; b++) {
      g = make(fams[fi], 1, 16);
      gen(g, prompts[b], 3, NULL, alone[b], 10);
      mn_generator_free(g);
      cr_assert_arr_eq(both + b * 10, alone[b], sizeof alone[b], "family %d sequence %d", fi, b);
    }
    cr_assert(memcmp(alone[0], alone[1], sizeof alone[0]) != 0, "both prompts gave one text");
  }
}

Test(generator, refused_calls_change_nothing) {
  const uint32_t prompt[3] = {5, 6, 7}, bad[2] = {5, 61};
  uint32_t want[8], got[8], junk[64];
  mn_generator *ref = make(MN_MODEL_LLAMA, 1, 12), *g = make(MN_MODEL_LLAMA, 1, 12);
  gen(ref, prompt, 3, &warm, want, 4);
  gen(ref, NULL, 0, &warm, want + 4, 4);

  gen(g, prompt, 3, &warm, got, 4);
  cr_assert_eq(mn_generator_generate(g, bad, 2, &warm, junk, 2), MN_ERR_INVALID_ARGUMENT);
  cr_assert(strstr(mn_last_error(), "past the vocabulary of 61"), "%s", mn_last_error());
  /* 6 rows are cached (3 + 4 - 1), one token is pending: 6 more would need 12 + 1 rows. */
  cr_assert_eq(mn_generator_generate(g, NULL, 0, &warm, junk, 7), MN_ERR_INVALID_ARGUMENT);
  cr_assert(strstr(mn_last_error(), "would pass max_seq 12"), "%s", mn_last_error());
  mn_sampling bad_p = warm;
  bad_p.top_p = 0;
  cr_assert_eq(mn_generator_generate(g, NULL, 0, &bad_p, junk, 1), MN_ERR_INVALID_ARGUMENT);
  gen(g, NULL, 0, &warm, got + 4, 4);
  cr_assert_arr_eq(got, want, sizeof want, "a refused call changed the generator");
  /* Exactly up to max_seq is allowed: 8 + 4 - 0 launches fill rows 10, 11 and 12 is over. */
  cr_assert_eq(mn_generator_generate(g, NULL, 0, &warm, junk, 2), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_generator_generate(g, NULL, 0, &warm, junk, 1), MN_ERR_INVALID_ARGUMENT);
  cr_assert_eq(mn_generator_generate(g, NULL, 0, NULL, junk, 1), MN_ERR_INVALID_ARGUMENT);
  cr_assert_eq(mn_generator_reset(g), MN_OK);
  cr_assert_eq(mn_generator_generate(g, NULL, 0, NULL, junk, 1), MN_ERR_INVALID_ARGUMENT);
  cr_assert(strstr(mn_last_error(), "nothing to continue from"), "%s", mn_last_error());
  gen(g, prompt, 3, &warm, got, 4);
  cr_assert_arr_eq(got, want, 4 * sizeof *got, "reset does not start over");
  mn_generator_free(ref);
  mn_generator_free(g);
}

Test(generator, options_refused) {
  mn_model_config c = mn_test_gen_config(MN_MODEL_LLAMA);
  mn_generator_options o = mn_generator_options_default();
  o.session.backend = MN_BACKEND_CPU;
  mn_generator *g = (mn_generator *)&o;
  o.quant = MN_QUANT_Q4_0; /* hidden_size 48 is no whole number of 32-weight blocks */
  cr_assert_eq(mn_generator_new(&c, path_of(MN_MODEL_LLAMA), &o, &g), MN_ERR_INVALID_ARGUMENT);
  cr_assert(strstr(mn_last_error(), "multiple of the q4_0 block of 32"), "%s", mn_last_error());
  cr_assert_null(g);
  o.quant = MN_QUANT_NONE;
  o.batch = 0;
  cr_assert_eq(mn_generator_new(&c, path_of(MN_MODEL_LLAMA), &o, &g), MN_ERR_INVALID_ARGUMENT);
  o.batch = 1;
  mn_model_config gpt = mn_test_gen_config(MN_MODEL_GPT2);
  cr_assert_neq(mn_generator_new(&gpt, path_of(MN_MODEL_LLAMA), &o, &g), MN_OK,
                "Llama weights loaded as GPT-2");
  cr_assert_null(g);
}
