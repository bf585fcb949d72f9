/* The bucket plan, the plan hash and the host-memory gradient collectives. */
#include <stdlib.h>
#include <string.h>

#include "host/data_parallel.h"
#include "host/error.h"

typedef struct grad_entry {
  mn_dp_range range;
  size_t ready, slot;
} grad_entry;

/* The last dispatch that writes the gradient's buffer: after it the gradient is final. A
 * gradient no dispatch writes (there is none in a valid plan) counts as final at the end. */
static size_t ready_index(const mn_plan *p, mn_node grad) {
  uint32_t buffer = p->node_buffer[grad];
  size_t ready = p->num_dispatches ? p->num_dispatches - 1 : 0;
  for (size_t d = 0; d < p->num_dispatches; d++) {
    mn_node id = p->dispatches[d].node;
    bool writes = p->node_buffer[id] == buffer;
    for (int k = 1; k <= mn_node_num_extra_outputs(&p->graph->nodes[id]); k++)
      writes = writes || p->node_buffer[mn_plan_extra_output(p, id, k)] == buffer;
    if (writes) ready = d;
  }
  return ready;
}

static int by_ready(const void *a, const void *b) {
  const grad_entry *x = a, *y = b;
  if (x->ready != y->ready) return x->ready < y->ready ? -1 : 1;
  return x->slot < y->slot ? -1 : x->slot > y->slot;
}

mn_status mn_dp_new(const mn_plan *p, mn_group *g, int rank, bool zero1, size_t bucket_bytes,
                    mn_dp **out) {
  *out = NULL;
  mn_dp *dp = calloc(1, sizeof *dp);
  grad_entry *e = calloc(p->num_params ? p->num_params : 1, sizeof *e);
  if (dp) {
    dp->ranges = calloc(p->num_params ? p->num_params : 1, sizeof *dp->ranges);
    dp->buckets = calloc(p->num_params ? p->num_params : 1, sizeof *dp->buckets);
  }
  if (!dp || !e || !dp->ranges || !dp->buckets) {
    free(e);
    mn_dp_free(dp);
    return mn_fail(MN_ERR_OUT_OF_MEMORY, "data-parallel plan: out of memory");
  }
  dp->group = g;
  dp->rank = rank;
  dp->world = g->world_size;
  dp->zero1 = zero1;
  dp->flat = p->update_bytes / sizeof(float);
  dp->shard = (dp->flat + (size_t)dp->world - 1) / (size_t)dp->world;
  size_t n = 0;
  for (size_t i = 0; i < p->num_params; i++) {
    mn_node grad = p->params[i].grad;
    if (grad == MN_NO_NODE) continue;
    e[n].range.offset =
        (mn_plan_buffer_of(p, grad)->offset - p->update_grads_offset) / sizeof(float);
    e[n].range.count = (size_t)mn_tensor_type_numel(&p->graph->nodes[grad].type);
    e[n].ready = ready_index(p, grad);
    e[n].slot = i;
    n++;
  }
  qsort(e, n, sizeof *e, by_ready);
  size_t limit = bucket_bytes / sizeof(float);
  for (size_t i = 0; i < n; i++) {
    mn_dp_bucket *b = dp->num_buckets ? &dp->buckets[dp->num_buckets - 1] : NULL;
    if (!b || (b->elements + e[i].range.count > limit && b->elements > 0)) {
      b = &dp->buckets[dp->num_buckets++];
      *b = (mn_dp_bucket){.first = i};
    }
    dp->ranges[i] = e[i].range;
    b->num++;
    b->elements += e[i].range.count;
    b->ready_after = e[i].ready;
  }
  dp->num_ranges = n;
  free(e);
  *out = dp;
  return MN_OK;
}

void mn_dp_free(mn_dp *dp) {
  if (!dp) return;
  free(dp->ranges);
  free(dp->buckets);
  free(dp);
}

static uint64_t fnv(uint64_t h, const void *data, size_t n) {
  const unsigned char *b = data;
  for (size_t i = 0; i < n; i++)
    h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

uint64_t mn_dp_plan_hash(const mn_plan *p, bool zero1) {
  uint64_t h = 14695981039346656037ull;
  const mn_graph *g = p->graph;
  h = fnv(h, &p->num_params, sizeof p->num_params);
  for (size_t i = 0; i < p->num_params; i++) {
    const mn_node_rec *n = &g->nodes[p->params[i].param];
    if (n->name) h = fnv(h, n->name, strlen(n->name) + 1);
    h = fnv(h, &n->type.dtype, sizeof n->type.dtype);
    h = fnv(h, n->type.shape, (size_t)n->type.rank * sizeof n->type.shape[0]);
    bool has_grad = p->params[i].grad != MN_NO_NODE;
    h = fnv(h, &has_grad, sizeof has_grad);
  }
  for (size_t d = 0; d < p->num_dispatches; d++)
    h = fnv(h, &g->nodes[p->dispatches[d].node].op, sizeof(mn_op));
  h = fnv(h, &p->precision, sizeof p->precision);
  return fnv(h, &zero1, sizeof zero1);
}

mn_status mn_dp_all_reduce_grads(mn_dp *dp, float *grads) {
  size_t most = 0;
  for (size_t b = 0; b < dp->num_buckets; b++)
    if (dp->buckets[b].elements > most) most = dp->buckets[b].elements;
  float *pack = malloc((most ? most : 1) * sizeof *pack);
  if (!pack)
    return mn_fail(MN_ERR_OUT_OF_MEMORY, "mn_session_step: out of memory (gradient bucket)");
  mn_status st = MN_OK;
  /* One collective per bucket over its gradients packed back to back. */
  for (size_t b = 0; b < dp->num_buckets && st == MN_OK; b++) {
    const mn_dp_bucket *k = &dp->buckets[b];
    size_t at = 0;
    for (size_t r = k->first; r < k->first + k->num; r++) {
      memcpy(pack + at, grads + dp->ranges[r].offset, dp->ranges[r].count * sizeof *pack);
      at += dp->ranges[r].count;
    }
    st = mn_all_reduce(dp->group, dp->rank, pack, at, MN_REDUCE_MEAN);
    at = 0;
    for (size_t r = k->first; st == MN_OK && r < k->first + k->num; r++) {
      memcpy(grads + dp->ranges[r].offset, pack + at, dp->ranges[r].count * sizeof *pack);
      at += dp->ranges[r].count;
    }
  }
  free(pack);
  return st;
}

/* The flat block padded with zeros to world * shard elements. */
static float *padded(const mn_dp *dp, const float *flat) {
  size_t n = dp->shard * (size_t)dp->world;
  float *out = calloc(n ? n : 1, sizeof *out);
  if (out && flat) memcpy(out, flat, dp->flat * sizeof *out);
  return out;
}

mn_status mn_dp_reduce_scatter_grads(mn_dp *dp, const float *grads, float *shard) {
  float *in = padded(dp, grads);
  if (!in) return mn_fail(MN_ERR_OUT_OF_MEMORY, "mn_session_step: out of memory (ZeRO-1)");
  mn_status st = mn_reduce_scatter(dp->group, dp->rank, in, shard, dp->shard, MN_REDUCE_MEAN);
  free(in);
  return st;
}

mn_status mn_dp_all_gather_params(mn_dp *dp, const float *shard, float *params) {
  float *out = padded(dp, NULL);
  if (!out) return mn_fail(MN_ERR_OUT_OF_MEMORY, "mn_session_step: out of memory (ZeRO-1)");
  mn_status st = mn_all_gather(dp->group, dp->rank, shard, out, dp->shard);
  if (st == MN_OK) memcpy(params, out, dp->flat * sizeof *params);
  free(out);
  return st;
}

mn_status mn_dp_sync_params(mn_dp *dp, float *params) {
  if (dp->synced) return MN_OK;
  mn_status st = mn_broadcast(dp->group, dp->rank, params, dp->flat * sizeof *params, 0);
  dp->synced = st == MN_OK;
  return st;
}
