/* NVRTC compilation of a program's translation unit, through an on-disk cubin cache.
 * Needs no device: the offline check and CI compile kernels for a named architecture. */
#ifndef MN_CUDA_JIT_H
#define MN_CUDA_JIT_H

#include <stdbool.h>
#include <stddef.h>

#include "meganeura.h"

typedef struct mn_cu_binary {
  void *data; /* cubin, malloc'd */
  size_t size;
  bool from_cache;   /* true when nothing was compiled */
  double compile_ms; /* NVRTC time (0 on a cache hit) */
  char key[33];      /* cache key: hex of the hash of source, options, NVRTC version, arch */
} mn_cu_binary;

/* Compiles `source` for `arch` (e.g. "sm_90"). cache_dir NULL means MN_CACHE_DIR, else
 * ~/.cache/meganeura; "" disables the cache. A compile error is MN_ERR_DEVICE with the
 * compiler log in the message. */
mn_status mn_cu_compile(const char *source, const char *arch, const char *cache_dir,
                        mn_cu_binary *out);
void mn_cu_binary_free(mn_cu_binary *b);

/* The cache folder (created when missing) as mn_cu_compile names it from cache_dir, or false
 * when caching is off or no folder can be made. */
bool mn_cu_cache_folder(const char *cache_dir, char *out, size_t size);

#endif
