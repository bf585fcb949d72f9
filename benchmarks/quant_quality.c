/* The quality of quantized weights on a trained byte-level model (issue 18, "Quantized"):
 * for each format, the teacher-forced next-token agreement with the unquantized model's
 * argmax and the perplexity of held-out text, over non-overlapping windows. The graphs are the
 * family builders' forward graphs with quantized linear layers (mn_model_ctx.quant), loaded
 * as the generator loads them, on the CPU backend.
 *
 * usage: bench_quant_quality CONFIG.json WEIGHTS.safetensors HELD_OUT.txt [WINDOW] [MAX_WINDOWS]
 * The model must be byte-level (vocab_size 256): each byte of the text is a token. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/quant.h"
#include "models/model_internal.h"

typedef struct fmt {
  mn_quant quant;
  int group;
} fmt;

static const fmt formats[] = {
    {MN_QUANT_NONE, 0}, {MN_QUANT_Q8_0, 0}, {MN_QUANT_AFFINE_INT8, 32}, {MN_QUANT_AFFINE_INT8, 64},
    {MN_QUANT_Q4_0, 0}, {MN_QUANT_Q4_1, 0}, {MN_QUANT_AFFINE_INT4, 32}, {MN_QUANT_AFFINE_INT4, 64}};
#define NFMT (sizeof formats / sizeof formats[0])

static int fail(const char *what) {
  fprintf(stderr, "bench_quant_quality: %s: %s\n", what, mn_last_error());
  return 1;
}

/* The logits of every window, [windows, T, V], for one format. */
static int logits_of(const mn_model_config *c, const char *weights, const char *prefix, fmt f,
                     const uint32_t *ids, size_t windows, int64_t T, float *out) {
  mn_graph *g = mn_graph_new();
  mn_model_ctx m = {.g = g,
                    .c = c,
                    .batch = 1,
                    .seq = T,
                    .prefix = prefix,
                    .positions = MN_NO_NODE,
                    .quant = f.quant,
                    .group_size = f.group};
  mn_node logits = c->family == MN_MODEL_GPT2 ? mn_gpt2_logits(&m) : mn_llama_logits(&m);
  if (mn_graph_status(g) != MN_OK) {
    fprintf(stderr, "bench_quant_quality: %s: %s\n", mn_quant_name(f.quant), mn_graph_error(g));
    mn_graph_free(g);
    return 1;
  }
  mn_set_outputs(g, &logits, 1);
  mn_session_options o = mn_session_options_default();
  o.backend = MN_BACKEND_CPU;
  mn_session *s = NULL;
  mn_status st = mn_build_inference_session(g, &o, &s);
  if (st == MN_OK)
    st = f.quant == MN_QUANT_NONE
             ? mn_session_load_safetensors(s, weights, true)
             : mn_model_load_quant(c, weights, prefix, false, f.quant, f.group, g, s);
  if (st == MN_OK) st = mn_model_prepare_session(g, s);
  size_t V = (size_t)c->vocab_size;
  for (size_t w = 0; st == MN_OK && w < windows; w++) {
    st = mn_session_set_input_u32(s, "input_ids", ids + w * (size_t)T, (size_t)T);
    if (st == MN_OK) st = mn_session_step(s);
    if (st == MN_OK) st = mn_session_wait(s);
    if (st == MN_OK)
      st = mn_session_read_output_by_index(s, 0, out + w * (size_t)T * V, (size_t)T * V);
  }
  mn_session_free(s);
  mn_graph_free(g);
  return st == MN_OK ? 0 : fail(mn_quant_name(f.quant));
}

static size_t argmax(const float *x, size_t n) {
  size_t best = 0;
  for (size_t i = 1; i < n; i++)
    if (x[i] > x[best]) best = i;
  return best;
}

static double nll(const float *x, size_t n, size_t target) {
  double mx = x[argmax(x, n)], sum = 0;
  for (size_t i = 0; i < n; i++)
    sum += exp((double)x[i] - mx);
  return log(sum) + mx - x[target];
}

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr,
            "usage: %s CONFIG.json WEIGHTS.safetensors HELD_OUT.txt [WINDOW] "
            "[MAX_WINDOWS]\n",
            argv[0]);
    return 2;
  }
  mn_model_config c;
  if (mn_model_config_load(argv[1], &c) != MN_OK) return fail(argv[1]);
  if (c.vocab_size != 256) {
    fprintf(stderr, "bench_quant_quality: a byte-level model (vocab_size 256) is needed\n");
    return 2;
  }
  int64_t T = argc > 4 ? atol(argv[4]) : c.max_positions;
  size_t max_windows = argc > 5 ? (size_t)atol(argv[5]) : 256;
  const char *prefix = NULL;
  if (mn_model_name_prefix(&c, argv[2], &prefix) != MN_OK) return fail(argv[2]);
  FILE *fp = fopen(argv[3], "rb");
  if (!fp) {
    perror(argv[3]);
    return 1;
  }
  size_t windows = 0;
  uint32_t *ids = malloc(max_windows * (size_t)T * sizeof *ids);
  unsigned char *buf = malloc((size_t)T);
  while (windows < max_windows && fread(buf, 1, (size_t)T, fp) == (size_t)T) {
    for (int64_t t = 0; t < T; t++)
      ids[windows * (size_t)T + (size_t)t] = buf[t];
    windows++;
  }
  fclose(fp);
  size_t V = 256, n = windows * (size_t)T * V;
  float *base = malloc(n * sizeof *base), *q = malloc(n * sizeof *q);
  if (!ids || !buf || !base || !q || !windows) {
    fprintf(stderr, "bench_quant_quality: out of memory or no whole window of text\n");
    return 1;
  }
  size_t preds = windows * (size_t)(T - 1);
  printf("%zu windows of %lld bytes of %s: %zu predictions\n\n", windows, (long long)T, argv[3],
         preds);
  printf("| format | weight bytes (linear layers) | next-token agreement | held-out perplexity | "
         "increase |\n|---|---|---|---|---|\n");
  double base_ppl = 0;
  for (size_t k = 0; k < NFMT; k++) {
    fmt f = formats[k];
    if (logits_of(&c, argv[2], prefix, f, ids, windows, T, k ? q : base)) return 1;
    const float *l = k ? q : base;
    size_t agree = 0;
    double sum = 0;
    for (size_t w = 0; w < windows; w++)
      for (int64_t t = 0; t + 1 < T; t++) {
        size_t at = (w * (size_t)T + (size_t)t) * V;
        agree += argmax(l + at, V) == argmax(base + at, V);
        sum += nll(l + at, V, ids[w * (size_t)T + (size_t)t + 1]);
      }
    double ppl = exp(sum / (double)preds);
    if (!k) base_ppl = ppl;
    /* Bytes of the linear weights: GPT-2's four and Llama's seven per layer. */
    int64_t d = c.hidden_size, ff = c.intermediate_size;
    int64_t qd = c.num_heads * c.head_dim, kv = c.num_kv_heads * c.head_dim;
    int64_t shapes[7][2] = {{3 * d, d}, {d, d}, {ff, d}, {d, ff}};
    if (c.family == MN_MODEL_LLAMA) {
      int64_t l7[7][2] = {{qd, d}, {kv, d}, {kv, d}, {d, qd}, {ff, d}, {ff, d}, {d, ff}};
      memcpy(shapes, l7, sizeof l7);
    }
    size_t bytes = 0;
    for (int i = 0; i < (c.family == MN_MODEL_LLAMA ? 7 : 4); i++)
      bytes += (size_t)c.num_layers * (size_t)shapes[i][0] *
               (f.quant == MN_QUANT_NONE ? (size_t)shapes[i][1] * 4
                                         : mn_quant_row_words(f.quant, f.group, shapes[i][1]) * 4);
    char name[32];
    snprintf(name, sizeof name, "%s%s",
             f.quant == MN_QUANT_NONE ? "none (f32)" : mn_quant_name(f.quant),
             f.group ? (f.group == 32 ? " g32" : " g64") : "");
    printf("| %s | %zu | %.2f%% | %.4f | %+.2f%% |\n", name, bytes,
           100.0 * (double)agree / (double)preds, ppl, 100.0 * (ppl / base_ppl - 1));
  }
  free(ids);
  free(buf);
  free(base);
  free(q);
  return 0;
}
