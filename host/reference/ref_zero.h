/* ZeRO stage 1 on the reference backend: each rank keeps the Adam moments of its shard of the
 * flat update block only, updates that shard and gathers the others'. */
#ifndef MN_HOST_REF_ZERO_H
#define MN_HOST_REF_ZERO_H

#include "host/backend.h"

typedef struct mn_ref_zero {
  float *m, *v; /* the shard's moments (dp->shard floats), NULL before the first Adam step */
  /* Every rank's moments, gathered for reading (checkpoints) and valid while gathered_step is
   * the session's step_count and nothing was written since. */
  float *all_m, *all_v;
  uint64_t gathered_step;
  bool gathered;
} mn_ref_zero;

void mn_ref_zero_free(mn_ref_zero *z);
/* The update of an applying step, after the gradients are final on this rank: reduce-scatter
 * them, clip on the global norm, update the shard, all-gather the parameters. */
mn_status mn_ref_zero_step(mn_session *s, unsigned char *arena, mn_ref_zero *z);
/* Moment `which` of slot, n elements: collective (every rank reads the same slots in the same
 * order, as checkpoint saves do). */
mn_status mn_ref_zero_read_moment(mn_session *s, mn_ref_zero *z, size_t slot, int which, float *dst,
                                  size_t n);
/* Keeps the part of src that lies in this rank's shard. */
mn_status mn_ref_zero_write_moment(mn_session *s, mn_ref_zero *z, size_t slot, int which,
                                   const float *src, size_t n);

#endif
