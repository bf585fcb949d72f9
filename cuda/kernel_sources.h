/* The kernel templates of cuda/kernels/, embedded at build time by
 * cmake/embed_kernels.cmake: the headers shared with C first (MN_KERNEL_SHARED_HEADERS in
 * CMakeLists.txt), then common.cuh, then the other templates by name. */
#ifndef MN_CUDA_KERNEL_SOURCES_H
#define MN_CUDA_KERNEL_SOURCES_H

#include <stddef.h>

typedef struct mn_cu_kernel_source {
  const char *name;
  const char *text;
} mn_cu_kernel_source;

extern const mn_cu_kernel_source mn_cu_kernel_sources[];
extern const size_t mn_cu_num_kernel_sources;

#endif
