/* The CUDA side of mixed precision (host/storage.h, docs/precision.md) that is not a kernel:
 * the weights' low-precision copy that matrix products read, the staging region for other
 * fp32 product operands, and host conversions of buffers stored in 2 bytes.
 *
 * The copy of the parameters that have a gradient lies as the update block does (byte
 * offset / 2), so the optimizer writes it in the same pass as the fp32 master weights; the
 * other parameters follow. Outside the optimizer a parameter changes only when the host
 * writes it, so a write marks the copies stale and the next step refreshes them before it
 * launches the graph. A session that reads another session's parameters cannot see when
 * they change and refreshes every step. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_state.h"
#include "cuda/storage_layout.h"
#include "host/error.h"
#include "host/storage.h"

static bool low(const mn_session *s) { return mn_cu_low_storage(s->plan) != MN_DEV_F32; }

/* mn_convert of n values into the low-precision storage; -1 when out of memory. */
static int convert_kernel(mn_cu_program *prog, const mn_plan *p, long long n) {
  mn_cu_op_ctx c = {.prog = prog, .plan = p, .g = p->graph, .node = p->graph->nodes};
  int k = mn_cu_kernel(&c, 256, "mn_convert<%lldLL>", n);
  return k < 0 ? -1 : mn_cu_instance(prog, k, (unsigned)mn_cu_low_storage(p));
}

mn_status mn_cu_program_add_converts(mn_cu_program *prog, const mn_plan *p, int *block,
                                     int *per_buffer) {
  *block = -2;
  if (mn_cu_low_storage(p) == MN_DEV_F32) return MN_OK;
  /* The update block's parameters in one launch, the others one by one. */
  if (p->update_bytes)
    *block = convert_kernel(prog, p, (long long)(p->update_bytes / sizeof(float)));
  if (*block == -1) return mn_fail(MN_ERR_OUT_OF_MEMORY, "cuda backend: out of host memory");
  for (size_t b = 0; b < p->num_buffers; b++) {
    const mn_buffer_desc *d = &p->buffers[b];
    int k = -2;
    if (d->role == MN_BUF_PARAMETER && !(p->update_bytes && mn_cu_in_update_block(p, d)))
      k = convert_kernel(prog, p, mn_tensor_type_numel(&p->graph->nodes[d->node].type));
    if (k == -1) return mn_fail(MN_ERR_OUT_OF_MEMORY, "cuda backend: out of host memory");
    if (per_buffer) per_buffer[b] = k;
  }
  return MN_OK;
}

/* Enqueues the conversion (inside a capture too); launch_convert counts it as a submission. */
static mn_status convert(cuda_state *st, int kernel, void *dst, void *src, long long n) {
  mn_ptrs io = {{dst, src}};
  long long blocks = ((n + 7) / 8 + 255) / 256;
  dim3 grid = {(unsigned)(blocks < 1      ? 1
                          : blocks > 4096 ? 4096
                                          : blocks),
               1, 1},
       block = {256, 1, 1};
  void *args[] = {&io};
  return mn_cu_check(
      cudaLaunchKernel((const void *)st->kernels[kernel], grid, block, args, 0, st->stream),
      "refreshing the weights' low-precision copy");
}

static mn_status launch_convert(cuda_state *st, int kernel, void *dst, void *src, long long n) {
  mn_status rc = convert(st, kernel, dst, src, n);
  if (rc == MN_OK) st->submissions++;
  return rc;
}

mn_status mn_cu_low_declare(cuda_state *st, const mn_session *s) {
  const mn_plan *p = s->plan;
  if (!low(s)) return MN_OK;
  st->shadow_kernel = malloc((p->num_buffers ? p->num_buffers : 1) * sizeof *st->shadow_kernel);
  if (!st->shadow_kernel) return mn_fail(MN_ERR_OUT_OF_MEMORY, "cuda backend: out of host memory");
  return mn_cu_program_add_converts(&st->prog, p, &st->shadow_block_kernel, st->shadow_kernel);
}

mn_status mn_cu_low_allocate(cuda_state *st, const mn_session *s) {
  const mn_plan *p = s->plan;
  if (!low(s)) return MN_OK;
  st->shadow_at = malloc((p->num_buffers ? p->num_buffers : 1) * sizeof *st->shadow_at);
  if (!st->shadow_at) return mn_fail(MN_ERR_OUT_OF_MEMORY, "cuda backend: out of host memory");
  size_t end = mn_cu_low_shadow_layout(p, st->shadow_at);
  mn_status rc = mn_cu_check(cudaMalloc((void **)&st->shadow, end ? end : 256),
                             "the weights' low-precision copy");
  if (rc == MN_OK && st->prog.stage_bytes)
    rc = mn_cu_check(cudaMalloc((void **)&st->stage, st->prog.stage_bytes),
                     "staging for product operands");
  st->shadow_dirty = true;
  return rc;
}

mn_status mn_cu_low_refresh(cuda_state *st, const mn_session *s) {
  const mn_plan *p = s->plan;
  if (!low(s) || (!st->shadow_dirty && !s->shared)) return MN_OK;
  mn_status rc = MN_OK;
  if (st->shadow_block_kernel >= 0)
    rc =
        launch_convert(st, st->shadow_block_kernel, st->shadow, st->arena + p->update_params_offset,
                       (long long)(p->update_bytes / sizeof(float)));
  for (size_t b = 0; rc == MN_OK && b < p->num_buffers; b++) {
    if (st->shadow_kernel[b] < 0) continue;
    mn_node n = p->buffers[b].node;
    mn_cu_arg dst = {.kind = MN_CU_ARG_SHADOW, .node = n};
    rc = launch_convert(st, st->shadow_kernel[b], mn_cu_resolve(st, s, dst),
                        mn_cu_resolve(st, s, mn_cu_node_arg(n)),
                        mn_tensor_type_numel(&p->graph->nodes[n].type));
  }
  if (rc == MN_OK) st->shadow_dirty = false;
  return rc;
}

mn_status mn_cu_low_enqueue_block(cuda_state *st, const mn_session *s) {
  if (!low(s) || st->shadow_block_kernel < 0) return MN_OK;
  return convert(st, st->shadow_block_kernel, st->shadow, st->arena + s->plan->update_params_offset,
                 (long long)(s->plan->update_bytes / sizeof(float)));
}

void mn_cu_low_free(cuda_state *st) {
  cudaFree(st->shadow);
  cudaFree(st->stage);
  free(st->shadow_at);
  free(st->shadow_kernel);
  st->shadow = st->stage = NULL;
  st->shadow_at = NULL;
  st->shadow_kernel = NULL;
}

mn_status mn_cu_low_write(cuda_state *st, mn_dtype storage, void *dst, const float *src,
                          size_t count) {
  uint16_t *bits = malloc((count ? count : 1) * sizeof *bits);
  if (!bits) return mn_fail(MN_ERR_OUT_OF_MEMORY, "cuda backend: out of host memory");
  for (size_t i = 0; i < count; i++)
    bits[i] = mn_storage_bits(storage, src[i]);
  mn_status rc = mn_cu_check(
      cudaMemcpyAsync(dst, bits, count * sizeof *bits, cudaMemcpyHostToDevice, st->stream),
      "copying to the device");
  if (rc == MN_OK) rc = mn_cu_sync(st, "copying to the device");
  free(bits);
  return rc;
}

mn_status mn_cu_low_read(cuda_state *st, mn_dtype storage, const void *src, float *dst,
                         size_t count, size_t cols, size_t pitch) {
  (void)st;
  uint16_t *bits = malloc((count ? count : 1) * sizeof *bits);
  if (!bits) return mn_fail(MN_ERR_OUT_OF_MEMORY, "cuda backend: out of host memory");
  mn_status rc =
      pitch && cols
          ? mn_cu_check(cudaMemcpy2D(bits, cols * sizeof *bits, src, pitch * sizeof *bits,
                                     cols * sizeof *bits, count / cols, cudaMemcpyDeviceToHost),
                        "copying padded rows from the device")
          : mn_cu_check(cudaMemcpy(bits, src, count * sizeof *bits, cudaMemcpyDeviceToHost),
                        "copying from the device");
  for (size_t i = 0; rc == MN_OK && i < count; i++)
    dst[i] = mn_storage_value(storage, bits[i]);
  free(bits);
  return rc;
}
