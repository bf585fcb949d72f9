/* The NCCL group of one CUDA rank. NCCL's blocking ncclCommInitRank waits for every rank
 * without a deadline, so it runs in a thread the caller waits for at most the group's
 * timeout; a rank that gives up leaves the thread to abort the communicator should it ever
 * come. Collectives take device memory and are enqueued on the stream of the session that
 * joined; host-memory ones (the join check, checkpoint outcomes) go through a small pinned
 * and device staging area. Every wait polls (mn_cu_nccl_wait): NCCL kernels spin until every
 * rank arrives, so a dead rank would otherwise hang its peers. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda/cuda_backend.h"
#include "cuda/nccl_group.h"
#include "host/error.h"

/* The largest host-memory collective (a checkpoint's outcome is about 500 bytes). */
#define STAGE_BYTES 1024
/* After an abort, how long the stream may take to drain before the wait gives up on it. */
#define DRAIN_S 10.0

typedef struct cu_nccl {
  const mn_nccl *api;
  mn_nccl_comm_t comm;
  int device, rank;
  cudaStream_t own, stream; /* stream: the joined session's, else own */
  unsigned char *dev_stage, *host_stage;
  bool failed; /* a call failed: freeing aborts the communicator instead of destroying it */
  atomic_bool aborted;
  char why[512];
} cu_nccl;

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static void abort_comm(cu_nccl *c, const char *why) {
  bool was = atomic_exchange(&c->aborted, true);
  if (was) return;
  snprintf(c->why, sizeof c->why, "%s", why);
  c->api->comm_abort(c->comm);
}

mn_status mn_cu_nccl_check(mn_group *g, mn_nccl_result r, const char *what) {
  if (r == 0) return MN_OK;
  cu_nccl *c = g->impl;
  c->failed = true;
  return mn_fail(MN_ERR_DEVICE, "%s: %s", what, c->api->get_error_string(r));
}

mn_status mn_cu_nccl_usable(const mn_group *g, const char *what) {
  cu_nccl *c = g->impl;
  if (!atomic_load(&c->aborted)) return MN_OK;
  return mn_fail(MN_ERR_STATE, "%s: the NCCL group was aborted (%s)", what, c->why);
}

/* Polls the stream, or the event when there is one. */
static mn_status poll(mn_group *g, cudaStream_t stream, cudaEvent_t event, const char *what) {
  cu_nccl *c = g->impl;
  double t0 = now_s();
  for (unsigned polls = 0;; polls++) {
    cudaError_t e = event ? cudaEventQuery(event) : cudaStreamQuery(stream);
    if (e == cudaSuccess) return mn_cu_nccl_usable(g, what);
    if (e != cudaErrorNotReady) {
      c->failed = true;
      cudaGetLastError();
      return mn_fail(MN_ERR_DEVICE, "%s: %s", what, cudaGetErrorString(e));
    }
    double waited = now_s() - t0;
    if (!atomic_load(&c->aborted)) {
      mn_nccl_result async = 0;
      char why[sizeof c->why];
      if (c->api->comm_get_async_error(c->comm, &async) == 0 && async != 0 &&
          async != MN_NCCL_IN_PROGRESS) {
        snprintf(why, sizeof why, "rank %d: NCCL error: %s", c->rank,
                 c->api->get_error_string(async));
        abort_comm(c, why);
      } else if (waited > g->timeout_s) {
        snprintf(why, sizeof why,
                 "rank %d waited %.1f s for the other ranks of the NCCL group; the communicator "
                 "was aborted",
                 c->rank, waited);
        abort_comm(c, why);
      }
    } else if (waited > g->timeout_s + DRAIN_S) {
      return mn_fail(MN_ERR_STATE, "%s: %s, and its work did not end", what, c->why);
    }
    struct timespec pause = {0, polls < 1000 ? 20000 : 1000000};
    nanosleep(&pause, NULL);
  }
}

mn_status mn_cu_nccl_wait(mn_group *g, cudaStream_t stream, const char *what) {
  return poll(g, stream, NULL, what);
}

mn_status mn_cu_nccl_wait_event(mn_group *g, cudaEvent_t event, const char *what) {
  return poll(g, NULL, event, what);
}

/* ------------------------------------------------------------------ collectives */

static int nccl_op(mn_reduce_op op) {
  return op == MN_REDUCE_MEAN ? MN_NCCL_AVG : op == MN_REDUCE_MAX ? MN_NCCL_MAX : MN_NCCL_SUM;
}

static mn_status ready(mn_group *g, const char *what) {
  cu_nccl *c = g->impl;
  mn_status st = mn_cu_nccl_usable(g, what);
  if (st == MN_OK && cudaSetDevice(c->device) != cudaSuccess)
    st = mn_fail(MN_ERR_DEVICE, "%s: cannot use device %d", what, c->device);
  return st;
}

static mn_status n_all_reduce(mn_group *g, int rank, float *buf, size_t n, mn_reduce_op op) {
  (void)rank;
  cu_nccl *c = g->impl;
  mn_status st = ready(g, "ncclAllReduce");
  if (st != MN_OK) return st;
  return mn_cu_nccl_check(
      g, c->api->all_reduce(buf, buf, n, MN_NCCL_FLOAT32, nccl_op(op), c->comm, c->stream),
      "ncclAllReduce");
}

static mn_status n_reduce_scatter(mn_group *g, int rank, const float *in, float *out, size_t shard,
                                  mn_reduce_op op) {
  (void)rank;
  cu_nccl *c = g->impl;
  mn_status st = ready(g, "ncclReduceScatter");
  if (st != MN_OK) return st;
  return mn_cu_nccl_check(
      g, c->api->reduce_scatter(in, out, shard, MN_NCCL_FLOAT32, nccl_op(op), c->comm, c->stream),
      "ncclReduceScatter");
}

static mn_status n_all_gather(mn_group *g, int rank, const float *in, float *out, size_t shard) {
  (void)rank;
  cu_nccl *c = g->impl;
  mn_status st = ready(g, "ncclAllGather");
  if (st != MN_OK) return st;
  return mn_cu_nccl_check(
      g, c->api->all_gather(in, out, shard, MN_NCCL_FLOAT32, c->comm, c->stream), "ncclAllGather");
}

static mn_status n_broadcast(mn_group *g, int rank, void *buf, size_t bytes, int root) {
  (void)rank;
  cu_nccl *c = g->impl;
  mn_status st = ready(g, "ncclBroadcast");
  if (st != MN_OK) return st;
  return mn_cu_nccl_check(
      g, c->api->broadcast(buf, buf, bytes, MN_NCCL_UINT8, root, c->comm, c->stream),
      "ncclBroadcast");
}

/* Host memory through the staging area: in, the collective, out, then the watchdog's wait. */
static mn_status staged(mn_group *g, void *buf, size_t bytes, mn_reduce_op op, int root,
                        const char *what) {
  cu_nccl *c = g->impl;
  if (bytes > STAGE_BYTES)
    return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: %zu bytes of host memory exceed the %d staged",
                   what, bytes, STAGE_BYTES);
  mn_status st = ready(g, what);
  if (st != MN_OK) return st;
  memcpy(c->host_stage, buf, bytes);
  if (cudaMemcpyAsync(c->dev_stage, c->host_stage, bytes, cudaMemcpyHostToDevice, c->stream) !=
      cudaSuccess)
    return mn_fail(MN_ERR_DEVICE, "%s: cannot copy to device %d", what, c->device);
  mn_nccl_result r = root >= 0
                         ? c->api->broadcast(c->dev_stage, c->dev_stage, bytes, MN_NCCL_UINT8, root,
                                             c->comm, c->stream)
                         : c->api->all_reduce(c->dev_stage, c->dev_stage, bytes / sizeof(float),
                                              MN_NCCL_FLOAT32, nccl_op(op), c->comm, c->stream);
  if ((st = mn_cu_nccl_check(g, r, what)) != MN_OK) return st;
  if (cudaMemcpyAsync(c->host_stage, c->dev_stage, bytes, cudaMemcpyDeviceToHost, c->stream) !=
      cudaSuccess)
    return mn_fail(MN_ERR_DEVICE, "%s: cannot copy from device %d", what, c->device);
  if ((st = mn_cu_nccl_wait(g, c->stream, what)) != MN_OK) return st;
  memcpy(buf, c->host_stage, bytes);
  return MN_OK;
}

static mn_status n_host_all_reduce(mn_group *g, int rank, float *buf, size_t n, mn_reduce_op op) {
  (void)rank;
  return staged(g, buf, n * sizeof *buf, op, -1, "ncclAllReduce");
}

static mn_status n_host_broadcast(mn_group *g, int rank, void *buf, size_t bytes, int root) {
  (void)rank;
  return staged(g, buf, bytes, MN_REDUCE_SUM, root, "ncclBroadcast");
}

static mn_status n_barrier(mn_group *g, int rank) {
  float one = 1.0f;
  return n_host_all_reduce(g, rank, &one, 1, MN_REDUCE_SUM);
}

static void n_abort(mn_group *g, const char *why) {
  cu_nccl *c = g->impl;
  cudaSetDevice(c->device);
  abort_comm(c, why ? why : "aborted");
}

static void release(cu_nccl *c) {
  cudaSetDevice(c->device);
  if (c->own) cudaStreamDestroy(c->own);
  cudaFree(c->dev_stage);
  cudaFreeHost(c->host_stage);
  cudaGetLastError();
  free(c);
}

static void n_destroy(mn_group *g) {
  cu_nccl *c = g->impl;
  cudaSetDevice(c->device);
  if (!atomic_load(&c->aborted)) {
    if (c->failed)
      c->api->comm_abort(c->comm);
    else
      c->api->comm_destroy(c->comm);
  }
  release(c);
}

static const mn_collective_ops nccl_ops = {
    .name = "nccl",
    .all_reduce = n_all_reduce,
    .reduce_scatter = n_reduce_scatter,
    .all_gather = n_all_gather,
    .broadcast = n_broadcast,
    .barrier = n_barrier,
    .host_all_reduce = n_host_all_reduce,
    .host_broadcast = n_host_broadcast,
    .abort = n_abort,
    .destroy = n_destroy,
};

bool mn_cu_nccl_is(const mn_group *g) { return g && g->ops == &nccl_ops; }
int mn_cu_nccl_device(const mn_group *g) { return ((const cu_nccl *)g->impl)->device; }
const mn_nccl *mn_cu_nccl_api(const mn_group *g) { return ((const cu_nccl *)g->impl)->api; }
mn_nccl_comm_t mn_cu_nccl_comm(const mn_group *g) { return ((const cu_nccl *)g->impl)->comm; }

void mn_cu_nccl_bind(mn_group *g, cudaStream_t stream) {
  cu_nccl *c = g->impl;
  c->stream = stream ? stream : c->own;
}

/* ------------------------------------------------------------------ creation */

typedef struct init_job {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  const mn_nccl *api;
  mn_nccl_unique_id id;
  int world, rank, device;
  mn_nccl_comm_t comm;
  mn_nccl_result result;
  bool done, abandoned;
} init_job;

static void job_free(init_job *j) {
  pthread_mutex_destroy(&j->mu);
  pthread_cond_destroy(&j->cv);
  free(j);
}

static void *init_main(void *arg) {
  init_job *j = arg;
  mn_nccl_comm_t comm = NULL;
  mn_nccl_result r = 1; /* ncclUnhandledCudaError */
  if (cudaSetDevice(j->device) == cudaSuccess)
    r = j->api->comm_init_rank(&comm, j->world, j->id, j->rank);
  pthread_mutex_lock(&j->mu);
  j->comm = comm;
  j->result = r;
  j->done = true;
  bool abandoned = j->abandoned;
  pthread_cond_signal(&j->cv);
  pthread_mutex_unlock(&j->mu);
  if (!abandoned) return NULL;
  if (r == 0) j->api->comm_abort(comm);
  job_free(j);
  return NULL;
}

/* ncclCommInitRank on a thread of its own, waited for at most timeout_s. */
static mn_status init_comm(const char *fn, const mn_nccl *api, const mn_group_id *id, int world,
                           int rank, int device, double timeout_s, mn_nccl_comm_t *out) {
  init_job *j = calloc(1, sizeof *j);
  if (!j) return mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
  *j = (init_job){.api = api, .world = world, .rank = rank, .device = device};
  memcpy(j->id.internal, id->bytes, sizeof j->id.internal);
  pthread_mutex_init(&j->mu, NULL);
  pthread_cond_init(&j->cv, NULL);
  pthread_t thread;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  int started = pthread_create(&thread, &attr, init_main, j);
  pthread_attr_destroy(&attr);
  if (started != 0) {
    job_free(j);
    return mn_fail(MN_ERR_STATE, "%s: cannot start a thread", fn);
  }
  struct timespec deadline;
  clock_gettime(CLOCK_REALTIME, &deadline);
  double whole = (double)deadline.tv_sec + (double)deadline.tv_nsec / 1e9 + timeout_s;
  deadline.tv_sec = (time_t)whole;
  deadline.tv_nsec = (long)((whole - (double)deadline.tv_sec) * 1e9);
  pthread_mutex_lock(&j->mu);
  while (!j->done)
    if (pthread_cond_timedwait(&j->cv, &j->mu, &deadline) != 0 && !j->done) break;
  if (!j->done) {
    j->abandoned = true;
    pthread_mutex_unlock(&j->mu);
    return mn_fail(MN_ERR_STATE,
                   "%s: rank %d waited %.1f s for the other ranks of %d to join the NCCL group", fn,
                   rank, timeout_s, world);
  }
  pthread_mutex_unlock(&j->mu);
  mn_nccl_result r = j->result;
  *out = j->comm;
  job_free(j);
  if (r != 0)
    return mn_fail(MN_ERR_DEVICE, "%s: ncclCommInitRank: %s", fn, api->get_error_string(r));
  return MN_OK;
}

mn_status mn_cuda_nccl_group_new(const mn_group_id *id, int world_size, int rank, int device,
                                 double timeout_s, mn_group **out) {
  const char *fn = "mn_group_new_nccl";
  *out = NULL;
  int devices = mn_cuda_usable_devices();
  if (device < 0 || device >= devices)
    return mn_fail(MN_ERR_DEVICE, "%s: device %d is not usable (%d CUDA device%s)", fn, device,
                   devices, devices == 1 ? "" : "s");
  const mn_nccl *api = NULL;
  mn_status st = mn_nccl_get(&api);
  if (st != MN_OK) return st;
  if (cudaSetDevice(device) != cudaSuccess)
    return mn_fail(MN_ERR_DEVICE, "%s: cannot use device %d", fn, device);
  cu_nccl *c = calloc(1, sizeof *c);
  mn_group *g = calloc(1, sizeof *g);
  if (!c || !g) {
    free(c);
    free(g);
    return mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
  }
  c->api = api;
  c->device = device;
  c->rank = rank;
  atomic_init(&c->aborted, false);
  if (cudaStreamCreateWithFlags(&c->own, cudaStreamNonBlocking) != cudaSuccess ||
      cudaMalloc((void **)&c->dev_stage, STAGE_BYTES) != cudaSuccess ||
      cudaMallocHost((void **)&c->host_stage, STAGE_BYTES) != cudaSuccess) {
    release(c);
    free(g);
    return mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: cannot allocate on device %d", fn, device);
  }
  c->stream = c->own;
  double timeout = timeout_s > 0 ? timeout_s : MN_GROUP_DEFAULT_TIMEOUT_S;
  st = init_comm(fn, api, id, world_size, rank, device, timeout, &c->comm);
  if (st != MN_OK) {
    release(c);
    free(g);
    return st;
  }
  *g = (mn_group){.ops = &nccl_ops, .world_size = world_size, .timeout_s = timeout, .impl = c};
  *out = g;
  return MN_OK;
}
