/* The CUDA backend's per-session state, shared by its source files. */
#ifndef MN_CUDA_STATE_H
#define MN_CUDA_STATE_H

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "cuda/cuda_backend.h"
#include "cuda/device_abi.h"
#include "cuda/emit.h"
#include "cuda/update_split.h"

/* What the step graph's last node (kernels/readback.cuh) writes into pinned host memory. */
typedef struct mn_cu_readback {
  mn_dev_error error;
  float loss;
  mn_dev_scaler scaler; /* F16 training: the device's loss scaler after the step */
} mn_cu_readback;

/* An input copied from pinned staging memory by the graph's first nodes. Outside a
 * data-parallel group the copy is a node of the kept graph that a step leaves disabled when
 * nothing wrote the input since the previous step: the input's device memory (never shared,
 * host/memplan.c) still holds it. */
typedef struct mn_cu_staged {
  uint32_t buffer;
  size_t host_offset, bytes;
  cudaGraphNode_t copy; /* the copy's node in cuda_state.graph, NULL when not kept */
  bool written;         /* the staging was written since the last step's launch */
  bool copy_on;         /* the copy's node is enabled in cuda_state.exec */
} mn_cu_staged;

typedef struct mn_cu_matmul_plan {
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t a, b, c;
  cublasLtMatmulAlgo_t algo;
  bool fused;             /* the epilogue runs in cuBLASLt; its fallback commands are skipped */
  bool plain_to_fallback; /* not fused: the plain product goes to the desc's c_fallback */
} mn_cu_matmul_plan;

typedef struct mn_cu_device_misc {
  mn_dev_scalars scalars;
  mn_dev_error error;
  mn_dev_scaler scaler;      /* F16 training: the loss scaler (loss_scale.c) */
  mn_dev_scaler scaler_host; /* the host's state, copied in by every step */
} mn_cu_device_misc;

/* The streams of a capture built from data dependencies (schedule.c): stream 0 is the
 * session's; each other has its own cuBLASLt workspace. events[i] marks the end of command i
 * for the commands of other streams that wait for it. */
#define MN_CU_MAX_STREAMS 8
typedef struct mn_cu_lanes {
  int streams;
  int *lane;    /* per command: its stream, -1 for a skipped command */
  size_t *wait; /* per command and stream: 1 + the command of that stream it waits for, or 0 */
  cudaStream_t stream[MN_CU_MAX_STREAMS];
  void *workspace[MN_CU_MAX_STREAMS];
  cudaEvent_t fork, join[MN_CU_MAX_STREAMS];
  cudaEvent_t edge[2]; /* the step's side branches on stream 1 (capture.c) */
  /* The early part of a split update (update_split.h): on stream[streams], forked by part[0]
   * and joined back by part[1]. */
  cudaEvent_t part[2];
  cudaEvent_t *events;
  size_t num_events;
  bool active; /* the program is being enqueued: the other streams have not joined yet */
} mn_cu_lanes;

/* A data-parallel session's collectives (data_parallel.c). */
typedef struct mn_cu_dp mn_cu_dp;

/* Capture-key bit of a data-parallel step graph that reduces the gradients (every step's
 * graph without accumulation, the applying step's with it). */
#define MN_CU_KEY_REDUCE 16u

typedef struct cuda_state {
  int device;
  cudaStream_t stream;
  unsigned char *arena, *scratch;
  size_t arena_bytes, scratch_bytes;
  mn_cu_device_misc *misc; /* device: scalars and the error record */
  double *norm_partials;   /* device: one per norm block */
  float *adam;             /* device: m then v, 2 * update_bytes; NULL until Adam is used */
  float *accum;            /* device: the gradient sum, update_bytes; NULL until accumulating */
  void *workspace;         /* cuBLASLt */
  size_t workspace_bytes;
  cublasLtHandle_t lt;
  mn_cu_matmul_plan *matmuls; /* one per program command (only MATMUL ones set) */
  bool *skip; /* per program command: an epilogue fallback that a fused matmul made moot */

  /* pinned host memory */
  mn_dev_scalars *host_scalars;
  mn_cu_readback *host_readback;
  mn_cu_readback *dev_readback; /* host_readback as the device addresses it (mapped) */
  int readback_kernel;          /* mn_step_readback, the step graph's last node */
  unsigned char *host_staging;
  mn_cu_staged *staged;
  size_t num_staged;

  /* Low-precision sessions (low_precision.c): the weights' low-precision copy, laid out as
   * the update block (shadow_at[buffer]: byte offset, SIZE_MAX for a non-parameter), the
   * kernel that refreshes each parameter's copy, and the staging of rounded product
   * operands. */
  unsigned char *shadow, *stage;
  size_t *shadow_at;
  int *shadow_kernel;      /* per buffer: a parameter outside the update block, else < 0 */
  int shadow_block_kernel; /* the update block's parameters, < 0 without one */
  bool shadow_dirty;       /* a parameter was written since its copy was refreshed */

  /* F16 training (loss_scale.c): the scaler's kernels (-1 without a loss scale), the host's
   * state as pinned memory that every step copies in, the session's scaler, step count and
   * accumulation round as the backend last left them (a difference is a host write), and
   * whether no step has run since the device's state was last read back. */
  int scaler_begin, scaler_unscale, scaler_end;
  mn_dev_scaler *host_scaler;
  mn_dev_scaler scaler_view;
  unsigned scaler_view_accum; /* grad_accum then */
  bool scaler_idle;

  mn_cu_program prog;
  cudaLibrary_t library;
  cudaKernel_t *kernels;
  int opt_sumsq, opt_update, opt_accumulate; /* kernel indices, -1 for inference */
  mn_cu_update_split split;
  /* During a capture: 1 + the command after which the early part runs (0: one update), and
   * whether it was enqueued (then the update at the end is the late part). */
  size_t split_after;
  bool split_enqueued;

  mn_cu_lanes lanes;
  size_t graph_width; /* the most nodes of the captured graph at one depth (1: a chain) */
  size_t graph_overlapped_edges; /* its programmatic edges (mn_cu_launch_kernel) */
  cudaGraphExec_t exec;
  cudaGraph_t graph; /* what exec was made from, kept for its input copies' nodes */
  /* exec without its input copies' nodes, launched when no input was written since the last
   * step (mn_cu_inputs_written); NULL without bare_graph or a copy node kept. */
  cudaGraphExec_t bare_exec;
  /* A small training step, MN_CUDA_BARE_GRAPH not 0 at the build (capture.c, instantiate_bare). */
  bool bare_graph;
  unsigned captured_key; /* what the captured graph was built for (see capture.c) */
  bool captured;
  /* Kernels marked overlapping (emit.h mn_cu_kernel_overlaps) launch as programmatic dependents;
   * MN_CUDA_OVERLAP=0 launches them as every other kernel, to time what it buys. */
  bool overlap;
  /* The graph captured before it, kept while valid: a data-parallel session that accumulates
   * launches two graphs in turn (the applying one reduces, the others must not). */
  cudaGraphExec_t other_exec;
  unsigned other_key;
  bool other_captured;
  mn_cu_dp *dp;                /* NULL outside a data-parallel group */
  int zero_sumsq, zero_update; /* ZeRO-1: the optimizer kernels over one shard, -1 without */
  cudaEvent_t inputs_consumed;
  bool in_flight;
  uint64_t launches;       /* cudaGraphLaunch calls */
  uint64_t copies_skipped; /* input copies left disabled in a launch (mn_cu_inputs_copied) */
  uint64_t bare_launches;  /* launches of bare_exec */
  uint64_t captures;       /* graph (re-)captures */
  uint64_t submissions;    /* every stream submission made by step (launches included) */
  size_t graph_nodes;
  /* session build, in milliseconds */
  double lower_ms, compile_ms, load_ms, matmul_ms, build_ms;
  bool cache_hit;
} cuda_state;

/* "cuda backend: <what>: <CUDA error string>" as MN_ERR_DEVICE (MN_ERR_OUT_OF_MEMORY for
 * allocation failures). */
mn_status mn_cu_check(cudaError_t e, const char *what);

void *mn_cu_resolve(const cuda_state *st, const mn_session *s, mn_cu_arg a);

/* Low-precision sessions (low_precision.c). Declares the kernels that round each parameter
 * into its copy (before compiling); allocates the copies and the staging region; refreshes
 * the copies on the stream when a parameter was written (every step for a session that
 * shares another's parameters, which may have changed them); and converts between a
 * buffer's stored values and the floats the API speaks. */
mn_status mn_cu_low_declare(cuda_state *st, const mn_session *s);
mn_status mn_cu_low_allocate(cuda_state *st, const mn_session *s);
mn_status mn_cu_low_refresh(cuda_state *st, const mn_session *s);
void mn_cu_low_free(cuda_state *st);
/* Copies between host floats and a device buffer that stores `storage` (an mn_dtype). */
mn_status mn_cu_low_write(cuda_state *st, mn_dtype storage, void *dst, const float *src,
                          size_t count);
/* count values in rows of `cols` stored `pitch` apart (pitch 0: dense). */
mn_status mn_cu_low_read(cuda_state *st, mn_dtype storage, const void *src, float *dst,
                         size_t count, size_t cols, size_t pitch);

/* cuBLASLt: plans for every MATMUL command, chosen at build time; enqueue. */
mn_status mn_cu_matmuls_prepare(cuda_state *st, const mn_session *s);
void mn_cu_matmuls_destroy(cuda_state *st);
/* The scratch the step needs once the plans are chosen: the program's, and the fp32 product of
 * every epilogue that cuBLASLt did not fuse (mn_cu_program_scratch_bytes). */
size_t mn_cu_matmuls_scratch_bytes(const cuda_state *st);
mn_status mn_cu_matmul_enqueue(cuda_state *st, const mn_session *s, size_t cmd);

/* Whether command i of the program is not run (an epilogue fallback, see emit.h). */
static inline bool mn_cu_cmd_skipped(const cuda_state *st, size_t i) {
  return st->skip && st->skip[i];
}

/* Enqueues command i of the program (nothing for a skipped one), or the optimizer update of
 * capture key `key`, on the session stream (capture.c; the profiler runs them one by one
 * outside a graph). */
mn_status mn_cu_enqueue_cmd(cuda_state *st, const mn_session *s, size_t i);
mn_status mn_cu_enqueue_update(cuda_state *st, const mn_session *s, unsigned key);
/* F16 training: the device's loss scaler (loss_scale.c). mn_cu_scaled: whether the session has
 * one. declare: its kernels and pinned memory, at session build. enqueue_begin: the step's
 * first kernel after the input copies (capture.c; mn_cu_enqueue_update runs the unscale before
 * and the end after the optimizer). stage: before a launch, the host's state and whether the
 * step takes it. launched: after the launch, records what the host state then was. absorb:
 * once the stream is idle, the device's state becomes the session's (s->scaler, step_count,
 * accum_index), unless the host changed those since, which the next step then takes. */
bool mn_cu_scaled(const mn_session *s);
mn_status mn_cu_scaler_declare(cuda_state *st, const mn_session *s);
mn_status mn_cu_scaler_allocate(cuda_state *st, const mn_session *s);
void mn_cu_scaler_free(cuda_state *st);
mn_status mn_cu_scaler_enqueue_begin(cuda_state *st, const mn_session *s);
mn_status mn_cu_scaler_enqueue_unscale(cuda_state *st, const mn_session *s);
mn_status mn_cu_scaler_enqueue_end(cuda_state *st);
void mn_cu_scaler_stage(cuda_state *st, const mn_session *s);
void mn_cu_scaler_launched(cuda_state *st, const mn_session *s);
void mn_cu_scaler_absorb(cuda_state *st, mn_session *s);

/* Launches kernel `kernel` (an instance of the program) on the session stream with io. */
mn_status mn_cu_launch_kernel(cuda_state *st, uint32_t kernel, const unsigned grid[3],
                              unsigned block, size_t smem, mn_ptrs *io);

/* Waits until the session's stream is idle: through the group's watchdog in a data-parallel
 * session (a rank that died fails the wait instead of hanging it). */
mn_status mn_cu_sync(cuda_state *st, const char *what);

/* Low-precision sessions: enqueues the refresh of the update block's low-precision copy from
 * its fp32 parameters (ZeRO-1 gathers them outside the optimizer kernel). */
mn_status mn_cu_low_enqueue_block(cuda_state *st, const mn_session *s);

/* Data parallelism (data_parallel.c). declare: the ZeRO-1 kernels, at build. free: at
 * destroy. sync_params: before the first step, rank 0's parameters broadcast (outside the
 * graph). In the step graph: capture_begin; after_cmd after every program command (buckets
 * overlapped with the backward pass, when mn_cu_dp_overlaps); reduce before the optimizer,
 * or in F16 before the unscale (overlapped: the remaining buckets and the join; else every
 * bucket on the compute stream); zero_update instead of the optimizer kernels in a ZeRO-1
 * session; loss after the update.
 * Moments of a ZeRO-1 session: ensure (allocated on first use), read (collective), write
 * (the part in the rank's shard). usable: MN_ERR_STATE once the group was aborted; abort:
 * breaks the group; wait: the watchdog's wait on `event`, or on the session stream (NULL). */
mn_status mn_cu_dp_declare(cuda_state *st, const mn_session *s);
void mn_cu_dp_free(cuda_state *st);
mn_status mn_cu_dp_sync_params(cuda_state *st, mn_session *s);
bool mn_cu_dp_overlaps(const cuda_state *st, const mn_session *s, unsigned key);
void mn_cu_dp_capture_begin(cuda_state *st);
/* After the step's last node, also after a failure: joins the communication stream back if
 * a bucket forked it and nothing joined it yet, so that the capture can end. */
mn_status mn_cu_dp_capture_end(cuda_state *st);
mn_status mn_cu_dp_after_cmd(cuda_state *st, const mn_session *s, size_t cmd);
mn_status mn_cu_dp_reduce(cuda_state *st, const mn_session *s, bool overlapped);
/* F16 in a group. reduces_before_unscale: whether the step of `key` all-reduces the whole
 * gradients, which its unscale then reads (mn_cu_enqueue_update issues mn_cu_dp_reduce before
 * it); otherwise the unscale reads the rank's own. agree_overflow: after the unscale, every
 * rank takes the group's overflow flag (nothing outside a group). settle_round: before an
 * accumulating session picks its graph, the device's round, which an overflow in flight may
 * have kept open (waits for the steps in flight). */
bool mn_cu_dp_reduces_before_unscale(const cuda_state *st, const mn_session *s, unsigned key);
mn_status mn_cu_dp_agree_overflow(cuda_state *st);
mn_status mn_cu_dp_settle_round(cuda_state *st, mn_session *s);
mn_status mn_cu_dp_zero_update(cuda_state *st, const mn_session *s, unsigned key);
mn_status mn_cu_dp_loss(cuda_state *st, const mn_session *s);
bool mn_cu_dp_zero1(const cuda_state *st, const mn_session *s);
mn_status mn_cu_dp_ensure_moments(cuda_state *st, const mn_session *s);
mn_status mn_cu_dp_read_moment(cuda_state *st, mn_session *s, size_t slot, int which, float *dst,
                               size_t n);
mn_status mn_cu_dp_write_moment(cuda_state *st, mn_session *s, size_t slot, int which,
                                const float *src, size_t n);
mn_status mn_cu_dp_usable(const cuda_state *st);
void mn_cu_dp_abort(cuda_state *st, const char *why);
mn_status mn_cu_dp_wait(cuda_state *st, cudaEvent_t event, const char *what);

/* Records the whole step into a CUDA graph and instantiates it. */
mn_status mn_cu_capture(cuda_state *st, mn_session *s, unsigned key);
/* Destroys the captured graph (exec and the graph kept for its input copies). */
void mn_cu_graph_release(cuda_state *st);
/* Whether an input was written since the last launch (else bare_exec can run). */
bool mn_cu_inputs_written(const cuda_state *st);
/* Before a launch of exec: each input copy enabled when its staging was written since the last
 * launch, disabled when not (its device memory holds it still). After the launch succeeded:
 * the marks cleared (a failed launch keeps them, so a retry copies), skipped copies counted
 * (after a launch of bare_exec, `bare`, every copy it was built without). */
mn_status mn_cu_inputs_copied(cuda_state *st);
void mn_cu_inputs_launched(cuda_state *st, bool bare);

#endif
