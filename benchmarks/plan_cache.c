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

#include "../io/plan_cache.h"
#include "session.h"

enum { LAYERS = 12, D = 64, HEADS = 4, FF = 256, VOCAB = 512, BATCH = 2, SEQ = 32 };

static mn_node linear(mn_graph *g, mn_node x, int layer, const char *what, int64_t in,
                      int64_t out) {
  char w[96], b[96];
  snprintf(w, sizeof w, "transformer.h.%d.%s.weight", layer, what);
  snprintf(b, sizeof b, "transformer.h.%d.%s.bias", layer, what);
  return mn_bias_add(g, mn_matmul(g, x, mn_parameter(g, w, MN_SHAPE(in, out))),
                     mn_parameter(g, b, MN_SHAPE(out)));
}

static mn_node norm(mn_graph *g, mn_node x, int layer, const char *what) {
  char w[96], b[96];
  snprintf(w, sizeof w, "transformer.h.%d.%s.weight", layer, what);
  snprintf(b, sizeof b, "transformer.h.%d.%s.bias", layer, what);
  return mn_layer_norm(g, x, mn_parameter(g, w, MN_SHAPE(D)), mn_parameter(g, b, MN_SHAPE(D)),
                       1e-5f);
}

static mn_graph *gpt(void) {
  mn_graph *g = mn_graph_new();
  mn_node tokens = mn_input_u32(g, "tokens", MN_SHAPE(BATCH, SEQ));
  mn_node positions = mn_input_u32(g, "positions", MN_SHAPE(BATCH, SEQ));
  mn_node labels = mn_input_u32(g, "labels", MN_SHAPE(BATCH, SEQ));
  mn_node wte = mn_parameter(g, "transformer.wte.weight", MN_SHAPE(VOCAB, D));
  mn_node wpe = mn_parameter(g, "transformer.wpe.weight", MN_SHAPE(SEQ, D));
  mn_node h = mn_add(g, mn_embedding(g, tokens, wte), mn_embedding(g, positions, wpe));
  for (int l = 0; l < LAYERS; l++) {
    mn_node a = norm(g, h, l, "ln_1");
    mn_node q = linear(g, a, l, "attn.q", D, D), k = linear(g, a, l, "attn.k", D, D);
    mn_node v = linear(g, a, l, "attn.v", D, D);
    mn_node att = mn_causal_attention(g, q, k, v, HEADS, HEADS, D / HEADS);
    h = mn_add(g, h, linear(g, att, l, "attn.c_proj", D, D));
    mn_node m = mn_gelu(g, linear(g, norm(g, h, l, "ln_2"), l, "mlp.c_fc", D, FF));
    h = mn_add(g, h, linear(g, m, l, "mlp.c_proj", FF, D));
  }
  mn_node ln_f = mn_layer_norm(g, h, mn_parameter(g, "transformer.ln_f.weight", MN_SHAPE(D)),
                               mn_parameter(g, "transformer.ln_f.bias", MN_SHAPE(D)), 1e-5f);
  mn_node loss = mn_sparse_cross_entropy_loss(g, mn_matmul_bt(g, ln_f, wte), labels);
  mn_set_outputs(g, &loss, 1);
  return g;
}

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

typedef enum mode { UNCACHED, COLD, WARM, LOWER, READ, NUM_MODES } mode;

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

static void fail(const char *what) {
  fprintf(stderr, "%s failed: %s\n", what, mn_last_error());
  exit(1);
}

static double run_ms(const mn_graph *g, const char *path, mode m) {
  mn_session_options o = mn_session_options_default();
  o.backend = MN_BACKEND_CPU;
  if (m == COLD) unlink(path);
  mn_session *s = NULL;
  mn_plan *plan = NULL;
  double t0 = now_ms();
  if (m == LOWER) {
    if (mn_lower_training("bench", g, &o, &plan) != MN_OK) fail("lowering");
  } else if (m == READ) {
    size_t len = 0;
    char *text = slurp(path, &len);
    if (!text || mn_plan_cache_parse(text, len, g, &o, MN_PLAN_CACHE_VERIFY_CHECKSUM, &plan, NULL,
                                     0) != MN_OK)
      fail("reading the cache");
    free(text);
  } else if ((m == UNCACHED ? mn_build_session(g, &o, &s)
                            : mn_build_session_cached(g, path, &o, &s)) != MN_OK) {
    fail("build");
  }
  double t1 = now_ms();
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
    snprintf(path, sizeof path, "/tmp/mn_bench_plan_cache_%ld.json", (long)getpid());
  mn_graph *g = gpt();
  if (mn_graph_status(g) != MN_OK) {
    fprintf(stderr, "graph: %s\n", mn_graph_error(g));
    return 1;
  }
  double *t[NUM_MODES];
  for (int m = 0; m < NUM_MODES; m++)
    t[m] = malloc((size_t)repeats * sizeof *t[m]);
  for (int r = 0; r < repeats; r++)
    for (int m = 0; m < NUM_MODES; m++) /* COLD writes the file that WARM and READ read */
      t[m][r] = run_ms(g, path, (mode)m);
  size_t bytes = 0;
  free(slurp(path, &bytes));
  double med[NUM_MODES];
  for (int m = 0; m < NUM_MODES; m++)
    med[m] = median(t[m], repeats);
  printf("plan cache, gpt-style %d layers (d %d, %zu user nodes), cpu backend, median of %d:\n"
         "  lowering %.2f ms, reading the cache %.2f ms (%zu bytes)\n"
         "  session build: mn_build_session %.2f ms, cached cold %.2f ms, cached warm %.2f ms\n",
         LAYERS, D, mn_graph_num_nodes(g), repeats, med[LOWER], med[READ], bytes, med[UNCACHED],
         med[COLD], med[WARM]);
  unlink(path);
  for (int m = 0; m < NUM_MODES; m++)
    free(t[m]);
  mn_graph_free(g);
  return 0;
}
