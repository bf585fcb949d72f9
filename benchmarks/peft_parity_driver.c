/* The C half of scripts/peft_parity.py: LoRA on a transformers checkpoint through models/, as
 * peft would run it. Loads DIR's base (config.json, model.safetensors) under adapters of rank R
 * on the --targets layers, gives every lora_B random values (PEFT starts them at zero, which
 * would hide lora_A's gradient), saves that adapter in PEFT's layout, runs one training step
 * (forward, backward, AdamW over the adapters) and dumps what peft is compared against, then
 * saves the stepped adapter and the merged model and dumps the merged model's logits computed
 * by a plain (adapter-free) session from the merged file.
 *
 * usage: bench_peft_parity_driver --model DIR --out DIR --batch B --seq T --rank R --alpha A
 *            --targets LIST [--lr X] [--beta1 X] [--beta2 X] [--eps X] [--weight-decay X]
 *   the batch: DIR/input_ids.u32 and DIR/labels.u32, B*T little-endian uint32 each (labels
 *   may be MN_IGNORE_LABEL). The backend follows MN_BACKEND; matmuls are full fp32.
 * Writes to the --out folder:
 *   result.txt          "backend B", "loss X", and "lora NAME NUMEL" for every adapter tensor
 *   adapter/            the adapter before the step (adapter_config.json, .safetensors)
 *   inference_logits.f32  the adapted model's logits from an inference session, before the step
 *   logits.f32          output 1 of the step, [B, T, V]
 *   grad/NAME.f32       dLoss/dNAME of the step, param/NAME.f32 NAME after it
 *   adapter_after/      the adapter after the step
 *   merged/model.safetensors, merged_logits.f32   the stepped adapter merged into the base, and
 *                       the logits of a session of the plain model loaded from that file */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "benchmarks/driver_util.h"
#include "meganeura.h"

#define PROG "peft_parity_driver"

typedef struct args {
  const char *model, *out, *targets;
  long long batch, seq, rank;
  double alpha;
  drv_adamw opt;
} args;

static void usage(void) {
  fprintf(stderr, "usage: bench_peft_parity_driver --model DIR --out DIR --batch B --seq T "
                  "--rank R --alpha A --targets LIST [--lr X] [--beta1 X] [--beta2 X] [--eps X] "
                  "[--weight-decay X]\n");
  exit(2);
}

static args parse_args(int argc, char **argv) {
  args a = {.opt = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .wd = 0.01}};
  for (int i = 1; i < argc; i += 2) {
    if (i + 1 >= argc) usage();
    const char *k = argv[i], *v = argv[i + 1];
    if (!strcmp(k, "--model"))
      a.model = v;
    else if (!strcmp(k, "--out"))
      a.out = v;
    else if (!strcmp(k, "--targets"))
      a.targets = v;
    else if (!strcmp(k, "--batch"))
      a.batch = atoll(v);
    else if (!strcmp(k, "--seq"))
      a.seq = atoll(v);
    else if (!strcmp(k, "--rank"))
      a.rank = atoll(v);
    else if (!strcmp(k, "--alpha"))
      a.alpha = atof(v);
    else if (drv_adamw_arg(k, v, &a.opt))
      ;
    else
      usage();
  }
  if (!a.model || !a.out || !a.targets || a.batch < 1 || a.seq < 1 || a.rank < 1 || a.alpha <= 0)
    usage();
  return a;
}

static bool is_adapter(const char *name) {
  return strstr(name, ".lora_A.weight") || strstr(name, ".lora_B.weight");
}

/* Every lora_B uniform in [-0.05, 0.05), from a fixed seed. */
static void randomize_b(const mn_graph *g, mn_session *s) {
  uint64_t state = 12345;
  for (size_t i = 0; i < mn_graph_num_nodes(g); i++) {
    mn_node_info info;
    if (mn_graph_node(g, (mn_node)i, &info) != MN_OK || !info.name ||
        !strstr(info.name, ".lora_B.weight"))
      continue;
    size_t n = (size_t)mn_tensor_type_numel(&info.type);
    float *w = malloc(n * sizeof *w);
    if (!w) drv_die(PROG, "out of memory");
    for (size_t k = 0; k < n; k++) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      w[k] = (float)((double)(state >> 11) / 9007199254740992.0 - 0.5) * 0.1f;
    }
    drv_expect_ok(PROG, mn_session_set_parameter(s, info.name, w, n), info.name);
    free(w);
  }
}

/* grad/NAME.f32 and param/NAME.f32 of every adapter tensor, listed in result. */
static void dump_adapters(const mn_graph *g, mn_session *s, const char *out, FILE *result) {
  char dir[4096], path[4096], file[1024];
  drv_make_dir(PROG, drv_join_path(PROG, dir, sizeof dir, out, "grad"));
  drv_make_dir(PROG, drv_join_path(PROG, dir, sizeof dir, out, "param"));
  for (size_t i = 0; i < mn_graph_num_nodes(g); i++) {
    mn_node_info info;
    if (mn_graph_node(g, (mn_node)i, &info) != MN_OK || strcmp(info.op, "parameter") != 0 ||
        !is_adapter(info.name))
      continue;
    size_t n = (size_t)mn_tensor_type_numel(&info.type);
    float *x = malloc(n * sizeof *x);
    if (!x) drv_die(PROG, "out of memory");
    snprintf(file, sizeof file, "grad/%s.f32", info.name);
    drv_expect_ok(PROG, mn_session_read_grad(s, info.name, x, n), info.name);
    drv_write_f32(PROG, drv_join_path(PROG, path, sizeof path, out, file), x, n);
    snprintf(file, sizeof file, "param/%s.f32", info.name);
    drv_expect_ok(PROG, mn_session_read_param(s, info.name, x, n), info.name);
    drv_write_f32(PROG, drv_join_path(PROG, path, sizeof path, out, file), x, n);
    fprintf(result, "lora %s %zu\n", info.name, n);
    free(x);
  }
}

int main(int argc, char **argv) {
  args a = parse_args(argc, argv);
  char path[4096], dir[4096];
  mn_session_options o = mn_session_options_default();
  o.allow_tf32 = false;
  mn_model_config c;
  drv_expect_ok(
      PROG,
      mn_model_config_load(drv_join_path(PROG, path, sizeof path, a.model, "config.json"), &c),
      "config");
  char base[4096];
  drv_join_path(PROG, base, sizeof base, a.model, "model.safetensors");
  const char *prefix = NULL;
  drv_expect_ok(PROG, mn_model_name_prefix(&c, base, &prefix), "name prefix");
  mn_lora_config lora = mn_lora_config_default();
  lora.rank = a.rank;
  lora.alpha = (float)a.alpha;
  snprintf(lora.target_modules, sizeof lora.target_modules, "%s", a.targets);
  snprintf(lora.base_model, sizeof lora.base_model, "%s", a.model);
  mn_model_options mo = {.name_prefix = prefix, .lora = &lora};
  mn_graph *g = NULL;
  drv_expect_ok(PROG, mn_model_build_with(&c, a.batch, a.seq, &mo, &g), "build");
  mn_session *s = NULL;
  drv_expect_ok(PROG, mn_build_session(g, &o, &s), "session");
  drv_expect_ok(PROG, mn_model_init_parameters(&c, g, s, 1), "init");
  drv_expect_ok(PROG, mn_session_load_safetensors_flags(s, base, MN_LOAD_STRICT_FROZEN), "base");
  randomize_b(g, s);
  size_t n = (size_t)(a.batch * a.seq);
  uint32_t *ids = drv_read_exact(
      PROG, drv_join_path(PROG, path, sizeof path, a.model, "input_ids.u32"), sizeof(uint32_t), n);
  uint32_t *labels = drv_read_exact(
      PROG, drv_join_path(PROG, path, sizeof path, a.model, "labels.u32"), sizeof(uint32_t), n);
  drv_set_lm_batch(PROG, s, g, ids, labels, n);
  drv_expect_ok(PROG,
                mn_session_set_adamw(s, (float)a.opt.lr, (float)a.opt.beta1, (float)a.opt.beta2,
                                     (float)a.opt.eps, (float)a.opt.wd),
                "adamw");
  drv_make_dir(PROG, a.out);
  drv_expect_ok(PROG,
                mn_lora_save(s, g, &lora, drv_join_path(PROG, dir, sizeof dir, a.out, "adapter")),
                "save adapter");
  /* The adapted model's logits from an inference session that reads the training session's
   * weights before the step: what the step's output 1 must equal. */
  size_t nl = n * (size_t)c.vocab_size;
  float *logits = malloc(nl * sizeof *logits);
  if (!logits) drv_die(PROG, "out of memory");
  mn_session *inf = NULL;
  drv_expect_ok(PROG, mn_build_inference_session_shared(g, &o, s, &inf), "inference session");
  drv_set_lm_batch(PROG, inf, g, ids, labels, n);
  drv_expect_ok(PROG, mn_session_step(inf), "inference");
  drv_expect_ok(PROG, mn_session_wait(inf), "inference wait");
  drv_expect_ok(PROG, mn_session_read_output_by_index(inf, 1, logits, nl), "inference logits");
  drv_write_f32(PROG, drv_join_path(PROG, path, sizeof path, a.out, "inference_logits.f32"), logits,
                nl);
  mn_session_free(inf);
  FILE *result = fopen(drv_join_path(PROG, path, sizeof path, a.out, "result.txt"), "w");
  if (!result) drv_die(PROG, "result.txt");
  drv_expect_ok(PROG, mn_session_step(s), "step");
  drv_expect_ok(PROG, mn_session_wait(s), "wait");
  mn_session_stats stats;
  drv_expect_ok(PROG, mn_session_get_stats(s, &stats), "stats");
  fprintf(result, "backend %s\nloss %.9g\n", stats.backend, (double)mn_session_read_loss(s));
  drv_expect_ok(PROG, mn_session_read_output_by_index(s, 1, logits, nl), "logits");
  drv_write_f32(PROG, drv_join_path(PROG, path, sizeof path, a.out, "logits.f32"), logits, nl);
  dump_adapters(g, s, a.out, result);
  drv_expect_ok(
      PROG, mn_lora_save(s, g, &lora, drv_join_path(PROG, dir, sizeof dir, a.out, "adapter_after")),
      "save stepped adapter");
  drv_make_dir(PROG, drv_join_path(PROG, dir, sizeof dir, a.out, "merged"));
  drv_expect_ok(PROG,
                mn_lora_save_merged(
                    s, g, &lora, drv_join_path(PROG, path, sizeof path, dir, "model.safetensors")),
                "save merged");

  /* The merged file through a plain model: what transformers must reproduce from it. */
  mn_model_options plain = {.name_prefix = prefix};
  mn_graph *pg = NULL;
  mn_session *ps = NULL;
  drv_expect_ok(PROG, mn_model_build_with(&c, a.batch, a.seq, &plain, &pg), "plain build");
  drv_expect_ok(PROG, mn_build_inference_session(pg, &o, &ps), "plain session");
  drv_expect_ok(PROG, mn_session_load_safetensors(ps, path, true), "load merged");
  drv_set_lm_batch(PROG, ps, pg, ids, labels, n);
  drv_expect_ok(PROG, mn_session_step(ps), "merged forward");
  drv_expect_ok(PROG, mn_session_wait(ps), "merged wait");
  drv_expect_ok(PROG, mn_session_read_output_by_index(ps, 1, logits, nl), "merged logits");
  drv_write_f32(PROG, drv_join_path(PROG, path, sizeof path, a.out, "merged_logits.f32"), logits,
                nl);
  fclose(result);
  free(logits);
  free(ids);
  free(labels);
  mn_session_free(ps);
  mn_graph_free(pg);
  mn_session_free(s);
  mn_graph_free(g);
  return 0;
}
