/* NVTX ranges around session build phases and steps, so nsys and ncu timelines read
 * well. NVTX 3 is header-only: with no profiler attached a range costs a branch. */
#ifndef MN_CUDA_NVTX_H
#define MN_CUDA_NVTX_H

#include <nvtx3/nvToolsExt.h>

static inline void mn_nvtx_push(const char *name) { nvtxRangePushA(name); }
static inline void mn_nvtx_pop(void) { nvtxRangePop(); }

#endif
