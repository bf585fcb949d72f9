/* meganeura bench: times training steps of a model config on the selected backend. */
#include "tools/cli.h"

#include <stdlib.h>
#include <string.h>

static const char *const CMD = "meganeura bench";
static const char USAGE[] =
    "usage: meganeura bench --config CONFIG.json --batch B --seq T [--steps N]\n"
    "         [--precision f32|tf32|bf16|f16]\n"
    "Times N (default 10) AdamW training steps on random tokens after 2 warm-up steps and\n"
    "prints the median step time and tokens/s. MN_BACKEND=cpu|cuda picks the backend.\n"
    "--precision defaults to bf16 on a CUDA device of compute capability 8.0 or newer, else\n"
    "f32.\n";

enum { O_CONFIG, O_BATCH, O_SEQ, O_STEPS, O_PRECISION, O_COUNT };

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int cli_bench(int argc, char **argv) {
  cli_opt o[O_COUNT] = {
      [O_CONFIG] = {"--config", 1, NULL, 0},
      [O_BATCH] = {"--batch", 1, NULL, 0},
      [O_SEQ] = {"--seq", 1, NULL, 0},
      [O_STEPS] = {"--steps", 1, NULL, 0},
      [O_PRECISION] = {"--precision", 1, NULL, 0},
  };
  int rc = cli_parse(CMD, argc, argv, o, O_COUNT, USAGE);
  if (rc) return rc == CLI_HELP ? CLI_OK : rc;
  long batch = 0, seq = 0, steps = 10;
  mn_session_options options = mn_session_options_default();
  const char *precision = NULL;
  if (cli_precision(CMD, &o[O_PRECISION], &options, &precision) ||
      cli_pos_long(CMD, &o[O_BATCH], &batch) || cli_pos_long(CMD, &o[O_SEQ], &seq) ||
      cli_pos_long(CMD, &o[O_STEPS], &steps) || cli_require(CMD, &o[O_CONFIG]) ||
      cli_require(CMD, &o[O_BATCH]) || cli_require(CMD, &o[O_SEQ]))
    return CLI_USAGE;
  mn_model_config cfg;
  if (cli_load_config(CMD, o[O_CONFIG].value, &cfg)) return CLI_FAIL;
  mn_graph *g = NULL;
  mn_session *s = NULL;
  size_t bt = (size_t)(batch * seq);
  uint32_t *ids = malloc(bt * sizeof *ids);
  double *ms = malloc((size_t)steps * sizeof *ms);
  if (!ids || !ms) {
    fprintf(stderr, "%s: out of memory\n", CMD);
    rc = CLI_FAIL;
  } else if (mn_model_build(&cfg, batch, seq, NULL, &g) != MN_OK) {
    rc = cli_lib_fail(CMD, "cannot build the model");
  } else if (mn_build_session(g, &options, &s) != MN_OK) {
    rc = cli_lib_fail(CMD, "cannot build the session");
  } else if (mn_model_init_parameters(&cfg, g, s, 1) != MN_OK ||
             mn_session_set_adamw(s, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.01f) != MN_OK) {
    rc = cli_lib_fail(CMD, "cannot initialize the parameters");
  }
  uint64_t rng = 42;
  for (size_t i = 0; !rc && i < bt; i++)
    ids[i] = (uint32_t)(cli_rand(&rng) % (uint64_t)cfg.vocab_size);
  if (!rc && (mn_session_set_input_u32(s, "input_ids", ids, bt) != MN_OK ||
              mn_session_set_input_u32(s, "labels", ids, bt) != MN_OK))
    rc = cli_lib_fail(CMD, "cannot set the inputs");
  for (long i = -2; !rc && i < steps; i++) {
    double t0 = cli_now();
    if (mn_session_step(s) != MN_OK || mn_session_wait(s) != MN_OK)
      rc = cli_lib_fail(CMD, "training step failed");
    else {
      (void)mn_session_read_loss(s);
      if (i >= 0) ms[i] = (cli_now() - t0) * 1e3;
    }
  }
  if (!rc) {
    qsort(ms, (size_t)steps, sizeof *ms, cmp_double);
    double med = steps % 2 ? ms[steps / 2] : 0.5 * (ms[steps / 2 - 1] + ms[steps / 2]);
    mn_session_stats st;
    const char *be = mn_session_get_stats(s, &st) == MN_OK ? st.backend : "?";
    printf("backend %s, precision %s, batch %ld, seq %ld, %ld steps: median %.3f ms/step, %.0f "
           "tokens/s\n",
           be, precision, batch, seq, steps, med, (double)bt / (med * 1e-3));
  }
  mn_session_free(s);
  mn_graph_free(g);
  free(ids);
  free(ms);
  return rc;
}
