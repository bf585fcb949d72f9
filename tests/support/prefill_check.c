#include "tests/support/prefill_check.h"

#include "models/prefill_mode.h"
#include "tests/support/generator_check.h"
#include "tests/support/mn_test.h"

mn_model_config mn_test_prefill_config(mn_model_family f) {
  mn_model_config c = mn_test_gen_config(f);
  c.max_positions = 96;
  return c;
}

void mn_test_prefill_tokens(const mn_model_config *c, const char *path, mn_backend be,
                            mn_precision prec, int64_t batch, int64_t max_seq, size_t n_prompt,
                            size_t n_new, const mn_sampling *s, bool token_path, uint32_t *out) {
  mn_generator_options o = mn_generator_options_default();
  o.session.backend = be;
  o.session.precision = prec;
  o.batch = batch;
  o.max_seq = max_seq;
  mn_generator *g = NULL;
  cr_assert_eq(mn_generator_new(c, path, &o, &g), MN_OK, "%s", mn_last_error());
  cr_assert(mn_generator_set_prefill_mode(g, token_path ? MN_PREFILL_TOKENS : MN_PREFILL_CHUNKS),
            "the generator has no prefill graph");
  uint32_t prompt[2 * 96], first[2 * 96], more[2 * 4];
  cr_assert((size_t)batch * n_prompt <= sizeof prompt / sizeof *prompt && n_new <= 96);
  for (size_t i = 0; i < (size_t)batch * n_prompt; i++)
    prompt[i] = (uint32_t)((i * 37 + 11) % (size_t)c->vocab_size);
  cr_assert_eq(mn_generator_generate(g, prompt, n_prompt, s, first, n_new), MN_OK, "%s",
               mn_last_error());
  /* The second call's pending token goes in first, then one more prompt token per sequence. */
  uint32_t extra[2] = {7, 9};
  cr_assert_eq(mn_generator_generate(g, extra, 1, s, more, 4), MN_OK, "%s", mn_last_error());
  mn_generator_stats st;
  cr_assert_eq(mn_generator_get_stats(g, &st), MN_OK);
  cr_assert_eq(st.cache_len, n_prompt + n_new + 4, "cache_len %zu", st.cache_len);
  for (int64_t b = 0; b < batch; b++)
    for (size_t t = 0; t < n_new + 4; t++)
      out[(size_t)b * (n_new + 4) + t] =
          t < n_new ? first[(size_t)b * n_new + t] : more[(size_t)b * 4 + t - n_new];
  mn_generator_free(g);
}
