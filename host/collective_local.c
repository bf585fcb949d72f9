/* The in-process group: ranks are threads of one process. Each collective is a rendezvous in
 * two phases: every rank posts its buffers and waits for the others (phase 1), computes its own
 * result from every rank's input into scratch, waits again (phase 2: nobody's input changes
 * while another rank still reads it), then writes its result. Reductions run over ranks
 * 0, 1, ... in order, so every rank gets the same bits whatever the timing. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "host/collective.h"
#include "host/error.h"

typedef struct local_group {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  unsigned long generation; /* rendezvous completed so far */
  int arrived;
  bool *present;      /* per rank: posted in the current rendezvous */
  const void **input; /* per rank: its posted input */
  /* Per rank: the collective and the size it posted, which must be every rank's. */
  const char **kind;
  size_t *size;
  bool broken;
  char why[256];
} local_group;

static local_group *impl(mn_group *g) { return g->impl; }

/* Names the ranks absent from the current rendezvous ("1, 3"). */
static void missing_ranks(const mn_group *g, const local_group *l, char *buf, size_t size) {
  size_t used = 0;
  buf[0] = '\0';
  for (int r = 0; r < g->world_size && used < size; r++)
    if (!l->present[r])
      used += (size_t)snprintf(buf + used, size - used, "%s%d", used ? ", " : "", r);
}

/* The last rank to arrive checks that every rank called the same collective on the same size:
 * ranks whose steps went apart (one failed, one skipped a step) break the group instead of
 * reading past each other's buffers. */
static bool same_call(mn_group *g, local_group *l, int rank) {
  for (int r = 0; r < g->world_size; r++)
    if (l->size[r] != l->size[rank] || strcmp(l->kind[r], l->kind[rank]) != 0) {
      snprintf(l->why, sizeof l->why,
               "the ranks called different collectives: rank %d %s of %zu, rank %d %s of %zu", r,
               l->kind[r], l->size[r], rank, l->kind[rank], l->size[rank]);
      return false;
    }
  return true;
}

/* Posts input (NULL: keeps the last one) for rank, a call of collective `what` on `size`
 * elements, and waits until every rank has posted; on a timeout or a mismatch the group
 * breaks. */
static mn_status rendezvous(mn_group *g, int rank, const void *input, size_t size,
                            const char *what) {
  local_group *l = impl(g);
  if (rank < 0 || rank >= g->world_size)
    return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: rank %d outside [0, %d)", what, rank,
                   g->world_size);
  struct timespec deadline;
  clock_gettime(CLOCK_REALTIME, &deadline);
  double whole = floor(g->timeout_s);
  deadline.tv_sec += (time_t)whole;
  deadline.tv_nsec += (long)((g->timeout_s - whole) * 1e9);
  if (deadline.tv_nsec >= 1000000000L) {
    deadline.tv_sec++;
    deadline.tv_nsec -= 1000000000L;
  }
  pthread_mutex_lock(&l->mu);
  mn_status st = MN_OK;
  if (l->broken) {
    st = mn_fail(MN_ERR_STATE, "%s: the group is broken: %s", what, l->why);
  } else if (l->present[rank]) {
    st = mn_fail(MN_ERR_INVALID_ARGUMENT,
                 "%s: rank %d joined twice (two sessions were given the same rank)", what, rank);
  } else {
    l->present[rank] = true;
    /* The second phase posts no input: another rank may still be reading this one. */
    if (input) l->input[rank] = input;
    l->kind[rank] = what;
    l->size[rank] = size;
    unsigned long gen = l->generation;
    if (++l->arrived == g->world_size) {
      if (same_call(g, l, rank))
        l->generation++;
      else
        l->broken = true;
      l->arrived = 0;
      pthread_cond_broadcast(&l->cv);
    }
    while (l->generation == gen && !l->broken) {
      if (pthread_cond_timedwait(&l->cv, &l->mu, &deadline) != ETIMEDOUT) continue;
      char missing[128];
      missing_ranks(g, l, missing, sizeof missing);
      snprintf(l->why, sizeof l->why, "timed out: rank %d waited %g s for rank(s) %s of %d in %s",
               rank, g->timeout_s, missing, g->world_size, what);
      l->broken = true;
      pthread_cond_broadcast(&l->cv);
    }
    if (l->generation == gen)
      st = mn_fail(MN_ERR_STATE, "%s: %s", what, l->why);
    else
      l->present[rank] = false;
  }
  pthread_mutex_unlock(&l->mu);
  return st;
}

static float reduce_at(const mn_group *g, const local_group *l, size_t i, mn_reduce_op op) {
  const float *first = l->input[0];
  double acc = first[i];
  for (int r = 1; r < g->world_size; r++) {
    double v = ((const float *)l->input[r])[i];
    acc = op == MN_REDUCE_MAX ? fmax(acc, v) : acc + v;
  }
  if (op == MN_REDUCE_MEAN) acc /= g->world_size;
  return (float)acc;
}

static mn_status local_all_reduce(mn_group *g, int rank, float *buf, size_t n, mn_reduce_op op) {
  const char *what = "all-reduce";
  float *scratch = malloc((n ? n : 1) * sizeof *scratch);
  if (!scratch) return mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: out of memory (%zu floats)", what, n);
  mn_status st = rendezvous(g, rank, buf, n, what);
  if (st == MN_OK) {
    for (size_t i = 0; i < n; i++)
      scratch[i] = reduce_at(g, impl(g), i, op);
    st = rendezvous(g, rank, NULL, n, what);
  }
  if (st == MN_OK) memcpy(buf, scratch, n * sizeof *buf);
  free(scratch);
  return st;
}

static mn_status local_reduce_scatter(mn_group *g, int rank, const float *in, float *out,
                                      size_t shard, mn_reduce_op op) {
  const char *what = "reduce-scatter";
  float *scratch = malloc((shard ? shard : 1) * sizeof *scratch);
  if (!scratch) return mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: out of memory", what);
  mn_status st = rendezvous(g, rank, in, shard, what);
  if (st == MN_OK) {
    for (size_t i = 0; i < shard; i++)
      scratch[i] = reduce_at(g, impl(g), (size_t)rank * shard + i, op);
    st = rendezvous(g, rank, NULL, shard, what);
  }
  if (st == MN_OK) memcpy(out, scratch, shard * sizeof *out);
  free(scratch);
  return st;
}

static mn_status local_all_gather(mn_group *g, int rank, const float *in, float *out,
                                  size_t shard) {
  const char *what = "all-gather";
  size_t n = shard * (size_t)g->world_size;
  float *scratch = malloc((n ? n : 1) * sizeof *scratch);
  if (!scratch) return mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: out of memory", what);
  mn_status st = rendezvous(g, rank, in, shard, what);
  if (st == MN_OK) {
    for (int r = 0; r < g->world_size; r++)
      memcpy(scratch + (size_t)r * shard, impl(g)->input[r], shard * sizeof *scratch);
    st = rendezvous(g, rank, NULL, shard, what);
  }
  if (st == MN_OK) memcpy(out, scratch, n * sizeof *out);
  free(scratch);
  return st;
}

static mn_status local_broadcast(mn_group *g, int rank, void *buf, size_t bytes, int root) {
  const char *what = "broadcast";
  if (root < 0 || root >= g->world_size)
    return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: root %d outside [0, %d)", what, root,
                   g->world_size);
  void *scratch = malloc(bytes ? bytes : 1);
  if (!scratch) return mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: out of memory", what);
  mn_status st = rendezvous(g, rank, buf, bytes, what);
  if (st == MN_OK) {
    memcpy(scratch, impl(g)->input[root], bytes);
    st = rendezvous(g, rank, NULL, bytes, what);
  }
  if (st == MN_OK) memcpy(buf, scratch, bytes);
  free(scratch);
  return st;
}

static mn_status local_barrier(mn_group *g, int rank) {
  return rendezvous(g, rank, NULL, 0, "barrier");
}

static void local_abort(mn_group *g, const char *why) {
  local_group *l = impl(g);
  pthread_mutex_lock(&l->mu);
  if (!l->broken) snprintf(l->why, sizeof l->why, "aborted: %s", why ? why : "");
  l->broken = true;
  pthread_cond_broadcast(&l->cv);
  pthread_mutex_unlock(&l->mu);
}

static void local_destroy(mn_group *g) {
  local_group *l = impl(g);
  pthread_mutex_destroy(&l->mu);
  pthread_cond_destroy(&l->cv);
  free(l->present);
  free(l->input);
  free(l->kind);
  free(l->size);
  free(l);
}

static const mn_collective_ops local_ops = {
    .name = "local",
    .all_reduce = local_all_reduce,
    .reduce_scatter = local_reduce_scatter,
    .all_gather = local_all_gather,
    .broadcast = local_broadcast,
    .barrier = local_barrier,
    .abort = local_abort,
    .destroy = local_destroy,
};

mn_status mn_group_new_local(int world_size, double timeout_s, mn_group **out) {
  const char *fn = "mn_group_new_local";
  if (!out) return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: out is NULL", fn);
  *out = NULL;
  if (world_size < 1)
    return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: world_size = %d, expected at least 1", fn,
                   world_size);
  if (!isfinite(timeout_s))
    return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: timeout_s is not finite", fn);
  mn_group *g = calloc(1, sizeof *g);
  local_group *l = calloc(1, sizeof *l);
  if (l) {
    l->present = calloc((size_t)world_size, sizeof *l->present);
    l->input = calloc((size_t)world_size, sizeof *l->input);
    l->kind = calloc((size_t)world_size, sizeof *l->kind);
    l->size = calloc((size_t)world_size, sizeof *l->size);
  }
  if (!g || !l || !l->present || !l->input || !l->kind || !l->size) {
    if (l) free(l->present), free(l->input), free(l->kind), free(l->size);
    free(l);
    free(g);
    return mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
  }
  pthread_mutex_init(&l->mu, NULL);
  pthread_cond_init(&l->cv, NULL);
  *g = (mn_group){.ops = &local_ops,
                  .world_size = world_size,
                  .timeout_s = timeout_s > 0 ? timeout_s : MN_GROUP_DEFAULT_TIMEOUT_S,
                  .impl = l};
  *out = g;
  return MN_OK;
}

bool mn_group_is_local(const mn_group *g) { return g && g->ops == &local_ops; }

void mn_group_abort(mn_group *g, const char *why) {
  if (g) g->ops->abort(g, why);
}

void mn_group_free(mn_group *g) {
  if (!g) return;
  g->ops->destroy(g);
  free(g);
}
