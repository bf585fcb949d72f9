/* A CUDA session's rank of an NCCL group (docs/distributed.md): the collectives captured into
 * the step graph and the ZeRO-1 update.
 *
 * Without accumulation each gradient bucket (host/data_parallel.h) is all-reduced on a
 * communication stream as soon as the program command that finishes it has run: an event
 * recorded on the compute stream after that command, which the communication stream waits
 * on, forks it into the graph, and the optimizer waits on an event after the last bucket, so
 * NCCL runs while the rest of the backward pass computes. A bucket's gradients are reduced
 * inside one ncclGroupStart/End, one call per run of adjacent gradients. With accumulation
 * the mean of the round is known only after the accumulate kernel, so the buckets are
 * reduced after it, on the compute stream, and only the applying step's graph has them.
 *
 * ZeRO-1: the gradient block is copied into a buffer padded with zeros to world * shard,
 * reduce-scattered (mean) in place, the shard's sum of squares (per-block partials, in
 * double) all-reduced for clipping, the shard of a padded copy of the parameters updated by
 * optimizer kernels compiled for the shard's length with shard-sized moments, and the
 * parameter shards all-gathered in place and copied back (and into the weights'
 * low-precision copy). Every NCCL call of a step is ordered after the previous one by the
 * graph's edges, so all ranks run them in one order.
 *
 * F16 (the device's loss scaler, loss_scale.c): a step that all-reduces the whole gradients
 * joins its buckets before the unscale, which reads and rewrites them; accumulation's steps and
 * ZeRO-1 unscale the rank's own gradients before they are reduced, as the CPU backend does.
 * Either way the unscale's overflow flag is all-reduced (max) before anything reads it, so
 * every rank skips the same steps and keeps one scale. An overflow keeps the accumulation
 * round open on the device alone, and the graph (with or without the gradients' collectives)
 * follows the round, so an accumulating F16 session reads the device's round back before it
 * picks one. On a skipped step the gradients are still reduced (the collectives are in the
 * graph), so mn_session_read_grad then shows the group's mean where the CPU backend, which
 * returns before reducing, shows the rank's own; parameters, moments and scale agree. */
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_state.h"
#include "cuda/nccl_group.h"
#include "cuda/schedule.h"
#include "host/data_parallel.h"
#include "host/error.h"

struct mn_cu_dp {
  mn_group *group;
  const mn_nccl *api;
  mn_nccl_comm_t comm;
  cudaStream_t comm_stream;
  cudaEvent_t *ready; /* per bucket, recorded on the compute stream once it is final */
  cudaEvent_t done;   /* on the communication stream after the last bucket */
  size_t num_buckets;
  mn_dp_range *runs; /* per bucket, its gradients merged where they lie back to back */
  size_t *run_first, *run_num;
  size_t *after_cmd; /* per bucket: the program command after which it is final */
  size_t next;       /* while capturing: the next bucket to issue */
  bool serial;       /* MN_DP_OVERLAP=0: every bucket after the backward pass (a baseline) */
  bool forked;       /* while capturing: the communication stream joined the capture */
  bool joined;       /* ... and the compute stream has waited for it since */
  /* ZeRO-1 */
  float *pad_grads, *pad_params; /* device, world * shard each */
  float *all_m, *all_v;          /* host: every rank's moments, gathered for reading */
  uint64_t gathered_step;
  bool gathered;
};

static const char *const fn_step = "mn_session_step";

static size_t flat(const mn_session *s) { return s->plan->update_bytes / sizeof(float); }

static mn_status nccl(const cuda_state *st, mn_nccl_result r, const char *what) {
  return mn_cu_nccl_check(st->dp->group, r, what);
}

mn_status mn_cu_dp_declare(cuda_state *st, const mn_session *s) {
  st->zero_sumsq = st->zero_update = -1;
  const mn_session_options *o = &s->options;
  if (!s->training || !o->group || !o->zero1 || o->world_size < 1 || !s->plan->update_bytes)
    return MN_OK;
  const mn_plan *p = s->plan;
  mn_cu_op_ctx c = {.prog = &st->prog, .plan = p, .g = p->graph, .node = p->graph->nodes};
  long long shard = (long long)((flat(s) + (size_t)o->world_size - 1) / (size_t)o->world_size);
  st->zero_sumsq = mn_cu_kernel(&c, 256, "mn_opt_sumsq<256, %lldLL>", shard);
  st->zero_update =
      mn_cu_kernel(&c, 256, "mn_opt_update<256, %lldLL, %d>", shard, MN_CU_NORM_BLOCKS);
  if (st->zero_sumsq < 0 || st->zero_update < 0)
    return mn_fail(MN_ERR_OUT_OF_MEMORY, "cuda backend: out of host memory");
  return MN_OK;
}

mn_status mn_cuda_dp_prepare(mn_session *s, const char *fn) {
  cuda_state *st = s->backend_state;
  mn_group *g = s->options.group;
  if (!mn_cu_nccl_is(g))
    return mn_fail(MN_ERR_UNSUPPORTED,
                   "%s: a CUDA session's group must be an NCCL group (mn_group_new_nccl); an "
                   "in-process group (mn_group_new_local) serves the CPU backend",
                   fn);
  if (mn_cu_nccl_device(g) != st->device)
    return mn_fail(MN_ERR_INVALID_ARGUMENT,
                   "%s: options.device = %d but the NCCL group of rank %d lives on device %d", fn,
                   st->device, s->options.rank, mn_cu_nccl_device(g));
  st->dp = calloc(1, sizeof *st->dp);
  if (!st->dp) return mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
  st->dp->group = g;
  st->dp->api = mn_cu_nccl_api(g);
  /* Only for measuring what the overlap hides (bench_dp_step): the same collectives, in the
   * same order, with nothing computing beside them. */
  const char *overlap = getenv("MN_DP_OVERLAP");
  st->dp->serial = overlap && strcmp(overlap, "0") == 0;
  st->dp->comm = mn_cu_nccl_comm(g);
  mn_cu_nccl_bind(g, st->stream);
  return MN_OK;
}

/* Bucket b's gradients sorted by offset and merged where adjacent. */
static void merge_runs(mn_cu_dp *d, const mn_dp *dp, size_t b) {
  const mn_dp_bucket *k = &dp->buckets[b];
  mn_dp_range *r = d->runs + k->first;
  memcpy(r, dp->ranges + k->first, k->num * sizeof *r);
  for (size_t i = 1; i < k->num; i++)
    for (size_t j = i; j > 0 && r[j - 1].offset > r[j].offset; j--) {
      mn_dp_range t = r[j];
      r[j] = r[j - 1];
      r[j - 1] = t;
    }
  size_t n = 0;
  for (size_t i = 0; i < k->num; i++)
    if (n && r[n - 1].offset + r[n - 1].count == r[i].offset)
      r[n - 1].count += r[i].count;
    else
      r[n++] = r[i];
  d->run_first[b] = k->first;
  d->run_num[b] = n;
}

/* The last program command of a dispatch at or before `ready` (0 when there is none). */
static size_t last_cmd_by(const cuda_state *st, const size_t *dispatch_of, size_t ready) {
  size_t last = 0;
  for (size_t i = 0; i < st->prog.num_cmds; i++)
    if (dispatch_of[st->prog.cmds[i].node] <= ready) last = i;
  return last;
}

static mn_status plan_buckets(cuda_state *st, const mn_session *s) {
  mn_cu_dp *d = st->dp;
  const mn_dp *dp = s->dp;
  const mn_plan *p = s->plan;
  size_t nodes = p->graph->num_nodes, n = dp->num_buckets ? dp->num_buckets : 1;
  size_t *dispatch_of = malloc((nodes ? nodes : 1) * sizeof *dispatch_of);
  d->runs = malloc((dp->num_ranges ? dp->num_ranges : 1) * sizeof *d->runs);
  d->run_first = calloc(n, sizeof *d->run_first);
  d->run_num = calloc(n, sizeof *d->run_num);
  d->after_cmd = calloc(n, sizeof *d->after_cmd);
  d->ready = calloc(n, sizeof *d->ready);
  if (!dispatch_of || !d->runs || !d->run_first || !d->run_num || !d->after_cmd || !d->ready) {
    free(dispatch_of);
    return mn_fail(MN_ERR_OUT_OF_MEMORY, "cuda backend: out of host memory");
  }
  for (size_t i = 0; i < nodes; i++)
    dispatch_of[i] = SIZE_MAX;
  for (size_t i = 0; i < p->num_dispatches; i++)
    dispatch_of[p->dispatches[i].node] = i;
  mn_status rc = MN_OK;
  for (size_t b = 0; b < dp->num_buckets && rc == MN_OK; b++) {
    merge_runs(d, dp, b);
    d->after_cmd[b] = last_cmd_by(st, dispatch_of, dp->buckets[b].ready_after);
    rc = mn_cu_check(cudaEventCreateWithFlags(&d->ready[b], cudaEventDisableTiming), "an event");
    if (rc == MN_OK) d->num_buckets = b + 1;
  }
  free(dispatch_of);
  return rc;
}

static mn_status allocate_zero(cuda_state *st, const mn_session *s) {
  mn_cu_dp *d = st->dp;
  size_t all = s->dp->shard * (size_t)s->dp->world * sizeof(float);
  if (!all) return MN_OK;
  mn_status rc = mn_cu_check(cudaMalloc((void **)&d->pad_grads, all), "the ZeRO-1 gradients");
  if (rc == MN_OK)
    rc = mn_cu_check(cudaMalloc((void **)&d->pad_params, all), "the ZeRO-1 parameters");
  /* The padding past the block stays zero: zero gradients leave zero parameters alone. */
  if (rc == MN_OK) rc = mn_cu_check(cudaMemsetAsync(d->pad_grads, 0, all, st->stream), "ZeRO-1");
  if (rc == MN_OK) rc = mn_cu_check(cudaMemsetAsync(d->pad_params, 0, all, st->stream), "ZeRO-1");
  return rc;
}

mn_status mn_cuda_dp_attach(mn_session *s) {
  cuda_state *st = s->backend_state;
  mn_status rc = mn_cu_check(cudaSetDevice(st->device), "selecting the session's device");
  if (rc == MN_OK)
    rc = mn_cu_check(cudaStreamCreateWithFlags(&st->dp->comm_stream, cudaStreamNonBlocking),
                     "the communication stream");
  if (rc == MN_OK)
    rc = mn_cu_check(cudaEventCreateWithFlags(&st->dp->done, cudaEventDisableTiming), "an event");
  if (rc == MN_OK) rc = plan_buckets(st, s);
  if (rc == MN_OK && s->dp->zero1 && s->training) rc = allocate_zero(st, s);
  if (rc == MN_OK) rc = mn_cu_sync(st, "setting up the group's buffers");
  st->captured = st->other_captured = false;
  return rc;
}

void mn_cu_dp_free(cuda_state *st) {
  mn_cu_dp *d = st->dp;
  if (!d) return;
  mn_cu_nccl_bind(d->group, NULL);
  for (size_t b = 0; b < d->num_buckets; b++)
    cudaEventDestroy(d->ready[b]);
  if (d->done) cudaEventDestroy(d->done);
  if (d->comm_stream) cudaStreamDestroy(d->comm_stream);
  cudaFree(d->pad_grads);
  cudaFree(d->pad_params);
  free(d->ready);
  free(d->runs);
  free(d->run_first);
  free(d->run_num);
  free(d->after_cmd);
  free(d->all_m);
  free(d->all_v);
  free(d);
  st->dp = NULL;
}

mn_status mn_cu_dp_sync_params(cuda_state *st, mn_session *s) {
  mn_dp *dp = s->dp;
  if (dp->synced || !flat(s)) return MN_OK;
  float *params = (float *)(st->arena + s->plan->update_params_offset);
  mn_status rc = nccl(
      st,
      st->dp->api->broadcast(params, params, flat(s), MN_NCCL_FLOAT32, 0, st->dp->comm, st->stream),
      "ncclBroadcast of rank 0's parameters");
  if (rc != MN_OK) return rc;
  st->submissions++;
  dp->synced = true;
  st->shadow_dirty = true;
  return MN_OK;
}

/* ------------------------------------------------------------------ in the step graph */

bool mn_cu_dp_overlaps(const cuda_state *st, const mn_session *s, unsigned key) {
  return st->dp && !st->dp->serial && (key & MN_CU_KEY_REDUCE) && !(key & 8u) && !s->dp->zero1;
}

void mn_cu_dp_capture_begin(cuda_state *st) {
  if (!st->dp) return;
  st->dp->next = 0;
  st->dp->forked = st->dp->joined = false;
}

/* The compute stream waits for the communication stream, so that the capture can end. */
static mn_status join_comm(cuda_state *st) {
  mn_cu_dp *d = st->dp;
  mn_status rc = mn_cu_check(cudaEventRecord(d->done, d->comm_stream), "recording the last bucket");
  if (rc == MN_OK)
    rc = mn_cu_check(cudaStreamWaitEvent(st->stream, d->done, 0), "waiting on the last bucket");
  d->joined = rc == MN_OK;
  return rc;
}

mn_status mn_cu_dp_capture_end(cuda_state *st) {
  mn_cu_dp *d = st->dp;
  return d && d->forked && !d->joined ? join_comm(st) : MN_OK;
}

/* Bucket b's all-reduce (mean) on `stream`. */
static mn_status issue(cuda_state *st, const mn_session *s, size_t b, cudaStream_t stream) {
  mn_cu_dp *d = st->dp;
  float *grads = (float *)(st->arena + s->plan->update_grads_offset);
  mn_status rc = nccl(st, d->api->group_start(), "ncclGroupStart");
  for (size_t r = d->run_first[b]; rc == MN_OK && r < d->run_first[b] + d->run_num[b]; r++) {
    float *at = grads + d->runs[r].offset;
    rc = nccl(
        st,
        d->api->all_reduce(at, at, d->runs[r].count, MN_NCCL_FLOAT32, MN_NCCL_AVG, d->comm, stream),
        "ncclAllReduce of a gradient bucket");
  }
  mn_status end = nccl(st, d->api->group_end(), "ncclGroupEnd");
  return rc != MN_OK ? rc : end;
}

/* The next bucket forks onto the communication stream from the compute stream's position. */
static mn_status issue_forked(cuda_state *st, const mn_session *s) {
  mn_cu_dp *d = st->dp;
  size_t b = d->next++;
  /* The commands that wrote the bucket may run on any stream of the capture (schedule.c). */
  mn_status rc = mn_cu_lanes_wait_all(st, d->ready[b], d->comm_stream);
  d->forked = d->forked || rc == MN_OK;
  return rc == MN_OK ? issue(st, s, b, d->comm_stream) : rc;
}

mn_status mn_cu_dp_after_cmd(cuda_state *st, const mn_session *s, size_t cmd) {
  mn_cu_dp *d = st->dp;
  mn_status rc = MN_OK;
  while (rc == MN_OK && d->next < d->num_buckets && d->after_cmd[d->next] <= cmd)
    rc = issue_forked(st, s);
  return rc;
}

bool mn_cu_dp_reduces_before_unscale(const cuda_state *st, const mn_session *s, unsigned key) {
  return st->dp && (key & 1u) && st->opt_update >= 0 && (key & MN_CU_KEY_REDUCE) && !(key & 8u) &&
         !s->dp->zero1;
}

/* One rule for every graph that runs the scaler: the flag is all-reduced right after the
 * unscale. Where the unscale read the all-reduced gradients the ranks' flags agree already (an
 * inf or NaN on any rank makes the mean non-finite, and every rank receives the same bits);
 * where it read the rank's own (accumulation's steps, ZeRO-1's before the reduce-scatter) they
 * need not. Telling the two apart would save one 4-byte collective a step and give F16 steps
 * two shapes of graph to keep right. */
mn_status mn_cu_dp_agree_overflow(cuda_state *st) {
  if (!st->dp) return MN_OK;
  unsigned *flag = &st->misc->error.nonfinite;
  return nccl(
      st,
      st->dp->api->all_reduce(flag, flag, 1, MN_NCCL_UINT32, MN_NCCL_MAX, st->dp->comm, st->stream),
      "ncclAllReduce of the overflow flag");
}

mn_status mn_cu_dp_settle_round(cuda_state *st, mn_session *s) {
  if (!st->dp || !mn_cu_scaled(s) || s->optim.kind == MN_OPTIM_NONE || s->grad_accum <= 1 ||
      st->scaler_idle)
    return MN_OK;
  mn_status rc = mn_cu_sync(st, "waiting for the steps in flight");
  if (rc == MN_OK) mn_cu_scaler_absorb(st, s);
  return rc;
}

mn_status mn_cu_dp_reduce(cuda_state *st, const mn_session *s, bool overlapped) {
  mn_cu_dp *d = st->dp;
  mn_status rc = MN_OK;
  if (!overlapped) {
    for (size_t b = 0; b < d->num_buckets && rc == MN_OK; b++)
      rc = issue(st, s, b, st->stream);
    return rc;
  }
  while (rc == MN_OK && d->next < d->num_buckets)
    rc = issue_forked(st, s);
  if (rc != MN_OK || !d->num_buckets) return rc;
  return join_comm(st);
}

static mn_status copy(cuda_state *st, void *dst, const void *src, size_t floats) {
  if (!floats) return MN_OK;
  return mn_cu_check(
      cudaMemcpyAsync(dst, src, floats * sizeof(float), cudaMemcpyDeviceToDevice, st->stream),
      "a ZeRO-1 copy");
}

mn_status mn_cu_dp_zero_update(cuda_state *st, const mn_session *s, unsigned key) {
  mn_cu_dp *d = st->dp;
  const mn_dp *dp = s->dp;
  const mn_plan *p = s->plan;
  size_t lo, hi, shard = dp->shard;
  mn_dp_shard_range(dp, &lo, &hi);
  float *grads = (float *)(st->arena + p->update_grads_offset);
  float *params = (float *)(st->arena + p->update_params_offset);
  float *g = d->pad_grads + (size_t)dp->rank * shard, *w = d->pad_params + (size_t)dp->rank * shard;
  mn_status rc = copy(st, d->pad_grads, grads, flat(s));
  if (rc == MN_OK)
    rc = nccl(st,
              d->api->reduce_scatter(d->pad_grads, g, shard, MN_NCCL_FLOAT32, MN_NCCL_AVG, d->comm,
                                     st->stream),
              "ncclReduceScatter of the gradients");
  if (rc == MN_OK) rc = copy(st, w, params + lo, hi - lo);
  size_t blocks = (shard + 255) / 256;
  const unsigned grid[3] = {(unsigned)(blocks < 1 ? 1 : blocks > 4096 ? 4096 : blocks), 1, 1};
  bool clip = key & 2u;
  if (rc == MN_OK && clip) {
    mn_ptrs io = {{g, st->norm_partials, &st->misc->error, &st->misc->scalars}};
    const unsigned norm_grid[3] = {MN_CU_NORM_BLOCKS, 1, 1};
    rc = mn_cu_launch_kernel(st, (uint32_t)st->zero_sumsq, norm_grid, 256, 0, &io);
    /* Every rank then adds up the same partials in the same order: one global norm. */
    if (rc == MN_OK)
      rc = nccl(st,
                d->api->all_reduce(st->norm_partials, st->norm_partials, MN_CU_NORM_BLOCKS,
                                   MN_NCCL_FLOAT64, MN_NCCL_SUM, d->comm, st->stream),
                "ncclAllReduce of the gradient norm");
  }
  float *m = (key & 4u) ? st->adam : NULL, *v = m ? st->adam + shard : NULL;
  if (rc == MN_OK) {
    mn_ptrs io = {
        {w, g, m, v, &st->misc->scalars, clip ? st->norm_partials : NULL, &st->misc->error, NULL}};
    rc = mn_cu_launch_kernel(st, (uint32_t)st->zero_update, grid, 256, 0, &io);
  }
  /* mn_session_read_grad shows the shard's gradient as the update used it. */
  if (rc == MN_OK) rc = copy(st, grads + lo, g, hi - lo);
  if (rc == MN_OK)
    rc = nccl(st, d->api->all_gather(w, d->pad_params, shard, MN_NCCL_FLOAT32, d->comm, st->stream),
              "ncclAllGather of the parameters");
  if (rc == MN_OK) rc = copy(st, params, d->pad_params, flat(s));
  if (rc == MN_OK) rc = mn_cu_low_enqueue_block(st, s);
  return rc;
}

mn_status mn_cu_dp_loss(cuda_state *st, const mn_session *s) {
  const mn_plan *p = s->plan;
  if (p->loss == MN_NO_NODE) return MN_OK;
  float *loss = (float *)(st->arena + mn_plan_buffer_of(p, p->loss)->offset);
  return nccl(st,
              st->dp->api->all_reduce(loss, loss, 1, MN_NCCL_FLOAT32, MN_NCCL_AVG, st->dp->comm,
                                      st->stream),
              "ncclAllReduce of the loss");
}

/* ------------------------------------------------------------------ ZeRO-1 moments */

mn_status mn_cu_dp_ensure_moments(cuda_state *st, const mn_session *s) {
  if (st->adam || !s->dp->shard) return MN_OK;
  size_t bytes = 2 * s->dp->shard * sizeof(float);
  mn_status rc = mn_cu_check(cudaMalloc((void **)&st->adam, bytes), "the Adam state");
  if (rc == MN_OK) rc = mn_cu_check(cudaMemsetAsync(st->adam, 0, bytes, st->stream), "Adam state");
  st->captured = st->other_captured = false; /* the update kernel's arguments change */
  return rc;
}

/* Every rank's moments into host memory: collective, once per optimizer step. */
static mn_status gather(cuda_state *st, mn_session *s) {
  mn_cu_dp *d = st->dp;
  const mn_dp *dp = s->dp;
  if (d->gathered && d->gathered_step == s->step_count) return MN_OK;
  size_t all = dp->shard * (size_t)dp->world;
  if (!d->all_m) {
    d->all_m = malloc((all ? all : 1) * sizeof(float));
    d->all_v = malloc((all ? all : 1) * sizeof(float));
    if (!d->all_m || !d->all_v)
      return mn_fail(MN_ERR_OUT_OF_MEMORY, "reading the optimizer state: out of memory");
  }
  mn_status rc = mn_cu_dp_ensure_moments(st, s);
  for (int which = 0; rc == MN_OK && which < 2 && all; which++) {
    rc = nccl(st,
              d->api->all_gather(st->adam + (size_t)which * dp->shard, d->pad_grads, dp->shard,
                                 MN_NCCL_FLOAT32, d->comm, st->stream),
              "ncclAllGather of the Adam state");
    if (rc == MN_OK) rc = mn_cu_sync(st, "gathering the Adam state");
    if (rc == MN_OK)
      rc = mn_cu_check(cudaMemcpy(which ? d->all_v : d->all_m, d->pad_grads, all * sizeof(float),
                                  cudaMemcpyDeviceToHost),
                       "reading the Adam state");
  }
  d->gathered = rc == MN_OK;
  d->gathered_step = s->step_count;
  return rc;
}

mn_status mn_cu_dp_read_moment(cuda_state *st, mn_session *s, size_t slot, int which, float *dst,
                               size_t n) {
  mn_status rc = mn_cu_sync(st, "waiting for the step");
  if (rc == MN_OK) rc = gather(st, s);
  if (rc != MN_OK) return rc;
  memcpy(dst, (which ? st->dp->all_v : st->dp->all_m) + mn_dp_slot_offset(s->plan, slot),
         n * sizeof *dst);
  return MN_OK;
}

mn_status mn_cu_dp_write_moment(cuda_state *st, mn_session *s, size_t slot, int which,
                                const float *src, size_t n) {
  mn_status rc = mn_cu_dp_ensure_moments(st, s);
  if (rc != MN_OK) return rc;
  size_t lo, hi, at = mn_dp_slot_offset(s->plan, slot);
  mn_dp_shard_range(s->dp, &lo, &hi);
  size_t a = at > lo ? at : lo, b = at + n < hi ? at + n : hi;
  float *dst = st->adam + (size_t)which * s->dp->shard;
  if (a < b)
    rc = mn_cu_check(cudaMemcpyAsync(dst + (a - lo), src + (a - at), (b - a) * sizeof *dst,
                                     cudaMemcpyHostToDevice, st->stream),
                     "writing the Adam state");
  if (rc == MN_OK) rc = mn_cu_sync(st, "writing the Adam state");
  st->dp->gathered = false;
  return rc;
}

bool mn_cu_dp_zero1(const cuda_state *st, const mn_session *s) {
  return st->dp && s->dp && s->dp->zero1;
}

mn_status mn_cu_dp_usable(const cuda_state *st) {
  return st->dp ? mn_cu_nccl_usable(st->dp->group, fn_step) : MN_OK;
}

void mn_cu_dp_abort(cuda_state *st, const char *why) {
  if (st->dp) mn_group_abort(st->dp->group, why);
}

mn_status mn_cu_dp_wait(cuda_state *st, cudaEvent_t event, const char *what) {
  return event ? mn_cu_nccl_wait_event(st->dp->group, event, what)
               : mn_cu_nccl_wait(st->dp->group, st->stream, what);
}
