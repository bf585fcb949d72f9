/* The meganeura command: shared declarations of its subcommands and helpers. */
#ifndef MN_CLI_H
#define MN_CLI_H

#include <meganeura.h>

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Exit codes: 0 success, 1 runtime failure (files, library errors), 2 usage. */
enum { CLI_OK = 0, CLI_FAIL = 1, CLI_USAGE = 2, CLI_HELP = -1 };

typedef struct cli_opt {
  const char *name; /* "--batch" */
  int takes_value;  /* 0: a flag */
  const char *value;
  int seen;
} cli_opt;

/* Parses argv[1..] against opts; CLI_OK, CLI_USAGE (message printed) or CLI_HELP (usage
 * printed to stdout for --help / -h). */
int cli_parse(const char *cmd, int argc, char **argv, cli_opt *opts, size_t n, const char *usage);
/* Each returns CLI_OK or prints one line and returns CLI_USAGE. An unset option keeps *out. */
int cli_require(const char *cmd, const cli_opt *o);
int cli_pos_long(const char *cmd, const cli_opt *o, long *out);
int cli_nonneg_long(const char *cmd, const cli_opt *o, long *out);
int cli_pos_float(const char *cmd, const cli_opt *o, float *out);
int cli_nonneg_float(const char *cmd, const cli_opt *o, float *out);
/* --precision f32|tf32|bf16|f16 into *out (tf32: f32 with TF32 matmuls; bf16 and f16 are
 * mixed precision, docs/precision.md); when it is not given, cli_default_precision(out), so
 * set out's backend and device first. *name (if name is not NULL) gets the precision used. */
int cli_precision(const char *cmd, const cli_opt *o, mn_session_options *out, const char **name);
/* The precision when --precision is not given: "bf16" when a session of these options will
 * run on a CUDA device of compute capability 8.0 or newer, else "f32" (the CPU, older GPUs). */
const char *cli_default_precision(const mn_session_options *o);
/* The compute capability of CUDA device `device` (80 for 8.0); 0 in a build without CUDA or
 * when the device is not usable. */
int cli_compute_capability(int device);
/* Prints "CMD: what: <mn_last_error()>" and returns CLI_FAIL. */
int cli_lib_fail(const char *cmd, const char *what);
double cli_now(void);
int cli_mkdir_p(const char *path);

/* The whole file, malloc'd (a folder or an unreadable file prints why and fails). */
int cli_read_file(const char *cmd, const char *path, unsigned char **out, size_t *n_out);
/* Tokens of a --data file: bytes (tok NULL, format NULL), tokenizer ids, or raw u16/u32. */
int cli_load_tokens(const char *cmd, const char *path, const char *format, const mn_tokenizer *tok,
                    uint32_t **out, size_t *n_out);
/* Loads config (and prints the failure); builds a model graph with the given prefix. */
int cli_load_config(const char *cmd, const char *path, mn_model_config *cfg);

/* A seeded xorshift64* generator. */
uint64_t cli_rand(uint64_t *state);
double cli_rand_unit(uint64_t *state);

/* Loss curves: an SVG with axes, labels, a legend and one polyline per series. */
typedef struct cli_series {
  const char *label, *color;
  const long *steps;
  const float *values;
  size_t n;
} cli_series;
int cli_write_svg(const char *path, const cli_series *series, size_t num_series, const char *title);

/* Outputs, checked before any work. Creates dir (and its parents), proves it writable with a
 * probe file, and removes the command's own stale temporary files there (the safetensors
 * writer's "<name>.safetensors.tmp.<pid>.<n>" of model.safetensors and checkpoint-N files,
 * whose writing process is gone); nothing else is touched. */
int cli_prepare_out_dir(const char *cmd, const char *dir);
/* Creates the parent folder of an output file and proves the file can be opened for writing,
 * without changing a file that exists. */
int cli_check_output_file(const char *cmd, const char *option, const char *path);
/* Keeps the newest `keep` checkpoint-N.safetensors files of dir (and their .step files). */
int cli_keep_last(const char *cmd, const char *dir, long keep);
/* Copies the file `from` to `to` (replacing it); prints the failure. */
int cli_copy_file(const char *cmd, const char *from, const char *to);

int cli_train(int argc, char **argv);
int cli_generate(int argc, char **argv);
int cli_bench(int argc, char **argv);

#endif
