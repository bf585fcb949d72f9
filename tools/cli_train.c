/* meganeura train: AdamW on random windows of a token file, with a cosine schedule,
 * progress, metrics CSV, an SVG of the training and held-out loss, checkpoints and resume.
 * Resume and checkpoint metadata live in cli_resume.c, evaluation in cli_eval.c, output
 * checks in cli_outputs.c. */
#include "tools/cli_train.h"

#include "tools/cli_instruct.h"

#include <errno.h>
#include <math.h>
#include <regex.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *const CMD = "meganeura train";
static const char USAGE[] =
    "usage: meganeura train --config CONFIG.json --data FILE --batch B --seq T --steps N --lr LR\n"
    "         [--tokenizer tokenizer.json | --data-format text|u16|u32]\n"
    "         [--init-from FILE.safetensors] [--warmup W] [--weight-decay WD] [--grad-clip C]\n"
    "         [--val-data FILE | --val-fraction F] [--eval-every K] [--eval-batches N]\n"
    "         [--checkpoint-every K] [--keep-last N] [--out DIR] [--resume CKPT] [--seed S]\n"
    "         [--metrics FILE.csv] [--plot FILE.svg] [--precision f32|tf32|bf16|f16]\n"
    "         [--grad-accum K] [--freeze REGEX] [--allow-nonfinite] [--ranks N | --gpus N]\n"
    "         [--launcher auto|env|none] [--group-id-file PATH]\n"
    "         [--lora-rank R [--lora-alpha A] [--lora-targets LIST] [--lora-dropout P]\n"
    "          [--merge-lora]] [--chat-template chatml|plain] [--pack]\n"
    "Trains with AdamW on random windows of --data (text: each byte is a token, vocabulary\n"
    "256; with --tokenizer: its ids; u16/u32: little-endian token ids). The learning rate\n"
    "warms up linearly for W steps, then decays by a cosine to 10% of LR. Final weights go\n"
    "to OUT/model.safetensors (OUT defaults to meganeura-out); checkpoints to\n"
    "OUT/checkpoint-STEP.safetensors (--keep-last N keeps the newest N).\n"
    "Held-out loss: the mean loss over N (default 8) fixed batches of windows of --val-data\n"
    "(or of the last fraction F of --data, then not trained on), every K steps and at the end.\n"
    "--resume CKPT continues a run bit for bit from its checkpoint alone: the model, the data,\n"
    "the sampler and the options are recorded in it (options given must agree; --steps may\n"
    "grow); the metrics CSV is cut back to the checkpoint's step.\n"
    "--precision: f32, tf32 (f32 with TF32 matmuls), or bf16 / f16 mixed precision (fp32\n"
    "master weights; f16 scales the loss dynamically). The default is bf16 on a\n"
    "CUDA device of compute capability 8.0 or newer, else f32; a resumed run keeps its own.\n"
    "--grad-accum K: each step averages the gradients of K batches of B windows before\n"
    "its update, as one step of batch K*B would (a step's loss is their mean).\n"
    "--ranks N: N data-parallel ranks on the CPU backend (threads), each training on its\n"
    "own B windows of every step's N*B, as one rank of batch N*B would; rank 0 reports.\n"
    "--gpus N: the same with N ranks on CUDA devices 0..N-1, one process each (NCCL); the\n"
    "first rank that fails stops the others.\n"
    "Under torchrun, srun or mpirun (RANK/WORLD_SIZE, SLURM_PROCID/SLURM_NTASKS or\n"
    "OMPI_COMM_WORLD_RANK/SIZE with a world size above 1; --launcher env takes any size,\n"
    "--launcher none ignores them) each process is one rank on device LOCAL_RANK. Rank 0\n"
    "hands the NCCL id to the others at MASTER_ADDR, port MN_GROUP_PORT (default\n"
    "MASTER_PORT + 1), or through --group-id-file PATH on a file system every rank sees\n"
    "(remove the file before a new job).\n"
    "--freeze REGEX: parameters whose names match the POSIX extended regular expression (say\n"
    "'h\\.[0-5]\\.' or 'wte|wpe') are frozen: no gradient, no optimizer state, no update.\n"
    "--init-from weights holding NaN or infinity are refused unless --allow-nonfinite.\n"
    "--lora-rank R: LoRA fine-tuning as PEFT does it: adapters of rank R on the layers named\n"
    "by --lora-targets (comma-separated module names, default all-linear: q_proj,...,down_proj\n"
    "for Llama, c_attn,c_proj,c_fc for GPT-2), scaled by A / R (--lora-alpha, default 2R),\n"
    "--lora-dropout on their input (default 0); the base is frozen. OUT gets the adapter as\n"
    "PEFT saves it (adapter_config.json, adapter_model.safetensors); --merge-lora also writes\n"
    "OUT/merged with the adapters merged, which transformers loads without peft.\n"
    "Instruction data: --data FILE.jsonl (and --val-data) of {\"prompt\", \"completion\"} or\n"
    "{\"messages\": [{\"role\", \"content\"}, ...]} records, needs --tokenizer; rendered with\n"
    "--chat-template (chatml, the default: <|im_start|>role ... <|im_end|>; or plain), the\n"
    "loss counting only completion / assistant tokens. One example per row of --seq tokens\n"
    "(padded), or with --pack examples packed into full rows, attention and positions kept\n"
    "inside each example.\n";

enum {
  O_CONFIG,
  O_DATA,
  O_TOKENIZER,
  O_FORMAT,
  O_INIT,
  O_BATCH,
  O_SEQ,
  O_STEPS,
  O_LR,
  O_WARMUP,
  O_WD,
  O_CLIP,
  O_CKEVERY,
  O_KEEP,
  O_OUT,
  O_RESUME,
  O_SEED,
  O_METRICS,
  O_PLOT,
  O_VAL_DATA,
  O_VAL_FRACTION,
  O_EVAL_EVERY,
  O_EVAL_BATCHES,
  O_PRECISION,
  O_GRAD_ACCUM,
  O_FREEZE,
  O_ALLOW_NONFINITE,
  O_LORA_RANK,
  O_LORA_ALPHA,
  O_LORA_TARGETS,
  O_LORA_DROPOUT,
  O_MERGE_LORA,
  O_CHAT_TEMPLATE,
  O_PACK,
  O_RANKS,
  O_GPUS,
  O_LAUNCHER,
  O_GROUP_ID_FILE,
  O_COUNT
};

static const char CSV_HEADER[] = "step,loss,lr,tokens_per_s,val_loss,val_ppl,precision\n";

static float lr_at(const train_args *a, long step) {
  long warmup = a->warmup < a->steps ? a->warmup : a->steps - 1;
  if (step < warmup) return a->lr * (float)(step + 1) / (float)warmup;
  double p = (double)(step - warmup) / (double)(a->steps - warmup > 0 ? a->steps - warmup : 1);
  if (p > 1) p = 1;
  return a->lr * (float)(0.1 + 0.9 * 0.5 * (1.0 + cos(3.14159265358979323846 * p)));
}

static void fmt_eta(double s, char *buf, size_t n) {
  if (!(s >= 0) || s > 1e7) s = 0;
  long t = (long)(s + 0.5);
  if (t >= 3600)
    snprintf(buf, n, "%ldh%02ldm", t / 3600, t / 60 % 60);
  else
    snprintf(buf, n, "%ldm%02lds", t / 60, t % 60);
}

static bool is_jsonl(const char *path) {
  size_t n = path ? strlen(path) : 0;
  return n >= 6 && strcmp(path + n - 6, ".jsonl") == 0;
}

/* --chat-template and --pack, for instruction data only. */
static int instruct_args(cli_opt *o, train_args *a) {
  bool instruct = is_jsonl(a->data);
  if (instruct && o[O_FORMAT].seen) {
    fprintf(stderr, "%s: --data-format does not apply to instruction data (.jsonl)\n", CMD);
    return CLI_USAGE;
  }
  if (a->val_data && is_jsonl(a->val_data) != instruct) {
    fprintf(stderr, "%s: --val-data must be %s like --data\n", CMD,
            instruct ? "instruction data (.jsonl)" : "tokens, not instruction data,");
    return CLI_USAGE;
  }
  if (!instruct && (o[O_CHAT_TEMPLATE].seen || o[O_PACK].seen)) {
    fprintf(stderr, "%s: %s applies to instruction data (--data FILE.jsonl) only\n", CMD,
            o[O_CHAT_TEMPLATE].seen ? "--chat-template" : "--pack");
    return CLI_USAGE;
  }
  if (!instruct) return CLI_OK;
  const char *name = o[O_CHAT_TEMPLATE].seen ? o[O_CHAT_TEMPLATE].value : "chatml";
  if (!(a->chat_template = cli_chat_template(name))) {
    fprintf(stderr, "%s: --chat-template must be chatml or plain, got '%s'\n", CMD, name);
    return CLI_USAGE;
  }
  a->pack = o[O_PACK].seen;
  return CLI_OK;
}

static int check_args(cli_opt *o, train_args *a, bool config_known) {
  if (cli_pos_long(CMD, &o[O_BATCH], &a->batch) || cli_pos_long(CMD, &o[O_SEQ], &a->seq) ||
      cli_pos_long(CMD, &o[O_STEPS], &a->steps) || cli_pos_float(CMD, &o[O_LR], &a->lr) ||
      cli_nonneg_long(CMD, &o[O_WARMUP], &a->warmup) || cli_nonneg_float(CMD, &o[O_WD], &a->wd) ||
      cli_pos_float(CMD, &o[O_CLIP], &a->clip) || cli_pos_long(CMD, &o[O_CKEVERY], &a->ck_every) ||
      cli_pos_long(CMD, &o[O_KEEP], &a->keep_last) || cli_nonneg_long(CMD, &o[O_SEED], &a->seed) ||
      cli_pos_float(CMD, &o[O_VAL_FRACTION], &a->val_fraction) ||
      cli_pos_long(CMD, &o[O_EVAL_EVERY], &a->eval_every) ||
      cli_pos_long(CMD, &o[O_EVAL_BATCHES], &a->eval_batches) ||
      cli_pos_long(CMD, &o[O_GRAD_ACCUM], &a->grad_accum) ||
      cli_pos_long(CMD, &o[O_RANKS], &a->ranks) || cli_pos_long(CMD, &o[O_GPUS], &a->gpus))
    return CLI_USAGE;
  if (a->ranks > 64 || a->gpus > 64) {
    fprintf(stderr, "%s: %s must be at most 64, got %ld\n", CMD,
            a->gpus > 64 ? "--gpus" : "--ranks", a->gpus > 64 ? a->gpus : a->ranks);
    return CLI_USAGE;
  }
  if (o[O_RANKS].seen && o[O_GPUS].seen) {
    fprintf(stderr,
            "%s: give --ranks (CPU threads) or --gpus (one process per CUDA device), not "
            "both\n",
            CMD);
    return CLI_USAGE;
  }
  /* In-process ranks are threads of the CPU backend. */
  if (a->ranks > 1) a->options.backend = MN_BACKEND_CPU;
  a->group_id_file = o[O_GROUP_ID_FILE].value;
  /* After the launcher's device is known: the default precision depends on it. */
  if (cli_launch_args(a, o[O_LAUNCHER].value, o[O_RANKS].seen) ||
      cli_precision(CMD, &o[O_PRECISION], &a->options, &a->precision))
    return CLI_USAGE;
  if (a->grad_accum > 1024) {
    fprintf(stderr, "%s: --grad-accum must be at most 1024, got %ld\n", CMD, a->grad_accum);
    return CLI_USAGE;
  }
  const int req[] = {O_CONFIG, O_DATA, O_BATCH, O_SEQ, O_STEPS, O_LR};
  for (size_t i = config_known ? 1 : 0; i < sizeof req / sizeof req[0]; i++)
    if (cli_require(CMD, &o[req[i]])) return CLI_USAGE;
  const char *fmt = o[O_FORMAT].value;
  if (fmt && strcmp(fmt, "text") && strcmp(fmt, "u16") && strcmp(fmt, "u32")) {
    fprintf(stderr, "%s: --data-format must be text, u16 or u32, got '%s'\n", CMD, fmt);
    return CLI_USAGE;
  }
  if (fmt && strcmp(fmt, "text") && o[O_TOKENIZER].seen) {
    fprintf(stderr, "%s: --tokenizer applies to text data only, not --data-format %s\n", CMD, fmt);
    return CLI_USAGE;
  }
  if (a->val_fraction >= 1) {
    fprintf(stderr, "%s: --val-fraction must be below 1, got '%s'\n", CMD, o[O_VAL_FRACTION].value);
    return CLI_USAGE;
  }
  if (o[O_VAL_DATA].seen && o[O_VAL_FRACTION].seen) {
    fprintf(stderr, "%s: give --val-data or --val-fraction, not both\n", CMD);
    return CLI_USAGE;
  }
  if ((o[O_EVAL_EVERY].seen || o[O_EVAL_BATCHES].seen) && !o[O_VAL_DATA].seen &&
      !o[O_VAL_FRACTION].seen) {
    fprintf(stderr, "%s: %s needs --val-data or --val-fraction\n", CMD,
            o[O_EVAL_EVERY].seen ? "--eval-every" : "--eval-batches");
    return CLI_USAGE;
  }
  a->config = o[O_CONFIG].value;
  a->data = o[O_DATA].value;
  a->format = o[O_FORMAT].value;
  a->tokenizer = o[O_TOKENIZER].value;
  a->val_data = o[O_VAL_DATA].value;
  a->init = o[O_INIT].value;
  a->resume = o[O_RESUME].value;
  a->metrics = o[O_METRICS].value;
  a->plot = o[O_PLOT].value;
  a->out = o[O_OUT].seen ? o[O_OUT].value : "meganeura-out";
  a->allow_nonfinite = o[O_ALLOW_NONFINITE].seen;
  a->freeze = o[O_FREEZE].value;
  if (a->freeze) {
    regex_t re;
    if (regcomp(&re, a->freeze, REG_EXTENDED | REG_NOSUB) != 0) {
      fprintf(stderr, "%s: --freeze '%s' is not a POSIX extended regular expression\n", CMD,
              a->freeze);
      return CLI_USAGE;
    }
    regfree(&re);
  }
  if (instruct_args(o, a)) return CLI_USAGE;
  const cli_opt *lora[CLI_LORA_OPTIONS] = {&o[O_LORA_RANK], &o[O_LORA_ALPHA], &o[O_LORA_TARGETS],
                                           &o[O_LORA_DROPOUT], &o[O_MERGE_LORA]};
  return cli_lora_options(CMD, lora, a);
}

typedef struct run {
  mn_model_config cfg;
  mn_tokenizer *tok;
  uint32_t *data, *val, *ids, *labels, *positions;
  cli_rows rows, val_rows; /* instruction data, instead of data and val */
  size_t n_data, n_val;
  const char *prefix;
  uint64_t data_hash, tokenizer_hash;
  mn_graph *g;
  mn_session *s;
  cli_eval eval;
  bool evaluating;
  long *steps_log, *val_steps;
  float *loss_log, *val_log;
  size_t n_log, n_val_log;
  FILE *csv;
} run;

static void run_free(run *r) {
  mn_tokenizer_free(r->tok);
  free(r->data);
  free(r->val);
  free(r->ids);
  free(r->labels);
  free(r->positions);
  cli_rows_free(&r->rows);
  cli_rows_free(&r->val_rows);
  cli_eval_free(&r->eval);
  mn_session_free(r->s);
  mn_graph_free(r->g);
  free(r->steps_log);
  free(r->loss_log);
  free(r->val_steps);
  free(r->val_log);
  if (r->csv) fclose(r->csv);
}

/* The identity of a tokenizer: FNV-1a of its file's bytes. */
static int hash_file(const char *path, uint64_t *out) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "%s: cannot read '%s': %s\n", CMD, path, strerror(errno));
    return CLI_FAIL;
  }
  uint64_t h = CLI_FNV_OFFSET;
  unsigned char buf[1 << 14];
  for (size_t got; (got = fread(buf, 1, sizeof buf, f)) > 0;)
    h = cli_fnv1a(h, buf, got);
  fclose(f);
  *out = h;
  return CLI_OK;
}

static int check_vocab(const run *r, const uint32_t *ids, size_t n, const char *path) {
  for (size_t i = 0; i < n; i++)
    if ((int64_t)ids[i] >= r->cfg.vocab_size) {
      fprintf(stderr, "%s: token %u at position %zu of '%s' is outside the vocabulary (%lld)\n",
              CMD, ids[i], i, path, (long long)r->cfg.vocab_size);
      return CLI_FAIL;
    }
  return CLI_OK;
}

/* Instruction data: rows of examples (and held-out rows) instead of a token stream. */
static int load_rows(const train_args *a, const resume_point *rp, run *r) {
  int rc = cli_rows_load(CMD, a->data, r->tok, a->chat_template, a->seq, a->pack, (uint64_t)a->seed,
                         &r->rows);
  if (rc) return rc;
  r->data_hash = cli_rows_hash(&r->rows);
  if (rp->self_contained && r->data_hash != rp->data_hash) {
    fprintf(stderr, "%s: --data '%s' is not the data the checkpoint was trained on\n", CMD,
            a->data);
    return CLI_FAIL;
  }
  if (check_vocab(r, r->rows.ids, r->rows.n * r->rows.seq, a->data)) return CLI_FAIL;
  if (a->rank == 0)
    fprintf(stderr,
            "%s: %zu examples (%zu cut to --seq, %zu without a counted token dropped) in %zu "
            "rows%s, %zu of %zu tokens counted\n",
            CMD, r->rows.examples, r->rows.truncated, r->rows.dropped, r->rows.n,
            a->pack ? " (packed)" : "", r->rows.counted, r->rows.n * r->rows.seq);
  if (a->val_data) {
    rc = cli_rows_load(CMD, a->val_data, r->tok, a->chat_template, a->seq, a->pack,
                       (uint64_t)a->seed, &r->val_rows);
    if (!rc) rc = check_vocab(r, r->val_rows.ids, r->val_rows.n * r->val_rows.seq, a->val_data);
  } else if (a->val_fraction > 0) {
    rc = cli_rows_split(CMD, &r->rows, a->val_fraction, &r->val_rows);
  }
  return rc;
}

static int load_data(const train_args *a, const resume_point *rp, run *r) {
  if (a->tokenizer) {
    if (hash_file(a->tokenizer, &r->tokenizer_hash)) return CLI_FAIL;
    if (mn_tokenizer_load(a->tokenizer, &r->tok) != MN_OK)
      return cli_lib_fail(CMD, "cannot load tokenizer");
  }
  if (rp->self_contained && r->tokenizer_hash != rp->tokenizer_hash) {
    fprintf(stderr, "%s: --tokenizer '%s' is not the tokenizer the checkpoint was trained with\n",
            CMD, a->tokenizer ? a->tokenizer : "(none)");
    return CLI_FAIL;
  }
  if (a->chat_template) return load_rows(a, rp, r);
  if (cli_load_tokens(CMD, a->data, a->format, r->tok, &r->data, &r->n_data)) return CLI_FAIL;
  r->data_hash = cli_fnv1a(CLI_FNV_OFFSET, r->data, r->n_data * sizeof *r->data);
  if (rp->self_contained && r->data_hash != rp->data_hash) {
    fprintf(stderr, "%s: --data '%s' is not the data the checkpoint was trained on\n", CMD,
            a->data);
    return CLI_FAIL;
  }
  if (check_vocab(r, r->data, r->n_data, a->data)) return CLI_FAIL;
  if (a->val_data) {
    if (cli_load_tokens(CMD, a->val_data, a->format, r->tok, &r->val, &r->n_val)) return CLI_FAIL;
    if (check_vocab(r, r->val, r->n_val, a->val_data)) return CLI_FAIL;
  } else if (a->val_fraction > 0) {
    /* The tail of --data is held out: the sampler never draws windows from it. */
    size_t held = (size_t)((double)r->n_data * a->val_fraction);
    if (!(r->val = malloc((held ? held : 1) * sizeof *r->val)))
      return fprintf(stderr, "%s: out of memory\n", CMD), CLI_FAIL;
    memcpy(r->val, r->data + (r->n_data - held), held * sizeof *r->val);
    r->n_val = held;
    r->n_data -= held;
  }
  if (r->n_data < (size_t)a->seq + 1) {
    fprintf(stderr, "%s: '%s' holds %zu training tokens, fewer than --seq + 1 = %ld\n", CMD,
            a->data, r->n_data, a->seq + 1);
    return CLI_FAIL;
  }
  return CLI_OK;
}

/* --freeze: the parameters whose names match `pattern` (checked by check_args) are frozen; a
 * pattern that matches none is a usage error, as a typo would train everything. */
static int freeze(const char *pattern, mn_graph *g, bool report) {
  regex_t re;
  if (regcomp(&re, pattern, REG_EXTENDED | REG_NOSUB) != 0) return CLI_USAGE;
  size_t frozen = 0, params = 0;
  int64_t values = 0;
  for (size_t i = 0; i < mn_graph_num_nodes(g); i++) {
    mn_node_info info;
    if (mn_graph_node(g, (mn_node)i, &info) != MN_OK || strcmp(info.op, "parameter")) continue;
    params++;
    if (regexec(&re, info.name, 0, NULL, 0) != 0) continue;
    mn_set_trainable(g, (mn_node)i, false);
    frozen++;
    values += mn_tensor_type_numel(&info.type);
  }
  regfree(&re);
  if (!frozen) {
    fprintf(stderr, "%s: --freeze '%s' matches no parameter\n", CMD, pattern);
    return CLI_USAGE;
  }
  if (report)
    fprintf(stderr, "%s: froze %zu of %zu parameters (%lld values)\n", CMD, frozen, params,
            (long long)values);
  return CLI_OK;
}

static int build(const train_args *a, const resume_point *rp, run *r) {
  r->prefix = r->cfg.family == MN_MODEL_GPT2 ? "transformer." : "model.";
  if (rp->self_contained) r->prefix = rp->name_prefix;
  if (a->init && mn_model_name_prefix(&r->cfg, a->init, &r->prefix) != MN_OK)
    return cli_lib_fail(CMD, "cannot read --init-from");
  /* Training reads the loss alone: without the logits output, their gradient overwrites them
   * (a [batch, seq, vocab] buffer less on the device). */
  mn_model_options mo = {.name_prefix = r->prefix,
                         .lora = a->lora_rank ? &a->lora : NULL,
                         .loss_only = true,
                         .packed = a->pack != 0};
  if (mn_model_build_with(&r->cfg, a->batch, a->seq, &mo, &r->g) != MN_OK)
    return cli_lib_fail(CMD, "cannot build the model");
  if (a->freeze && freeze(a->freeze, r->g, a->rank == 0)) return CLI_USAGE;
  if (mn_build_session(r->g, &a->options, &r->s) != MN_OK)
    return cli_lib_fail(CMD, "cannot build the session");
  if (mn_session_set_grad_accumulation(r->s, (int)a->grad_accum) != MN_OK)
    return cli_lib_fail(CMD, "cannot set --grad-accum");
  if (mn_model_init_parameters(&r->cfg, r->g, r->s, (uint64_t)a->seed) != MN_OK)
    return cli_lib_fail(CMD, "cannot initialize the parameters");
  /* Under adapters the base file holds every frozen weight and no adapter. */
  unsigned load = (a->lora_rank ? MN_LOAD_STRICT_FROZEN : MN_LOAD_STRICT) |
                  (a->allow_nonfinite ? MN_LOAD_ALLOW_NONFINITE : 0);
  if (a->init && mn_session_load_safetensors_flags(r->s, a->init, load) != MN_OK)
    return cli_lib_fail(CMD, "cannot load --init-from");
  if (a->resume && mn_session_load_checkpoint(r->s, a->resume) != MN_OK)
    return cli_lib_fail(CMD, "cannot load --resume checkpoint");
  long eval_batches = a->eval_batches ? a->eval_batches : 8;
  mn_session_options eval_options = a->options;
  eval_options.group = NULL;
  bool lead = a->rank == 0; /* only rank 0 evaluates */
  if (lead && r->val) {
    if (cli_eval_init(CMD, &r->eval, r->g, r->s, &eval_options, a->batch, a->seq, eval_batches,
                      r->val, r->n_val))
      return CLI_FAIL;
    r->evaluating = true;
  } else if (lead && r->val_rows.n) {
    if (cli_eval_init_rows(CMD, &r->eval, r->g, r->s, &eval_options, a->batch, eval_batches,
                           &r->val_rows))
      return CLI_FAIL;
    r->evaluating = true;
  }
  size_t bt = (size_t)(a->batch * a->seq), n = (size_t)a->steps + 1;
  r->ids = malloc(bt * sizeof *r->ids);
  r->labels = malloc(bt * sizeof *r->labels);
  if (a->pack && !(r->positions = malloc(bt * sizeof *r->positions)))
    return fprintf(stderr, "%s: out of memory\n", CMD), CLI_FAIL;
  r->steps_log = malloc(n * sizeof *r->steps_log);
  r->loss_log = malloc(n * sizeof *r->loss_log);
  r->val_steps = malloc(n * sizeof *r->val_steps);
  r->val_log = malloc(n * sizeof *r->val_log);
  if (!r->ids || !r->labels || !r->steps_log || !r->loss_log || !r->val_steps || !r->val_log)
    return fprintf(stderr, "%s: out of memory\n", CMD), CLI_FAIL;
  return CLI_OK;
}

static int open_metrics(const train_args *a, long start, run *r) {
  if (!a->metrics) return CLI_OK;
  if (start > 0 && cli_metrics_cut(CMD, a->metrics, start, CSV_HEADER)) return CLI_FAIL;
  bool append = start > 0 && access(a->metrics, F_OK) == 0;
  r->csv = fopen(a->metrics, append ? "a" : "w");
  if (!r->csv) {
    fprintf(stderr, "%s: cannot write '%s': %s\n", CMD, a->metrics, strerror(errno));
    return CLI_FAIL;
  }
  if (!append) fputs(CSV_HEADER, r->csv);
  return CLI_OK;
}

static int save_final(const train_args *a, run *r) {
  char path[4200];
  snprintf(path, sizeof path, "%s/model.safetensors", a->out);
  if (a->lora_rank) {
    if (mn_lora_save(r->s, r->g, &a->lora, a->out) != MN_OK)
      return cli_lib_fail(CMD, "cannot save the adapter");
    fprintf(stderr, "%s: adapter saved to %s (adapter_config.json, adapter_model.safetensors)\n",
            CMD, a->out);
    if (!a->merge_lora) return CLI_OK;
    /* A folder of its own: beside adapter_config.json, transformers would load the adapter
     * onto the merged weights. */
    snprintf(path, sizeof path, "%s/merged", a->out);
    if (cli_mkdir_p(path)) {
      fprintf(stderr, "%s: cannot create '%s': %s\n", CMD, path, strerror(errno));
      return CLI_FAIL;
    }
    snprintf(path, sizeof path, "%s/merged/model.safetensors", a->out);
    if (mn_lora_save_merged(r->s, r->g, &a->lora, path) != MN_OK)
      return cli_lib_fail(CMD, "cannot save the merged weights");
    snprintf(path, sizeof path, "%s/merged/config.json", a->out);
    if (a->config && cli_copy_file(CMD, a->config, path)) return CLI_FAIL;
    fprintf(stderr, "%s: merged weights saved to %s/merged (model.safetensors, config.json)\n", CMD,
            a->out);
    return CLI_OK;
  }
  if (mn_session_save_safetensors(r->s, path) != MN_OK)
    return cli_lib_fail(CMD, "cannot save the final weights");
  fprintf(stderr, "%s: weights saved to %s\n", CMD, path);
  return CLI_OK;
}

static void write_plot(const train_args *a, const run *r) {
  char title[256];
  snprintf(title, sizeof title, "loss (batch %ld, seq %ld, lr %g)", a->batch, a->seq,
           (double)a->lr);
  const cli_series series[] = {
      {"training loss", "#1f77b4", r->steps_log, r->loss_log, r->n_log},
      {"held-out loss", "#d62728", r->val_steps, r->val_log, r->n_val_log},
  };
  /* The weights are saved already: a plot that cannot be written costs only the plot. */
  if (cli_write_svg(a->plot, series, r->evaluating ? 2 : 1, title))
    fprintf(stderr, "%s: warning: cannot write --plot '%s': %s\n", CMD, a->plot, strerror(errno));
}

/* Every rank draws the whole step's ranks * batch windows from the one sampler (so the
 * sampler's state is the same on every rank and in checkpoints) and keeps its own batch. */
static void draw_batch(const train_args *a, run *r, uint64_t *rng) {
  for (long k = 0; k < a->ranks * a->batch; k++) {
    long b = k - a->rank * a->batch;
    bool mine = b >= 0 && b < a->batch;
    if (a->chat_template) {
      size_t row = (size_t)(cli_rand(rng) % r->rows.n);
      if (mine)
        cli_rows_copy(&r->rows, row, r->ids + b * a->seq, r->labels + b * a->seq,
                      r->positions ? r->positions + b * a->seq : NULL);
      continue;
    }
    size_t off = (size_t)(cli_rand(rng) % (r->n_data - (size_t)a->seq));
    if (!mine) continue;
    memcpy(r->ids + b * a->seq, r->data + off, (size_t)a->seq * sizeof *r->ids);
    memcpy(r->labels + b * a->seq, r->data + off + 1, (size_t)a->seq * sizeof *r->ids);
  }
}

static int train_loop(const train_args *a, run *r, long start, uint64_t rng) {
  size_t bt = (size_t)(a->batch * a->seq);
  bool lead = a->rank == 0;
  int tty = lead && isatty(STDERR_FILENO);
  mn_session_stats stats;
  const char *backend = mn_session_get_stats(r->s, &stats) == MN_OK ? stats.backend : "?";
  size_t tokens = a->chat_template ? r->rows.n * r->rows.seq : r->n_data;
  if (lead && a->ranks > 1)
    fprintf(stderr, "%s: %ld data-parallel ranks of batch %ld\n", CMD, a->ranks, a->batch);
  if (lead)
    fprintf(stderr, "%s: %s backend, %s precision, %zu tokens of data, steps %ld..%ld\n", CMD,
            backend, a->precision, tokens, start + 1, a->steps);
  const ckpt_record rec = {a, &r->cfg, r->prefix, r->data_hash, r->tokenizer_hash};
  double t0 = cli_now();
  long done = 0;
  for (long step = start; step < a->steps; step++) {
    float lr = lr_at(a, step), loss = 0;
    /* One step is grad_accum batches; the session updates on the last (the mean loss shows). */
    for (long micro = 0; micro < a->grad_accum; micro++) {
      draw_batch(a, r, &rng);
      if ((r->positions &&
           mn_session_set_input_u32(r->s, "position_ids", r->positions, bt) != MN_OK) ||
          mn_session_set_input_u32(r->s, "input_ids", r->ids, bt) != MN_OK ||
          mn_session_set_input_u32(r->s, "labels", r->labels, bt) != MN_OK ||
          mn_session_set_adamw(r->s, lr, 0.9f, 0.95f, 1e-8f, a->wd) != MN_OK ||
          (a->clip > 0 && mn_session_set_grad_clip(r->s, a->clip) != MN_OK) ||
          mn_session_step(r->s) != MN_OK || mn_session_wait(r->s) != MN_OK)
        return cli_lib_fail(CMD, "training step failed");
      loss += mn_session_read_loss(r->s) / (float)a->grad_accum;
    }
    done++;
    bool last = step + 1 == a->steps;
    if (!isfinite(loss)) {
      if (lead)
        fprintf(stderr, "\n%s: the loss is not finite at step %ld; lower --lr\n", CMD, step + 1);
      return CLI_FAIL;
    }
    if (last && lead && save_final(a, r)) return CLI_FAIL;
    double el = cli_now() - t0, tps = (double)bt * (double)a->grad_accum * (double)a->ranks *
                                      (double)done / (el > 0 ? el : 1e-9);
    r->steps_log[r->n_log] = step + 1;
    r->loss_log[r->n_log++] = loss;
    char val[64] = "", cols[64] = ",";
    if (r->evaluating && (last || (a->eval_every && (step + 1) % a->eval_every == 0))) {
      float vl = 0;
      if (cli_eval_run(CMD, &r->eval, &vl)) return CLI_FAIL;
      r->val_steps[r->n_val_log] = step + 1;
      r->val_log[r->n_val_log++] = vl;
      snprintf(val, sizeof val, "  val %.4f  ppl %.2f", vl, exp(vl));
      snprintf(cols, sizeof cols, "%.6f,%.6g", vl, exp(vl));
    }
    if (r->csv)
      fprintf(r->csv, "%ld,%.6f,%.6g,%.1f,%s,%s\n", step + 1, loss, lr, tps, cols, a->precision);
    char eta[32];
    fmt_eta(el / (double)done * (double)(a->steps - step - 1), eta, sizeof eta);
    long every = a->steps / 20 > 0 ? a->steps / 20 : 1;
    if (lead && (tty || (step + 1) % every == 0 || last || step == start || *val))
      fprintf(stderr, "%sstep %ld/%ld  loss %.4f%s  lr %.3g  %.0f tok/s  ETA %s%s", tty ? "\r" : "",
              step + 1, a->steps, loss, val, lr, tps, eta, tty ? "   " : "\n");
    if (a->ck_every && (step + 1) % a->ck_every == 0) {
      char path[4200];
      snprintf(path, sizeof path, "%s/checkpoint-%06ld.safetensors", a->out, step + 1);
      if (cli_save_checkpoint(CMD, r->s, path, &rec, step + 1, rng)) return CLI_FAIL;
      if (lead && a->keep_last && cli_keep_last(CMD, a->out, a->keep_last)) return CLI_FAIL;
    }
  }
  if (!lead) return CLI_OK;
  if (tty) fputc('\n', stderr);
  fprintf(stderr, "%s: loss %.4f -> %.4f in %ld steps, %.1f s\n", CMD, r->loss_log[0],
          r->loss_log[r->n_log - 1], done, cli_now() - t0);
  if (r->csv && fflush(r->csv) != 0)
    fprintf(stderr, "%s: warning: cannot write --metrics '%s': %s\n", CMD, a->metrics,
            strerror(errno));
  if (a->plot) write_plot(a, r);
  return CLI_OK;
}

static long start_step(const train_args *a, const resume_point *rp) {
  return a->resume ? rp->step : 0;
}

/* A checkpoint of this command holds the sampler's state; older ones seeded it from the step,
 * which is why their resumed runs drew other batches. */
static uint64_t sampler_start(const train_args *a, const resume_point *rp) {
  return rp->self_contained
             ? rp->sampler_rng
             : (uint64_t)a->seed * 0x9E3779B97F4A7C15ull + (uint64_t)start_step(a, rp) + 1;
}

int cli_train_rank(const train_args *a, const resume_point *rp, const mn_model_config *cfg) {
  run r = {.cfg = *cfg};
  int rc = load_data(a, rp, &r);
  if (!rc) rc = build(a, rp, &r);
  if (!rc && a->rank == 0) rc = open_metrics(a, start_step(a, rp), &r);
  if (!rc) rc = train_loop(a, &r, start_step(a, rp), sampler_start(a, rp));
  run_free(&r);
  return rc;
}

/* Everything that can be refused is refused here, before any output is touched. */
static int prepare(cli_opt *o, train_args *a, resume_point *rp, mn_safetensors **ck,
                   mn_model_config *cfg) {
  if (o[O_RESUME].seen && o[O_INIT].seen) {
    fprintf(stderr, "%s: --resume and --init-from cannot be used together\n", CMD);
    return CLI_USAGE;
  }
  if (o[O_RESUME].seen) {
    int rc = cli_resume_read(CMD, o[O_RESUME].value, o, O_COUNT, rp, ck);
    if (rc) return rc;
  }
  if (check_args(o, a, rp->has_config)) return CLI_USAGE;
  if (a->resume && a->steps <= rp->step) {
    fprintf(stderr, "%s: --steps %ld is at or below the checkpoint's step %ld: nothing to train\n",
            CMD, a->steps, rp->step);
    return CLI_USAGE;
  }
  if (a->config) {
    if (cli_load_config(CMD, a->config, cfg)) return CLI_FAIL;
    if (cli_resume_check_config(CMD, rp, cfg)) return CLI_FAIL;
  } else {
    *cfg = rp->cfg;
  }
  if (cli_prepare_out_dir(CMD, a->out)) return CLI_FAIL;
  if (a->metrics && cli_check_output_file(CMD, "--metrics", a->metrics)) return CLI_FAIL;
  if (a->plot && cli_check_output_file(CMD, "--plot", a->plot)) return CLI_FAIL;
  return CLI_OK;
}

int cli_train(int argc, char **argv) {
  cli_opt o[O_COUNT] = {
      [O_CONFIG] = {"--config", 1, NULL, 0},
      [O_DATA] = {"--data", 1, NULL, 0},
      [O_TOKENIZER] = {"--tokenizer", 1, NULL, 0},
      [O_FORMAT] = {"--data-format", 1, NULL, 0},
      [O_INIT] = {"--init-from", 1, NULL, 0},
      [O_BATCH] = {"--batch", 1, NULL, 0},
      [O_SEQ] = {"--seq", 1, NULL, 0},
      [O_STEPS] = {"--steps", 1, NULL, 0},
      [O_LR] = {"--lr", 1, NULL, 0},
      [O_WARMUP] = {"--warmup", 1, NULL, 0},
      [O_WD] = {"--weight-decay", 1, NULL, 0},
      [O_CLIP] = {"--grad-clip", 1, NULL, 0},
      [O_CKEVERY] = {"--checkpoint-every", 1, NULL, 0},
      [O_KEEP] = {"--keep-last", 1, NULL, 0},
      [O_OUT] = {"--out", 1, NULL, 0},
      [O_RESUME] = {"--resume", 1, NULL, 0},
      [O_SEED] = {"--seed", 1, NULL, 0},
      [O_METRICS] = {"--metrics", 1, NULL, 0},
      [O_PLOT] = {"--plot", 1, NULL, 0},
      [O_VAL_DATA] = {"--val-data", 1, NULL, 0},
      [O_VAL_FRACTION] = {"--val-fraction", 1, NULL, 0},
      [O_EVAL_EVERY] = {"--eval-every", 1, NULL, 0},
      [O_EVAL_BATCHES] = {"--eval-batches", 1, NULL, 0},
      [O_PRECISION] = {"--precision", 1, NULL, 0},
      [O_GRAD_ACCUM] = {"--grad-accum", 1, NULL, 0},
      [O_FREEZE] = {"--freeze", 1, NULL, 0},
      [O_ALLOW_NONFINITE] = {"--allow-nonfinite", 0, NULL, 0},
      [O_LORA_RANK] = {"--lora-rank", 1, NULL, 0},
      [O_LORA_ALPHA] = {"--lora-alpha", 1, NULL, 0},
      [O_LORA_TARGETS] = {"--lora-targets", 1, NULL, 0},
      [O_LORA_DROPOUT] = {"--lora-dropout", 1, NULL, 0},
      [O_MERGE_LORA] = {"--merge-lora", 0, NULL, 0},
      [O_CHAT_TEMPLATE] = {"--chat-template", 1, NULL, 0},
      [O_PACK] = {"--pack", 0, NULL, 0},
      [O_RANKS] = {"--ranks", 1, NULL, 0},
      [O_GPUS] = {"--gpus", 1, NULL, 0},
      [O_LAUNCHER] = {"--launcher", 1, NULL, 0},
      [O_GROUP_ID_FILE] = {"--group-id-file", 1, NULL, 0},
  };
  int rc = cli_parse(CMD, argc, argv, o, O_COUNT, USAGE);
  if (rc) return rc == CLI_HELP ? CLI_OK : rc;
  train_args a = {.warmup = 0,
                  .grad_accum = 1,
                  .ranks = 1,
                  .seed = 0,
                  .wd = 0.01f,
                  /* 0: not given (8 batches when evaluating); unrecorded, so a resumed
                   * run without held-out data does not take it for a given option */
                  .eval_batches = 0,
                  .options = mn_session_options_default()};
  resume_point rp = {0};
  mn_safetensors *ck = NULL;
  mn_model_config cfg;
  rc = prepare(o, &a, &rp, &ck, &cfg);
  if (!rc) {
    if (a.gpus)
      rc = cli_train_gpus(&a, &rp, &cfg, argc, argv);
    else if (a.launched)
      rc = cli_train_launched(&a, &rp, &cfg);
    else if (a.ranks > 1)
      rc = cli_train_threads(&a, &rp, &cfg);
    else
      rc = cli_train_rank(&a, &rp, &cfg);
  }
  mn_safetensors_close(ck);
  return rc;
}
