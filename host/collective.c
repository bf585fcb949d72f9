/* Joining a group: the check that every rank builds the same thing. */
#include "host/collective.h"
#include "host/error.h"

mn_status mn_group_join(mn_group *g, int rank, int world_size, uint64_t config_hash,
                        const char *fn) {
  if (rank < 0 || rank >= g->world_size)
    return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: options.rank = %d outside [0, %d)", fn, rank,
                   g->world_size);
  /* A rank that disagrees still takes part, so that every rank fails at once rather than
   * waiting for it: rank 0's hash goes to everyone, and a maximum over ranks tells all of them
   * the last rank that differs (0: none). */
  bool size_ok = world_size == g->world_size;
  uint64_t root = config_hash;
  mn_status st = mn_broadcast_host(g, rank, &root, sizeof root, 0);
  if (st != MN_OK) return st;
  float mark = root == config_hash && size_ok ? 0.0f : (float)(rank + 1);
  st = mn_all_reduce_host(g, rank, &mark, 1, MN_REDUCE_MAX);
  if (st != MN_OK) return st;
  if (mark == 0) return MN_OK;
  if (!size_ok)
    return mn_fail(MN_ERR_INVALID_ARGUMENT,
                   "%s: rank %d: options.world_size = %d but the group has %d ranks", fn, rank,
                   world_size, g->world_size);
  return mn_fail(MN_ERR_INVALID_ARGUMENT,
                 "%s: rank %d: rank %d's world size, graph or options differ from rank 0's "
                 "(plan hash): every rank must build the same model",
                 fn, rank, (int)mark - 1);
}
