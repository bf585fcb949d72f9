/* Collectives between the ranks of a data-parallel group (mn_group, include/meganeura.h):
 * the layer the backends call to reduce gradients and the session calls to join a group and
 * save checkpoints. A group is implemented by a table of functions: the in-process one
 * (collective_local.c: ranks are threads of one process, for the CPU backend) here, NCCL's
 * (host/nccl.h) for the CUDA backend. Buffers are host memory for the in-process group and
 * device memory for NCCL.
 *
 * Every rank calls the same collectives in the same order. The in-process group reduces in
 * rank order, so that results do not depend on which thread arrives first. */
#ifndef MN_HOST_COLLECTIVE_H
#define MN_HOST_COLLECTIVE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "meganeura.h"

typedef enum mn_reduce_op { MN_REDUCE_SUM, MN_REDUCE_MEAN, MN_REDUCE_MAX } mn_reduce_op;

typedef struct mn_collective_ops {
  const char *name;
  /* buf (n floats) becomes the reduction of every rank's buf. */
  mn_status (*all_reduce)(mn_group *g, int rank, float *buf, size_t n, mn_reduce_op op);
  /* out (shard floats) becomes the reduction of elements [rank * shard, (rank + 1) * shard)
   * of every rank's in (world_size * shard floats). */
  mn_status (*reduce_scatter)(mn_group *g, int rank, const float *in, float *out, size_t shard,
                              mn_reduce_op op);
  /* out (world_size * shard floats) becomes every rank's in (shard floats), in rank order. */
  mn_status (*all_gather)(mn_group *g, int rank, const float *in, float *out, size_t shard);
  /* buf (bytes) becomes root's buf. */
  mn_status (*broadcast)(mn_group *g, int rank, void *buf, size_t bytes, int root);
  mn_status (*barrier)(mn_group *g, int rank);
  /* all_reduce and broadcast over host memory, waiting until done (the join check, checkpoint
   * outcomes); NULL where the collectives above take host memory already. */
  mn_status (*host_all_reduce)(mn_group *g, int rank, float *buf, size_t n, mn_reduce_op op);
  mn_status (*host_broadcast)(mn_group *g, int rank, void *buf, size_t bytes, int root);
  /* Breaks the group: every pending and later collective fails at once, naming why. */
  void (*abort)(mn_group *g, const char *why);
  void (*destroy)(mn_group *g);
} mn_collective_ops;

struct mn_group {
  const mn_collective_ops *ops;
  int world_size;
  double timeout_s;
  void *impl;
};

/* The timeout when none is given (seconds). */
#define MN_GROUP_DEFAULT_TIMEOUT_S 300.0

/* A rank's first collective, made when its session is built: every rank tells its world size
 * and a hash of its plan; MN_ERR_INVALID_ARGUMENT on every rank when they differ (naming a
 * rank that disagrees with rank 0), MN_ERR_STATE on a timeout. */
mn_status mn_group_join(mn_group *g, int rank, int world_size, uint64_t config_hash,
                        const char *fn);

/* Whether g is an in-process group (collective_local.c). */
bool mn_group_is_local(const mn_group *g);

/* Shorthands through g->ops. */
static inline mn_status mn_all_reduce(mn_group *g, int rank, float *buf, size_t n,
                                      mn_reduce_op op) {
  return g->ops->all_reduce(g, rank, buf, n, op);
}
static inline mn_status mn_reduce_scatter(mn_group *g, int rank, const float *in, float *out,
                                          size_t shard, mn_reduce_op op) {
  return g->ops->reduce_scatter(g, rank, in, out, shard, op);
}
static inline mn_status mn_all_gather(mn_group *g, int rank, const float *in, float *out,
                                      size_t shard) {
  return g->ops->all_gather(g, rank, in, out, shard);
}
static inline mn_status mn_broadcast(mn_group *g, int rank, void *buf, size_t bytes, int root) {
  return g->ops->broadcast(g, rank, buf, bytes, root);
}
static inline mn_status mn_barrier(mn_group *g, int rank) { return g->ops->barrier(g, rank); }
/* Small host buffers, whatever memory the group's collectives take. */
static inline mn_status mn_all_reduce_host(mn_group *g, int rank, float *buf, size_t n,
                                           mn_reduce_op op) {
  return (g->ops->host_all_reduce ? g->ops->host_all_reduce : g->ops->all_reduce)(g, rank, buf, n,
                                                                                  op);
}
static inline mn_status mn_broadcast_host(mn_group *g, int rank, void *buf, size_t bytes,
                                          int root) {
  return (g->ops->host_broadcast ? g->ops->host_broadcast : g->ops->broadcast)(g, rank, buf, bytes,
                                                                               root);
}

#endif
