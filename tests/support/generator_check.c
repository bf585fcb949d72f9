#include "tests/support/generator_check.h"

#include <stdlib.h>
#include <string.h>

#include "tests/support/mn_test.h"
#include "tests/support/models.h"

mn_model_config mn_test_gen_config(mn_model_family f) {
  mn_model_config c = f == MN_MODEL_GPT2 ? mn_test_tiny_gpt2() : mn_test_tiny_llama();
  c.initializer_range = 0.3f;
  return c;
}

struct mn_test_oracle {
  mn_graph *g;
  mn_session *s;
  int64_t window, vocab;
  uint32_t *ids, *labels;
  float *logits;
};

static mn_test_oracle *oracle_of(const mn_model_config *c, int64_t window) {
  mn_test_oracle *o = calloc(1, sizeof *o);
  cr_assert(o);
  o->window = window;
  o->vocab = c->vocab_size;
  cr_assert_eq(mn_model_build(c, 1, window, NULL, &o->g), MN_OK, "%s", mn_last_error());
  mn_session_options so = mn_session_options_default();
  so.backend = MN_BACKEND_CPU;
  cr_assert_eq(mn_build_inference_session(o->g, &so, &o->s), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_model_prepare_session(o->g, o->s), MN_OK, "%s", mn_last_error());
  o->ids = calloc((size_t)window, sizeof *o->ids);
  o->labels = calloc((size_t)window, sizeof *o->labels);
  o->logits = malloc((size_t)(window * c->vocab_size) * sizeof *o->logits);
  cr_assert(o->ids && o->labels && o->logits);
  return o;
}

void mn_test_gen_write_weights(const mn_model_config *c, const char *path, uint64_t seed) {
  mn_test_oracle *o = oracle_of(c, 1);
  cr_assert_eq(mn_model_init_parameters(c, o->g, o->s, seed), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_save_safetensors(o->s, path), MN_OK, "%s", mn_last_error());
  mn_test_oracle_free(o);
}

mn_test_oracle *mn_test_oracle_new(const mn_model_config *c, const char *path, int64_t window) {
  mn_test_oracle *o = oracle_of(c, window);
  cr_assert_eq(mn_session_load_safetensors(o->s, path, true), MN_OK, "%s", mn_last_error());
  return o;
}

uint32_t mn_test_oracle_next(mn_test_oracle *o, const uint32_t *ids, size_t n) {
  cr_assert(n >= 1 && (int64_t)n <= o->window, "window %lld, %zu ids", (long long)o->window, n);
  memset(o->ids, 0, (size_t)o->window * sizeof *o->ids);
  memcpy(o->ids, ids, n * sizeof *ids);
  size_t w = (size_t)o->window, v = (size_t)o->vocab;
  cr_assert_eq(mn_session_set_input_u32(o->s, "input_ids", o->ids, w), MN_OK);
  cr_assert_eq(mn_session_set_input_u32(o->s, "labels", o->labels, w), MN_OK);
  cr_assert_eq(mn_session_step(o->s), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_wait(o->s), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_read_output_by_index(o->s, 1, o->logits, w * v), MN_OK);
  const float *row = o->logits + (n - 1) * v;
  size_t best = 0;
  for (size_t i = 1; i < v; i++)
    if (row[i] > row[best]) best = i;
  return (uint32_t)best;
}

void mn_test_oracle_free(mn_test_oracle *o) {
  if (!o) return;
  mn_session_free(o->s);
  mn_graph_free(o->g);
  free(o->ids);
  free(o->labels);
  free(o->logits);
  free(o);
}
