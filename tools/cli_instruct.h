/* Instruction data for meganeura train: JSON Lines of {"prompt", "completion"} or
 * {"messages": [{"role", "content"}, ...]} records, rendered by a chat template, tokenized,
 * and laid out in rows of a fixed length whose labels count only the completion (assistant)
 * tokens: every other label is MN_IGNORE_LABEL. */
#ifndef MN_CLI_INSTRUCT_H
#define MN_CLI_INSTRUCT_H

#include "tools/cli.h"

#include <stdbool.h>

/* Rows ready to feed: input ids, labels (the next token of the same example, or the ignore
 * label) and, when packed, position ids that restart at 0 in each example. */
typedef struct cli_rows {
  size_t n;                            /* rows */
  size_t seq;                          /* tokens per row */
  uint32_t *ids, *labels, *positions;  /* [n, seq]; positions NULL unless packed */
  size_t examples, truncated, dropped; /* read; cut to seq tokens; without a counted label */
  size_t tokens, counted;              /* example tokens in rows; labels that count */
} cli_rows;

/* The chat templates: "chatml" (SmolLM2-Instruct, Qwen: <|im_start|>role\ncontent<|im_end|>\n,
 * the assistant's content and <|im_end|> counted) and "plain" (each message's content and a
 * newline, the assistant's content and the EOS token counted; a prompt/completion record is
 * prompt + completion + EOS). NULL when the name is neither. */
const char *cli_chat_template(const char *name);

/* Loads path. Without pack every row holds one example (cut to seq tokens) and padding
 * (the pad id is the template's EOS token, labels ignored); with pack, examples in an order
 * shuffled by seed fill rows one after another, an example that does not fit the rest of a
 * row starting the next one. Examples whose labels would all be ignored (say a completion
 * cut off by seq) are dropped and counted. `what` names the file in messages. */
int cli_rows_load(const char *cmd, const char *path, const mn_tokenizer *tok, const char *tmpl,
                  long seq, bool pack, uint64_t seed, cli_rows *out);

/* Moves the last `fraction` of the rows (at least one) of r into held. */
int cli_rows_split(const char *cmd, cli_rows *r, double fraction, cli_rows *held);

/* Row i of r into ids, labels and positions (positions may be NULL, and are 0..seq-1 when r is
 * not packed). */
void cli_rows_copy(const cli_rows *r, size_t i, uint32_t *ids, uint32_t *labels,
                   uint32_t *positions);

/* FNV-1a of the rows: the identity of the data a checkpoint was trained on. */
uint64_t cli_rows_hash(const cli_rows *r);

void cli_rows_free(cli_rows *r);

#endif
