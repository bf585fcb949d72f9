/* meganeura train's held-out loss: the mean loss over a fixed set of windows of the
 * validation tokens (the same windows at every eval, spread evenly over the tokens), computed
 * by an inference session of the training graph built once, which reads the training
 * session's parameters in place (mn_build_inference_session_shared): no copy per eval, and on
 * CUDA no new capture. */
#include "tools/cli_train.h"

#include "tools/cli_instruct.h"

#include <stdlib.h>
#include <string.h>

void cli_eval_free(cli_eval *e) {
  mn_session_free(e->s);
  free(e->offsets);
  free(e->ids);
  free(e->labels);
  free(e->positions);
  *e = (cli_eval){0};
}

int cli_eval_init(const char *cmd, cli_eval *e, const mn_graph *g, mn_session *train,
                  const mn_session_options *options, long batch, long seq, long batches,
                  const uint32_t *tokens, size_t n) {
  *e = (cli_eval){.g = g, .tokens = tokens, .batch = batch, .seq = seq};
  if (n < (size_t)seq + 1) {
    fprintf(stderr, "%s: the validation data holds %zu tokens, fewer than --seq + 1 = %ld\n", cmd,
            n, seq + 1);
    return CLI_FAIL;
  }
  size_t last = n - (size_t)seq - 1; /* the last window's start */
  e->num_windows = (size_t)batches * (size_t)batch;
  e->offsets = malloc(e->num_windows * sizeof *e->offsets);
  e->ids = malloc((size_t)(batch * seq) * sizeof *e->ids);
  e->labels = malloc((size_t)(batch * seq) * sizeof *e->labels);
  if (!e->offsets || !e->ids || !e->labels)
    return fprintf(stderr, "%s: out of memory\n", cmd), CLI_FAIL;
  for (size_t i = 0; i < e->num_windows; i++)
    e->offsets[i] =
        e->num_windows > 1
            ? (size_t)((unsigned long long)i * last / (unsigned long long)(e->num_windows - 1))
            : 0;
  if (mn_build_inference_session_shared(g, options, train, &e->s) != MN_OK)
    return cli_lib_fail(cmd, "cannot build the evaluation session");
  if (mn_model_prepare_session(g, e->s) != MN_OK)
    return cli_lib_fail(cmd, "cannot prepare the evaluation session");
  return CLI_OK;
}

int cli_eval_init_rows(const char *cmd, cli_eval *e, const mn_graph *g, mn_session *train,
                       const mn_session_options *options, long batch, long batches,
                       const cli_rows *rows) {
  *e = (cli_eval){.g = g, .rows = rows, .batch = batch, .seq = (long)rows->seq};
  e->num_windows = (size_t)batches * (size_t)batch;
  size_t bt = (size_t)batch * rows->seq;
  e->ids = malloc(bt * sizeof *e->ids);
  e->labels = malloc(bt * sizeof *e->labels);
  if (rows->positions) e->positions = malloc(bt * sizeof *e->positions);
  if (!e->ids || !e->labels || (rows->positions && !e->positions))
    return fprintf(stderr, "%s: out of memory\n", cmd), CLI_FAIL;
  if (mn_build_inference_session_shared(g, options, train, &e->s) != MN_OK)
    return cli_lib_fail(cmd, "cannot build the evaluation session");
  if (mn_model_prepare_session(g, e->s) != MN_OK)
    return cli_lib_fail(cmd, "cannot prepare the evaluation session");
  return CLI_OK;
}

/* Batch b of the evaluation into e->ids, e->labels (and e->positions). */
static void fill_batch(cli_eval *e, size_t b) {
  size_t seq = (size_t)e->seq;
  for (size_t r = 0; r < (size_t)e->batch; r++) {
    size_t i = b * (size_t)e->batch + r;
    if (e->rows) {
      cli_rows_copy(e->rows, i % e->rows->n, e->ids + r * seq, e->labels + r * seq,
                    e->positions ? e->positions + r * seq : NULL);
      continue;
    }
    size_t off = e->offsets[i];
    memcpy(e->ids + r * seq, e->tokens + off, seq * sizeof *e->ids);
    memcpy(e->labels + r * seq, e->tokens + off + 1, seq * sizeof *e->labels);
  }
}

int cli_eval_run(const char *cmd, cli_eval *e, float *loss) {
  size_t bt = (size_t)(e->batch * e->seq);
  double total = 0;
  size_t batches = e->num_windows / (size_t)e->batch;
  for (size_t b = 0; b < batches; b++) {
    fill_batch(e, b);
    if ((e->positions &&
         mn_session_set_input_u32(e->s, "position_ids", e->positions, bt) != MN_OK) ||
        mn_session_set_input_u32(e->s, "input_ids", e->ids, bt) != MN_OK ||
        mn_session_set_input_u32(e->s, "labels", e->labels, bt) != MN_OK ||
        mn_session_step(e->s) != MN_OK || mn_session_wait(e->s) != MN_OK)
      return cli_lib_fail(cmd, "evaluation step failed");
    total += mn_session_read_loss(e->s);
  }
  *loss = (float)(total / (double)batches);
  return CLI_OK;
}
