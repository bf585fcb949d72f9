/* The meganeura command: train, generate and bench subcommands over the public API. */
#include "tools/cli.h"

#include <string.h>

static const char USAGE[] =
    "usage: meganeura <command> [options]\n"
    "commands:\n"
    "  train     train a GPT-2 or Llama config on a text or token file (AdamW)\n"
    "  generate  sample text from trained weights or a checkpoint\n"
    "  bench     time training steps of a config\n"
    "  version   print the library version\n"
    "'meganeura <command> --help' describes each command's options.\n";

int main(int argc, char **argv) {
  if (argc < 2) {
    fputs(USAGE, stderr);
    return CLI_USAGE;
  }
  const char *c = argv[1];
  if (strcmp(c, "--help") == 0 || strcmp(c, "-h") == 0 || strcmp(c, "help") == 0) {
    fputs(USAGE, stdout);
    return CLI_OK;
  }
  if (strcmp(c, "version") == 0 || strcmp(c, "--version") == 0) {
    printf("meganeura %s\n", mn_version());
    return CLI_OK;
  }
  if (strcmp(c, "train") == 0) return cli_train(argc - 1, argv + 1);
  if (strcmp(c, "generate") == 0) return cli_generate(argc - 1, argv + 1);
  if (strcmp(c, "bench") == 0) return cli_bench(argc - 1, argv + 1);
  fprintf(stderr, "meganeura: unknown command '%s' (see meganeura --help)\n", c);
  return CLI_USAGE;
}
