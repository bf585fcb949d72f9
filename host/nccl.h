/* NCCL, loaded at run time (dlopen), so that the library builds and runs without it: the few
 * types and functions meganeura calls, declared here after nccl.h (NCCL 2.x ABI), and the
 * group whose collectives run through them on a CUDA stream. */
#ifndef MN_HOST_NCCL_H
#define MN_HOST_NCCL_H

#include <stddef.h>

#include "host/collective.h"

#define MN_NCCL_LIBRARY "libnccl.so.2"

typedef struct mn_nccl_comm *mn_nccl_comm_t; /* ncclComm_t */
typedef struct mn_nccl_unique_id {
  char internal[128];
} mn_nccl_unique_id;        /* ncclUniqueId */
typedef int mn_nccl_result; /* ncclResult_t: 0 is ncclSuccess */
/* ncclDataType_t and ncclRedOp_t values used here. */
enum { MN_NCCL_FLOAT32 = 7, MN_NCCL_FLOAT64 = 8, MN_NCCL_UINT8 = 1, MN_NCCL_UINT32 = 3 };
/* ncclResult_t's ncclInProgress: an operation of a communicator is still running. */
enum { MN_NCCL_IN_PROGRESS = 7 };
enum { MN_NCCL_SUM = 0, MN_NCCL_MAX = 2, MN_NCCL_AVG = 4 };

typedef struct mn_nccl {
  void *handle;
  mn_nccl_result (*get_unique_id)(mn_nccl_unique_id *id);
  mn_nccl_result (*comm_init_rank)(mn_nccl_comm_t *comm, int nranks, mn_nccl_unique_id id,
                                   int rank);
  mn_nccl_result (*all_reduce)(const void *send, void *recv, size_t count, int dtype, int op,
                               mn_nccl_comm_t comm, void *stream);
  mn_nccl_result (*reduce_scatter)(const void *send, void *recv, size_t recv_count, int dtype,
                                   int op, mn_nccl_comm_t comm, void *stream);
  mn_nccl_result (*all_gather)(const void *send, void *recv, size_t send_count, int dtype,
                               mn_nccl_comm_t comm, void *stream);
  mn_nccl_result (*broadcast)(const void *send, void *recv, size_t count, int dtype, int root,
                              mn_nccl_comm_t comm, void *stream);
  mn_nccl_result (*group_start)(void);
  mn_nccl_result (*group_end)(void);
  mn_nccl_result (*comm_abort)(mn_nccl_comm_t comm);
  mn_nccl_result (*comm_destroy)(mn_nccl_comm_t comm);
  const char *(*get_error_string)(mn_nccl_result r);
  mn_nccl_result (*comm_get_async_error)(mn_nccl_comm_t comm, mn_nccl_result *async_error);
} mn_nccl;

/* Opens `library` and resolves every function: MN_ERR_UNSUPPORTED naming the library and what
 * dlopen or dlsym said when it cannot (api left zeroed). */
mn_status mn_nccl_open(const char *library, mn_nccl *api);
/* The process's NCCL, opened once: MN_NCCL_LIBRARY from the environment, else libnccl.so.2.
 * On failure the same error every time, also in mn_nccl_error. */
mn_status mn_nccl_get(const mn_nccl **out);
/* Why mn_nccl_get failed ("" when it did not). */
const char *mn_nccl_error(void);

#endif
