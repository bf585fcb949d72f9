/* Temporary folders for tests that write files: a fresh folder under /tmp, paths of files in
 * it, counting and removing what it holds, and reading or writing a whole file. The folders
 * are flat: these helpers look only at files directly inside them. */
#ifndef MN_TEST_TMP_DIR_H
#define MN_TEST_TMP_DIR_H

#include <stddef.h>

typedef struct mn_tmp_dir {
  char path[64];
} mn_tmp_dir;

/* Creates /tmp/<prefix>_XXXXXX (mkdtemp), failing the test if it cannot. */
mn_tmp_dir mn_tmp_dir_make(const char *prefix);

/* "<folder>/<name>" in one of 8 static buffers used in turn, so that a test can hold several
 * paths at once without declaring buffers: a result stays valid for the next 7 calls, and must
 * be copied to be kept longer. Not thread-safe (the suites run with --jobs 1). */
const char *mn_tmp_path(const mn_tmp_dir *t, const char *name);

/* How many files in the folder have `fragment` in their name (all of them when NULL). */
size_t mn_tmp_dir_count(const mn_tmp_dir *t, const char *fragment);

/* Removes every file in the folder, then the folder (failing the test if it remains); returns
 * how many files it removed. */
size_t mn_tmp_dir_remove(const mn_tmp_dir *t);

/* The whole file in a malloc'd buffer with a NUL after its last byte (so text can be used as
 * a string); *len gets its size when len is not NULL. Fails the test if it cannot be read. */
char *mn_test_read_file(const char *path, size_t *len);

/* Creates or replaces path with the n bytes at data, failing the test on a short write. */
void mn_test_write_file(const char *path, const void *data, size_t n);

#endif
