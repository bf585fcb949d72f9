/* Captures one whole step into a CUDA graph: staging copies in, every command of the
 * program, the optimizer update, and the error record and loss written out to pinned host
 * memory by one kernel (kernels/readback.cuh); in a data-parallel session also the gradients'
 * and the loss's collectives (data_parallel.c). An F16 training step also copies the host's
 * loss-scaler state in, runs the scaler's kernels around the program and the update
 * (loss_scale.c), and writes the device's scaler out with the loss. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_state.h"
#include "cuda/schedule.h"
#include "host/error.h"

/* A programmatic edge joins two kernel nodes: a launch whose captured dependencies include a
 * copy or a memset (the step's first nodes) is made plainly. */
static bool follows_kernels_only(cudaStream_t stream) {
  enum cudaStreamCaptureStatus status;
  const cudaGraphNode_t *deps = NULL;
  size_t n = 0;
  const cudaGraphEdgeData *edges = NULL;
  if (cudaStreamGetCaptureInfo(stream, &status, NULL, NULL, &deps, &edges, &n) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  if (status != cudaStreamCaptureStatusActive) return true;
  for (size_t i = 0; i < n; i++) {
    enum cudaGraphNodeType type;
    if (cudaGraphNodeGetType(deps[i], &type) != cudaSuccess || type != cudaGraphNodeTypeKernel) {
      cudaGetLastError();
      return false;
    }
  }
  return n > 0;
}

mn_status mn_cu_launch_kernel(cuda_state *st, uint32_t kernel, const unsigned grid[3],
                              unsigned block, size_t smem, mn_ptrs *io) {
  void *args[] = {io};
  dim3 g = {grid[0], grid[1], grid[2]}, b = {block, 1, 1};
  if (st->prog.kernels[kernel].overlaps && st->overlap && follows_kernels_only(st->stream)) {
    cudaLaunchAttribute attr = {.id = cudaLaunchAttributeProgrammaticStreamSerialization};
    attr.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {.gridDim = g,
                              .blockDim = b,
                              .dynamicSmemBytes = smem,
                              .stream = st->stream,
                              .attrs = &attr,
                              .numAttrs = 1};
    return mn_cu_check(cudaLaunchKernelExC(&cfg, (const void *)st->kernels[kernel], args),
                       "launching a kernel");
  }
  return mn_cu_check(
      cudaLaunchKernel((const void *)st->kernels[kernel], g, b, args, smem, st->stream),
      "launching a kernel");
}

mn_status mn_cu_enqueue_cmd(cuda_state *st, const mn_session *s, size_t i) {
  const mn_cu_cmd *cmd = &st->prog.cmds[i];
  if (mn_cu_cmd_skipped(st, i)) return MN_OK;
  switch (cmd->kind) {
  case MN_CU_CMD_LAUNCH: {
    mn_ptrs io = {{0}};
    for (int a = 0; a < cmd->num_args; a++)
      io.p[a] = mn_cu_resolve(st, s, cmd->args[a]);
    return mn_cu_launch_kernel(st, cmd->kernel, cmd->grid, st->prog.kernels[cmd->kernel].block,
                               cmd->smem, &io);
  }
  case MN_CU_CMD_MATMUL: return mn_cu_matmul_enqueue(st, s, i);
  case MN_CU_CMD_MEMSET:
    return mn_cu_check(
        cudaMemsetAsync(mn_cu_resolve(st, s, cmd->args[0]), 0, cmd->bytes, st->stream), "memset");
  case MN_CU_CMD_COPY:
    return mn_cu_check(cudaMemcpyAsync(mn_cu_resolve(st, s, cmd->args[0]),
                                       mn_cu_resolve(st, s, cmd->args[1]), cmd->bytes,
                                       cudaMemcpyDeviceToDevice, st->stream),
                       "copy");
  }
  return MN_OK;
}

/* The update kernel over elements [first, first + count) of the flat block, on st->stream;
 * `shadow`: the weights' low-precision copy it also writes (NULL: none). */
static mn_status launch_update(cuda_state *st, const mn_session *s, int kernel, long long first,
                               long long count, bool clipped, void *shadow) {
  const mn_plan *p = s->plan;
  size_t n = p->update_bytes / sizeof(float);
  float *params = (float *)(st->arena + p->update_params_offset) + first;
  float *grads = (float *)(st->arena + p->update_grads_offset) + first;
  float *m = st->adam ? st->adam + first : NULL, *v = st->adam ? st->adam + n + first : NULL;
  mn_ptrs io = {{params, grads, m, v, &st->misc->scalars, clipped ? st->norm_partials : NULL,
                 &st->misc->error, shadow}};
  /* The update takes four elements a thread where it can (optimizer.cuh). */
  long long blocks = (count + 1023) / 1024;
  if (blocks > 4096) blocks = 4096;
  const unsigned grid[3] = {(unsigned)(blocks ? blocks : 1), 1, 1};
  return mn_cu_launch_kernel(st, (uint32_t)kernel, grid, 256, 0, &io);
}

/* The optimizer kernels of capture key `key` (nothing without an optimizer); `reduced`: the
 * gradients' all-reduce is in the graph already (an F16 step, mn_cu_enqueue_update). After a
 * split update's early part (split_enqueued), the update is its late part. */
static mn_status enqueue_optimizer(cuda_state *st, const mn_session *s, unsigned key,
                                   bool reduced) {
  if (!(key & 1u) || st->opt_update < 0) return MN_OK;
  const mn_plan *p = s->plan;
  float *grads = (float *)(st->arena + p->update_grads_offset);
  size_t n = p->update_bytes / sizeof(float);
  size_t blocks = (n + 255) / 256;
  if (blocks > 4096) blocks = 4096;
  const unsigned grid[3] = {(unsigned)(blocks ? blocks : 1), 1, 1};
  if (key & 8u) {
    mn_ptrs io = {{grads, st->accum, &st->misc->scalars, &st->misc->error}};
    mn_status rc = mn_cu_launch_kernel(st, (uint32_t)st->opt_accumulate, grid, 256, 0, &io);
    if (rc != MN_OK) return rc;
  }
  /* Data parallelism: the update reads the mean over ranks (with accumulation, of the
   * round's means, known only now). */
  if ((key & MN_CU_KEY_REDUCE) && !reduced) {
    if (mn_cu_dp_zero1(st, s)) return mn_cu_dp_zero_update(st, s, key);
    mn_status rc = mn_cu_dp_reduce(st, s, mn_cu_dp_overlaps(st, s, key));
    if (rc != MN_OK) return rc;
  }
  if (key & 2u) {
    mn_ptrs io = {{grads, st->norm_partials, &st->misc->error, &st->misc->scalars}};
    const unsigned norm_grid[3] = {MN_CU_NORM_BLOCKS, 1, 1};
    mn_status rc = mn_cu_launch_kernel(st, (uint32_t)st->opt_sumsq, norm_grid, 256, 0, &io);
    if (rc != MN_OK) return rc;
  }
  /* A part is whole parameters of an F32 session (update_split.h): no weight copies. */
  if (st->split_enqueued)
    return launch_update(st, s, st->split.late.kernel, st->split.late.first, st->split.late.count,
                         false, NULL);
  return launch_update(st, s, st->opt_update, 0, (long long)n, (key & 2u) != 0, st->shadow);
}

/* F16 training: the gradients are unscaled before the optimizer reads them, and the scaler
 * moves after it, also in a session without an optimizer. In a data-parallel session the
 * unscale of a step that all-reduces the whole gradients waits for them (the buckets'
 * all-reduces write the gradients it reads), and every rank takes the group's overflow flag
 * before anything reads it (data_parallel.c, mn_cu_dp_agree_overflow). */
mn_status mn_cu_enqueue_update(cuda_state *st, const mn_session *s, unsigned key) {
  bool scaled = mn_cu_scaled(s);
  bool reduced = scaled && mn_cu_dp_reduces_before_unscale(st, s, key);
  mn_status rc = reduced ? mn_cu_dp_reduce(st, s, mn_cu_dp_overlaps(st, s, key)) : MN_OK;
  if (rc == MN_OK && scaled) rc = mn_cu_scaler_enqueue_unscale(st, s);
  if (rc == MN_OK && scaled) rc = mn_cu_dp_agree_overflow(st);
  if (rc == MN_OK) rc = enqueue_optimizer(st, s, key, reduced);
  if (rc == MN_OK && scaled) rc = mn_cu_scaler_enqueue_end(st);
  return rc;
}

/* The copy just captured is the stream's one dependency: its node, for mn_cu_inputs_copied.
 * A data-parallel session copies every input every step (it keeps two graphs). */
static mn_status note_copy_node(cuda_state *st, mn_cu_staged *sg) {
  if (st->dp) return MN_OK;
  enum cudaStreamCaptureStatus status;
  const cudaGraphNode_t *deps = NULL;
  size_t n = 0;
  /* Skipping copies only saves time: an answer that does not name the copy (or none) leaves
   * it copying every step. */
  const cudaGraphEdgeData *edges = NULL;
  if (cudaStreamGetCaptureInfo(st->stream, &status, NULL, NULL, &deps, &edges, &n) != cudaSuccess) {
    cudaGetLastError();
    return MN_OK;
  }
  if (status == cudaStreamCaptureStatusActive && n == 1) sg->copy = deps[0];
  return MN_OK;
}

/* The error record, the loss and the scaler into the host's readback, by one kernel;
 * `beside_update`: the scalars, when it runs beside the optimizer update (readback.cuh). */
static mn_status enqueue_readback(cuda_state *st, const mn_session *s, bool scaled,
                                  void *beside_update) {
  const mn_plan *p = s->plan;
  mn_cu_readback *h = st->dev_readback;
  mn_ptrs io = {{&st->misc->error,
                 p->loss != MN_NO_NODE ? st->arena + mn_plan_buffer_of(p, p->loss)->offset : NULL,
                 scaled ? &st->misc->scaler : NULL, &h->error, &h->loss, &h->scaler,
                 beside_update}};
  const unsigned grid[3] = {1, 1, 1};
  return mn_cu_launch_kernel(st, (uint32_t)st->readback_kernel, grid, MN_CU_READBACK_BLOCK, 0, &io);
}

static bool program_reads_scalars(const cuda_state *st) {
  for (size_t i = 0; i < st->prog.num_cmds; i++) {
    const mn_cu_cmd *c = &st->prog.cmds[i];
    for (int a = 0; c->kind == MN_CU_CMD_LAUNCH && a < c->num_args; a++)
      if (c->args[a].kind == MN_CU_ARG_SCALARS) return true;
  }
  return false;
}

/* A step on several streams (a small one, schedule.h) waits on every node of its longest
 * chain, so two nodes that need not be on it move to stream 1: the scalars' copy, which only
 * the optimizer reads when no program kernel does, runs beside the forward pass (an H2D node
 * first in a graph cost 2.3 us, docs/performance.md), and the readback beside the update.
 * Not for F16 steps (the scaler's kernels read and write the scalars around the program) nor
 * data-parallel ones (their collectives order the end of the step). MN_CUDA_SIDE=0: one chain
 * at both ends, for comparison. */
static cudaStream_t side_stream(const cuda_state *st, bool scaled) {
  const char *env = getenv("MN_CUDA_SIDE");
  if ((env && strcmp(env, "0") == 0) || st->lanes.streams < 2 || scaled || st->dp) return NULL;
  return program_reads_scalars(st) ? NULL : st->lanes.stream[1];
}

/* `to` waits for what `from` has enqueued so far. */
static mn_status edge(cudaEvent_t ev, cudaStream_t from, cudaStream_t to) {
  mn_status rc = mn_cu_check(cudaEventRecord(ev, from), "ordering the capture");
  return rc == MN_OK ? mn_cu_check(cudaStreamWaitEvent(to, ev, 0), "ordering the capture") : rc;
}

static mn_status copy_scalars(cuda_state *st, cudaStream_t stream) {
  return mn_cu_check(cudaMemcpyAsync(&st->misc->scalars, st->host_scalars, sizeof *st->host_scalars,
                                     cudaMemcpyHostToDevice, stream),
                     "copying scalars");
}

/* The update, and the readback after it or beside it on `side`; joined back. */
static mn_status enqueue_end(cuda_state *st, const mn_session *s, unsigned key, bool scaled,
                             cudaStream_t side) {
  bool update = ((key & 1u) && st->opt_update >= 0) || scaled;
  if (!side) {
    mn_status rc = update ? mn_cu_enqueue_update(st, s, key) : MN_OK;
    if (rc == MN_OK && st->dp) rc = mn_cu_dp_loss(st, s);
    return rc == MN_OK ? enqueue_readback(st, s, scaled, NULL) : rc;
  }
  cudaStream_t main = st->stream;
  mn_status rc = edge(st->lanes.edge[0], main, side);
  if (rc == MN_OK) {
    st->stream = side;
    rc = enqueue_readback(st, s, scaled, update ? &st->misc->scalars : NULL);
    st->stream = main;
  }
  if (rc == MN_OK && update) rc = mn_cu_enqueue_update(st, s, key);
  /* Joined also after a failure, so that the capture can end. */
  mn_status joined = edge(st->lanes.edge[1], side, main);
  return rc != MN_OK ? rc : joined;
}

/* The byte ranges of a part's weights and gradients on the device. */
static void part_ranges(const cuda_state *st, const mn_plan *p, const mn_cu_update_part *part,
                        uintptr_t lo[2], uintptr_t hi[2]) {
  size_t at = (size_t)part->first * sizeof(float), bytes = (size_t)part->count * sizeof(float);
  lo[0] = (uintptr_t)(st->arena + p->update_params_offset + at);
  lo[1] = (uintptr_t)(st->arena + p->update_grads_offset + at);
  hi[0] = lo[0] + bytes;
  hi[1] = lo[1] + bytes;
}

/* 1 + the command after which the early part of a split update runs in the capture of `key`,
 * or 0 for one update at the end (update_split.h says which steps split). */
static size_t split_after(const cuda_state *st, const mn_session *s, unsigned key, bool scaled) {
  const mn_cu_lanes *ln = &st->lanes;
  if (st->split.early.kernel < 0 || ln->streams < 2 || ln->streams >= MN_CU_MAX_STREAMS ||
      !ln->stream[ln->streams] || !ln->part[0] || scaled || st->dp || !(key & 1u) ||
      (key & (2u | 8u | MN_CU_KEY_REDUCE)) || st->opt_update < 0)
    return 0;
  uintptr_t lo[2], hi[2];
  part_ranges(st, s->plan, &st->split.early, lo, hi);
  size_t early = mn_cu_schedule_last_touch(st, s, lo, hi, 2, true);
  part_ranges(st, s->plan, &st->split.late, lo, hi);
  size_t late = mn_cu_schedule_last_touch(st, s, lo, hi, 2, false);
  return early && early < late ? early : 0;
}

/* After command `cmd` of the program: the early part once everything it waits for is in. */
static mn_status early_update_after(cuda_state *st, const mn_session *s, size_t cmd) {
  if (cmd + 1 != st->split_after) return MN_OK;
  mn_cu_lanes *ln = &st->lanes;
  cudaStream_t part = ln->stream[ln->streams], origin = st->stream;
  /* Joined back at the end even when forking it fails half way (enqueue_step). */
  st->split_enqueued = true;
  mn_status rc = mn_cu_lanes_wait_all(st, ln->part[0], part);
  if (rc != MN_OK) return rc;
  st->stream = part;
  rc = launch_update(st, s, st->split.early.kernel, st->split.early.first, st->split.early.count,
                     false, NULL);
  st->stream = origin;
  return rc;
}

static mn_status enqueue_step(cuda_state *st, const mn_session *s, unsigned key) {
  bool scaled = mn_cu_scaled(s);
  cudaStream_t side = side_stream(st, scaled);
  st->split_after = split_after(st, s, key, scaled);
  mn_status rc = side ? edge(st->lanes.edge[0], st->stream, side) : MN_OK;
  if (rc == MN_OK) rc = copy_scalars(st, side ? side : st->stream);
  if (rc == MN_OK && scaled)
    rc = mn_cu_check(cudaMemcpyAsync(&st->misc->scaler_host, st->host_scaler,
                                     sizeof *st->host_scaler, cudaMemcpyHostToDevice, st->stream),
                     "copying the loss scaler");
  for (size_t i = 0; rc == MN_OK && i < st->num_staged; i++) {
    mn_cu_staged *sg = &st->staged[i];
    rc = mn_cu_check(cudaMemcpyAsync(st->arena + s->plan->buffers[sg->buffer].offset,
                                     st->host_staging + sg->host_offset, sg->bytes,
                                     cudaMemcpyHostToDevice, st->stream),
                     "copying an input");
    if (rc == MN_OK) rc = note_copy_node(st, sg);
  }
  /* The host rewrites the staging and the scalars once this event has passed. */
  if (rc == MN_OK && side) rc = edge(st->lanes.edge[1], st->stream, side);
  if (rc == MN_OK)
    rc = mn_cu_check(cudaEventRecordWithFlags(st->inputs_consumed, side ? side : st->stream,
                                              cudaEventRecordExternal),
                     "recording the input event");
  if (rc == MN_OK && scaled) rc = mn_cu_scaler_enqueue_begin(st, s);
  /* Gradient buckets go to NCCL as soon as the commands that finish them have run. */
  bool overlap = mn_cu_dp_overlaps(st, s, key);
  mn_cu_dp_capture_begin(st);
  mn_cu_after_cmd after = overlap           ? mn_cu_dp_after_cmd
                          : st->split_after ? early_update_after
                                            : NULL;
  if (rc == MN_OK) rc = mn_cu_enqueue_program(st, s, after);
  if (rc == MN_OK)
    rc = enqueue_end(st, s, key, scaled, side);
  else if (side)
    edge(st->lanes.edge[1], side, st->stream); /* so that the capture can end */
  /* The early part's stream joins back, also after a failure. */
  mn_status parted = st->split_enqueued
                         ? edge(st->lanes.part[1], st->lanes.stream[st->lanes.streams], st->stream)
                         : MN_OK;
  mn_status joined = mn_cu_dp_capture_end(st);
  return rc != MN_OK ? rc : parted != MN_OK ? parted : joined;
}

/* The nodes on one side of `node` (`after`: its dependents) into nodes[cap], with room for
 * their edges' data: a query without it is refused as lossy where an edge is programmatic. */
static bool edge_ends(cudaGraphNode_t node, bool after, cudaGraphNode_t *nodes,
                      cudaGraphEdgeData *data, size_t cap, size_t *n) {
  *n = cap;
  cudaError_t e = after ? cudaGraphNodeGetDependentNodes(node, nodes, data, n)
                        : cudaGraphNodeGetDependencies(node, nodes, data, n);
  if (e != cudaSuccess) cudaGetLastError();
  return e == cudaSuccess;
}

/* Removes `node` from `graph`, each node before it then ordered before each node after it,
 * which waited on those through it (the scalars' copy, the loss scaler's, before the first
 * kernel). */
static mn_status remove_keeping_order(cudaGraph_t graph, cudaGraphNode_t node) {
  size_t cap = 0;
  if (cudaGraphGetEdges(graph, NULL, NULL, NULL, &cap) != cudaSuccess) {
    cudaGetLastError();
    return mn_fail(MN_ERR_DEVICE, "cuda backend: could not count the step graph's edges");
  }
  cap++;
  cudaGraphNode_t *in = malloc(3 * cap * sizeof *in), *out = in ? in + cap : NULL,
                  *before = in ? in + 2 * cap : NULL;
  cudaGraphEdgeData *data = malloc(cap * sizeof *data);
  size_t nin = 0, nout = 0, nb = 0;
  mn_status rc =
      in && data ? MN_OK : mn_fail(MN_ERR_OUT_OF_MEMORY, "cuda backend: out of host memory");
  if (rc == MN_OK && (!edge_ends(node, false, in, data, cap, &nin) ||
                      !edge_ends(node, true, out, data, cap, &nout)))
    rc = mn_fail(MN_ERR_DEVICE, "cuda backend: could not read an input copy's edges");
  for (size_t o = 0; rc == MN_OK && o < nout; o++) {
    if (!edge_ends(out[o], false, before, data, cap, &nb)) {
      rc = mn_fail(MN_ERR_DEVICE, "cuda backend: could not read a node's edges");
      break;
    }
    for (size_t i = 0; rc == MN_OK && i < nin; i++) {
      bool present = false;
      /* A programmatic edge orders less than the copy did: only a full one counts. */
      for (size_t b = 0; b < nb; b++)
        present =
            present || (before[b] == in[i] && data[b].type == cudaGraphDependencyTypeDefault &&
                        data[b].from_port == 0);
      if (!present)
        rc = mn_cu_check(cudaGraphAddDependencies(graph, &in[i], &out[o], NULL, 1),
                         "ordering around an input copy");
    }
  }
  free(in);
  free(data);
  return rc != MN_OK ? rc : mn_cu_check(cudaGraphDestroyNode(node), "removing an input copy");
}

/* A small step whose inputs are on the device already launches the graph without its copy
 * nodes, which, disabled, still stand at the head of the chain: the MLP TF32 step went from
 * 0.0501-0.0502 to 0.0493-0.0498 ms (H200). The removed copies' edges become edges from their
 * predecessors to their successors, so the scalars' and the loss scaler's copies still come
 * before the kernels that read them (docs/performance.md). MN_CUDA_BARE_GRAPH=0 turns it off. */
static mn_status instantiate_bare(cuda_state *st, cudaGraph_t graph) {
  if (!st->bare_graph) return MN_OK;
  cudaGraph_t clone = NULL;
  mn_status rc = mn_cu_check(cudaGraphClone(&clone, graph), "cloning the step graph");
  for (size_t i = 0; rc == MN_OK && i < st->num_staged; i++) {
    cudaGraphNode_t node = NULL;
    if (!st->staged[i].copy) continue;
    rc = mn_cu_check(cudaGraphNodeFindInClone(&node, st->staged[i].copy, clone),
                     "finding an input copy in the clone");
    if (rc == MN_OK) rc = remove_keeping_order(clone, node);
  }
  if (rc == MN_OK)
    rc = mn_cu_check(cudaGraphInstantiate(&st->bare_exec, clone, 0),
                     "instantiating the step graph without its input copies");
  if (rc == MN_OK)
    rc = mn_cu_check(cudaGraphUpload(st->bare_exec, st->stream), "uploading the graph");
  if (clone) cudaGraphDestroy(clone);
  return rc;
}

/* A copy's node is only as good as the graph that holds it. */
static void forget_copies_unless_kept(cuda_state *st) {
  for (size_t i = 0; !st->graph && i < st->num_staged; i++)
    st->staged[i].copy = NULL;
}

mn_status mn_cu_capture(cuda_state *st, mn_session *s, unsigned key) {
  mn_status rc = mn_cu_sync(st, "waiting before capture");
  if (rc != MN_OK) return rc;
  mn_cu_graph_release(st);
  st->captured = false;
  rc = mn_cu_lanes_prepare(st, s);
  if (rc != MN_OK) return rc;
  rc = mn_cu_check(cudaStreamBeginCapture(st->stream, cudaStreamCaptureModeThreadLocal),
                   "starting the capture");
  if (rc != MN_OK) return rc;
  rc = enqueue_step(st, s, key);
  /* Outside a capture (the profiler's update) the update is one kernel again. */
  st->split_after = 0;
  st->split_enqueued = false;
  if (rc != MN_OK) forget_copies_unless_kept(st);
  char msg[2048];
  snprintf(msg, sizeof msg, "%s", mn_last_error());
  cudaGraph_t graph = NULL;
  mn_status end = mn_cu_check(cudaStreamEndCapture(st->stream, &graph), "ending the capture");
  if (rc != MN_OK) {
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();
    mn_set_last_error(msg);
    return rc;
  }
  if (end != MN_OK) {
    forget_copies_unless_kept(st);
    return end;
  }
  size_t nodes = 0;
  cudaGraphGetNodes(graph, NULL, &nodes);
  /* For reading a step's nodes and edges where no profiler shows them (docs/performance.md). */
  const char *dot = getenv("MN_CUDA_GRAPH_DOT");
  if (dot && *dot) cudaGraphDebugDotPrint(graph, dot, cudaGraphDebugDotFlagsKernelNodeParams);
  st->graph_width = mn_cu_graph_width(graph, &st->graph_overlapped_edges);
  rc = mn_cu_check(cudaGraphInstantiate(&st->exec, graph, 0), "instantiating the step graph");
  /* Nodes are enabled as instantiated; the graph stays while its copies' nodes are used. */
  bool kept = false;
  for (size_t i = 0; i < st->num_staged; i++) {
    st->staged[i].copy_on = true;
    kept = kept || st->staged[i].copy;
  }
  /* Without the bare graph every step launches exec, a little slower but the same; the failure is
   * told on stderr, not to the caller, whose step is fine. */
  if (rc == MN_OK && kept && instantiate_bare(st, graph) != MN_OK) {
    fprintf(stderr,
            "meganeura: the step graph without input copies failed (steps copy as "
            "before): %s\n",
            mn_last_error());
    cudaGetLastError();
    if (st->bare_exec) cudaGraphExecDestroy(st->bare_exec);
    st->bare_exec = NULL;
  }
  if (rc == MN_OK && kept)
    st->graph = graph;
  else
    cudaGraphDestroy(graph);
  forget_copies_unless_kept(st);
  if (rc != MN_OK) return rc;
  if (rc == MN_OK) rc = mn_cu_check(cudaGraphUpload(st->exec, st->stream), "uploading the graph");
  st->graph_nodes = nodes;
  st->captured_key = key;
  st->captured = rc == MN_OK;
  return rc;
}

void mn_cu_graph_release(cuda_state *st) {
  if (st->exec) cudaGraphExecDestroy(st->exec);
  st->exec = NULL;
  if (st->bare_exec) cudaGraphExecDestroy(st->bare_exec);
  st->bare_exec = NULL;
  if (st->graph) cudaGraphDestroy(st->graph);
  st->graph = NULL;
  for (size_t i = 0; i < st->num_staged; i++)
    st->staged[i].copy = NULL;
}

bool mn_cu_inputs_written(const cuda_state *st) {
  for (size_t i = 0; i < st->num_staged; i++)
    if (st->staged[i].written) return true;
  return false;
}

mn_status mn_cu_inputs_copied(cuda_state *st) {
  mn_status rc = MN_OK;
  for (size_t i = 0; i < st->num_staged && rc == MN_OK; i++) {
    mn_cu_staged *sg = &st->staged[i];
    if (!sg->copy || sg->copy_on == sg->written) continue;
    rc = mn_cu_check(cudaGraphNodeSetEnabled(st->exec, sg->copy, sg->written ? 1u : 0u),
                     "switching an input copy");
    if (rc == MN_OK) sg->copy_on = sg->written;
  }
  return rc;
}

void mn_cu_inputs_launched(cuda_state *st, bool bare) {
  st->bare_launches += bare;
  for (size_t i = 0; i < st->num_staged; i++) {
    mn_cu_staged *sg = &st->staged[i];
    /* A copy whose node the capture did not name stays in the bare graph too. */
    if ((bare && sg->copy) || !sg->copy_on) st->copies_skipped++;
    sg->written = false;
  }
}
