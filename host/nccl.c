/* NCCL loaded at run time (nccl.h); the group over it is the CUDA backend's
 * (cuda/nccl_group.c). */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/error.h"
#include "host/nccl.h"

/* Stores a dlsym result in a function pointer (ISO C has no conversion from void *). */
static bool resolve(void *handle, const char *name, void *fn_slot, size_t size) {
  void *sym = dlsym(handle, name);
  if (!sym) return false;
  memcpy(fn_slot, &sym, size);
  return true;
}

mn_status mn_nccl_open(const char *library, mn_nccl *api) {
  *api = (mn_nccl){0};
  void *h = dlopen(library, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char *why = dlerror();
    return mn_fail(MN_ERR_UNSUPPORTED,
                   "NCCL is not available: cannot load %s (%s); install NCCL 2 or set "
                   "MN_NCCL_LIBRARY to its path",
                   library, why ? why : "not found");
  }
  struct {
    const char *name;
    void *slot;
    size_t size;
  } fns[] = {
      {"ncclGetUniqueId", &api->get_unique_id, sizeof api->get_unique_id},
      {"ncclCommInitRank", &api->comm_init_rank, sizeof api->comm_init_rank},
      {"ncclAllReduce", &api->all_reduce, sizeof api->all_reduce},
      {"ncclReduceScatter", &api->reduce_scatter, sizeof api->reduce_scatter},
      {"ncclAllGather", &api->all_gather, sizeof api->all_gather},
      {"ncclBroadcast", &api->broadcast, sizeof api->broadcast},
      {"ncclGroupStart", &api->group_start, sizeof api->group_start},
      {"ncclGroupEnd", &api->group_end, sizeof api->group_end},
      {"ncclCommAbort", &api->comm_abort, sizeof api->comm_abort},
      {"ncclCommDestroy", &api->comm_destroy, sizeof api->comm_destroy},
      {"ncclGetErrorString", &api->get_error_string, sizeof api->get_error_string},
      {"ncclCommGetAsyncError", &api->comm_get_async_error, sizeof api->comm_get_async_error},
  };
  for (size_t i = 0; i < sizeof fns / sizeof fns[0]; i++)
    if (!resolve(h, fns[i].name, fns[i].slot, fns[i].size)) {
      dlclose(h);
      *api = (mn_nccl){0};
      return mn_fail(MN_ERR_UNSUPPORTED, "NCCL is not usable: %s has no %s (NCCL 2 expected)",
                     library, fns[i].name);
    }
  api->handle = h;
  return MN_OK;
}

static pthread_once_t once = PTHREAD_ONCE_INIT;
static mn_nccl nccl;
static mn_status nccl_status;
static char nccl_why[512];

static void open_once(void) {
  const char *lib = getenv("MN_NCCL_LIBRARY");
  nccl_status = mn_nccl_open(lib && *lib ? lib : MN_NCCL_LIBRARY, &nccl);
  if (nccl_status != MN_OK) snprintf(nccl_why, sizeof nccl_why, "%s", mn_last_error());
}

mn_status mn_nccl_get(const mn_nccl **out) {
  pthread_once(&once, open_once);
  *out = nccl_status == MN_OK ? &nccl : NULL;
  if (nccl_status != MN_OK) return mn_fail(nccl_status, "%s", nccl_why);
  return MN_OK;
}

const char *mn_nccl_error(void) {
  pthread_once(&once, open_once);
  return nccl_why;
}

mn_status mn_group_id_new(mn_group_id *out) {
  if (!out) return mn_fail(MN_ERR_INVALID_ARGUMENT, "mn_group_id_new: out is NULL");
  const mn_nccl *api = NULL;
  mn_status st = mn_nccl_get(&api);
  if (st != MN_OK) return mn_fail(st, "mn_group_id_new: %s", mn_nccl_error());
  mn_nccl_unique_id id;
  mn_nccl_result r = api->get_unique_id(&id);
  if (r != 0)
    return mn_fail(MN_ERR_DEVICE, "mn_group_id_new: ncclGetUniqueId: %s", api->get_error_string(r));
  memcpy(out->bytes, id.internal, sizeof out->bytes);
  return MN_OK;
}
