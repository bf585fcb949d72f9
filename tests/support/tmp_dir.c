#include "tests/support/tmp_dir.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

mn_tmp_dir mn_tmp_dir_make(const char *prefix) {
  mn_tmp_dir t;
  int n = snprintf(t.path, sizeof t.path, "/tmp/%s_XXXXXX", prefix);
  cr_assert(n > 0 && (size_t)n < sizeof t.path, "prefix \"%s\" is too long", prefix);
  cr_assert_not_null(mkdtemp(t.path), "mkdtemp %s failed", t.path);
  return t;
}

const char *mn_tmp_path(const mn_tmp_dir *t, const char *name) {
  enum { SLOTS = 8 };
  static char path[SLOTS][256];
  static unsigned next;
  char *p = path[next++ % SLOTS];
  int n = snprintf(p, sizeof path[0], "%s/%s", t->path, name);
  cr_assert(n > 0 && (size_t)n < sizeof path[0], "path %s/%s is too long", t->path, name);
  return p;
}

/* Calls `visit` on the path of every file in the folder whose name contains `fragment` (every
 * file when NULL) and returns how many there were. */
static size_t each_file(const mn_tmp_dir *t, const char *fragment, void (*visit)(const char *)) {
  DIR *d = opendir(t->path);
  cr_assert_not_null(d, "cannot open %s", t->path);
  struct dirent *e;
  size_t n = 0;
  char path[512];
  while ((e = readdir(d))) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    if (fragment && !strstr(e->d_name, fragment)) continue;
    if (visit) {
      snprintf(path, sizeof path, "%s/%s", t->path, e->d_name);
      visit(path);
    }
    n++;
  }
  closedir(d);
  return n;
}

size_t mn_tmp_dir_count(const mn_tmp_dir *t, const char *fragment) {
  return each_file(t, fragment, NULL);
}

static void unlink_file(const char *path) { unlink(path); }

size_t mn_tmp_dir_remove(const mn_tmp_dir *t) {
  size_t n = each_file(t, NULL, unlink_file);
  cr_assert_eq(rmdir(t->path), 0, "cannot remove %s", t->path);
  return n;
}

char *mn_test_read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  cr_assert_not_null(f, "cannot open %s", path);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  cr_assert_geq(n, 0, "cannot size %s", path);
  char *buf = malloc((size_t)n + 1);
  cr_assert_not_null(buf);
  cr_assert_eq(fread(buf, 1, (size_t)n, f), (size_t)n, "short read of %s", path);
  buf[n] = '\0';
  fclose(f);
  if (len) *len = (size_t)n;
  return buf;
}

void mn_test_write_file(const char *path, const void *data, size_t n) {
  FILE *f = fopen(path, "wb");
  cr_assert_not_null(f, "cannot create %s", path);
  cr_assert_eq(fwrite(data, 1, n, f), n, "short write of %s", path);
  cr_assert_eq(fclose(f), 0, "cannot close %s", path);
}
