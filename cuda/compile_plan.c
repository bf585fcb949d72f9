/* Offline compilation of a plan's kernels: lowering plus NVRTC, no device. */
#include <stdlib.h>

#include "cuda/cuda_backend.h"
#include "cuda/emit.h"
#include "cuda/update_split.h"
#include "host/error.h"

mn_status mn_cuda_plan_source(const mn_plan *p, bool allow_tf32, bool training, char **source) {
  *source = NULL;
  mn_cu_program prog;
  mn_status st = mn_cu_program_build(p, allow_tf32, &prog);
  if (st != MN_OK) return st;
  int sumsq, update, accumulate;
  mn_cu_update_split split;
  st = mn_cu_program_add_optimizer(&prog, p, training, &sumsq, &update, &accumulate);
  if (st == MN_OK) st = mn_cu_update_split_declare(&prog, p, training, &split);
  int readback;
  if (st == MN_OK) st = mn_cu_program_add_readback(&prog, p, &readback);
  if (st == MN_OK) mn_cu_program_overlap_small_step(&prog, p, training);
  /* In cuda_create's order, so the wrappers' indices are the session's. */
  int converts;
  if (st == MN_OK) st = mn_cu_program_add_converts(&prog, p, &converts, NULL);
  if (st == MN_OK && !(*source = mn_cu_program_source(&prog)))
    st = mn_fail(MN_ERR_OUT_OF_MEMORY, "cuda backend: no memory for kernel source");
  mn_cu_program_free(&prog);
  return st;
}

mn_status mn_cuda_compile_plan(const mn_plan *p, const char *arch, bool allow_tf32, bool training,
                               const char *cache_dir, mn_cu_binary *out) {
  char *src = NULL;
  mn_status st = mn_cuda_plan_source(p, allow_tf32, training, &src);
  if (st != MN_OK) return st;
  st = mn_cu_compile(src, arch, cache_dir, out);
  free(src);
  return st;
}
