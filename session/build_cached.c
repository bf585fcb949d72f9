/* mn_build_session_cached: a training session whose lowering is read from a cache file when
 * the file was written for the same graph, options and library, and is redone (and the file
 * rewritten) otherwise. A cache that cannot be used costs one warning line and a normal
 * build; it never fails the build and is never partly trusted. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "host/error.h"
#include "io/plan_cache.h"
#include "session/session.h"

/* Far above any real plan; keeps a stray huge file at the path from being read in. */
#define MAX_CACHE_BYTES ((size_t)1 << 30)

typedef enum read_result { READ_OK, READ_ABSENT, READ_FAILED } read_result;

static read_result read_all(const char *path, char **text, size_t *len, char *why,
                            size_t why_size) {
  *text = NULL;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return READ_ABSENT;
    snprintf(why, why_size, "cannot open: %s", strerror(errno));
    return READ_FAILED;
  }
  struct stat sb;
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || (uintmax_t)sb.st_size > MAX_CACHE_BYTES) {
    snprintf(why, why_size, "not a regular file of at most %zu bytes", MAX_CACHE_BYTES);
    close(fd);
    return READ_FAILED;
  }
  size_t cap = (size_t)sb.st_size, used = 0;
  char *buf = malloc(cap + 1);
  while (buf && used < cap) {
    ssize_t got = read(fd, buf + used, cap - used);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break; /* shrank under us: parse what is there; it will not validate */
    used += (size_t)got;
  }
  close(fd);
  if (!buf) {
    snprintf(why, why_size, "out of memory reading %zu bytes", cap);
    return READ_FAILED;
  }
  buf[used] = '\0';
  *text = buf;
  *len = used;
  return READ_OK;
}

static bool write_all(int fd, const char *p, size_t n) {
  while (n) {
    ssize_t put = write(fd, p, n);
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0) return false;
    p += put;
    n -= (size_t)put;
  }
  return true;
}

/* The folder of path (for its fsync), "." for a bare name. */
static void dir_of(const char *path, char *dir, size_t size) {
  const char *slash = strrchr(path, '/');
  if (!slash)
    snprintf(dir, size, ".");
  else if (slash == path)
    snprintf(dir, size, "/");
  else
    snprintf(dir, size, "%.*s", (int)(slash - path), path);
}

/* Readers see the old file or the new one, never a part: a temp file in the same folder,
 * fsync, rename over path, fsync of the folder so the rename survives a crash. A crash before
 * the rename leaves the temp file behind ("<path>.tmp.<pid>.<n>"), which nothing reads. */
static bool write_atomic(const char *path, const char *text, size_t len, char *why,
                         size_t why_size) {
  static atomic_uint sequence; /* two threads of one process writing the same cache */
  char tmp[PATH_MAX], dir[PATH_MAX];
  int w = snprintf(tmp, sizeof tmp, "%s.tmp.%ld.%u", path, (long)getpid(),
                   atomic_fetch_add(&sequence, 1u));
  if (w < 0 || (size_t)w >= sizeof tmp) {
    snprintf(why, why_size, "path too long");
    return false;
  }
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd < 0) {
    snprintf(why, why_size, "cannot create %s: %s", tmp, strerror(errno));
    return false;
  }
  bool ok = write_all(fd, text, len) && fsync(fd) == 0;
  int err = errno;
  ok = close(fd) == 0 && ok;
  if (ok && rename(tmp, path) != 0) {
    ok = false;
    err = errno;
  }
  if (!ok) {
    snprintf(why, why_size, "cannot write %s: %s", tmp, strerror(err));
    unlink(tmp);
    return false;
  }
  dir_of(path, dir, sizeof dir);
  int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    fsync(dfd); /* some file systems refuse; the rename itself already happened */
    close(dfd);
  }
  return true;
}

/* One line: reasons quote text from the file, whose control characters become '?'. */
static void warn(const char *path, const char *state, const char *why) {
  char clean[256];
  size_t i = 0;
  for (; why[i] && i + 1 < sizeof clean; i++)
    clean[i] = (unsigned char)why[i] < 0x20 || why[i] == 0x7f ? '?' : why[i];
  clean[i] = '\0';
  fprintf(stderr, "meganeura: plan cache %s is %s (%s); rebuilding\n", path, state, clean);
}

static void save_cache(const char *path, const mn_plan *plan, const mn_graph *g,
                       const mn_session_options *o) {
  char *text = NULL, why[PATH_MAX + 128];
  if (mn_plan_cache_serialize(plan, g, o, &text) != MN_OK) {
    fprintf(stderr, "meganeura: plan cache %s not written: %s\n", path, mn_last_error());
    return;
  }
  if (!write_atomic(path, text, strlen(text), why, sizeof why))
    fprintf(stderr, "meganeura: plan cache %s not written: %s\n", path, why);
  free(text);
}

mn_status mn_build_session_cached(const mn_graph *g, const char *cache_path,
                                  const mn_session_options *opts, mn_session **out) {
  const char *fn = "mn_build_session_cached";
  mn_status st = mn_session_check_buildable(fn, g, opts, out);
  if (st != MN_OK) return st;
  if (!cache_path) return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: cache_path is NULL", fn);
  mn_session_options o = opts ? *opts : mn_session_options_default();

  char why[256] = "";
  char *text = NULL;
  size_t len = 0;
  mn_plan *plan = NULL;
  read_result rd = read_all(cache_path, &text, &len, why, sizeof why);
  if (rd == READ_OK) {
    st = mn_plan_cache_parse(text, len, g, &o, MN_PLAN_CACHE_VERIFY_CHECKSUM, &plan, why,
                             sizeof why);
    free(text);
    if (st == MN_OK) return mn_session_create(fn, plan, &o, true, out);
    if (st == MN_ERR_OUT_OF_MEMORY)
      return mn_fail(st, "%s: %s: out of memory reading the plan cache", fn, cache_path);
    warn(cache_path, st == MN_ERR_STATE ? "stale" : "corrupt", why);
  } else if (rd == READ_FAILED) {
    warn(cache_path, "corrupt", why);
  }
  /* No file yet is the normal cold start and gets no warning. */
  if ((st = mn_lower_training(fn, g, &o, &plan)) != MN_OK) return st;
  if ((st = mn_session_create(fn, plan, &o, true, out)) != MN_OK) return st;
  save_cache(cache_path, (*out)->plan, g, &o);
  return MN_OK;
}
