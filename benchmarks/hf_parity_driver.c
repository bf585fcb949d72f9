/* The C half of scripts/hf_parity.py: loads a transformers checkpoint (config.json and
 * model.safetensors, as save_pretrained writes them) through models/, runs one training step
 * (forward, backward, AdamW) and dumps what PyTorch is compared against; optionally fine-tunes
 * further, saves with mn_session_save_safetensors and dumps the logits of the saved weights, so
 * the script can check that transformers' from_pretrained on that file gives the same logits.
 *
 * usage: bench_hf_parity_driver --model DIR --out DIR --batch B --seq T
 *            [--lr X] [--beta1 X] [--beta2 X] [--eps X] [--weight-decay X] [--finetune N]
 *            [--precision f32|bf16|f16]
 *   DIR/config.json, DIR/model.safetensors, and the batch: DIR/input_ids.u32 and
 *   DIR/labels.u32, B*T little-endian uint32 each. The backend follows MN_BACKEND (cpu, cuda);
 *   matmuls are full fp32 (no TF32). --precision bf16 or f16 runs both sessions (training and
 *   the fine-tuned weights' inference) in that mixed precision (docs/precision.md): fp32
 *   master weights, gradients and optimizer state, low-precision activations, so the logits
 *   read back as the bf16/fp16 values stored; f32, the default, is the behaviour without it.
 * Writes to the --out folder (created if needed):
 *   result.txt           "backend B", "prefix P", "loss X" (the first step), "step_loss I X"
 *                        per fine-tune step, and "param NAME NUMEL" for every parameter; with
 *                        --precision other than f32 also "precision NAME" after the prefix
 *   logits.f32           output 1 of the first step, [B, T, V]
 *   grad/NAME.f32        dLoss/dNAME of the first step
 *   param/NAME.f32       NAME after the first AdamW update
 *   finetuned/model.safetensors, finetuned_logits.f32   with --finetune N: the weights after
 *                        N more steps, and the logits an inference session computes from them
 * Exit status 0 on success; errors go to stderr with the library's message. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "benchmarks/driver_util.h"
#include "meganeura.h"

#define PROG "hf_parity_driver"

typedef struct driver_args {
  const char *model, *out;
  long long batch, seq;
  drv_adamw opt;
  int finetune;
  const char *precision_name;
  mn_precision precision;
} driver_args;

static void usage(void) {
  fprintf(stderr, "usage: bench_hf_parity_driver --model DIR --out DIR --batch B --seq T [--lr X] "
                  "[--beta1 X] [--beta2 X] [--eps X] [--weight-decay X] [--finetune N] "
                  "[--precision f32|bf16|f16]\n");
  exit(2);
}

static driver_args parse_args(int argc, char **argv) {
  driver_args a = {.opt = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .wd = 0.01},
                   .precision_name = "f32",
                   .precision = MN_PRECISION_F32};
  for (int i = 1; i < argc; i += 2) {
    if (i + 1 >= argc) usage();
    const char *k = argv[i], *v = argv[i + 1];
    if (!strcmp(k, "--model"))
      a.model = v;
    else if (!strcmp(k, "--out"))
      a.out = v;
    else if (!strcmp(k, "--batch"))
      a.batch = atoll(v);
    else if (!strcmp(k, "--seq"))
      a.seq = atoll(v);
    else if (drv_adamw_arg(k, v, &a.opt))
      ;
    else if (!strcmp(k, "--finetune"))
      a.finetune = atoi(v);
    else if (!strcmp(k, "--precision")) {
      bool tf32;
      a.precision_name = v;
      if (!drv_precision(v, &a.precision, &tf32) || tf32) usage();
    } else
      usage();
  }
  if (!a.model || !a.out || a.batch < 1 || a.seq < 1) usage();
  return a;
}

static float run_step(mn_session *s) {
  drv_expect_ok(PROG, mn_session_step(s), "step");
  drv_expect_ok(PROG, mn_session_wait(s), "wait");
  return mn_session_read_loss(s);
}

/* Writes grad/NAME.f32 and param/NAME.f32 for every parameter, and lists it in result. */
static void dump_params(const mn_graph *g, mn_session *s, const char *out, FILE *result) {
  char dir[4096], path[4096], file[1024];
  drv_make_dir(PROG, drv_join_path(PROG, dir, sizeof dir, out, "grad"));
  drv_make_dir(PROG, drv_join_path(PROG, dir, sizeof dir, out, "param"));
  for (size_t i = 0; i < mn_graph_num_nodes(g); i++) {
    mn_node_info info;
    if (mn_graph_node(g, (mn_node)i, &info) != MN_OK || strcmp(info.op, "parameter") != 0) continue;
    size_t n = (size_t)mn_tensor_type_numel(&info.type);
    float *x = malloc(n * sizeof *x);
    if (!x) drv_die(PROG, "out of memory");
    snprintf(file, sizeof file, "grad/%s.f32", info.name);
    drv_expect_ok(PROG, mn_session_read_grad(s, info.name, x, n), info.name);
    drv_write_f32(PROG, drv_join_path(PROG, path, sizeof path, out, file), x, n);
    snprintf(file, sizeof file, "param/%s.f32", info.name);
    drv_expect_ok(PROG, mn_session_read_param(s, info.name, x, n), info.name);
    drv_write_f32(PROG, drv_join_path(PROG, path, sizeof path, out, file), x, n);
    fprintf(result, "param %s %zu\n", info.name, n);
    free(x);
  }
}

int main(int argc, char **argv) {
  driver_args a = parse_args(argc, argv);
  char path[4096];
  mn_session_options o = mn_session_options_default();
  o.allow_tf32 = false;
  o.precision = a.precision;
  drv_model m = drv_load_model(PROG, a.model, "model.safetensors", a.batch, a.seq, &o);
  mn_model_config c = m.config;
  const char *prefix = m.prefix;
  mn_graph *g = m.graph;
  mn_session *s = m.session;
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
  FILE *result = fopen(drv_join_path(PROG, path, sizeof path, a.out, "result.txt"), "w");
  if (!result) drv_die(PROG, "result.txt");
  float loss = run_step(s);
  mn_session_stats stats;
  drv_expect_ok(PROG, mn_session_get_stats(s, &stats), "stats");
  fprintf(result, "backend %s\nprefix %s\n", stats.backend, prefix);
  if (a.precision != MN_PRECISION_F32) fprintf(result, "precision %s\n", a.precision_name);
  fprintf(result, "loss %.9g\n", (double)loss);
  size_t nl = n * (size_t)c.vocab_size;
  float *logits = malloc(nl * sizeof *logits);
  if (!logits) drv_die(PROG, "out of memory");
  drv_expect_ok(PROG, mn_session_read_output_by_index(s, 1, logits, nl), "logits");
  drv_write_f32(PROG, drv_join_path(PROG, path, sizeof path, a.out, "logits.f32"), logits, nl);
  dump_params(g, s, a.out, result);

  if (a.finetune > 0) {
    for (int i = 0; i < a.finetune; i++)
      fprintf(result, "step_loss %d %.9g\n", i + 2, (double)run_step(s));
    char dir[4096];
    drv_make_dir(PROG, drv_join_path(PROG, dir, sizeof dir, a.out, "finetuned"));
    drv_expect_ok(PROG,
                  mn_session_save_safetensors(
                      s, drv_join_path(PROG, path, sizeof path, dir, "model.safetensors")),
                  "save");
    /* The saved file read back by a fresh inference session: the logits transformers must
     * reproduce from the same file. */
    mn_session *inf = NULL;
    drv_expect_ok(PROG, mn_build_inference_session(g, &o, &inf), "inference session");
    drv_expect_ok(PROG, mn_session_load_safetensors(inf, path, true), "load finetuned");
    drv_set_lm_batch(PROG, inf, g, ids, labels, n);
    run_step(inf);
    drv_expect_ok(PROG, mn_session_read_output_by_index(inf, 1, logits, nl), "finetuned logits");
    drv_write_f32(PROG, drv_join_path(PROG, path, sizeof path, a.out, "finetuned_logits.f32"),
                  logits, nl);
    mn_session_free(inf);
  }
  if (fclose(result) != 0) drv_die(PROG, "result.txt");
  free(logits);
  free(ids);
  free(labels);
  mn_session_free(s);
  mn_graph_free(g);
  return 0;
}
