/* The kernels of a benchmark's bf16 (or f32) training plan, lowered and compiled for an
 * architecture with NVRTC and no device, so that their machine code can be read where no GPU
 * is: DIR/plan.cubin, and DIR/plan-kernels.txt with one line a kernel (its cubin name mn_kN,
 * threads a block, the template instance). scripts/kernel-sass.sh disassembles the cubin and
 * prints each kernel's registers, spills and instruction mix beside its template.
 *
 * Models: gpt2 and smollm2 (the step benchmarks' configs, lm_configs.h, loss only),
 * attention-gpt2 / attention-smollm2 (bench_attention's graphs: causal attention between scaled
 * q, k, v parameters and an MSE loss), and mlp (bench_mlp_step's graph; --precision f32).
 *
 * usage: bench_plan_kernels MODEL [--precision bf16|f32] [--arch sm_90] [--batch B] [--seq T]
 *                          [--out DIR] */
#include <stdint.h>

#include "benchmarks/bench_util.h"
#include "benchmarks/lm_configs.h"
#include "benchmarks/mlp_graph.h"

#ifdef MN_WITH_CUDA
#include "cuda/jit.h"
#include "cuda/storage_layout.h"
#include "host/storage.h"
#include "session/session.h"

/* bench_attention's graph at batch x seq with heads / kv_heads of 64. */
static mn_graph *attention_graph(int64_t batch, int64_t seq, int heads, int kv_heads) {
  mn_graph *g = mn_graph_new();
  int64_t qw = (int64_t)heads * 64, kvw = (int64_t)kv_heads * 64;
  mn_node q = mn_scale(g, mn_parameter(g, "q", MN_SHAPE(batch, seq, qw)), 0.5f);
  mn_node k = mn_scale(g, mn_parameter(g, "k", MN_SHAPE(batch, seq, kvw)), 2.0f);
  mn_node v = mn_scale(g, mn_parameter(g, "v", MN_SHAPE(batch, seq, kvw)), 2.0f);
  mn_node y = mn_causal_attention(g, q, k, v, heads, kv_heads, 64);
  mn_node loss = mn_mse_loss(g, y, mn_input(g, "target", MN_SHAPE(batch, seq, qw)));
  mn_set_outputs(g, &loss, 1);
  bench_check(mn_graph_status(g), "graph");
  return g;
}

static mn_graph *model_graph(const char *name, int64_t batch, int64_t seq) {
  bool gpt2 = strstr(name, "gpt2") != NULL;
  if (strcmp(name, "mlp") == 0) return bench_mlp_graph();
  if (strncmp(name, "attention-", 10) == 0)
    return attention_graph(batch ? batch : (gpt2 ? 16 : 8), seq, gpt2 ? 12 : 9, gpt2 ? 12 : 3);
  mn_model_config cfg;
  bench_check(mn_model_config_parse(gpt2 ? MN_BENCH_GPT2 : MN_BENCH_SMOLLM2, &cfg), "config");
  mn_model_options mo = {.loss_only = true};
  mn_graph *g = NULL;
  bench_check(mn_model_build_with(&cfg, batch ? batch : (gpt2 ? 16 : 8), seq, &mo, &g), "model");
  return g;
}

/* The instance lines of the source (`extern "C" ... mn_kN(mn_ptrs io) { CALL(mn_io<MASK>...`) as
 * "mn_kN BLOCK MASK CALL" lines (MASK: the arguments' storage, 2 bits each, 1 = bf16). */
static void write_kernel_list(const char *src, FILE *f) {
  const char *tag = "__launch_bounds__(";
  for (const char *p = strstr(src, tag); p; p = strstr(p + 1, tag)) {
    unsigned block = (unsigned)strtoul(p + strlen(tag), NULL, 10);
    const char *name = strstr(p, "mn_k"), *body = name ? strstr(name, "{ ") : NULL;
    if (!body) break;
    const char *call_end = strstr(body, "(mn_io<");
    if (!call_end) break;
    unsigned mask = (unsigned)strtoul(call_end + strlen("(mn_io<"), NULL, 16);
    /* A small step's wrappers wait first (emit.h waits_at_entry): the template follows. */
    const char *call = body + 2, *wait = "mn_overlap_wait(); ";
    if (strncmp(call, wait, strlen(wait)) == 0) call += strlen(wait);
    fprintf(f, "%.*s %u 0x%x %.*s\n", (int)strcspn(name, "("), name, block, mask,
            (int)(call_end - call), call);
  }
}
#endif

int main(int argc, char **argv) {
  const char *model = NULL, *prec = "bf16", *arch = "sm_90", *out = ".";
  int64_t batch = 0, seq = 1024;
  for (int i = 1; i < argc; i++) {
    if (i + 1 < argc && strcmp(argv[i], "--precision") == 0)
      prec = argv[++i];
    else if (i + 1 < argc && strcmp(argv[i], "--arch") == 0)
      arch = argv[++i];
    else if (i + 1 < argc && strcmp(argv[i], "--batch") == 0)
      batch = atoll(argv[++i]);
    else if (i + 1 < argc && strcmp(argv[i], "--seq") == 0)
      seq = atoll(argv[++i]);
    else if (i + 1 < argc && strcmp(argv[i], "--out") == 0)
      out = argv[++i];
    else
      model = argv[i];
  }
  bool known = model && (strcmp(model, "gpt2") == 0 || strcmp(model, "smollm2") == 0 ||
                         strcmp(model, "attention-gpt2") == 0 ||
                         strcmp(model, "attention-smollm2") == 0 || strcmp(model, "mlp") == 0);
  if (!known || (strcmp(prec, "bf16") && strcmp(prec, "f32")) || batch < 0 || seq < 1) {
    fprintf(stderr, "usage: bench_plan_kernels gpt2|smollm2|attention-gpt2|attention-smollm2|mlp "
                    "[--precision bf16|f32] [--arch sm_90] [--batch B] [--seq T] [--out DIR]\n");
    return 2;
  }
#ifdef MN_WITH_CUDA
  mn_precision p = strcmp(prec, "bf16") == 0 ? MN_PRECISION_BF16 : MN_PRECISION_F32;
  mn_graph *g = model_graph(model, batch, seq);
  mn_session_options o = mn_session_options_default();
  o.precision = p;
  mn_plan *plan = NULL;
  bench_check(mn_lower_training("plan_kernels", g, &o, &plan), "lowering");
  bench_check(mn_plan_set_precision(plan, p), "precision");
  /* Stored as a session stores it, so the instances are the ones a session runs. */
  bench_check(mn_cu_size_plan(plan), "storage layout");
  char *src = NULL;
  bench_check(mn_cuda_plan_source(plan, false, true, &src), "kernel source");
  mn_cu_binary bin;
  bench_check(mn_cu_compile(src, arch, NULL, &bin), "NVRTC");
  char path[1024];
  snprintf(path, sizeof path, "%s/plan.cubin", out);
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(bin.data, 1, bin.size, f) != bin.size) bench_check(MN_ERR_IO, path);
  fclose(f);
  snprintf(path, sizeof path, "%s/plan-kernels.txt", out);
  if (!(f = fopen(path, "w"))) bench_check(MN_ERR_IO, path);
  write_kernel_list(src, f);
  fclose(f);
  printf("PLAN-KERNELS %s %s %s: %s/plan.cubin (%zu bytes, NVRTC %.0f ms), %s\n", model, prec, arch,
         out, bin.size, bin.compile_ms, path);
  mn_cu_binary_free(&bin);
  free(src);
  mn_plan_free(plan);
  mn_graph_free(g);
  return 0;
#else
  (void)arch, (void)out;
  fprintf(stderr, "bench_plan_kernels: built without the CUDA backend\n");
  return 1;
#endif
}
