/* meganeura generate: sampling from a trained model, recomputing the whole window for
 * every new token (no KV cache). */
#include "tools/cli.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *const CMD = "meganeura generate";
static const char USAGE[] =
    "usage: meganeura generate (--checkpoint FILE | --weights FILE.safetensors)\n"
    "         --config CONFIG.json --prompt TEXT [--tokens N] [--temperature X] [--top-k K]\n"
    "         [--greedy] [--seed S] [--seq T] [--tokenizer tokenizer.json]\n"
    "         [--allow-nonfinite] [--precision f32|tf32|bf16|f16] [--adapter DIR]\n"
    "Prints the prompt and N (default 200) sampled tokens: bytes, or with --tokenizer\n"
    "decoded ids. The window is the config's positions (or --seq, default at most 1024).\n"
    "--weights holding NaN or infinity are refused unless --allow-nonfinite; logits that\n"
    "are not finite stop generation with an error.\n"
    "--precision defaults to bf16 on a CUDA device of compute capability 8.0 or newer, else\n"
    "f32.\n"
    "--adapter DIR applies a LoRA adapter as PEFT saves it (adapter_config.json,\n"
    "adapter_model.safetensors, e.g. meganeura train --lora-rank's OUT) to the base model of\n"
    "--weights.\n";

enum {
  O_CKPT,
  O_WEIGHTS,
  O_CONFIG,
  O_PROMPT,
  O_TOKENS,
  O_TEMP,
  O_TOPK,
  O_GREEDY,
  O_SEED,
  O_SEQ,
  O_TOKENIZER,
  O_ALLOW_NONFINITE,
  O_PRECISION,
  O_ADAPTER,
  O_COUNT
};

static uint32_t sample(const float *logits, long v, float temp, long top_k, uint64_t *rng,
                       float *scratch) {
  long best = 0;
  for (long i = 1; i < v; i++)
    if (logits[i] > logits[best]) best = i;
  if (temp <= 0) return (uint32_t)best;
  /* threshold for top-k: the k-th largest logit */
  float thr = -INFINITY;
  if (top_k > 0 && top_k < v) {
    memcpy(scratch, logits, (size_t)v * sizeof *scratch);
    for (long k = 0; k < top_k; k++) {
      long m = k;
      for (long i = k + 1; i < v; i++)
        if (scratch[i] > scratch[m]) m = i;
      float t = scratch[k];
      scratch[k] = scratch[m];
      scratch[m] = t;
    }
    thr = scratch[top_k - 1];
  }
  double total = 0;
  for (long i = 0; i < v; i++)
    total += logits[i] >= thr ? exp((double)(logits[i] - logits[best]) / temp) : 0;
  double u = cli_rand_unit(rng) * total, acc = 0;
  for (long i = 0; i < v; i++) {
    if (logits[i] < thr) continue;
    acc += exp((double)(logits[i] - logits[best]) / temp);
    if (acc >= u) return (uint32_t)i;
  }
  return (uint32_t)best;
}

/* The index of the first NaN or infinity of x[0..n), or -1. */
static long first_non_finite(const float *x, long n) {
  for (long i = 0; i < n; i++)
    if (!isfinite(x[i])) return i;
  return -1;
}

static int emit(const mn_tokenizer *tok, uint32_t id) {
  if (!tok) return fputc((int)id, stdout) == EOF ? -1 : 0;
  char buf[256];
  size_t len = 0;
  if (mn_tokenizer_decode(tok, &id, 1, buf, sizeof buf, &len) != MN_OK) return -1;
  return fwrite(buf, 1, len, stdout) == len ? 0 : -1;
}

typedef struct gen {
  mn_model_config cfg;
  mn_tokenizer *tok;
  mn_graph *g;
  mn_session *s;
  uint32_t *ctx, *win, *zeros;
  float *logits, *scratch;
} gen;

static int setup(cli_opt *o, gen *r, const mn_session_options *options, long seq,
                 const char *prefix) {
  mn_lora_config lora;
  const char *adapter = o[O_ADAPTER].value;
  if (adapter && mn_lora_config_load(adapter, &lora) != MN_OK)
    return cli_lib_fail(CMD, "cannot read --adapter");
  mn_model_options mo = {.name_prefix = prefix, .lora = adapter ? &lora : NULL};
  if (mn_model_build_with(&r->cfg, 1, seq, &mo, &r->g) != MN_OK)
    return cli_lib_fail(CMD, "cannot build the model");
  if (mn_build_inference_session(r->g, options, &r->s) != MN_OK)
    return cli_lib_fail(CMD, "cannot build the session");
  if (mn_model_prepare_session(r->g, r->s) != MN_OK)
    return cli_lib_fail(CMD, "cannot prepare the session");
  if (o[O_CKPT].seen && mn_session_load_checkpoint(r->s, o[O_CKPT].value) != MN_OK)
    return cli_lib_fail(CMD, "cannot load --checkpoint");
  /* Under an adapter the base file holds every frozen weight and no adapter. */
  unsigned flags = (adapter ? MN_LOAD_STRICT_FROZEN : MN_LOAD_STRICT) |
                   (o[O_ALLOW_NONFINITE].seen ? MN_LOAD_ALLOW_NONFINITE : 0);
  if (o[O_WEIGHTS].seen &&
      mn_session_load_safetensors_flags(r->s, o[O_WEIGHTS].value, flags) != MN_OK)
    return cli_lib_fail(CMD, "cannot load --weights");
  if (adapter && o[O_WEIGHTS].seen && mn_lora_load(r->s, r->g, adapter) != MN_OK)
    return cli_lib_fail(CMD, "cannot load --adapter");
  return CLI_OK;
}

int cli_generate(int argc, char **argv) {
  cli_opt o[O_COUNT] = {
      [O_CKPT] = {"--checkpoint", 1, NULL, 0},
      [O_WEIGHTS] = {"--weights", 1, NULL, 0},
      [O_CONFIG] = {"--config", 1, NULL, 0},
      [O_PROMPT] = {"--prompt", 1, NULL, 0},
      [O_TOKENS] = {"--tokens", 1, NULL, 0},
      [O_TEMP] = {"--temperature", 1, NULL, 0},
      [O_TOPK] = {"--top-k", 1, NULL, 0},
      [O_GREEDY] = {"--greedy", 0, NULL, 0},
      [O_SEED] = {"--seed", 1, NULL, 0},
      [O_SEQ] = {"--seq", 1, NULL, 0},
      [O_TOKENIZER] = {"--tokenizer", 1, NULL, 0},
      [O_ALLOW_NONFINITE] = {"--allow-nonfinite", 0, NULL, 0},
      [O_PRECISION] = {"--precision", 1, NULL, 0},
      [O_ADAPTER] = {"--adapter", 1, NULL, 0},
  };
  int rc = cli_parse(CMD, argc, argv, o, O_COUNT, USAGE);
  if (rc) return rc == CLI_HELP ? CLI_OK : rc;
  long n_tokens = 200, top_k = 0, seed = 0, seq = 0;
  float temp = 1.0f;
  mn_session_options options = mn_session_options_default();
  if (cli_pos_long(CMD, &o[O_TOKENS], &n_tokens) || cli_nonneg_float(CMD, &o[O_TEMP], &temp) ||
      cli_nonneg_long(CMD, &o[O_TOPK], &top_k) || cli_nonneg_long(CMD, &o[O_SEED], &seed) ||
      cli_pos_long(CMD, &o[O_SEQ], &seq) || cli_require(CMD, &o[O_CONFIG]) ||
      cli_require(CMD, &o[O_PROMPT]) || cli_precision(CMD, &o[O_PRECISION], &options, NULL))
    return CLI_USAGE;
  if (o[O_CKPT].seen == o[O_WEIGHTS].seen) {
    fprintf(stderr, "%s: give exactly one of --checkpoint and --weights\n", CMD);
    return CLI_USAGE;
  }
  if (!*o[O_PROMPT].value) {
    fprintf(stderr, "%s: --prompt must not be empty\n", CMD);
    return CLI_USAGE;
  }
  if (o[O_GREEDY].seen) temp = 0;
  gen r = {0};
  rc = cli_load_config(CMD, o[O_CONFIG].value, &r.cfg);
  if (!rc && o[O_TOKENIZER].seen && mn_tokenizer_load(o[O_TOKENIZER].value, &r.tok) != MN_OK)
    rc = cli_lib_fail(CMD, "cannot load tokenizer");
  const char *prefix = NULL;
  if (!rc && o[O_WEIGHTS].seen &&
      mn_model_name_prefix(&r.cfg, o[O_WEIGHTS].value, &prefix) != MN_OK)
    rc = cli_lib_fail(CMD, "cannot read --weights");
  if (!seq) seq = r.cfg.max_positions < 1024 ? r.cfg.max_positions : 1024;
  const char *p = o[O_PROMPT].value;
  size_t np = strlen(p), n_ctx = 0;
  long v = r.cfg.vocab_size;
  if (!rc) {
    r.ctx = malloc((np + (size_t)n_tokens + 1) * sizeof *r.ctx);
    r.win = calloc((size_t)seq, sizeof *r.win);
    r.zeros = calloc((size_t)seq, sizeof *r.zeros);
    r.logits = malloc((size_t)(seq * v) * sizeof *r.logits);
    r.scratch = malloc((size_t)v * sizeof *r.scratch);
    if (!r.ctx || !r.win || !r.zeros || !r.logits || !r.scratch) {
      fprintf(stderr, "%s: out of memory\n", CMD);
      rc = CLI_FAIL;
    }
  }
  if (!rc && r.tok) {
    if (mn_tokenizer_encode(r.tok, p, np, r.ctx, np + 1, &n_ctx) != MN_OK)
      rc = cli_lib_fail(CMD, "cannot tokenize --prompt");
  } else if (!rc) {
    for (size_t i = 0; i < np; i++)
      r.ctx[i] = (unsigned char)p[i];
    n_ctx = np;
  }
  for (size_t i = 0; !rc && i < n_ctx; i++)
    if ((long)r.ctx[i] >= v) {
      fprintf(stderr, "%s: prompt token %u is outside the vocabulary (%ld)\n", CMD, r.ctx[i], v);
      rc = CLI_FAIL;
    }
  if (!rc && n_ctx == 0) {
    fprintf(stderr, "%s: --prompt gives no tokens\n", CMD);
    rc = CLI_USAGE;
  }
  if (!rc) rc = setup(o, &r, &options, seq, prefix);
  if (!rc) fwrite(p, 1, np, stdout);
  uint64_t rng = (uint64_t)seed * 0x9E3779B97F4A7C15ull + 7;
  for (long t = 0; !rc && t < n_tokens; t++) {
    size_t len = n_ctx < (size_t)seq ? n_ctx : (size_t)seq;
    memcpy(r.win, r.ctx + n_ctx - len, len * sizeof *r.win);
    if (mn_session_set_input_u32(r.s, "input_ids", r.win, (size_t)seq) != MN_OK ||
        mn_session_set_input_u32(r.s, "labels", r.zeros, (size_t)seq) != MN_OK ||
        mn_session_step(r.s) != MN_OK || mn_session_wait(r.s) != MN_OK ||
        mn_session_read_output_by_index(r.s, 1, r.logits, (size_t)(seq * v)) != MN_OK) {
      rc = cli_lib_fail(CMD, "forward pass failed");
      break;
    }
    const float *row = r.logits + (len - 1) * (size_t)v;
    /* NaN compares false everywhere, so sampling would pick token 0 (a NUL byte) forever. */
    long bad = first_non_finite(row, v);
    if (bad >= 0) {
      fprintf(stderr,
              "%s: the logits of token %ld are not finite (logit %ld is %g): the weights or "
              "the config are broken\n",
              CMD, t + 1, bad, (double)row[bad]);
      rc = CLI_FAIL;
      break;
    }
    uint32_t id = sample(row, v, temp, top_k, &rng, r.scratch);
    r.ctx[n_ctx++] = id;
    if (emit(r.tok, id)) {
      fprintf(stderr, "%s: cannot write token %u\n", CMD, id);
      rc = CLI_FAIL;
    }
    fflush(stdout);
  }
  if (!rc && isatty(STDOUT_FILENO)) fputc('\n', stdout);
  mn_tokenizer_free(r.tok);
  mn_session_free(r.s);
  mn_graph_free(r.g);
  free(r.ctx);
  free(r.win);
  free(r.zeros);
  free(r.logits);
  free(r.scratch);
  return rc;
}
