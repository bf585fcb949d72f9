/* meganeura generate: sampling through the KV-cache generator (mn_generator): the prompt is
 * prefilled into the cache, then each new token is one step that appends to it, with the
 * sampling on the device. Text streams in chunks of tokens; the prefill time and the token
 * rate go to stderr at the end. */
#include "tools/cli.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *const CMD = "meganeura generate";
static const char USAGE[] =
    "usage: meganeura generate (--checkpoint FILE | --weights FILE.safetensors|FILE.gguf)\n"
    "         [--config CONFIG.json] --prompt TEXT [--tokens N] [--temperature X] [--top-k K]\n"
    "         [--top-p P] [--greedy] [--seed S] [--seq T] [--batch B]\n"
    "         [--quant none|q8_0|q4_0|q4_1|int8|int4] [--group-size 32|64|128]\n"
    "         [--tokenizer tokenizer.json] [--precision f32|tf32|bf16|f16] [--adapter DIR]\n"
    "Prints the prompt and N (default 200, or what a GPT-2's positions leave) sampled tokens:\n"
    "bytes, or with --tokenizer decoded ids. The cache holds --seq positions (default: the prompt "
    "and N tokens); a GPT-2\n"
    "prompt and its tokens must fit the model's positions. --batch B samples B sequences of\n"
    "the same prompt (each its own random numbers), printed one per line after the run.\n"
    "--weights FILE.gguf takes the config and the tokenizer from the file too.\n"
    "--precision defaults to bf16 on a CUDA device of compute capability 8.0 or newer, else\n"
    "f32.\n"
    "--adapter DIR applies a LoRA adapter as PEFT saves it (adapter_config.json,\n"
    "adapter_model.safetensors, e.g. meganeura train --lora-rank's OUT) to the base model of\n"
    "--weights: it is merged into the weights before the generator loads them.\n"
    "--quant stores every linear layer's weight quantized (embeddings, norms, biases and a tied\n"
    "head stay): GGML's Q8_0, Q4_0, Q4_1 (blocks of 32; a GGUF tensor already in that format is\n"
    "kept as it is) or affine int8/int4 with --group-size weights per scale and bias (default\n"
    "64). Every layer's input width must be a multiple of the block or group.\n"
    "Weights holding NaN or infinity are refused. The prefill time and the token rate go to\n"
    "stderr at the end.\n";

enum {
  O_CKPT,
  O_WEIGHTS,
  O_CONFIG,
  O_PROMPT,
  O_TOKENS,
  O_TEMP,
  O_TOPK,
  O_TOPP,
  O_GREEDY,
  O_SEED,
  O_SEQ,
  O_BATCH,
  O_QUANT,
  O_TOKENIZER,
  O_PRECISION,
  O_ADAPTER,
  O_GROUP,
  O_COUNT
};

/* Tokens printed per generate call: the text streams with one call per chunk. */
#define CHUNK 16

static int emit(const mn_tokenizer *tok, const uint32_t *ids, size_t n) {
  if (!tok) {
    for (size_t i = 0; i < n; i++)
      if (fputc((int)ids[i], stdout) == EOF) return -1;
    return 0;
  }
  size_t len = 0;
  if (mn_tokenizer_decode(tok, ids, n, NULL, 0, &len) != MN_OK) return -1;
  char *buf = malloc(len + 1);
  int rc = buf && mn_tokenizer_decode(tok, ids, n, buf, len + 1, &len) == MN_OK &&
                   fwrite(buf, 1, len, stdout) == len
               ? 0
               : -1;
  free(buf);
  return rc;
}

static bool is_gguf(const char *path) {
  FILE *f = fopen(path, "rb");
  char magic[4] = {0};
  bool yes = f && fread(magic, 1, 4, f) == 4 && memcmp(magic, "GGUF", 4) == 0;
  if (f) fclose(f);
  return yes;
}

/* The base of --weights with --adapter merged in, written to a file in a fresh folder under
 * the temporary directory (*dir, removed by the caller), whose path goes to out. */
static int merge_adapter(const mn_model_config *cfg, const char *weights, const char *adapter,
                         const mn_session_options *options, char *dir, char *out, size_t cap) {
  mn_lora_config lora;
  if (mn_lora_config_load(adapter, &lora) != MN_OK)
    return cli_lib_fail(CMD, "cannot read --adapter");
  const char *prefix = NULL;
  if (mn_model_name_prefix(cfg, weights, &prefix) != MN_OK)
    return cli_lib_fail(CMD, "cannot read --weights");
  const char *tmp = getenv("TMPDIR");
  snprintf(dir, 4096, "%s/meganeura-merged-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (!mkdtemp(dir)) {
    dir[0] = '\0';
    fprintf(stderr, "%s: cannot create a temporary folder for the merged weights\n", CMD);
    return CLI_FAIL;
  }
  snprintf(out, cap, "%s/model.safetensors", dir);
  mn_model_options mo = {.name_prefix = prefix, .lora = &lora};
  mn_graph *g = NULL;
  mn_session *s = NULL;
  int rc = CLI_OK;
  if (mn_model_build_with(cfg, 1, 1, &mo, &g) != MN_OK)
    rc = cli_lib_fail(CMD, "cannot build the adapted model");
  else if (mn_build_inference_session(g, options, &s) != MN_OK)
    rc = cli_lib_fail(CMD, "cannot build the session");
  else if (mn_session_load_safetensors_flags(s, weights, MN_LOAD_STRICT_FROZEN) != MN_OK)
    rc = cli_lib_fail(CMD, "cannot load --weights");
  else if (mn_lora_load(s, g, adapter) != MN_OK)
    rc = cli_lib_fail(CMD, "cannot load --adapter");
  else if (mn_lora_save_merged(s, g, &lora, out) != MN_OK)
    rc = cli_lib_fail(CMD, "cannot merge --adapter");
  mn_session_free(s);
  mn_graph_free(g);
  return rc;
}

static void remove_merged(const char *dir, const char *file) {
  if (!dir[0]) return;
  remove(file);
  rmdir(dir);
}

typedef struct gen_args {
  long n_tokens, top_k, seed, seq, batch;
  float temp, top_p;
  mn_generator_options gopt;
} gen_args;

static int parse(cli_opt *o, gen_args *a) {
  a->gopt = mn_generator_options_default();
  if (cli_pos_long(CMD, &o[O_TOKENS], &a->n_tokens) ||
      cli_nonneg_float(CMD, &o[O_TEMP], &a->temp) || cli_nonneg_long(CMD, &o[O_TOPK], &a->top_k) ||
      cli_pos_float(CMD, &o[O_TOPP], &a->top_p) || cli_nonneg_long(CMD, &o[O_SEED], &a->seed) ||
      cli_pos_long(CMD, &o[O_SEQ], &a->seq) || cli_pos_long(CMD, &o[O_BATCH], &a->batch) ||
      cli_require(CMD, &o[O_PROMPT]) || cli_precision(CMD, &o[O_PRECISION], &a->gopt.session, NULL))
    return CLI_USAGE;
  if (o[O_CKPT].seen == o[O_WEIGHTS].seen) {
    fprintf(stderr, "%s: give exactly one of --checkpoint and --weights\n", CMD);
    return CLI_USAGE;
  }
  if (!*o[O_PROMPT].value) {
    fprintf(stderr, "%s: --prompt must not be empty\n", CMD);
    return CLI_USAGE;
  }
  if (a->top_p > 1) {
    fprintf(stderr, "%s: --top-p must be in (0, 1], got '%s'\n", CMD, o[O_TOPP].value);
    return CLI_USAGE;
  }
  static const struct {
    const char *name;
    mn_quant quant;
  } quants[] = {{"none", MN_QUANT_NONE},        {"q8_0", MN_QUANT_Q8_0},
                {"q4_0", MN_QUANT_Q4_0},        {"q4_1", MN_QUANT_Q4_1},
                {"int8", MN_QUANT_AFFINE_INT8}, {"int4", MN_QUANT_AFFINE_INT4}};
  const char *q = o[O_QUANT].seen ? o[O_QUANT].value : "none";
  a->gopt.quant = (mn_quant)-1;
  for (size_t i = 0; i < sizeof quants / sizeof quants[0]; i++)
    if (strcmp(q, quants[i].name) == 0) a->gopt.quant = quants[i].quant;
  if ((int)a->gopt.quant < 0) {
    fprintf(stderr, "%s: --quant must be none, q8_0, q4_0, q4_1, int8 or int4, got '%s'\n", CMD, q);
    return CLI_USAGE;
  }
  if (o[O_GROUP].seen) {
    const char *g = o[O_GROUP].value;
    if (strcmp(g, "32") && strcmp(g, "64") && strcmp(g, "128")) {
      fprintf(stderr, "%s: --group-size must be 32, 64 or 128, got '%s'\n", CMD, g);
      return CLI_USAGE;
    }
    a->gopt.group_size = atoi(g);
  }
  if (o[O_GREEDY].seen) a->temp = 0;
  if (o[O_ADAPTER].seen && o[O_CKPT].seen) {
    fprintf(stderr, "%s: --adapter applies to --weights (a base model), not --checkpoint\n", CMD);
    return CLI_USAGE;
  }
  return CLI_OK;
}

/* Config and tokenizer: from their options, else from a GGUF --weights. */
static int load_model_files(cli_opt *o, const char *weights, mn_model_config *cfg,
                            mn_tokenizer **tok) {
  bool gguf = weights && is_gguf(weights);
  const char *config = o[O_CONFIG].seen ? o[O_CONFIG].value : gguf ? weights : NULL;
  if (!config) {
    fprintf(stderr, "%s: --config is required (only a GGUF --weights carries its own)\n", CMD);
    return CLI_USAGE;
  }
  if (cli_load_config(CMD, config, cfg)) return CLI_FAIL;
  const char *tokenizer = o[O_TOKENIZER].seen ? o[O_TOKENIZER].value : gguf ? weights : NULL;
  if (tokenizer && mn_tokenizer_load(tokenizer, tok) != MN_OK)
    return cli_lib_fail(CMD, "cannot load tokenizer");
  return CLI_OK;
}

static int encode_prompt(const char *p, const mn_tokenizer *tok, long vocab, uint32_t **ids,
                         size_t *n) {
  size_t np = strlen(p);
  *ids = malloc((np + 1) * sizeof **ids);
  if (!*ids) return fprintf(stderr, "%s: out of memory\n", CMD), CLI_FAIL;
  if (tok) {
    if (mn_tokenizer_encode(tok, p, np, *ids, np + 1, n) != MN_OK)
      return cli_lib_fail(CMD, "cannot tokenize --prompt");
  } else {
    for (size_t i = 0; i < np; i++)
      (*ids)[i] = (unsigned char)p[i];
    *n = np;
  }
  for (size_t i = 0; i < *n; i++)
    if ((long)(*ids)[i] >= vocab) {
      fprintf(stderr, "%s: prompt token %u is outside the vocabulary (%ld)\n", CMD, (*ids)[i],
              vocab);
      return CLI_FAIL;
    }
  if (*n == 0) {
    fprintf(stderr, "%s: --prompt gives no tokens\n", CMD);
    return CLI_USAGE;
  }
  return CLI_OK;
}

static int write_failed(void) {
  fprintf(stderr, "%s: cannot write the generated text\n", CMD);
  return CLI_FAIL;
}

/* Prefill and decode in chunks; batch 1 streams, a batch prints its rows at the end. */
static int run(mn_generator *gen, const gen_args *a, const uint32_t *ids, size_t n_ids,
               const mn_tokenizer *tok, const char *prompt) {
  size_t b = (size_t)a->batch, total = (size_t)a->n_tokens;
  uint32_t *prompts = malloc(b * n_ids * sizeof *prompts);
  uint32_t *out = malloc(b * total * sizeof *out), *chunk = malloc(b * CHUNK * sizeof *chunk);
  if (!prompts || !out || !chunk) {
    free(prompts), free(out), free(chunk);
    return fprintf(stderr, "%s: out of memory\n", CMD), CLI_FAIL;
  }
  for (size_t r = 0; r < b; r++)
    memcpy(prompts + r * n_ids, ids, n_ids * sizeof *ids);
  mn_sampling s = {
      .temperature = a->temp, .top_k = (int)a->top_k, .top_p = a->top_p, .seed = (uint64_t)a->seed};
  if (b == 1) fputs(prompt, stdout);
  double prefill_ms = 0, decode_ms = 0;
  int rc = CLI_OK;
  for (size_t done = 0; done < total && rc == CLI_OK;) {
    size_t n = total - done < CHUNK ? total - done : CHUNK;
    mn_generator_stats st;
    if (mn_generator_generate(gen, done ? NULL : prompts, done ? 0 : n_ids, &s, chunk, n) !=
            MN_OK ||
        mn_generator_get_stats(gen, &st) != MN_OK) {
      rc = cli_lib_fail(CMD, "generation failed");
      break;
    }
    if (!done) prefill_ms = st.prefill_ms;
    decode_ms += st.ms_per_token * (double)n;
    for (size_t r = 0; r < b; r++)
      memcpy(out + r * total + done, chunk + r * n, n * sizeof *out);
    if (b == 1 && emit(tok, chunk, n)) rc = write_failed();
    fflush(stdout);
    done += n;
  }
  for (size_t r = 0; rc == CLI_OK && b > 1 && r < b; r++)
    if (fputs(prompt, stdout) == EOF || emit(tok, out + r * total, total) ||
        fputc('\n', stdout) == EOF)
      rc = write_failed();
  if (rc == CLI_OK && b == 1 && isatty(STDOUT_FILENO)) fputc('\n', stdout);
  if (rc == CLI_OK)
    fprintf(stderr, "%s: prefill %zu tokens in %.1f ms; %zu x %zu tokens at %.1f tokens/s\n", CMD,
            n_ids, prefill_ms, b, total,
            decode_ms > 0 ? (double)(b * total) / (decode_ms * 1e-3) : 0.0);
  free(prompts);
  free(out);
  free(chunk);
  return rc;
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
      [O_TOPP] = {"--top-p", 1, NULL, 0},
      [O_GREEDY] = {"--greedy", 0, NULL, 0},
      [O_SEED] = {"--seed", 1, NULL, 0},
      [O_SEQ] = {"--seq", 1, NULL, 0},
      [O_BATCH] = {"--batch", 1, NULL, 0},
      [O_QUANT] = {"--quant", 1, NULL, 0},
      [O_TOKENIZER] = {"--tokenizer", 1, NULL, 0},
      [O_PRECISION] = {"--precision", 1, NULL, 0},
      [O_ADAPTER] = {"--adapter", 1, NULL, 0},
      [O_GROUP] = {"--group-size", 1, NULL, 0},
  };
  int rc = cli_parse(CMD, argc, argv, o, O_COUNT, USAGE);
  if (rc) return rc == CLI_HELP ? CLI_OK : rc;
  gen_args a = {.n_tokens = 200, .temp = 1.0f, .top_p = 1.0f, .batch = 1};
  if ((rc = parse(o, &a))) return rc;
  const char *weights = o[O_WEIGHTS].seen ? o[O_WEIGHTS].value : o[O_CKPT].value;
  mn_model_config cfg;
  mn_tokenizer *tok = NULL;
  uint32_t *ids = NULL;
  size_t n_ids = 0;
  mn_generator *gen = NULL;
  char dir[4096] = "", merged[4200] = "";
  rc = load_model_files(o, weights, &cfg, &tok);
  if (!rc) rc = encode_prompt(o[O_PROMPT].value, tok, (long)cfg.vocab_size, &ids, &n_ids);
  /* Without --tokens, 200 or what a GPT-2's positions leave after the prompt. */
  if (!rc && !o[O_TOKENS].seen && cfg.family == MN_MODEL_GPT2 &&
      (int64_t)n_ids + a.n_tokens > (a.seq ? a.seq : cfg.max_positions) &&
      (a.seq ? a.seq : cfg.max_positions) > (int64_t)n_ids)
    a.n_tokens = (long)((a.seq ? a.seq : cfg.max_positions) - (int64_t)n_ids);
  a.gopt.batch = a.batch;
  a.gopt.max_seq = a.seq ? a.seq : (int64_t)n_ids + a.n_tokens;
  if (!rc && (int64_t)n_ids + a.n_tokens > a.gopt.max_seq) {
    fprintf(stderr,
            "%s: the prompt's %zu tokens and --tokens %ld need %lld positions; --seq is %ld\n", CMD,
            n_ids, a.n_tokens, (long long)n_ids + a.n_tokens, a.seq);
    rc = CLI_USAGE;
  }
  if (!rc && cfg.family == MN_MODEL_GPT2 && a.gopt.max_seq > cfg.max_positions) {
    fprintf(stderr,
            "%s: %lld positions (the prompt and --tokens, or --seq) are more than GPT-2's "
            "n_positions %lld\n",
            CMD, (long long)a.gopt.max_seq, (long long)cfg.max_positions);
    rc = CLI_USAGE;
  }
  if (!rc && o[O_ADAPTER].seen) {
    rc = merge_adapter(&cfg, weights, o[O_ADAPTER].value, &a.gopt.session, dir, merged,
                       sizeof merged);
    weights = merged;
  }
  if (!rc && mn_generator_new(&cfg, weights, &a.gopt, &gen) != MN_OK)
    rc =
        cli_lib_fail(CMD, o[O_WEIGHTS].seen ? "cannot load --weights" : "cannot load --checkpoint");
  remove_merged(dir, merged);
  if (!rc) rc = run(gen, &a, ids, n_ids, tok, o[O_PROMPT].value);
  mn_generator_free(gen);
  mn_tokenizer_free(tok);
  free(ids);
  return rc;
}
