/* The NCCL group of one CUDA rank (cuda/nccl_group.c), as the CUDA backend's data-parallel
 * code (cuda/data_parallel.c) uses it: the communicator and library for the collectives it
 * captures into the step graph, the stream the group's own collectives go on, and the
 * watchdog wait that every wait on a data-parallel session's stream goes through. */
#ifndef MN_CUDA_NCCL_GROUP_H
#define MN_CUDA_NCCL_GROUP_H

#include <cuda_runtime_api.h>

#include "host/nccl.h"

/* Whether g is an NCCL group of this backend. */
bool mn_cu_nccl_is(const mn_group *g);
/* The device the communicator lives on. */
int mn_cu_nccl_device(const mn_group *g);
/* The group's collectives (mn_all_reduce, ..., and the host-memory ones) go on `stream`, the
 * joined session's, so that they are ordered with its steps; NULL: the group's own stream. */
void mn_cu_nccl_bind(mn_group *g, cudaStream_t stream);
const mn_nccl *mn_cu_nccl_api(const mn_group *g);
mn_nccl_comm_t mn_cu_nccl_comm(const mn_group *g);
/* MN_OK for r == ncclSuccess, else MN_ERR_DEVICE naming `what` and NCCL's reason (the group
 * is then aborted rather than destroyed when freed). */
mn_status mn_cu_nccl_check(mn_group *g, mn_nccl_result r, const char *what);
/* MN_ERR_STATE once the communicator was aborted: no collective can run any more. */
mn_status mn_cu_nccl_usable(const mn_group *g, const char *what);
/* Waits until `stream` has run everything enqueued, polling: an asynchronous NCCL error, or
 * work still running after the group's timeout, aborts the communicator (ncclCommAbort ends
 * its kernels) and fails with MN_ERR_STATE. */
mn_status mn_cu_nccl_wait(mn_group *g, cudaStream_t stream, const char *what);
/* The same for an event. */
mn_status mn_cu_nccl_wait_event(mn_group *g, cudaEvent_t event, const char *what);

#endif
