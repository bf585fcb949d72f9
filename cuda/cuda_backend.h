/* The CUDA backend as the rest of the library sees it. */
#ifndef MN_CUDA_BACKEND_H
#define MN_CUDA_BACKEND_H

#include <stdio.h>

#include "cuda/jit.h"
#include "host/backend.h"

extern const mn_backend_ops mn_cuda_backend;

/* Number of usable CUDA devices (0 when there is no driver or no device). */
int mn_cuda_usable_devices(void);
/* Compute capability of CUDA device `device` as major * 10 + minor (80 for sm_80, 90 for
 * sm_90); 0 when there is no such usable device. */
int mn_cuda_compute_capability(int device);

/* Lowers a plan (with the optimizer kernels of a training session) and compiles its
 * kernels for `arch` with no device involved (the offline check that CI runs). */
mn_status mn_cuda_compile_plan(const mn_plan *p, const char *arch, bool allow_tf32, bool training,
                               const char *cache_dir, mn_cu_binary *out);
/* The CUDA source that mn_cuda_compile_plan compiles (*source malloc'd; NULL on failure): the
 * kernel templates, then one `mn_kN` instance a kernel, N in the order the cubin names them.
 * For reading a plan's kernels offline (benchmarks/plan_kernels.c). */
mn_status mn_cuda_plan_source(const mn_plan *p, bool allow_tf32, bool training, char **source);

/* The session's stream (a cudaStream_t), for benchmarks that time with CUDA events;
 * NULL for a session not on CUDA. */
void *mn_cuda_session_stream(const mn_session *s);

/* How many input copies the session's launches left out (inputs not written since the step
 * before), for tests; 0 for a session not on CUDA. */
uint64_t mn_cuda_input_copies_skipped(const mn_session *s);
/* How many of its launches were of the step graph without copy nodes (no input written since
 * the step before), for tests; 0 for a session not on CUDA. */
uint64_t mn_cuda_bare_launches(const mn_session *s);

/* Times every command of one training step (run eagerly, outside the step graph, so
 * the parameters take one more update) with CUDA events, `reps` times, and prints the
 * median time per op and the slowest commands to `out`. For benchmarks and
 * scripts/profile.sh; the session must run on CUDA and have stepped once. */
mn_status mn_cuda_profile_step(mn_session *s, int reps, FILE *out);

/* mn_group_new_nccl on CUDA (cuda/nccl_group.c): the communicator on `device`. */
mn_status mn_cuda_nccl_group_new(const mn_group_id *id, int world_size, int rank, int device,
                                 double timeout_s, mn_group **out);

/* A CUDA session joining its NCCL group (session/data_parallel.c): prepare, before the join
 * check, checks that the group is an NCCL group on the session's device and puts the group's
 * collectives on the session's stream; attach, once s->dp is set, makes the events, streams
 * and buffers the step graph's collectives use. */
mn_status mn_cuda_dp_prepare(mn_session *s, const char *fn);
mn_status mn_cuda_dp_attach(mn_session *s);

/* Tests: fills every activation and output buffer and the scratch with NaN, so an
 * element a kernel fails to write shows up. The session must run on CUDA. */
mn_status mn_cuda_poison(mn_session *s);

#endif
