/* NCCL loaded at run time (nccl.h) and the group over it. */
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

/* ------------------------------------------------------------------ the group */

typedef struct nccl_group {
  const mn_nccl *api;
  mn_nccl_comm_t comm;
  void *stream;
  float *scratch;
  bool failed;  /* a call failed: destroying aborts the communicator instead of waiting on it */
  bool aborted; /* the communicator is gone (ncclCommAbort) */
} nccl_group;

static mn_status check(nccl_group *n, mn_nccl_result r, const char *what) {
  if (r == 0) return MN_OK;
  n->failed = true;
  return mn_fail(MN_ERR_DEVICE, "%s: %s", what, n->api->get_error_string(r));
}

static mn_status aborted(void) { return mn_fail(MN_ERR_STATE, "the NCCL group was aborted"); }

static int nccl_op(mn_reduce_op op) {
  return op == MN_REDUCE_MEAN ? MN_NCCL_AVG : op == MN_REDUCE_MAX ? MN_NCCL_MAX : MN_NCCL_SUM;
}

static mn_status n_all_reduce(mn_group *g, int rank, float *buf, size_t n, mn_reduce_op op) {
  (void)rank;
  nccl_group *c = g->impl;
  if (c->aborted) return aborted();
  return check(c, c->api->all_reduce(buf, buf, n, MN_NCCL_FLOAT32, nccl_op(op), c->comm, c->stream),
               "ncclAllReduce");
}

static mn_status n_reduce_scatter(mn_group *g, int rank, const float *in, float *out, size_t shard,
                                  mn_reduce_op op) {
  (void)rank;
  nccl_group *c = g->impl;
  if (c->aborted) return aborted();
  return check(
      c, c->api->reduce_scatter(in, out, shard, MN_NCCL_FLOAT32, nccl_op(op), c->comm, c->stream),
      "ncclReduceScatter");
}

static mn_status n_all_gather(mn_group *g, int rank, const float *in, float *out, size_t shard) {
  (void)rank;
  nccl_group *c = g->impl;
  if (c->aborted) return aborted();
  return check(c, c->api->all_gather(in, out, shard, MN_NCCL_FLOAT32, c->comm, c->stream),
               "ncclAllGather");
}

static mn_status n_broadcast(mn_group *g, int rank, void *buf, size_t bytes, int root) {
  (void)rank;
  nccl_group *c = g->impl;
  if (c->aborted) return aborted();
  return check(c, c->api->broadcast(buf, buf, bytes, MN_NCCL_UINT8, root, c->comm, c->stream),
               "ncclBroadcast");
}

static mn_status n_barrier(mn_group *g, int rank) {
  nccl_group *c = g->impl;
  return n_all_reduce(g, rank, c->scratch, 1, MN_REDUCE_SUM);
}

static void n_abort(mn_group *g, const char *why) {
  (void)why;
  nccl_group *c = g->impl;
  if (!c->aborted) c->api->comm_abort(c->comm);
  c->aborted = true;
}

static void n_destroy(mn_group *g) {
  nccl_group *c = g->impl;
  if (c->failed && !c->aborted)
    c->api->comm_abort(c->comm);
  else if (!c->aborted)
    c->api->comm_destroy(c->comm);
  free(c);
}

static const mn_collective_ops nccl_ops = {
    .name = "nccl",
    .all_reduce = n_all_reduce,
    .reduce_scatter = n_reduce_scatter,
    .all_gather = n_all_gather,
    .broadcast = n_broadcast,
    .barrier = n_barrier,
    .abort = n_abort,
    .destroy = n_destroy,
};

mn_status mn_nccl_group_new(const mn_group_id *id, int world_size, int rank, void *stream,
                            float *device_scratch, mn_group **out) {
  *out = NULL;
  const mn_nccl *api = NULL;
  mn_status st = mn_nccl_get(&api);
  if (st != MN_OK) return st;
  nccl_group *c = calloc(1, sizeof *c);
  mn_group *g = calloc(1, sizeof *g);
  if (!c || !g) {
    free(c);
    free(g);
    return mn_fail(MN_ERR_OUT_OF_MEMORY, "NCCL group: out of memory");
  }
  *c = (nccl_group){.api = api, .stream = stream, .scratch = device_scratch};
  mn_nccl_unique_id uid;
  memcpy(uid.internal, id->bytes, sizeof uid.internal);
  if ((st = check(c, api->comm_init_rank(&c->comm, world_size, uid, rank), "ncclCommInitRank")) !=
      MN_OK) {
    free(c);
    free(g);
    return st;
  }
  *g = (mn_group){.ops = &nccl_ops,
                  .world_size = world_size,
                  .timeout_s = MN_GROUP_DEFAULT_TIMEOUT_S,
                  .impl = c};
  *out = g;
  return MN_OK;
}
