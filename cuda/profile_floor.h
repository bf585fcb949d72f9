/* A profiled step's distance to the card's floor (profile_floor.c), for mn_cuda_profile_step. */
#ifndef MN_CUDA_PROFILE_FLOOR_H
#define MN_CUDA_PROFILE_FLOOR_H

#include <stdio.h>

#include "cuda/cuda_state.h"

typedef struct mn_cu_peaks {
  double gemm_tflops; /* an 8192-cubed bf16 product, FP32 accumulation */
  double copy_tbps;   /* a 1 GiB device-to-device copy, bytes read + written per second */
} mn_cu_peaks;

/* Measures both peaks on the session's stream and device (about 0.2 s and 3 GiB). */
mn_status mn_cu_measure_peaks(cuda_state *st, mn_cu_peaks *out);

/* The command after which the forward pass ends: the last one of the dispatch that writes
 * the loss (num_cmds when the plan has no loss). */
size_t mn_cu_forward_end(const cuda_state *st, const mn_session *s);

/* The least work command `cmd` must do (cmd == num_cmds: the optimizer update): the FLOPs of
 * its products and attention passes, and the bytes of its node's inputs and outputs as stored,
 * counted at the node's first command only. */
void mn_cu_command_work(const cuda_state *st, const mn_session *s, size_t cmd, bool first_of_node,
                        double *flops, double *bytes);

/* The table: per op, the summed median ms, the floor ms (each command's FLOPs at the GEMM
 * rate or its bytes at the copy rate, whichever is longer), achieved TFLOP/s and TB/s, sorted
 * by the distance to the floor; then the forward, backward and optimizer phases. */
void mn_cu_print_floors(const mn_session *s, const double *med, size_t n, const mn_cu_peaks *pk,
                        FILE *out);

#endif
