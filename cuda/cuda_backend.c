/* The CUDA backend: one arena per session, kernels compiled by NVRTC (through the disk
 * cache) when the session is built, matmul algorithms chosen then too, and the whole
 * step captured into one CUDA graph, so that mn_session_step is one cudaGraphLaunch.
 *
 * Inputs are staged in pinned host memory and copied in by the graph's first nodes, each
 * only when it was written since the previous step (capture.c); optimizer scalars every step. A
 * staging area is rewritten only after the previous step's copies have run (the inputs_consumed
 * event), so set_input during a step is safe and the host never waits for a whole step. F16
 * training keeps its loss scaler on the device (loss_scale.c). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda/cuda_state.h"
#include "cuda/loss_scale.h"
#include "cuda/nvtx.h"
#include "cuda/schedule.h"
#include "cuda/storage_layout.h"
#include "host/error.h"

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

mn_status mn_cu_check(cudaError_t e, const char *what) {
  if (e == cudaSuccess) return MN_OK;
  cudaGetLastError();
  mn_status s = e == cudaErrorMemoryAllocation ? MN_ERR_OUT_OF_MEMORY : MN_ERR_DEVICE;
  return mn_fail(s, "cuda backend: %s: %s", what, cudaGetErrorString(e));
}

/* A buffer's device memory: the session's arena, or another session's for a shared parameter. */
static unsigned char *buffer_addr(const cuda_state *st, const mn_session *s, uint32_t buffer) {
  void *shared = mn_session_shared_buffer(s, buffer);
  return shared ? shared : st->arena + s->plan->buffers[buffer].offset;
}

static void *cuda_buffer_address(const mn_session *s, uint32_t buffer) {
  return buffer_addr(s->backend_state, s, buffer);
}

void *mn_cu_resolve(const cuda_state *st, const mn_session *s, mn_cu_arg a) {
  switch (a.kind) {
  case MN_CU_ARG_NODE:
    return buffer_addr(st, s, s->plan->node_buffer[a.node]) + mn_cu_stored_offset(s->plan, a);
  case MN_CU_ARG_SHADOW:
    return st->shadow + st->shadow_at[s->plan->node_buffer[a.node]] +
           mn_cu_stored_offset(s->plan, a);
  case MN_CU_ARG_STAGE: return st->stage + a.offset;
  case MN_CU_ARG_SCRATCH: return st->scratch + a.offset;
  case MN_CU_ARG_ERROR: return &st->misc->error;
  case MN_CU_ARG_SCALARS: return &st->misc->scalars;
  case MN_CU_ARG_VALUE: return (void *)(uintptr_t)a.offset;
  case MN_CU_ARG_NONE: break;
  }
  return NULL;
}

static mn_status plan_staging(cuda_state *st, const mn_plan *p) {
  size_t total = 0;
  st->staged = calloc(p->num_buffers ? p->num_buffers : 1, sizeof *st->staged);
  if (!st->staged) return mn_fail(MN_ERR_OUT_OF_MEMORY, "cuda backend: out of host memory");
  for (size_t b = 0; b < p->num_buffers; b++) {
    if (p->buffers[b].role != MN_BUF_INPUT || mn_plan_input_persists(p, (uint32_t)b)) continue;
    /* F16's #loss_scale: the step's first kernel writes it from the device's scaler. */
    if (p->loss_scale != MN_NO_NODE && b == p->node_buffer[p->loss_scale]) continue;
    st->staged[st->num_staged++] = (mn_cu_staged){
        .buffer = (uint32_t)b, .host_offset = total, .bytes = p->buffers[b].bytes, .written = true};
    total += (p->buffers[b].bytes + 255) / 256 * 256;
  }
  mn_status rc = mn_cu_check(cudaMallocHost((void **)&st->host_staging, total ? total : 256),
                             "pinned staging memory");
  if (rc == MN_OK) memset(st->host_staging, 0, total ? total : 256);
  return rc;
}

static mn_cu_staged *staged_of(const cuda_state *st, uint32_t buffer) {
  for (size_t i = 0; i < st->num_staged; i++)
    if (st->staged[i].buffer == buffer) return &st->staged[i];
  return NULL;
}

static mn_status compile_and_load(cuda_state *st) {
  int major = 0, minor = 0;
  mn_status rc = mn_cu_check(
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, st->device), "device");
  if (rc == MN_OK)
    rc = mn_cu_check(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, st->device),
                     "device");
  if (rc != MN_OK) return rc;
  /* Programmatic dependent launch needs sm_90; below it kernels launch plainly. */
  if (major < 9) st->overlap = false;
  /* sm_90 devices compile for sm_90a, whose warpgroup products (wgmma) the attention kernels
   * use (kernels/attention_wgmma.cuh, attention_wgmma_bwd.cuh); such a cubin runs on compute
   * capability 9.0 only, which is the device it is built for. MN_CUDA_WGMMA=0 compiles for plain
   * sm_90 (the mma.sync kernels), for comparisons on one machine. */
  const char *wgmma = getenv("MN_CUDA_WGMMA");
  const bool arch_a = major == 9 && minor == 0 && !(wgmma && strcmp(wgmma, "0") == 0);
  char arch[32];
  snprintf(arch, sizeof arch, "sm_%d%d%s", major, minor, arch_a ? "a" : "");
  char *src = mn_cu_program_source(&st->prog);
  if (!src) return mn_fail(MN_ERR_OUT_OF_MEMORY, "cuda backend: out of host memory");
  mn_cu_binary bin;
  rc = mn_cu_compile(src, arch, NULL, &bin);
  free(src);
  if (rc != MN_OK) return rc;
  st->compile_ms = bin.compile_ms;
  st->cache_hit = bin.from_cache;
  double t0 = now_ms();
  rc = mn_cu_check(cudaLibraryLoadData(&st->library, bin.data, NULL, NULL, 0, NULL, NULL, 0),
                   "loading the compiled kernels");
  mn_cu_binary_free(&bin);
  if (rc != MN_OK) return rc;
  st->kernels = calloc(st->prog.num_kernels ? st->prog.num_kernels : 1, sizeof *st->kernels);
  if (!st->kernels) return mn_fail(MN_ERR_OUT_OF_MEMORY, "cuda backend: out of host memory");
  for (size_t k = 0; k < st->prog.num_kernels; k++) {
    char name[32];
    snprintf(name, sizeof name, "mn_k%zu", k);
    rc = mn_cu_check(cudaLibraryGetKernel(&st->kernels[k], st->library, name), "finding a kernel");
    if (rc != MN_OK) return rc;
  }
  /* Kernels launched with more than the default 48 KB of shared memory must opt in, with
   * the largest amount any of their launches asks for. Their static shared memory counts
   * against the same 48 KB, so every kernel with dynamic shared memory opts in. */
  size_t *smem = calloc(st->prog.num_kernels ? st->prog.num_kernels : 1, sizeof *smem);
  if (!smem) return mn_fail(MN_ERR_OUT_OF_MEMORY, "cuda backend: out of host memory");
  for (size_t i = 0; i < st->prog.num_cmds; i++) {
    const mn_cu_cmd *cmd = &st->prog.cmds[i];
    if (cmd->kind == MN_CU_CMD_LAUNCH && cmd->smem > smem[cmd->kernel])
      smem[cmd->kernel] = cmd->smem;
  }
  for (size_t k = 0; k < st->prog.num_kernels && rc == MN_OK; k++)
    if (smem[k] > 0)
      rc = mn_cu_check(cudaKernelSetAttributeForDevice(st->kernels[k],
                                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                       (int)smem[k], st->device),
                       "raising a kernel's shared memory limit");
  free(smem);
  if (rc != MN_OK) return rc;
  st->load_ms = now_ms() - t0;
  return MN_OK;
}

static mn_status allocate(cuda_state *st, const mn_session *s) {
  const mn_plan *p = s->plan;
  st->arena_bytes = p->arena_bytes ? p->arena_bytes : 256;
  mn_status rc = mn_cu_check(cudaMalloc((void **)&st->arena, st->arena_bytes), "the arena");
  /* What every dispatch needs; fit_scratch adds the epilogues that fall back. */
  st->scratch_bytes = st->prog.scratch_bytes;
  if (rc == MN_OK && st->scratch_bytes)
    rc = mn_cu_check(cudaMalloc((void **)&st->scratch, st->scratch_bytes), "scratch memory");
  if (rc == MN_OK) rc = mn_cu_check(cudaMalloc((void **)&st->misc, sizeof *st->misc), "scalars");
  if (rc == MN_OK)
    rc = mn_cu_check(cudaMalloc((void **)&st->norm_partials, MN_CU_NORM_BLOCKS * sizeof(double)),
                     "norm partials");
  if (rc == MN_OK)
    rc = mn_cu_check(cudaMallocHost((void **)&st->host_scalars, sizeof *st->host_scalars),
                     "pinned scalars");
  if (rc == MN_OK)
    rc = mn_cu_check(
        cudaHostAlloc((void **)&st->host_readback, sizeof *st->host_readback, cudaHostAllocMapped),
        "pinned readback");
  if (rc == MN_OK)
    rc = mn_cu_check(cudaHostGetDevicePointer((void **)&st->dev_readback, st->host_readback, 0),
                     "mapping the readback");
  if (rc != MN_OK) return rc;
  memset(st->host_scalars, 0, sizeof *st->host_scalars);
  memset(st->host_readback, 0, sizeof *st->host_readback);
  /* Everything goes through the session's stream: it does not synchronize with the
   * legacy default stream, so a plain cudaMemset could land after later writes. */
  rc =
      mn_cu_check(cudaMemsetAsync(st->arena, 0, st->arena_bytes, st->stream), "clearing the arena");
  if (rc == MN_OK)
    rc =
        mn_cu_check(cudaMemsetAsync(st->misc, 0, sizeof *st->misc, st->stream), "clearing scalars");
  return rc;
}

/* The fp32 product of an epilogue that cuBLASLt does not fuse goes to scratch: the largest
 * such product (GPT-2's MLP projection, 201 MB at batch 16 x 1024) is reserved only when one
 * falls back, which is known once the algorithms are chosen. Those choices read the scratch's
 * address only for its alignment, which any cudaMalloc gives (256 bytes), so it may move;
 * nothing has been captured yet. */
static mn_status fit_scratch(cuda_state *st) {
  size_t need = mn_cu_matmuls_scratch_bytes(st);
  if (need <= st->scratch_bytes) return MN_OK;
  cudaFree(st->scratch);
  st->scratch = NULL;
  st->scratch_bytes = need;
  return mn_cu_check(cudaMalloc((void **)&st->scratch, need), "scratch memory");
}

static mn_status upload_constants(cuda_state *st, const mn_session *s) {
  const mn_graph *g = s->plan->graph;
  for (size_t i = 0; i < g->num_nodes; i++) {
    if (g->nodes[i].op != MN_OP_CONSTANT) continue;
    mn_status rc =
        mn_cu_check(cudaMemcpyAsync(st->arena + mn_plan_buffer_of(s->plan, (mn_node)i)->offset,
                                    g->nodes[i].data, mn_tensor_type_bytes(&g->nodes[i].type),
                                    cudaMemcpyHostToDevice, st->stream),
                    "uploading a constant");
    if (rc != MN_OK) return rc;
  }
  return MN_OK;
}

static mn_status poison(cuda_state *st, const mn_session *s, bool gradients);

static void cuda_destroy(mn_session *s) {
  cuda_state *st = s->backend_state;
  if (!st) return;
  cudaSetDevice(st->device);
  /* A data-parallel step waiting for a dead rank ends through the watchdog; the caller's
   * error stays the last one. */
  if (st->stream && st->dp) {
    char keep[2048];
    snprintf(keep, sizeof keep, "%s", mn_last_error());
    mn_cu_dp_wait(st, NULL, "freeing the session");
    mn_set_last_error(keep);
  }
  if (st->stream) cudaStreamSynchronize(st->stream);
  mn_cu_dp_free(st);
  mn_cu_graph_release(st);
  if (st->other_exec) cudaGraphExecDestroy(st->other_exec);
  mn_cu_matmuls_destroy(st);
  mn_cu_lanes_free(st);
  if (st->lt) cublasLtDestroy(st->lt);
  if (st->library) cudaLibraryUnload(st->library);
  if (st->inputs_consumed) cudaEventDestroy(st->inputs_consumed);
  if (st->stream) cudaStreamDestroy(st->stream);
  cudaFree(st->arena);
  cudaFree(st->scratch);
  cudaFree(st->misc);
  cudaFree(st->norm_partials);
  cudaFree(st->adam);
  cudaFree(st->accum);
  cudaFree(st->workspace);
  mn_cu_low_free(st);
  cudaFreeHost(st->host_scalars);
  cudaFreeHost(st->host_readback);
  cudaFreeHost(st->host_staging);
  mn_cu_scaler_free(st);
  cudaGetLastError();
  free(st->staged);
  free(st->kernels);
  mn_cu_program_free(&st->prog);
  free(st);
  s->backend_state = NULL;
}

static mn_status cuda_create(mn_session *s) {
  double t0 = now_ms();
  cuda_state *st = calloc(1, sizeof *st);
  if (!st) return mn_fail(MN_ERR_OUT_OF_MEMORY, "cuda backend: out of host memory");
  s->backend_state = st;
  st->split.early.kernel = st->split.late.kernel = -1;
  st->device = s->options.device;
  const char *overlap = getenv("MN_CUDA_OVERLAP");
  st->overlap = !(overlap && strcmp(overlap, "0") == 0);
  mn_status rc = mn_cu_check(cudaSetDevice(st->device), "selecting the device");
  if (rc == MN_OK)
    rc = mn_cu_check(cudaStreamCreateWithFlags(&st->stream, cudaStreamNonBlocking), "a stream");
  if (rc == MN_OK)
    rc = mn_cu_check(cudaEventCreateWithFlags(&st->inputs_consumed, cudaEventDisableTiming),
                     "an event");
  /* Values stored in 2 bytes take 2 bytes of the arena. */
  if (rc == MN_OK) rc = mn_cu_size_plan(s->plan);
  double tl = now_ms();
  mn_nvtx_push("meganeura: lower");
  if (rc == MN_OK) rc = mn_cu_program_build(s->plan, s->options.allow_tf32, &st->prog);
  if (rc == MN_OK)
    rc = mn_cu_program_add_optimizer(&st->prog, s->plan, s->training, &st->opt_sumsq,
                                     &st->opt_update, &st->opt_accumulate);
  if (rc == MN_OK) rc = mn_cu_update_split_declare(&st->prog, s->plan, s->training, &st->split);
  if (rc == MN_OK) rc = mn_cu_scaler_declare(st, s);
  if (rc == MN_OK) rc = mn_cu_program_add_readback(&st->prog, s->plan, &st->readback_kernel);
  if (rc == MN_OK) mn_cu_program_overlap_small_step(&st->prog, s->plan, s->training);
  /* Only a small step waits on the copies' launch latency; a large one's second instance would
   * cost build time and buy nothing (capture.c, instantiate_bare). */
  const char *bare = getenv("MN_CUDA_BARE_GRAPH");
  st->bare_graph = !(bare && strcmp(bare, "0") == 0) && s->training && rc == MN_OK &&
                   mn_cu_small_step(&st->prog, s->plan);
  if (rc == MN_OK) rc = mn_cu_low_declare(st, s);
  if (rc == MN_OK) rc = mn_cu_dp_declare(st, s);
  mn_nvtx_pop();
  st->lower_ms = now_ms() - tl;
  mn_nvtx_push("meganeura: compile kernels");
  if (rc == MN_OK) rc = compile_and_load(st);
  mn_nvtx_pop();
  mn_nvtx_push("meganeura: allocate");
  if (rc == MN_OK) rc = allocate(st, s);
  if (rc == MN_OK) rc = mn_cu_low_allocate(st, s);
  if (rc == MN_OK) rc = mn_cu_scaler_allocate(st, s);
  if (rc == MN_OK) rc = plan_staging(st, s->plan);
  if (rc == MN_OK) rc = upload_constants(st, s);
  mn_nvtx_pop();
  double tm = now_ms();
  mn_nvtx_push("meganeura: choose matmul algorithms");
  if (rc == MN_OK) rc = mn_cu_matmuls_prepare(st, s);
  if (rc == MN_OK) rc = fit_scratch(st);
  mn_nvtx_pop();
  st->matmul_ms = now_ms() - tm;
  if (rc == MN_OK) rc = poison(st, s, false);
  if (rc == MN_OK) rc = mn_cu_check(cudaStreamSynchronize(st->stream), "session set-up");
  if (rc != MN_OK) {
    char msg[2048];
    snprintf(msg, sizeof msg, "%s", mn_last_error());
    cuda_destroy(s);
    mn_set_last_error(msg);
    return rc;
  }
  st->build_ms = now_ms() - t0;
  return MN_OK;
}

/* Every entry point runs on the session's device, whatever the calling thread chose. */
static mn_status use_device(const cuda_state *st) {
  return mn_cu_check(cudaSetDevice(st->device), "selecting the session's device");
}

mn_status mn_cu_sync(cuda_state *st, const char *what) {
  if (st->dp) return mn_cu_dp_wait(st, NULL, what);
  return mn_cu_check(cudaStreamSynchronize(st->stream), what);
}

/* The previous step's staging copies must have run before staging is rewritten. */
static mn_status wait_inputs_consumed(cuda_state *st) {
  if (!st->in_flight) return MN_OK;
  if (st->dp) return mn_cu_dp_wait(st, st->inputs_consumed, "waiting for the input copies");
  return mn_cu_check(cudaEventSynchronize(st->inputs_consumed), "waiting for the input copies");
}

static mn_status cuda_write(mn_session *s, uint32_t buffer, const void *src, size_t bytes) {
  cuda_state *st = s->backend_state;
  mn_status dev = use_device(st);
  if (dev != MN_OK) return dev;
  mn_cu_staged *sg = staged_of(st, buffer);
  if (sg) {
    mn_status rc = wait_inputs_consumed(st);
    if (rc != MN_OK) return rc;
    memcpy(st->host_staging + sg->host_offset, src, bytes);
    sg->written = true;
    return MN_OK;
  }
  /* Parameters and caches: ordered after any step in flight on the session's stream. */
  void *dst = buffer_addr(st, s, buffer);
  const mn_buffer_desc *d = &s->plan->buffers[buffer];
  if (d->role == MN_BUF_PARAMETER) st->shadow_dirty = true;
  /* A parameter shared with another session is the owner's: its low-precision copy is stale. */
  if (mn_session_shared_buffer(s, buffer) && s->owner && s->owner->backend == &mn_cuda_backend)
    ((cuda_state *)s->owner->backend_state)->shadow_dirty = true;
  mn_status rc;
  if (d->storage == MN_BF16 || d->storage == MN_F16) {
    rc = mn_cu_low_write(st, d->storage, dst, src, bytes / sizeof(float));
  } else {
    rc = mn_cu_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, st->stream),
                     "copying to the device");
    if (rc == MN_OK) rc = mn_cu_sync(st, "copying to the device");
  }
  /* The stream is idle: every step has run. */
  if (rc == MN_OK) mn_cu_scaler_absorb(st, s);
  return rc;
}

static mn_status cuda_read(mn_session *s, uint32_t buffer, void *dst, size_t bytes) {
  cuda_state *st = s->backend_state;
  mn_status dev = use_device(st);
  if (dev != MN_OK) return dev;
  mn_status rc = mn_cu_sync(st, "waiting for the step");
  if (rc != MN_OK) return rc;
  mn_cu_scaler_absorb(st, s);
  if (s->plan->loss != MN_NO_NODE && buffer == s->plan->node_buffer[s->plan->loss] &&
      bytes == sizeof(float) && st->launches > 0) {
    memcpy(dst, &st->host_readback->loss, sizeof(float));
    return MN_OK;
  }
  const mn_cu_staged *sg = staged_of(st, buffer);
  if (sg) {
    memcpy(dst, st->host_staging + sg->host_offset, bytes);
    return MN_OK;
  }
  const mn_buffer_desc *d = &s->plan->buffers[buffer];
  const mn_tensor_type *t = &s->plan->graph->nodes[d->node].type;
  if (d->storage == MN_BF16 || d->storage == MN_F16)
    return mn_cu_low_read(st, d->storage, buffer_addr(st, s, buffer), dst, bytes / sizeof(float),
                          (size_t)t->shape[t->rank - 1], (size_t)d->pitch);
  size_t cols = (size_t)t->shape[t->rank - 1] * sizeof(float);
  if (d->pitch)
    return mn_cu_check(cudaMemcpy2D(dst, cols, buffer_addr(st, s, buffer),
                                    (size_t)d->pitch * sizeof(float), cols, bytes / cols,
                                    cudaMemcpyDeviceToHost),
                       "copying padded rows from the device");
  return mn_cu_check(cudaMemcpy(dst, buffer_addr(st, s, buffer), bytes, cudaMemcpyDeviceToHost),
                     "copying from the device");
}

/* Which graph is needed: the update kernels exist only for an optimizer, clipping only
 * when enabled, Adam moments only once allocated, the gradient sum only when accumulating. */
static unsigned capture_key(const mn_session *s) {
  bool update = s->training && s->optim.kind != MN_OPTIM_NONE;
  bool adam = s->optim.kind == MN_OPTIM_ADAM || s->optim.kind == MN_OPTIM_ADAMW;
  return (update ? 1u : 0u) | (update && s->optim.max_grad_norm > 0 ? 2u : 0u) |
         (update && adam ? 4u : 0u) | (update && s->grad_accum > 1 ? 8u : 0u);
}

static mn_status ensure_accum(cuda_state *st, const mn_session *s) {
  if (s->grad_accum <= 1 || st->accum || !s->training || s->plan->update_bytes == 0) return MN_OK;
  return mn_cu_check(cudaMalloc((void **)&st->accum, s->plan->update_bytes), "the gradient sum");
}

static mn_status ensure_adam(cuda_state *st, const mn_session *s) {
  bool adam = s->optim.kind == MN_OPTIM_ADAM || s->optim.kind == MN_OPTIM_ADAMW;
  if (!adam || st->adam || !s->training || s->plan->update_bytes == 0) return MN_OK;
  if (mn_cu_dp_zero1(st, s)) return mn_cu_dp_ensure_moments(st, s);
  size_t bytes = 2 * s->plan->update_bytes;
  mn_status rc = mn_cu_check(cudaMalloc((void **)&st->adam, bytes), "the Adam state");
  if (rc == MN_OK) rc = mn_cu_check(cudaMemsetAsync(st->adam, 0, bytes, st->stream), "Adam state");
  return rc;
}

/* The kernels read the public optimizer kind as it is. */
_Static_assert((int)MN_OPTIM_NONE == MN_DEV_OPTIM_NONE && (int)MN_OPTIM_SGD == MN_DEV_OPTIM_SGD &&
                   (int)MN_OPTIM_ADAM == MN_DEV_OPTIM_ADAM &&
                   (int)MN_OPTIM_ADAMW == MN_DEV_OPTIM_ADAMW,
               "mn_optimizer_kind and mn_dev_optim_kind differ");

static void fill_scalars(const mn_session *s, uint64_t step, bool apply, mn_dev_scalars *out) {
  const mn_optimizer_config *o = &s->optim;
  *out = (mn_dev_scalars){.lr = o->lr,
                          .beta1 = o->beta1,
                          .beta2 = o->beta2,
                          .eps = o->eps,
                          .weight_decay = o->weight_decay,
                          .max_grad_norm = o->max_grad_norm,
                          .step = (uint32_t)step,
                          .kind = (uint32_t)o->kind,
                          .bias_correction1 = 1.0 - pow(o->beta1, (double)step),
                          .bias_correction2 = 1.0 - pow(o->beta2, (double)step),
                          .accum_first = s->accum_index == 0,
                          .accum_apply = apply,
                          .accum_k = (float)(s->grad_accum > 1 ? s->grad_accum : 1),
                          .accum_steps = s->grad_accum > 1 ? s->grad_accum : 1,
                          .micro_step = s->micro_steps};
}

/* Makes the graph of `key` current: the kept one when it was captured for it, else a new
 * capture (a data-parallel session keeps the one it replaces). */
static mn_status select_graph(cuda_state *st, mn_session *s, unsigned key) {
  if (st->other_captured && st->other_key == key) {
    cudaGraphExec_t exec = st->exec;
    unsigned prev = st->captured_key;
    bool had = st->captured;
    st->exec = st->other_exec;
    st->captured_key = key;
    st->captured = true;
    st->other_exec = exec;
    st->other_key = prev;
    st->other_captured = had;
    return MN_OK;
  }
  if (st->dp && st->captured) {
    if (st->other_exec) cudaGraphExecDestroy(st->other_exec);
    st->other_exec = st->exec;
    st->other_key = st->captured_key;
    st->other_captured = true;
    st->exec = NULL;
    st->captured = false;
  }
  mn_status rc = mn_cu_capture(st, s, key);
  if (rc == MN_OK) st->captures++;
  return rc;
}

static mn_status cuda_step(mn_session *s) {
  cuda_state *st = s->backend_state;
  bool update = s->training && s->optim.kind != MN_OPTIM_NONE;
  mn_status rc = use_device(st);
  if (rc == MN_OK) rc = mn_cu_dp_usable(st);
  if (rc == MN_OK) rc = ensure_adam(st, s);
  if (rc == MN_OK) rc = ensure_accum(st, s);
  /* Which graph runs depends on the round; in F16 only the device knows it for certain. */
  if (rc == MN_OK) rc = mn_cu_dp_settle_round(st, s);
  if (rc != MN_OK) return rc;
  /* The decision to update is a scalar the graph copies in: no capture per accumulation step.
   * A data-parallel session's collectives cannot be skipped that way: its applying steps
   * launch a graph of their own. */
  bool apply = mn_session_accumulation_step(s);
  unsigned key = capture_key(s) | (st->dp && update && apply ? MN_CU_KEY_REDUCE : 0u);
  if (!st->captured || st->captured_key != key) {
    mn_nvtx_push("meganeura: capture step graph");
    rc = select_graph(st, s, key);
    mn_nvtx_pop();
    if (rc != MN_OK) return rc;
  }
  mn_nvtx_push("meganeura: step");
  if (st->dp) rc = mn_cu_dp_sync_params(st, s);
  if (rc == MN_OK) rc = mn_cu_low_refresh(st, s);
  if (rc == MN_OK) rc = wait_inputs_consumed(st);
  if (rc == MN_OK) {
    fill_scalars(s, s->step_count + (update && apply ? 1 : 0), apply, st->host_scalars);
    mn_cu_scaler_stage(st, s);
  }
  bool bare = rc == MN_OK && st->bare_exec && !mn_cu_inputs_written(st);
  if (rc == MN_OK && !bare) rc = mn_cu_inputs_copied(st);
  if (rc == MN_OK)
    rc = mn_cu_check(cudaGraphLaunch(bare ? st->bare_exec : st->exec, st->stream),
                     "launching the step");
  mn_nvtx_pop();
  if (rc != MN_OK) return rc;
  mn_cu_inputs_launched(st, bare);
  st->launches++;
  st->submissions++;
  st->in_flight = true;
  /* The host's guess; an F16 step that overflows advances neither, which the device knows
   * (loss_scale.c) and the next wait reads back. */
  if (update && apply) s->step_count++;
  if (update) mn_session_accumulation_advance(s, apply);
  mn_cu_scaler_launched(st, s);
  return MN_OK;
}

static const char *error_what(uint32_t what) {
  switch (what) {
  case MN_DEV_ERR_INDEX: return "index";
  case MN_DEV_ERR_LABEL: return "label";
  case MN_DEV_ERR_KV_POS: return "kv_pos";
  case MN_DEV_ERR_KV_LEN: return "kv_len";
  }
  return "value";
}

static mn_status cuda_wait(mn_session *s) {
  cuda_state *st = s->backend_state;
  mn_status dev = use_device(st);
  if (dev != MN_OK) return dev;
  mn_status rc = mn_cu_sync(st, "running the step");
  st->in_flight = false;
  if (rc != MN_OK) return rc;
  mn_cu_scaler_absorb(st, s);
  mn_dev_error *e = &st->host_readback->error;
  if (e->what == MN_DEV_ERR_NONE) return MN_OK;
  const mn_graph *g = s->plan->graph;
  const char *op = e->node < g->num_nodes ? mn_op_name(g->nodes[e->node].op) : "?";
  if (e->what == MN_DEV_ERR_KV_LEN)
    rc = mn_fail(MN_ERR_INVALID_ARGUMENT,
                 "mn_session_wait: node %u (%s): kv_len %lld is out of range 1..%lld", e->node, op,
                 (long long)e->value, (long long)e->limit);
  else if (e->what == MN_DEV_ERR_ALL_IGNORED)
    rc =
        mn_fail(MN_ERR_INVALID_ARGUMENT,
                "mn_session_wait: node %u (%s): every label of labels node %lld (%lld rows) is the "
                "ignore label MN_IGNORE_LABEL (%u): the mean cross-entropy over no counted rows "
                "is undefined",
                e->node, op, (long long)e->value, (long long)e->limit, MN_IGNORE_LABEL);
  else
    rc = mn_fail(MN_ERR_INVALID_ARGUMENT,
                 "mn_session_wait: node %u (%s): %s %lld at position %lld is out of range (must "
                 "be below %lld)",
                 e->node, op, error_what(e->what), (long long)e->value, (long long)e->position,
                 (long long)e->limit);
  /* The failed step and those after it updated nothing; count as the reference does. (An F16
   * session's device counted so already, and absorb has read it back.) */
  if (!mn_cu_scaled(s)) {
    if (e->skipped_step > 0) s->step_count = e->skipped_step - 1;
    /* The failed step added nothing to the gradient sum: the accumulation round starts again,
     * so the next step overwrites the sum instead of adding to a stale one. */
    s->accum_index = 0;
  }
  memset(e, 0, sizeof *e);
  char msg[2048];
  snprintf(msg, sizeof msg, "%s", mn_last_error());
  mn_status cleared =
      mn_cu_check(cudaMemsetAsync(&st->misc->error, 0, sizeof st->misc->error, st->stream),
                  "clearing an error");
  if (cleared == MN_OK) cleared = mn_cu_sync(st, "clearing an error");
  if (cleared != MN_OK) return cleared;
  /* This rank skipped an update the others made: the group cannot go on together. */
  mn_cu_dp_abort(st, msg);
  mn_set_last_error(msg);
  return rc;
}

/* Slot `slot`'s moments live at the parameter's offset within the update block. */
static mn_status optim_state_offset(const mn_session *s, size_t slot, int which, size_t n,
                                    size_t *offset) {
  const mn_plan *p = s->plan;
  if (slot >= p->num_params || p->params[slot].grad == MN_NO_NODE)
    return mn_fail(MN_ERR_INVALID_ARGUMENT, "parameter slot %zu has no gradient, so no Adam state",
                   slot);
  const mn_buffer_desc *b = mn_plan_buffer_of(p, p->params[slot].param);
  if (n * sizeof(float) > b->bytes)
    return mn_fail(MN_ERR_INVALID_ARGUMENT, "%zu values exceed parameter slot %zu", n, slot);
  *offset = (which ? p->update_bytes : 0) + (b->offset - p->update_params_offset);
  return MN_OK;
}

static mn_status cuda_read_optim_state(mn_session *s, size_t slot, int which, float *dst,
                                       size_t n) {
  cuda_state *st = s->backend_state;
  size_t off = 0;
  mn_status rc = use_device(st);
  if (rc == MN_OK) rc = optim_state_offset(s, slot, which, n, &off);
  if (rc != MN_OK) return rc;
  if (mn_cu_dp_zero1(st, s)) return mn_cu_dp_read_moment(st, s, slot, which, dst, n);
  if (!st->adam) {
    memset(dst, 0, n * sizeof *dst);
    return MN_OK;
  }
  rc = mn_cu_sync(st, "waiting for the step");
  if (rc != MN_OK) return rc;
  mn_cu_scaler_absorb(st, s);
  return mn_cu_check(
      cudaMemcpy(dst, (unsigned char *)st->adam + off, n * sizeof *dst, cudaMemcpyDeviceToHost),
      "reading the Adam state");
}

static mn_status cuda_write_optim_state(mn_session *s, size_t slot, int which, const float *src,
                                        size_t n) {
  cuda_state *st = s->backend_state;
  size_t off = 0;
  mn_status rc = use_device(st);
  if (rc == MN_OK) rc = optim_state_offset(s, slot, which, n, &off);
  if (rc != MN_OK) return rc;
  if (mn_cu_dp_zero1(st, s)) return mn_cu_dp_write_moment(st, s, slot, which, src, n);
  if (!st->adam && s->plan->update_bytes) {
    rc = mn_cu_check(cudaMalloc((void **)&st->adam, 2 * s->plan->update_bytes), "the Adam state");
    if (rc == MN_OK)
      rc = mn_cu_check(cudaMemsetAsync(st->adam, 0, 2 * s->plan->update_bytes, st->stream),
                       "the Adam state");
    st->captured = st->other_captured = false; /* the update kernel's arguments change */
    if (rc != MN_OK) return rc;
  }
  rc = mn_cu_check(cudaMemcpyAsync((unsigned char *)st->adam + off, src, n * sizeof *src,
                                   cudaMemcpyHostToDevice, st->stream),
                   "writing the Adam state");
  if (rc == MN_OK) rc = mn_cu_sync(st, "writing the Adam state");
  if (rc == MN_OK) mn_cu_scaler_absorb(st, s);
  return rc;
}

void *mn_cuda_session_stream(const mn_session *s) {
  if (!s || s->backend != &mn_cuda_backend) return NULL;
  return ((cuda_state *)s->backend_state)->stream;
}

uint64_t mn_cuda_input_copies_skipped(const mn_session *s) {
  if (!s || s->backend != &mn_cuda_backend) return 0;
  return ((cuda_state *)s->backend_state)->copies_skipped;
}

uint64_t mn_cuda_bare_launches(const mn_session *s) {
  if (!s || s->backend != &mn_cuda_backend) return 0;
  return ((cuda_state *)s->backend_state)->bare_launches;
}

/* All-ones bytes are a NaN in f32 and the largest value in u32. Gradients are included
 * only on request: before the first step they read as zeros, as on the CPU. */
static mn_status poison(cuda_state *st, const mn_session *s, bool gradients) {
  const mn_plan *p = s->plan;
  for (size_t b = 0; b < p->num_buffers; b++) {
    const mn_buffer_desc *d = &p->buffers[b];
    bool computed = d->role == MN_BUF_ACTIVATION || d->role == MN_BUF_OUTPUT ||
                    (gradients && d->role == MN_BUF_GRADIENT);
    /* An activation in a gradient's memory is poisoned with the gradients, if at all. */
    if (!computed || (d->role == MN_BUF_ACTIVATION && mn_plan_in_update_block(p, d))) continue;
    mn_status rc = mn_cu_check(cudaMemsetAsync(st->arena + d->offset, 0xff, d->bytes, st->stream),
                               "poisoning buffers");
    if (rc != MN_OK) return rc;
  }
  if (st->scratch)
    return mn_cu_check(cudaMemsetAsync(st->scratch, 0xff, st->scratch_bytes, st->stream),
                       "poisoning scratch");
  return MN_OK;
}

mn_status mn_cuda_poison(mn_session *s) {
  if (!s || s->backend != &mn_cuda_backend)
    return mn_fail(MN_ERR_INVALID_ARGUMENT, "mn_cuda_poison: not a CUDA session");
  mn_status rc = use_device(s->backend_state);
  return rc == MN_OK ? poison(s->backend_state, s, true) : rc;
}

static void cuda_stats(const mn_session *s, mn_session_stats *out) {
  const cuda_state *st = s->backend_state;
  out->graph_launches = st->launches;
  out->submissions = st->submissions;
  out->kernels = st->prog.num_kernels;
  out->graph_nodes = st->graph_nodes;
  out->graph_width = st->graph_width;
  out->graph_overlapped_edges = st->graph_overlapped_edges;
  out->graph_captures = st->captures;
  out->kernel_cache_hit = st->cache_hit;
  out->build_ms = st->build_ms;
  out->compile_ms = st->compile_ms;
}

const mn_backend_ops mn_cuda_backend = {.name = "cuda",
                                        .create = cuda_create,
                                        .destroy = cuda_destroy,
                                        .write_buffer = cuda_write,
                                        .read_buffer = cuda_read,
                                        .step = cuda_step,
                                        .wait = cuda_wait,
                                        .read_optim_state = cuda_read_optim_state,
                                        .write_optim_state = cuda_write_optim_state,
                                        .stats = cuda_stats,
                                        .buffer_address = cuda_buffer_address};
