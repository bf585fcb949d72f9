/* Output folders and files of meganeura train: proven writable before the first step, the
 * command's own stale temporary files removed, old checkpoints pruned. */
#include "tools/cli.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Skips one or more digits; NULL when there are none. */
static const char *digits(const char *s) {
  if (!isdigit((unsigned char)*s)) return NULL;
  while (isdigit((unsigned char)*s))
    s++;
  return s;
}

/* "checkpoint-<digits>.safetensors" followed by `tail`; the step, or -1. */
static long checkpoint_step(const char *name, const char *tail) {
  const char *p = name + strlen("checkpoint-");
  if (strncmp(name, "checkpoint-", strlen("checkpoint-")) != 0) return -1;
  const char *e = digits(p);
  if (!e || strncmp(e, ".safetensors", 12) != 0 || strcmp(e + 12, tail) != 0) return -1;
  return strtol(p, NULL, 10);
}

/* The writer's temp name "<target>.tmp.<pid>.<n>" for one of our targets: the pid, or 0. */
static long temp_owner(const char *name) {
  const char *t = strstr(name, ".safetensors.tmp.");
  if (!t) return 0;
  size_t stem = (size_t)(t - name);
  bool ours = (stem == strlen("model") && strncmp(name, "model", stem) == 0);
  if (!ours && strncmp(name, "checkpoint-", 11) == 0) {
    const char *e = digits(name + 11);
    ours = e == t;
  }
  if (!ours) return 0;
  const char *pid = t + strlen(".safetensors.tmp."), *e = digits(pid);
  if (!e || *e != '.' || !digits(e + 1) || *digits(e + 1)) return 0;
  return strtol(pid, NULL, 10);
}

static void remove_stale_temps(const char *cmd, const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return;
  for (struct dirent *ent; (ent = readdir(d));) {
    long pid = temp_owner(ent->d_name);
    /* A live writer (another run into the same folder) keeps its file. */
    if (pid <= 0 || (pid == (long)getpid()) || !(kill((pid_t)pid, 0) != 0 && errno == ESRCH))
      continue;
    char path[4400];
    snprintf(path, sizeof path, "%s/%s", dir, ent->d_name);
    if (unlink(path) == 0) fprintf(stderr, "%s: removed the stale temporary file %s\n", cmd, path);
  }
  closedir(d);
}

int cli_prepare_out_dir(const char *cmd, const char *dir) {
  if (cli_mkdir_p(dir) != 0) {
    fprintf(stderr, "%s: cannot create --out directory '%s': %s\n", cmd, dir, strerror(errno));
    return CLI_FAIL;
  }
  char probe[4200];
  snprintf(probe, sizeof probe, "%s/.meganeura-write-test.%ld", dir, (long)getpid());
  int fd = open(probe, O_WRONLY | O_CREAT | O_EXCL, 0600);
  if (fd < 0) {
    fprintf(stderr, "%s: cannot write into --out directory '%s': %s\n", cmd, dir, strerror(errno));
    return CLI_FAIL;
  }
  close(fd);
  unlink(probe);
  remove_stale_temps(cmd, dir);
  return CLI_OK;
}

int cli_check_output_file(const char *cmd, const char *option, const char *path) {
  char parent[4096];
  const char *slash = strrchr(path, '/');
  size_t len = slash ? (size_t)(slash - path) : 0;
  if (len >= sizeof parent) len = sizeof parent - 1;
  memcpy(parent, path, len);
  parent[len] = '\0';
  if (len && cli_mkdir_p(parent) != 0) {
    fprintf(stderr, "%s: cannot create the folder of %s '%s': %s\n", cmd, option, path,
            strerror(errno));
    return CLI_FAIL;
  }
  bool existed = access(path, F_OK) == 0;
  /* O_APPEND without O_TRUNC: an existing file is opened, not changed. */
  int fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0666);
  if (fd < 0) {
    fprintf(stderr, "%s: cannot write %s '%s': %s\n", cmd, option, path, strerror(errno));
    return CLI_FAIL;
  }
  close(fd);
  if (!existed) unlink(path);
  return CLI_OK;
}

typedef struct checkpoint_file {
  long step;
  char *name;
} checkpoint_file;

static int by_step(const void *a, const void *b) {
  long x = ((const checkpoint_file *)a)->step, y = ((const checkpoint_file *)b)->step;
  return (x > y) - (x < y);
}

int cli_keep_last(const char *cmd, const char *dir, long keep) {
  DIR *d = opendir(dir);
  if (!d) {
    fprintf(stderr, "%s: cannot list '%s': %s\n", cmd, dir, strerror(errno));
    return CLI_FAIL;
  }
  checkpoint_file *files = NULL;
  size_t n = 0, cap = 0;
  for (struct dirent *ent; (ent = readdir(d));) {
    long st = checkpoint_step(ent->d_name, "");
    if (st < 0) continue;
    if (n == cap) {
      checkpoint_file *grown = realloc(files, (cap = cap ? 2 * cap : 16) * sizeof *files);
      if (!grown) break;
      files = grown;
    }
    if ((files[n].name = strdup(ent->d_name))) files[n++].step = st;
  }
  closedir(d);
  if (n) qsort(files, n, sizeof *files, by_step);
  for (size_t i = 0; i < n; i++) {
    if (i + (size_t)keep < n) {
      char path[4400];
      snprintf(path, sizeof path, "%s/%s", dir, files[i].name);
      if (unlink(path) != 0 && errno != ENOENT)
        fprintf(stderr, "%s: warning: cannot remove '%s': %s\n", cmd, path, strerror(errno));
      /* the side file of checkpoints from before the step went into the metadata */
      strncat(path, ".step", sizeof path - strlen(path) - 1);
      unlink(path);
    }
    free(files[i].name);
  }
  free(files);
  return CLI_OK;
}

int cli_copy_file(const char *cmd, const char *from, const char *to) {
  FILE *in = fopen(from, "rb");
  if (!in) {
    fprintf(stderr, "%s: cannot read '%s': %s\n", cmd, from, strerror(errno));
    return CLI_FAIL;
  }
  FILE *out = fopen(to, "wb");
  bool ok = out != NULL;
  char buf[1 << 14];
  for (size_t n; ok && (n = fread(buf, 1, sizeof buf, in)) > 0;)
    ok = fwrite(buf, 1, n, out) == n;
  ok = ok && !ferror(in);
  if (out && fclose(out) != 0) ok = false;
  fclose(in);
  if (!ok) {
    fprintf(stderr, "%s: cannot write '%s': %s\n", cmd, to, strerror(errno));
    return CLI_FAIL;
  }
  return CLI_OK;
}
