/* What the plan cache saves on a GPT-2-style graph (12 layers): lowering (optimize, autodiff,
 * toposort, plan) against reading the cache (file, parse, validation, plan), and the whole
 * session build with mn_build_session, with mn_build_session_cached on a cold cache (lowering
 * plus writing the file) and on a warm one. CPU backend at a small width, so device setup
 * does not hide the difference. Medians of several runs.
 * Usage: plan_cache [repeats] [cache path] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "benchmarks/bench_util.h"
#include "benchmarks/gpt_graph.h"
#include "io/plan_cache.h"
#include "session/session.h"

/* GPT-2 small's depth (12 layers) at the small width the header speaks of. */
static gpt_config small_gpt_config(void) {
  gpt_config c = gpt2_small(2, 32);
  c.heads = 4;
  c.d_model = 64;
  c.d_ff = 256;
  c.vocab = 512;
  return c;
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, bench_cmp);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

typedef enum cache_mode { UNCACHED, COLD, WARM, LOWER, READ, NUM_MODES } cache_mode;

static char *slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = malloc((size_t)n + 1);
  *len = buf ? fread(buf, 1, (size_t)n, f) : 0;
  fclose(f);
  return buf;
}

static double run_ms(const mn_graph *g, const char *path, cache_mode m) {
  mn_session_options o = mn_session_options_default();
  o.backend = MN_BACKEND_CPU;
  if (m == COLD) unlink(path);
  mn_session *s = NULL;
  mn_plan *plan = NULL;
  double t0 = bench_now_ms();
  if (m == LOWER) {
    bench_check(mn_lower_training("bench", g, &o, &plan), "lowering");
  } else if (m == READ) {
    size_t len = 0;
    char *text = slurp(path, &len);
    if (!text) {
      fprintf(stderr, "cannot read %s\n", path);
      exit(1);
    }
    bench_check(
        mn_plan_cache_parse(text, len, g, &o, MN_PLAN_CACHE_VERIFY_CHECKSUM, &plan, NULL, 0),
        "reading the cache");
    free(text);
  } else {
    bench_check(m == UNCACHED ? mn_build_session(g, &o, &s)
                              : mn_build_session_cached(g, path, &o, &s),
                "build");
  }
  double t1 = bench_now_ms();
  mn_plan_free(plan);
  mn_session_free(s);
  return t1 - t0;
}

int main(int argc, char **argv) {
  int repeats = argc > 1 ? atoi(argv[1]) : 7;
  if (repeats < 1 || repeats > 1000) repeats = 7;
  char path[256];
  if (argc > 2)
    snprintf(path, sizeof path, "%s", argv[2]);
  else
    snprintf(path, sizeof path, "/tmp/mn_bench_cached_build_%ld.json", (long)getpid());
  const gpt_config c = small_gpt_config();
  mn_graph *g = gpt_graph(&c);
  if (mn_graph_status(g) != MN_OK) {
    fprintf(stderr, "graph: %s\n", mn_graph_error(g));
    return 1;
  }
  double *t[NUM_MODES];
  for (int m = 0; m < NUM_MODES; m++)
    t[m] = malloc((size_t)repeats * sizeof *t[m]);
  for (int r = 0; r < repeats; r++)
    for (int m = 0; m < NUM_MODES; m++) /* COLD writes the file that WARM and READ read */
      t[m][r] = run_ms(g, path, (cache_mode)m);
  size_t bytes = 0;
  free(slurp(path, &bytes));
  double med[NUM_MODES];
  for (int m = 0; m < NUM_MODES; m++)
    med[m] = median(t[m], repeats);
  printf("plan cache, gpt-style %d layers (d %d, %zu user nodes), cpu backend, median of %d:\n"
         "  lowering %.2f ms, reading the cache %.2f ms (%zu bytes)\n"
         "  session build: mn_build_session %.2f ms, cached cold %.2f ms, cached warm %.2f ms\n",
         c.layers, (int)c.d_model, mn_graph_num_nodes(g), repeats, med[LOWER], med[READ], bytes,
         med[UNCACHED], med[COLD], med[WARM]);
  unlink(path);
  for (int m = 0; m < NUM_MODES; m++)
    free(t[m]);
  mn_graph_free(g);
  return 0;
}
