/* meganeura train's LoRA options: --lora-rank, --lora-alpha, --lora-targets, --lora-dropout and
 * --merge-lora into the run's adapter configuration (checked against the model family when
 * the graph is built). */
#include "tools/cli_train.h"

#include <string.h>

/* --lora-*: the adapters' configuration, checked against the family later by the build. */
int cli_lora_options(const char *cmd, const cli_opt *const *o, train_args *a) {
  if (cli_pos_long(cmd, o[CLI_LORA_RANK], &a->lora_rank) ||
      cli_pos_float(cmd, o[CLI_LORA_ALPHA], &a->lora_alpha) ||
      cli_nonneg_float(cmd, o[CLI_LORA_DROPOUT], &a->lora_dropout))
    return CLI_USAGE;
  const int needs_rank[] = {CLI_LORA_ALPHA, CLI_LORA_TARGETS, CLI_LORA_DROPOUT, CLI_LORA_MERGE};
  for (size_t i = 0; i < sizeof needs_rank / sizeof *needs_rank; i++)
    if (o[needs_rank[i]]->seen && !o[CLI_LORA_RANK]->seen) {
      fprintf(stderr, "%s: %s needs --lora-rank\n", cmd, o[needs_rank[i]]->name);
      return CLI_USAGE;
    }
  a->merge_lora = o[CLI_LORA_MERGE]->seen;
  if (!a->lora_rank) return CLI_OK;
  if (a->freeze) {
    fprintf(stderr,
            "%s: --freeze and --lora-rank cannot be used together (LoRA freezes the "
            "whole base)\n",
            cmd);
    return CLI_USAGE;
  }
  if (a->lora_rank > 65536 || a->lora_dropout >= 1) {
    fprintf(stderr, "%s: %s\n", cmd,
            a->lora_dropout >= 1 ? "--lora-dropout must be below 1"
                                 : "--lora-rank must be at most 65536");
    return CLI_USAGE;
  }
  a->lora_targets = o[CLI_LORA_TARGETS]->seen ? o[CLI_LORA_TARGETS]->value : "all-linear";
  mn_lora_config l = mn_lora_config_default();
  l.rank = a->lora_rank;
  l.alpha = a->lora_alpha > 0 ? a->lora_alpha : 2.0f * (float)a->lora_rank;
  l.dropout = a->lora_dropout;
  if (strlen(a->lora_targets) >= sizeof l.target_modules) {
    fprintf(stderr, "%s: --lora-targets is longer than %zu bytes\n", cmd,
            sizeof l.target_modules - 1);
    return CLI_USAGE;
  }
  snprintf(l.target_modules, sizeof l.target_modules, "%s", a->lora_targets);
  /* base_model_name_or_path: the folder of the --init-from file, where config.json lies. */
  if (a->init) {
    const char *slash = strrchr(a->init, '/');
    if (slash)
      snprintf(l.base_model, sizeof l.base_model, "%.*s", (int)(slash - a->init), a->init);
    else
      snprintf(l.base_model, sizeof l.base_model, ".");
  }
  a->lora = l;
  return CLI_OK;
}
