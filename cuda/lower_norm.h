/* The row norms' launch shape, shared by their lowering (lower_transformer.c) and by fused
 * programs that hold a norm (lower_fused.c). */
#ifndef MN_CUDA_LOWER_NORM_H
#define MN_CUDA_LOWER_NORM_H

#include "cuda/emit.h"

/* Launches generated code `code` (mn_cu_kernel_generated) that defines
 *   template <int BLOCK, int RPB, long long ROWS, int VEC, long long N, int ITEMS, bool CACHE>
 *   __device__ void MN_GEN(const IO &io)
 * over the rows of x's last axis with the norm kernels' launch shape for x (norm.cuh), with
 * arguments args[0..nargs). */
mn_status mn_cu_launch_norm_rows(const mn_cu_op_ctx *c, const mn_tensor_type *x, const char *code,
                                 int nargs, const mn_cu_arg *args);

#endif
