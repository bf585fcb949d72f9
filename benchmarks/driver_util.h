/* What the programs that scripts drive (hf_parity_driver, quality_driver) share: paths, exact
 * binary files, the precision names. Static functions in a header because CMake builds every
 * .c file in benchmarks/ as its own program. Each exits with a message naming `prog`. */
#ifndef MN_BENCH_DRIVER_UTIL_H
#define MN_BENCH_DRIVER_UTIL_H

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meganeura.h"

static inline const char *drv_join_path(const char *prog, char *buf, size_t size, const char *dir,
                                        const char *name) {
  if ((size_t)snprintf(buf, size, "%s/%s", dir, name) >= size) {
    fprintf(stderr, "%s: path too long: %s/%s\n", prog, dir, name);
    exit(1);
  }
  return buf;
}

/* Exactly n elements of `size` bytes from path (a file of any other length is refused). */
static inline void *drv_read_exact(const char *prog, const char *path, size_t size, size_t n) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "%s: cannot open %s: %s\n", prog, path, strerror(errno));
    exit(1);
  }
  void *x = malloc(n * size);
  char extra;
  if (!x || fread(x, size, n, f) != n || fread(&extra, 1, 1, f) != 0) {
    fprintf(stderr, "%s: %s does not hold exactly %zu values of %zu bytes\n", prog, path, n, size);
    exit(1);
  }
  fclose(f);
  return x;
}

/* f32, tf32 (f32 with TF32 products), bf16 or f16; false for any other name. */
static inline bool drv_precision(const char *name, mn_precision *p, bool *tf32) {
  *tf32 = false;
  if (!strcmp(name, "f32") || !strcmp(name, "tf32")) {
    *p = MN_PRECISION_F32;
    *tf32 = name[0] == 't';
  } else if (!strcmp(name, "bf16")) {
    *p = MN_PRECISION_BF16;
  } else if (!strcmp(name, "f16")) {
    *p = MN_PRECISION_F16;
  } else {
    return false;
  }
  return true;
}

#endif
