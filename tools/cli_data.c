/* Reading training data and model configs for the meganeura command. */
#include "tools/cli.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int cli_read_file(const char *cmd, const char *path, unsigned char **out, size_t *n_out) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "%s: cannot read '%s': %s\n", cmd, path, strerror(errno));
    return CLI_FAIL;
  }
  /* fopen opens a folder too; its first read would fail with only "read error". */
  struct stat sb;
  if (fstat(fileno(f), &sb) == 0 && S_ISDIR(sb.st_mode)) {
    fclose(f);
    fprintf(stderr, "%s: cannot read '%s': it is a folder, not a file\n", cmd, path);
    return CLI_FAIL;
  }
  size_t cap = 1 << 16, n = 0;
  unsigned char *buf = malloc(cap);
  errno = 0;
  while (buf) {
    if (n == cap) {
      unsigned char *nb = realloc(buf, cap * 2);
      if (!nb) {
        free(buf);
        buf = NULL;
        break;
      }
      buf = nb;
      cap *= 2;
    }
    size_t got = fread(buf + n, 1, cap - n, f);
    n += got;
    if (got == 0) break;
  }
  int err = ferror(f) ? (errno ? errno : EIO) : 0;
  fclose(f);
  if (!buf || err) {
    fprintf(stderr, "%s: cannot read '%s': %s\n", cmd, path,
            !buf ? "out of memory" : strerror(err));
    free(buf);
    return CLI_FAIL;
  }
  *out = buf;
  *n_out = n;
  return CLI_OK;
}

int cli_load_tokens(const char *cmd, const char *path, const char *format, const mn_tokenizer *tok,
                    uint32_t **out, size_t *n_out) {
  unsigned char *bytes = NULL;
  size_t n = 0;
  int rc = cli_read_file(cmd, path, &bytes, &n);
  if (rc) return rc;
  uint32_t *ids = NULL;
  size_t count = 0;
  if (format && strcmp(format, "text") != 0) {
    size_t w = strcmp(format, "u16") == 0 ? 2 : 4;
    if (n % w) {
      fprintf(stderr, "%s: '%s' is not a %s token file: %zu bytes is not a multiple of %zu\n", cmd,
              path, format, n, w);
      free(bytes);
      return CLI_FAIL;
    }
    count = n / w;
    ids = malloc((count ? count : 1) * sizeof *ids);
    for (size_t i = 0; ids && i < count; i++) {
      const unsigned char *p = bytes + i * w;
      ids[i] = w == 2 ? (uint32_t)(p[0] | p[1] << 8)
                      : (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                            (uint32_t)p[3] << 24;
    }
  } else if (tok) {
    if (mn_tokenizer_encode(tok, (const char *)bytes, n, NULL, 0, &count) != MN_OK) {
      free(bytes);
      return cli_lib_fail(cmd, "cannot tokenize --data");
    }
    ids = malloc((count ? count : 1) * sizeof *ids);
    if (ids && mn_tokenizer_encode(tok, (const char *)bytes, n, ids, count, &count) != MN_OK) {
      free(ids);
      free(bytes);
      return cli_lib_fail(cmd, "cannot tokenize --data");
    }
  } else {
    count = n;
    ids = malloc((count ? count : 1) * sizeof *ids);
    for (size_t i = 0; ids && i < count; i++)
      ids[i] = bytes[i];
  }
  free(bytes);
  if (!ids) {
    fprintf(stderr, "%s: out of memory reading '%s'\n", cmd, path);
    return CLI_FAIL;
  }
  *out = ids;
  *n_out = count;
  return CLI_OK;
}

int cli_load_config(const char *cmd, const char *path, mn_model_config *cfg) {
  if (mn_model_config_load(path, cfg) != MN_OK) {
    char what[600];
    snprintf(what, sizeof what, "cannot load config '%s'", path);
    return cli_lib_fail(cmd, what);
  }
  return CLI_OK;
}
