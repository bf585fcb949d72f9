/* F16 training on CUDA: the kernels of the device's loss scaler (kernels/optimizer.cuh,
 * mn_scaler_*), declared beside the optimizer's. Kept out of emit.h, which the lowering
 * includes everywhere; emit.c defines it, and both the backend and the offline compile (through
 * mn_cu_program_add_optimizer) declare the same instances. */
#ifndef MN_CUDA_LOSS_SCALE_H
#define MN_CUDA_LOSS_SCALE_H

#include "cuda/emit.h"

/* The kernels run by every step of an F16 training plan (p->loss_scale set): mn_scaler_begin
 * (one thread), mn_scaler_unscale over the update block, mn_scaler_end (one thread). Sets the
 * three indices, or -1 each when the plan has no loss scale or is not trained. Declaring them
 * again returns the same indices. */
mn_status mn_cu_program_add_loss_scaler(mn_cu_program *prog, const mn_plan *p, bool training,
                                        int *begin, int *unscale, int *end);

/* Threads per block of the one-thread scaler kernels. */
#define MN_CU_SCALER_BLOCK 32

#endif
