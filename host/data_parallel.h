/* A session's place in a data-parallel group and the plan-level facts every backend needs
 * to reduce its gradients: the shards of the flat update block (ZeRO-1) and the buckets the
 * gradients are reduced in, in the order the backward pass finishes them, so that a backend
 * that overlaps communication (CUDA) issues each bucket as soon as its last gradient is
 * written. The CPU backend reduces the same buckets after the backward pass. */
#ifndef MN_HOST_DATA_PARALLEL_H
#define MN_HOST_DATA_PARALLEL_H

#include "host/collective.h"
#include "host/plan.h"

/* Elements [offset, offset + count) of the flat gradient block (plan->update_grads_offset). */
typedef struct mn_dp_range {
  size_t offset, count;
} mn_dp_range;

/* Ranges [first, first + num) of mn_dp.ranges, final once dispatch ready_after has run. */
typedef struct mn_dp_bucket {
  size_t first, num, elements;
  size_t ready_after;
} mn_dp_bucket;

typedef struct mn_dp {
  mn_group *group;
  int rank, world;
  bool zero1;
  size_t flat;  /* elements of the update block */
  size_t shard; /* elements of each rank's shard: flat rounded up to a multiple of world, / world */
  mn_dp_range *ranges; /* one per parameter that has a gradient, in bucket order */
  size_t num_ranges;
  mn_dp_bucket *buckets; /* in the order they become final */
  size_t num_buckets;
  bool synced; /* the trainable parameters were broadcast from rank 0 (the first step) */
} mn_dp;

/* The default bucket size (PyTorch DDP's 25 MiB). */
#define MN_DP_BUCKET_BYTES ((size_t)25 << 20)

/* The group state of a session of plan p; buckets hold at most bucket_bytes of gradients
 * unless one gradient alone is larger. */
mn_status mn_dp_new(const mn_plan *p, mn_group *g, int rank, bool zero1, size_t bucket_bytes,
                    mn_dp **out);
void mn_dp_free(mn_dp *dp);

/* A hash of what the ranks must agree on: the parameters (names, types, which have gradients),
 * the dispatches' ops, the precision, and zero1. */
uint64_t mn_dp_plan_hash(const mn_plan *p, bool zero1);

/* Rank's shard of the flat block: [*lo, *hi), clipped to flat. */
static inline void mn_dp_shard_range(const mn_dp *dp, size_t *lo, size_t *hi) {
  size_t a = (size_t)dp->rank * dp->shard, b = a + dp->shard;
  *lo = a < dp->flat ? a : dp->flat;
  *hi = b < dp->flat ? b : dp->flat;
}

/* Where plan parameter slot `slot` (one that has a gradient) lies in the flat block. */
static inline size_t mn_dp_slot_offset(const mn_plan *p, size_t slot) {
  return (mn_plan_buffer_of(p, p->params[slot].grad)->offset - p->update_grads_offset) /
         sizeof(float);
}

/* Host-memory steps (the CPU backend): grads is the flat gradient block. */
/* Before the first step: params (the flat parameter block) becomes rank 0's, as PyTorch DDP
 * does when it wraps a model, so that ranks initialized apart start together. */
mn_status mn_dp_sync_params(mn_dp *dp, float *params);
/* Replaces every gradient by the mean over ranks, bucket by bucket. */
mn_status mn_dp_all_reduce_grads(mn_dp *dp, float *grads);
/* ZeRO-1: shard (dp->shard floats) becomes the mean over ranks of rank's shard of grads. */
mn_status mn_dp_reduce_scatter_grads(mn_dp *dp, const float *grads, float *shard);
/* ZeRO-1: every rank's shard of params (dp->shard floats each) gathered into params (flat). */
mn_status mn_dp_all_gather_params(mn_dp *dp, const float *shard, float *params);

#endif
