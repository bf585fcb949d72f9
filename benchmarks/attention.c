/* Causal attention alone, forward and backward, at the shapes of the language-model steps:
 * GPT-2 124M (B 16, T 1024, 12 heads of 64) and SmolLM2-135M (B 8, T 1024, 9 query heads over
 * 3 kv heads of 64). A training graph: q, k and v parameters, each scaled (q by 0.5, k by 2,
 * which leaves q.k as it was; v by 2) so that the attention reads an op's output in the
 * session's 16-bit storage, as it reads the projections' outputs in the models (a scale by 1
 * would be removed by the optimizer, leaving fp32 leaves), mn_causal_attention, and an MSE loss
 * whose gradient makes the backward ops. The per-op medians of mn_cuda_profile_step give one ATTN
 * line per attention op with its milliseconds and TFLOP/s; benchmarks/torch_attention.py times
 * PyTorch's flash attention on the same shapes.
 *
 * FLOPs: one product over the causal triangle is B * H * T^2 * d multiply-adds counted as two
 * (half of the 2 B H T^2 d of the full square). The forward makes two (scores, P V); the dQ op
 * three (scores, dP, dS K) and the dK / dV op four (scores, dP, P^T dY, dS^T Q).
 *
 * usage: bench_attention [gpt2|smollm2|all] [--precision bf16|f16] [--reps N] */
#include <stdint.h>

#include "benchmarks/bench_util.h"

typedef struct attn_shape {
  const char *name;
  int64_t batch, seq;
  int heads, kv_heads, head_dim;
} attn_shape;

static const attn_shape shapes[] = {
    {"gpt2", 16, 1024, 12, 12, 64},
    {"smollm2", 8, 1024, 9, 3, 64},
};

static mn_graph *build(const attn_shape *a) {
  mn_graph *g = mn_graph_new();
  int64_t qw = (int64_t)a->heads * a->head_dim, kvw = (int64_t)a->kv_heads * a->head_dim;
  mn_node q = mn_scale(g, mn_parameter(g, "q", MN_SHAPE(a->batch, a->seq, qw)), 0.5f);
  mn_node k = mn_scale(g, mn_parameter(g, "k", MN_SHAPE(a->batch, a->seq, kvw)), 2.0f);
  mn_node v = mn_scale(g, mn_parameter(g, "v", MN_SHAPE(a->batch, a->seq, kvw)), 2.0f);
  mn_node y = mn_causal_attention(g, q, k, v, a->heads, a->kv_heads, a->head_dim);
  mn_node target = mn_input(g, "target", MN_SHAPE(a->batch, a->seq, qw));
  mn_node loss = mn_mse_loss(g, y, target);
  mn_set_outputs(g, &loss, 1);
  bench_check(mn_graph_status(g), "graph");
  return g;
}

static void set_random(mn_session *s, const char *name, size_t n, uint64_t *rng, bool parameter) {
  float *x = malloc(n * sizeof *x);
  if (!x) bench_check(MN_ERR_OUT_OF_MEMORY, "malloc");
  for (size_t i = 0; i < n; i++) {
    *rng = *rng * 6364136223846793005ULL + 1442695040888963407ULL;
    x[i] = (float)((double)(*rng >> 40) / (double)(1ULL << 24) * 3.0 - 1.5);
  }
  bench_check(parameter ? mn_session_set_parameter(s, name, x, n)
                        : mn_session_set_input(s, name, x, n),
              name);
  free(x);
}

#ifdef MN_WITH_CUDA
/* Products over the causal triangle that each attention op makes (see the top). */
static int products_of(const char *op) {
  if (strstr(op, "grad_kv")) return 4;
  if (strstr(op, "grad_q")) return 3;
  if (strstr(op, "grad_k")) return 3;
  return 2;
}
#endif

static void run(const attn_shape *a, const mn_session_options *o, const char *prec, int reps) {
  mn_graph *g = build(a);
  mn_session *s = NULL;
  bench_check(mn_build_session(g, o, &s), "build");
  size_t nq = (size_t)(a->batch * a->seq * a->heads * a->head_dim);
  size_t nkv = (size_t)(a->batch * a->seq * a->kv_heads * a->head_dim);
  uint64_t rng = 7;
  set_random(s, "q", nq, &rng, true);
  set_random(s, "k", nkv, &rng, true);
  set_random(s, "v", nkv, &rng, true);
  set_random(s, "target", nq, &rng, false);
  double step_ms = bench_steps_ms(s, 3, reps, 1);
  printf("BENCH attention_%s_%s step_ms=%.3f\n", a->name, prec, step_ms);
#ifdef MN_WITH_CUDA
  FILE *f = tmpfile();
  if (!f) bench_check(MN_ERR_OUT_OF_MEMORY, "tmpfile");
  bench_check(mn_cuda_profile_step(s, reps, f), "profile");
  rewind(f);
  char line[512];
  double unit = (double)a->batch * a->heads * (double)a->seq * (double)a->seq * a->head_dim;
  while (fgets(line, sizeof line, f)) {
    char op[64];
    size_t commands = 0;
    double ms = 0;
    if (sscanf(line, "PROFILE %63s %zu %lf", op, &commands, &ms) != 3) continue;
    if (!strstr(op, "attention")) continue;
    double tflops = products_of(op) * unit / (ms * 1e-3) / 1e12;
    printf("ATTN %s %s B=%lld T=%lld H=%d KVH=%d d=%d op=%s launches=%zu ms=%.3f tflops=%.1f\n",
           a->name, prec, (long long)a->batch, (long long)a->seq, a->heads, a->kv_heads,
           a->head_dim, op, commands, ms, tflops);
  }
  fclose(f);
#else
  printf("ATTN per-op times need a CUDA build\n");
#endif
  mn_session_free(s);
  mn_graph_free(g);
}

int main(int argc, char **argv) {
  const char *which = "all", *prec = "bf16";
  int reps = 20;
  for (int i = 1; i < argc; i++) {
    if (i + 1 < argc && strcmp(argv[i], "--precision") == 0)
      prec = argv[++i];
    else if (i + 1 < argc && strcmp(argv[i], "--reps") == 0)
      reps = atoi(argv[++i]);
    else
      which = argv[i];
  }
  if ((strcmp(prec, "bf16") && strcmp(prec, "f16")) || reps < 1) {
    fprintf(stderr,
            "usage: bench_attention [gpt2|smollm2|all] [--precision bf16|f16] [--reps N]\n");
    return 2;
  }
  mn_session_options o = mn_session_options_default();
  o.precision = strcmp(prec, "bf16") == 0 ? MN_PRECISION_BF16 : MN_PRECISION_F16;
  bool any = false;
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
    if (strcmp(which, "all") && strcmp(which, shapes[i].name)) continue;
    run(&shapes[i], &o, prec, reps);
    any = true;
  }
  if (!any) {
    fprintf(stderr, "bench_attention: no shape named %s (gpt2, smollm2, all)\n", which);
    return 2;
  }
  return 0;
}
