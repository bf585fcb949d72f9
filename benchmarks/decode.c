/* The decode benchmark of issue 18: mn_generator on a language model with random weights (or
 * a given weights file), a prompt of --prompt tokens and --new greedy tokens per sequence, for
 * every combination of --batch, --precision and --quant given. One BENCH-DECODE line per
 * configuration; --json FILE appends one JSON object per configuration (a line each) for
 * scripts/decode_summary.py. benchmarks/torch_decode.py times the same shapes in PyTorch.
 *
 * usage: bench_decode [smollm2|gpt2|CONFIG.json] [--weights FILE.safetensors] [--prompt 128]
 *        [--new 256] [--batch 1,8] [--precision f32,bf16] [--quant none,...] [--repeats 3]
 *        [--bandwidth GB/s] [--json FILE] [--profile]
 *
 * Per configuration: one warm-up call, then --repeats calls of mn_generator_generate from an
 * empty cache; prefill ms and ms per token are the medians of mn_generator_get_stats over the
 * repeats. Bytes read per token is the ideal that bounds a decoder by memory bandwidth: every
 * weight once (the parameter count times the precision's element size for quant none, else
 * the generator's weight_bytes) plus both KV caches of every layer at the mean cache length
 * of the decode, prompt + new / 2, in the precision's element size; the fraction of the limit
 * is that times tokens/s over the bandwidth. The bandwidth is measured here with a
 * device-to-device copy (read plus written bytes over time) unless --bandwidth gives it; the
 * line says which. A quant the generator refuses prints a BENCH-DECODE-UNSUPPORTED line with
 * the library's message and the run goes on. --profile (CUDA) then prints the time of every op of
 * one decode launch (mn_cuda_profile_step), to see which kernels a token spends its time in. */
#include <stdint.h>
#include <unistd.h>

#include "benchmarks/bench_util.h"
#include "benchmarks/driver_util.h"
#include "benchmarks/lm_configs.h"
#include "models/model_internal.h"

#define MAX_LIST 8

typedef struct list {
  const char *item[MAX_LIST];
  int n;
} list;

typedef struct args {
  const char *model, *weights, *json;
  long prompt, n_new, repeats;
  double bandwidth;
  bool profile;
  list batches, precisions, quants;
} args;

static void usage(void) {
  fprintf(stderr, "usage: bench_decode [smollm2|gpt2|CONFIG.json] [--weights FILE] [--prompt N] "
                  "[--new N] [--batch 1,8] [--precision f32,bf16] [--quant none,q8_0,q4_0,int8,"
                  "int4] [--repeats N] [--bandwidth GB/s] [--json FILE] [--profile]\n");
  exit(2);
}

/* Splits a comma-separated value in place. */
static list split(char *v) {
  list l = {.n = 0};
  for (char *tok = strtok(v, ","); tok; tok = strtok(NULL, ",")) {
    if (l.n == MAX_LIST) usage();
    l.item[l.n++] = tok;
  }
  if (l.n == 0) usage();
  return l;
}

static args parse(int argc, char **argv) {
  static char batches[] = "1,8", precisions[] = "f32,bf16", quants[] = "none";
  args a = {.model = "smollm2", .prompt = 128, .n_new = 256, .repeats = 3};
  a.batches = split(batches);
  a.precisions = split(precisions);
  a.quants = split(quants);
  int i = 1;
  if (i < argc && argv[i][0] != '-') a.model = argv[i++];
  for (; i < argc; i += 2) {
    if (!strcmp(argv[i], "--profile")) {
      a.profile = true;
      i--;
      continue;
    }
    if (i + 1 >= argc) usage();
    const char *k = argv[i];
    char *v = argv[i + 1];
    if (!strcmp(k, "--weights"))
      a.weights = v;
    else if (!strcmp(k, "--json"))
      a.json = v;
    else if (!strcmp(k, "--prompt"))
      a.prompt = atol(v);
    else if (!strcmp(k, "--new"))
      a.n_new = atol(v);
    else if (!strcmp(k, "--repeats"))
      a.repeats = atol(v);
    else if (!strcmp(k, "--bandwidth"))
      a.bandwidth = atof(v);
    else if (!strcmp(k, "--batch"))
      a.batches = split(v);
    else if (!strcmp(k, "--precision"))
      a.precisions = split(v);
    else if (!strcmp(k, "--quant"))
      a.quants = split(v);
    else
      usage();
  }
  if (a.prompt < 1 || a.n_new < 1 || a.repeats < 1 || a.bandwidth < 0) usage();
  return a;
}

static mn_model_config load_config(const char *model) {
  mn_model_config c;
  if (!strcmp(model, "smollm2"))
    bench_check(mn_model_config_parse(MN_BENCH_SMOLLM2, &c), "config smollm2");
  else if (!strcmp(model, "gpt2"))
    bench_check(mn_model_config_parse(MN_BENCH_GPT2, &c), "config gpt2");
  else
    bench_check(mn_model_config_load(model, &c), model);
  return c;
}

/* The model's name in the output: the shape's name, or the config file's base name without
 * ".json". */
static const char *model_label(const char *model) {
  static char label[64];
  const char *slash = strrchr(model, '/');
  snprintf(label, sizeof label, "%s", slash ? slash + 1 : model);
  char *dot = strstr(label, ".json");
  if (dot) *dot = '\0';
  return label;
}

/* The parameters of the model as transformers saves it (a tied head counted once). */
static int64_t parameter_count(const mn_graph *g) {
  int64_t n = 0;
  mn_node_info info;
  for (size_t i = 0; i < mn_graph_num_nodes(g); i++)
    if (mn_graph_node(g, (mn_node)i, &info) == MN_OK && strcmp(info.op, "parameter") == 0)
      n += mn_tensor_type_numel(&info.type);
  return n;
}

/* Writes the model's parameters, drawn as mn_model_init_parameters draws them, to path;
 * returns the parameter count and the backend the library picks by default. */
static int64_t write_random_weights(const mn_model_config *c, const char *path,
                                    const char **backend) {
  mn_graph *g = NULL;
  mn_session *s = NULL;
  bench_check(mn_model_build(c, 1, 1, NULL, &g), "build the model");
  bench_check(mn_build_inference_session(g, NULL, &s), "weights session");
  bench_check(mn_model_init_parameters(c, g, s, 1234), "init");
  if (path) bench_check(mn_session_save_safetensors(s, path), "save the random weights");
  mn_session_stats st;
  bench_check(mn_session_get_stats(s, &st), "stats");
  *backend = st.backend;
  int64_t n = parameter_count(g);
  mn_session_free(s);
  mn_graph_free(g);
  return n;
}

/* Device-to-device copy bandwidth in GB/s (bytes read plus bytes written), 0 without a
 * device. */
static double measure_bandwidth(void) {
#ifdef MN_WITH_CUDA
  size_t bytes = (size_t)1 << 30;
  void *src = NULL, *dst = NULL;
  if (cudaMalloc(&src, bytes) != cudaSuccess || cudaMalloc(&dst, bytes) != cudaSuccess) {
    cudaFree(src);
    cudaGetLastError();
    return 0;
  }
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice);
  const int reps = 10;
  cudaEventRecord(start, 0);
  for (int i = 0; i < reps; i++)
    cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, 0);
  cudaEventRecord(stop, 0);
  cudaEventSynchronize(stop);
  float ms = 0;
  cudaEventElapsedTime(&ms, start, stop);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaFree(src);
  cudaFree(dst);
  return ms > 0 ? 2.0 * (double)bytes * reps / (ms * 1e-3) / 1e9 : 0;
#else
  return 0;
#endif
}

static const char *const QUANT_NAMES[] = {"none", "q8_0", "q4_0", "int8", "int4", "q4_1"};

static bool quant_of(const char *name, mn_quant *q) {
  for (size_t i = 0; i < sizeof QUANT_NAMES / sizeof *QUANT_NAMES; i++)
    if (!strcmp(name, QUANT_NAMES[i])) {
      *q = (mn_quant)i;
      return true;
    }
  return false;
}

static size_t precision_bytes(mn_precision p) { return p == MN_PRECISION_F32 ? 4 : 2; }

typedef struct result {
  double prefill_ms, ms_per_token, weight_bytes, bytes_per_token;
  uint64_t launches;
} result;

static double median(double *x, long n) {
  qsort(x, (size_t)n, sizeof *x, bench_cmp);
  return x[n / 2];
}

/* Times one configuration; false (with the library's message printed) when the generator
 * refuses it. */
static bool run_one(const args *a, const mn_model_config *c, const char *weights, int64_t params,
                    long batch, mn_precision prec, mn_quant quant, const char *tag, result *r) {
  mn_generator_options o = mn_generator_options_default();
  o.session.precision = prec;
  o.batch = batch;
  o.max_seq = a->prompt + a->n_new;
  o.quant = quant;
  mn_generator *gen = NULL;
  mn_status st = mn_generator_new(c, weights, &o, &gen);
  if (st != MN_OK) {
    printf("BENCH-DECODE-UNSUPPORTED %s: %s (%s)\n", tag, mn_status_string(st), mn_last_error());
    return false;
  }
  size_t n_prompt = (size_t)(batch * a->prompt), n_out = (size_t)(batch * a->n_new);
  uint32_t *prompt = malloc(n_prompt * sizeof *prompt), *out = malloc(n_out * sizeof *out);
  double *prefill = malloc((size_t)a->repeats * sizeof *prefill);
  double *per_token = malloc((size_t)a->repeats * sizeof *per_token);
  if (!prompt || !out || !prefill || !per_token) {
    fprintf(stderr, "bench_decode: out of memory\n");
    exit(1);
  }
  uint64_t x = 88172645463325252ull;
  for (size_t i = 0; i < n_prompt; i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    prompt[i] = (uint32_t)(x % (uint64_t)c->vocab_size);
  }
  mn_generator_stats gs;
  for (long rep = -1; rep < a->repeats; rep++) {
    bench_check(mn_generator_reset(gen), "reset");
    bench_check(mn_generator_generate(gen, prompt, (size_t)a->prompt, NULL, out, (size_t)a->n_new),
                "generate");
    bench_check(mn_generator_get_stats(gen, &gs), "stats");
    if (rep < 0) continue;
    prefill[rep] = gs.prefill_ms;
    per_token[rep] = gs.ms_per_token;
  }
  r->prefill_ms = median(prefill, a->repeats);
  r->ms_per_token = median(per_token, a->repeats);
  r->launches = gs.launches_per_token;
  r->weight_bytes = (double)gs.weight_bytes;
  size_t elem = precision_bytes(prec);
  double weights_read = quant == MN_QUANT_NONE ? (double)params * (double)elem : r->weight_bytes;
  int64_t kv_heads = c->family == MN_MODEL_GPT2 ? c->num_heads : c->num_kv_heads;
  double mean_len = (double)a->prompt + (double)a->n_new / 2.0;
  double kv = 2.0 * (double)c->num_layers * (double)batch * mean_len * (double)kv_heads *
              (double)c->head_dim * (double)elem;
  r->bytes_per_token = weights_read + kv;
#ifdef MN_WITH_CUDA
  mn_session *ds = mn_generator_decode_session(gen);
  if (a->profile && mn_cuda_session_stream(ds)) {
    /* From the prompt's end: the profile's launches advance the cache past it. */
    bench_check(mn_generator_reset(gen), "reset");
    bench_check(mn_generator_generate(gen, prompt, (size_t)a->prompt, NULL, out, 1), "generate");
    printf("BENCH-DECODE-PROFILE %s\n", tag);
    bench_check(mn_cuda_profile_step(ds, 20, stdout), "profile");
  }
#endif
  mn_generator_free(gen);
  free(prompt);
  free(out);
  free(prefill);
  free(per_token);
  return true;
}

int main(int argc, char **argv) {
  args a = parse(argc, argv);
  mn_model_config c = load_config(a.model);
  char tmp_dir[] = "/tmp/mn-bench-decode-XXXXXX", tmp_path[64] = "";
  const char *weights = a.weights, *backend = "?";
  if (!weights) {
    if (!mkdtemp(tmp_dir)) {
      perror("bench_decode: mkdtemp");
      return 1;
    }
    snprintf(tmp_path, sizeof tmp_path, "%s/model.safetensors", tmp_dir);
    weights = tmp_path;
  }
  int64_t params = write_random_weights(&c, a.weights ? NULL : tmp_path, &backend);
  double bw = a.bandwidth;
  const char *bw_source = "given";
  if (bw == 0) {
    bw = !strcmp(backend, "cuda") ? measure_bandwidth() : 0;
    bw_source = "measured d2d copy";
  }
  FILE *js = NULL;
  if (a.json && !(js = fopen(a.json, "a"))) {
    perror(a.json);
    return 1;
  }
  const char *label = model_label(a.model);
  printf("# bench_decode %s: %lld parameters, prompt %ld, %ld new tokens, backend %s, bandwidth "
         "%.0f GB/s (%s)\n",
         label, (long long)params, a.prompt, a.n_new, backend, bw, bw > 0 ? bw_source : "none");
  for (int qi = 0; qi < a.quants.n; qi++)
    for (int pi = 0; pi < a.precisions.n; pi++)
      for (int bi = 0; bi < a.batches.n; bi++) {
        mn_quant quant;
        mn_precision prec;
        bool tf32;
        long batch = atol(a.batches.item[bi]);
        char tag[128];
        snprintf(tag, sizeof tag, "decode_%s_b%ld_%s_%s", label, batch, a.precisions.item[pi],
                 a.quants.item[qi]);
        if (!quant_of(a.quants.item[qi], &quant)) {
          printf("BENCH-DECODE-UNSUPPORTED %s: unknown --quant name\n", tag);
          continue;
        }
        if (!drv_precision(a.precisions.item[pi], &prec, &tf32) || batch < 1) usage();
        result r;
        if (!run_one(&a, &c, weights, params, batch, prec, quant, tag, &r)) continue;
        double tps = 1e3 / r.ms_per_token, total = tps * (double)batch;
        double frac = bw > 0 ? r.bytes_per_token * tps / (bw * 1e9) : 0;
        printf("BENCH-DECODE %s prefill %.2f ms  %.3f ms/token  %.1f tokens/s/seq  %.1f tokens/s "
               "total  launches/token %llu  weights %.1f MB  read/token %.1f MB  %.1f%% of "
               "bandwidth\n",
               tag, r.prefill_ms, r.ms_per_token, tps, total, (unsigned long long)r.launches,
               r.weight_bytes / 1e6, r.bytes_per_token / 1e6, 100 * frac);
        fflush(stdout);
        if (js)
          fprintf(js,
                  "{\"impl\":\"meganeura\",\"model\":\"%s\",\"batch\":%ld,\"precision\":\"%s\","
                  "\"quant\":\"%s\",\"backend\":\"%s\",\"prompt\":%ld,\"new\":%ld,"
                  "\"prefill_ms\":%.4f,\"ms_per_token\":%.5f,\"tokens_per_s_seq\":%.2f,"
                  "\"tokens_per_s\":%.2f,\"launches_per_token\":%llu,\"weight_bytes\":%.0f,"
                  "\"bytes_per_token\":%.0f,\"bandwidth_gbs\":%.1f,\"bandwidth_source\":\"%s\","
                  "\"bandwidth_fraction\":%.5f}\n",
                  label, batch, a.precisions.item[pi], a.quants.item[qi], backend, a.prompt,
                  a.n_new, r.prefill_ms, r.ms_per_token, tps, total, (unsigned long long)r.launches,
                  r.weight_bytes, r.bytes_per_token, bw, bw > 0 ? bw_source : "none", frac);
      }
  if (js) fclose(js);
  if (!a.weights) {
    remove(tmp_path);
    rmdir(tmp_dir);
  }
  return 0;
}
