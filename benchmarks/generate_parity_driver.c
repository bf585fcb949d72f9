/* The C half of scripts/hf_generate_parity.py: greedy tokens of mn_generator from a
 * transformers checkpoint (DIR/config.json and DIR/model.safetensors, as save_pretrained writes
 * them), in fp32 on the backend MN_BACKEND names (cpu, cuda).
 *
 * usage: bench_generate_parity_driver --model DIR --prompt ID,ID,... --new N
 * Prints "backend B" and then "tokens ID ID ..." (the N new ids) on stdout. Exit status 0 on
 * success; errors go to stderr with the library's message. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "benchmarks/driver_util.h"
#include "meganeura.h"

#define PROG       "generate_parity_driver"
#define MAX_PROMPT 1024

static void usage(void) {
  fprintf(stderr, "usage: bench_generate_parity_driver --model DIR --prompt ID,ID,... --new N\n");
  exit(2);
}

int main(int argc, char **argv) {
  const char *model = NULL, *prompt_arg = NULL;
  long n_new = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--model"))
      model = argv[i + 1];
    else if (!strcmp(argv[i], "--prompt"))
      prompt_arg = argv[i + 1];
    else if (!strcmp(argv[i], "--new"))
      n_new = atol(argv[i + 1]);
    else
      usage();
  }
  if (argc % 2 == 0 || !model || !prompt_arg || n_new < 1) usage();
  uint32_t prompt[MAX_PROMPT];
  size_t n_prompt = 0;
  for (const char *p = prompt_arg; *p;) {
    char *end;
    unsigned long id = strtoul(p, &end, 10);
    if (end == p || n_prompt == MAX_PROMPT || (*end && *end != ',')) usage();
    prompt[n_prompt++] = (uint32_t)id;
    p = *end ? end + 1 : end;
  }
  char path[4096];
  mn_model_config c;
  drv_expect_ok(
      PROG, mn_model_config_load(drv_join_path(PROG, path, sizeof path, model, "config.json"), &c),
      "config.json");
  mn_generator_options o = mn_generator_options_default();
  o.max_seq = (int64_t)n_prompt + n_new;
  mn_generator *g = NULL;
  drv_expect_ok(PROG,
                mn_generator_new(
                    &c, drv_join_path(PROG, path, sizeof path, model, "model.safetensors"), &o, &g),
                "mn_generator_new");
  uint32_t *out = malloc((size_t)n_new * sizeof *out);
  if (!out) {
    fprintf(stderr, "%s: out of memory\n", PROG);
    return 1;
  }
  drv_expect_ok(PROG, mn_generator_generate(g, prompt, n_prompt, NULL, out, (size_t)n_new),
                "generate");
  const char *backend = getenv("MN_BACKEND");
  printf("backend %s\ntokens", backend && *backend ? backend : "auto");
  for (long i = 0; i < n_new; i++)
    printf(" %u", out[i]);
  printf("\n");
  free(out);
  mn_generator_free(g);
  return 0;
}
