/* The generator's prefill: a prompt written into the KV caches in chunks of the prefill graph
 * (models/generator.c) against one decode launch per token, on random weights of a config.
 * Reports the generator's prefill_ms (median of the repeats, after one warm-up) for each path.
 * Usage: prefill CONFIG.json [cpu|cuda] [prompt tokens] [repeats] [weights file to write] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "benchmarks/bench_util.h"
#include "benchmarks/driver_util.h"
#include "models/prefill_mode.h"

static int fail(const char *what) {
  fprintf(stderr, "prefill: %s: %s\n", what, mn_last_error());
  return 1;
}

/* Median prefill_ms of `repeats` calls of n_prompt tokens, each from an empty cache. */
static mn_status time_path(mn_generator *gen, bool tokens, const uint32_t *prompt, size_t n,
                           int repeats, double *ms) {
  mn_generator_set_prefill_mode(gen, tokens ? MN_PREFILL_TOKENS : MN_PREFILL_AUTO);
  double t[64];
  uint32_t next = 0;
  for (int r = -1; r < repeats; r++) {
    mn_status st = mn_generator_reset(gen);
    if (st == MN_OK) st = mn_generator_generate(gen, prompt, n, NULL, &next, 1);
    mn_generator_stats stats;
    if (st == MN_OK) st = mn_generator_get_stats(gen, &stats);
    if (st != MN_OK) return st;
    if (r >= 0) t[r] = stats.prefill_ms;
  }
  qsort(t, (size_t)repeats, sizeof *t, bench_cmp);
  *ms = t[repeats / 2];
  return MN_OK;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: prefill CONFIG.json [cpu|cuda] [prompt] [repeats] [weights]\n");
    return 2;
  }
  bool cuda = argc > 2 && strcmp(argv[2], "cuda") == 0;
  size_t n = argc > 3 ? (size_t)atoi(argv[3]) : 128;
  int repeats = argc > 4 ? atoi(argv[4]) : 3;
  const char *path = argc > 5 ? argv[5] : "/tmp/mn_prefill_bench.safetensors";
  if (n < 1 || n > 4096 || repeats < 1 || repeats > 64) {
    fprintf(stderr, "prefill: prompt 1..4096, repeats 1..64\n");
    return 2;
  }
  mn_model_config c;
  if (mn_model_config_load(argv[1], &c) != MN_OK) return fail("config");
  if (drv_write_random_weights(&c, path, 7) != MN_OK) return fail("weights");
  mn_generator_options o = mn_generator_options_default();
  o.session.backend = cuda ? MN_BACKEND_CUDA : MN_BACKEND_CPU;
  o.max_seq = (int64_t)n + 64;
  mn_generator *gen = NULL;
  if (mn_generator_new(&c, path, &o, &gen) != MN_OK) return fail("generator");
  uint32_t *prompt = malloc(n * sizeof *prompt);
  if (!prompt) return 1;
  for (size_t i = 0; i < n; i++)
    prompt[i] = (uint32_t)((i * 7919 + 13) % (size_t)c.vocab_size);
  double chunked = 0, tokens = 0;
  if (time_path(gen, false, prompt, n, repeats, &chunked) != MN_OK) return fail("chunked");
  if (time_path(gen, true, prompt, n, repeats, &tokens) != MN_OK) return fail("token by token");
  printf("prefill of %zu tokens (%s, median of %d): chunks %.1f ms, token by token %.1f ms "
         "(%.1fx)\n",
         n, cuda ? "cuda" : "cpu", repeats, chunked, tokens, tokens / chunked);
  free(prompt);
  mn_generator_free(gen);
  remove(path);
  return 0;
}
