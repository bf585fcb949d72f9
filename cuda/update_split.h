/* The optimizer update of a small step in two launches (update_split.c): the parameters whose
 * gradients are done early in the backward pass (a network's last layers) are updated beside
 * the rest of it on a stream of their own, and only the others after it, so that the step's
 * last node updates part of the weights instead of all of them.
 *
 * The program build picks the two parts (contiguous runs of the flat update block, whole
 * parameters each) from which commands use each parameter and its gradient, and declares an
 * update kernel for each. The capture (capture.c) then checks the order on the device's
 * addresses: the early part starts once every command that touches its weights or gradients,
 * or may report an error (a failed step updates nothing), has run; it runs only where that is
 * before the last command that touches the other part. Plain SGD and Adam(W) steps of F32
 * sessions on several streams: gradient clipping needs every gradient first, accumulation and
 * data parallelism change what the update reads, and an F16 step's scaler runs around it. */
#ifndef MN_CUDA_UPDATE_SPLIT_H
#define MN_CUDA_UPDATE_SPLIT_H

#include "cuda/emit.h"

/* Elements of the flat update block; kernel -1: no split. */
typedef struct mn_cu_update_part {
  long long first, count;
  int kernel;
} mn_cu_update_part;

typedef struct mn_cu_update_split {
  mn_cu_update_part early, late;
} mn_cu_update_split;

/* A part smaller than this share of the update block is not worth a launch of its own. */
#define MN_CU_UPDATE_SPLIT_MIN_SHARE 0.125

/* Declares the two parts' update kernels for a small training program (products under
 * MN_CU_SMALL_STEP_FLOPS, F32 storage, two parameters or more), right after its whole update
 * (mn_cu_program_add_optimizer), so that a session and an offline compile of the plan declare
 * the same kernels; otherwise both kernels are -1. MN_CUDA_SPLIT_UPDATE=0 turns it off. */
mn_status mn_cu_update_split_declare(mn_cu_program *prog, const mn_plan *p, bool training,
                                     mn_cu_update_split *split);

#endif
