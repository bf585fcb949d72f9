/* The generator's decode speed on the default backend: a model config with random weights
 * (seeded, written to a temporary safetensors file), a 4-token prompt, then N new tokens at
 * batch 1, greedy and seeded sampling; each timed call follows an untimed one of the same
 * length (kernels compiled, graph captured). Prints the generator's ms_per_token.
 * Usage: decode_loop CONFIG.json [new_tokens] [weights_path] */
#include <stdio.h>
#include <stdlib.h>

#include "benchmarks/driver_util.h"
#include "meganeura.h"

static int fail(const char *what) {
  fprintf(stderr, "decode_loop: %s: %s\n", what, mn_last_error());
  return 1;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: decode_loop CONFIG.json [new_tokens] [weights_path]\n");
    return 2;
  }
  size_t n = argc > 2 ? (size_t)atoll(argv[2]) : 256;
  const char *path = argc > 3 ? argv[3] : "/tmp/mn_decode_loop.safetensors";
  mn_model_config c;
  if (mn_model_config_load(argv[1], &c) != MN_OK) return fail("config");
  c.initializer_range = 0.3f; /* logits far from flat: sampling draws from a real spread */
  if (drv_write_random_weights(&c, path, 3) != MN_OK) return fail("weights");
  mn_generator_options o = mn_generator_options_default();
  o.max_seq = (int64_t)n + 8;
  mn_generator *g = NULL;
  if (mn_generator_new(&c, path, &o, &g) != MN_OK) return fail("generator");
  uint32_t *out = malloc(n * sizeof *out);
  const uint32_t prompt[4] = {1, 2, 3, 4};
  const mn_sampling seeded = {.temperature = 0.8f, .top_k = 40, .top_p = 0.95f, .seed = 1};
  const mn_sampling *modes[2] = {NULL, &seeded};
  int rc = 0;
  for (int m = 0; m < 2 && rc == 0; m++)
    for (int rep = 0; rep < 2 && rc == 0; rep++) {
      mn_generator_reset(g);
      if (mn_generator_generate(g, prompt, 4, modes[m], out, n) != MN_OK) {
        rc = fail("generate");
        break;
      }
      mn_generator_stats st;
      mn_generator_get_stats(g, &st);
      if (rep == 1)
        printf("decode_loop %s: batch 1, %zu new tokens, %s: %.4f ms/token (%.0f tokens/s), "
               "prefill %.2f ms\n",
               argv[1], n, m ? "seeded" : "greedy", st.ms_per_token, 1e3 / st.ms_per_token,
               st.prefill_ms);
    }
  free(out);
  mn_generator_free(g);
  remove(path);
  return rc;
}
