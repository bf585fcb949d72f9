/* meganeura train: what its parts (options, resume, evaluation, outputs) share. */
#ifndef MN_CLI_TRAIN_H
#define MN_CLI_TRAIN_H

#include "tools/cli.h"

#include <stdbool.h>

/* The options of a run, paths included, after defaults and the checkpoint's values. */
typedef struct train_args {
  const char *config, *data, *format, *tokenizer, *val_data, *init, *out, *resume, *metrics, *plot;
  const char *precision;      /* the precision used: --precision, else the default */
  mn_session_options options; /* of the training and evaluation sessions */
  bool allow_nonfinite;       /* --init-from may hold NaN or infinity */
  const char *freeze;         /* --freeze: a regular expression over parameter names, or NULL */
  long batch, seq, steps, warmup, ck_every, seed, eval_every, eval_batches, keep_last, grad_accum;
  float lr, wd, clip, val_fraction;
  /* LoRA (--lora-rank R > 0): the adapters' configuration (lora, filled from the four
   * options), and --merge-lora: also OUT/merged, the adapters merged into the base. */
  long lora_rank;
  float lora_alpha, lora_dropout;
  const char *lora_targets;
  bool merge_lora;
  mn_lora_config lora;
  /* Instruction data (--data FILE.jsonl): its chat template, and --pack (1) or one example
   * per row (0). */
  const char *chat_template;
  long pack;
  /* --ranks N: N data-parallel ranks on the CPU backend, one thread each (1: none); rank is
   * this thread's, and only rank 0 prints, evaluates and writes files other than
   * checkpoints (whose saving every rank takes part in). */
  long ranks;
  int rank;
  /* --gpus N: N processes of this program, one per CUDA device (0: not given). */
  long gpus;
  /* One rank of a job started by a launcher (cli_launch_args): its environment, and where the
   * group id comes from: --group-id-file, else rank 0's group_port at env.master_addr. In such
   * a job ranks is the world size and rank this process's. */
  bool launched;
  mn_launch_env env;
  const char *group_id_file;
  int group_port;
} train_args;

/* The LoRA options, in this order, into a->lora_* and a->lora (CLI_USAGE after printing why);
 * --freeze must already be in a. */
enum {
  CLI_LORA_RANK,
  CLI_LORA_ALPHA,
  CLI_LORA_TARGETS,
  CLI_LORA_DROPOUT,
  CLI_LORA_MERGE,
  CLI_LORA_OPTIONS
};
int cli_lora_options(const char *cmd, const cli_opt *const *o, train_args *a);

/* What --resume restores beyond the session: where the run stood and what it was. */
typedef struct resume_point {
  long step;
  uint64_t sampler_rng;
  bool self_contained; /* a checkpoint of this command with its train.* metadata */
  bool has_config;
  mn_model_config cfg;
  char name_prefix[64];    /* the parameter-name prefix the run's graph was built with */
  uint64_t data_hash;      /* FNV-1a of the training tokens */
  uint64_t tokenizer_hash; /* FNV-1a of the tokenizer.json bytes; 0: no tokenizer */
} resume_point;

/* One rank's whole run: its data, session and training loop (rank 0 also writes the metrics
 * CSV, the plot and the final weights). */
int cli_train_rank(const train_args *a, const resume_point *rp, const mn_model_config *cfg);
/* --ranks N: a group of threads, rank 0 on the caller's. */
int cli_train_threads(train_args *a, const resume_point *rp, const mn_model_config *cfg);
/* --gpus N: N ranks as processes (this program run again as rank r on device r, as a launcher
 * would start it); the parent waits, and the first rank that fails stops the others. */
int cli_train_gpus(train_args *a, const resume_point *rp, const mn_model_config *cfg, int argc,
                   char **argv);
/* --launcher auto|env|none (NULL: auto) against the environment: sets a->launched (and the
 * rank, world size, device and the group id's source) for a job of WORLD_SIZE > 1 (or any
 * with env); CLI_USAGE with a message for options a launched rank cannot take. */
int cli_launch_args(train_args *a, const char *launcher, bool ranks_given);
/* One rank of a launched job: its NCCL group on device LOCAL_RANK, then cli_train_rank. */
int cli_train_launched(train_args *a, const resume_point *rp, const mn_model_config *cfg);

/* The checkpoint's metadata key of an option ("--lr" -> "train.lr"); NULL for options that
 * do not shape the trajectory. */
const char *cli_resume_key(const char *option);

/* Reads --resume's checkpoint: the step (train.step; else the deprecated CKPT.step side file;
 * else the library's step counter), and when present the sampler state, config and the
 * recorded options. Recorded options the user did not give are filled in (their values
 * point into *st_out, which the caller closes after the run); given ones must be equal. A
 * checkpoint that records no precision resumes at f32 (the default of its time). */
int cli_resume_read(const char *cmd, const char *path, cli_opt *opts, size_t n, resume_point *rp,
                    mn_safetensors **st_out);
/* Refuses a --config that differs from the checkpoint's, naming the first differing key. */
int cli_resume_check_config(const char *cmd, const resume_point *rp, const mn_model_config *cfg);

/* The train.* entries of a checkpoint; saved with mn_session_save_checkpoint_with. */
typedef struct ckpt_record {
  const train_args *a;
  const mn_model_config *cfg;
  const char *name_prefix;
  uint64_t data_hash, tokenizer_hash;
} ckpt_record;
int cli_save_checkpoint(const char *cmd, mn_session *s, const char *path, const ckpt_record *rec,
                        long step, uint64_t sampler_rng);

/* Rewrites the metrics CSV with its header and only the rows at or before `step`. */
int cli_metrics_cut(const char *cmd, const char *path, long step, const char *header);

uint64_t cli_fnv1a(uint64_t h, const void *data, size_t n);
#define CLI_FNV_OFFSET 0xcbf29ce484222325ull

/* Held-out loss: a fixed set of windows of the validation tokens, evaluated through an
 * inference session of the training graph that reads the training session's weights in place
 * (run it after the training step's wait). */
typedef struct cli_rows cli_rows;
typedef struct cli_eval {
  mn_session *s;
  const mn_graph *g;
  const cli_rows *rows; /* instruction data: its rows instead of windows of tokens */
  uint32_t *positions;  /* packed rows: their position ids */
  const uint32_t *tokens;
  size_t *offsets, num_windows;
  uint32_t *ids, *labels;
  long batch, seq;
} cli_eval;
int cli_eval_init(const char *cmd, cli_eval *e, const mn_graph *g, mn_session *train,
                  const mn_session_options *options, long batch, long seq, long batches,
                  const uint32_t *tokens, size_t n);
/* The same over the first batches * batch rows of instruction data (cycling when there are
 * fewer). */
int cli_eval_init_rows(const char *cmd, cli_eval *e, const mn_graph *g, mn_session *train,
                       const mn_session_options *options, long batch, long batches,
                       const cli_rows *rows);
int cli_eval_run(const char *cmd, cli_eval *e, float *loss);
void cli_eval_free(cli_eval *e);

#endif
