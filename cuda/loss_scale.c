/* F16 training on CUDA: the dynamic loss scaler (host/storage.h, docs/precision.md) runs on the
 * device, so a step stays one graph launch with no host synchronization.
 *
 * The device keeps the scaler with the optimizer's step count and the accumulation round
 * (mn_dev_scaler), because a step that overflows advances neither and only the device knows
 * in time. Each step the graph copies the host's state in (pinned memory), mn_scaler_begin
 * takes it when told to and writes the scale into the #loss_scale input, the program runs,
 * mn_scaler_unscale multiplies the gradients by 1 / scale and flags an inf or NaN in the error
 * record (the optimizer kernels then change nothing), mn_scaler_end moves the scale, and the
 * step's readback kernel writes the device's scaler out. In a data-parallel group the flag is
 * all-reduced between the unscale and the kernels that read it, so that every rank skips the same
 * steps (cuda/data_parallel.c).
 *
 * The session's fields (s->scaler, s->step_count, s->accum_index) follow the device: once the
 * stream is idle (mn_session_wait, reads and writes of buffers or optimizer state), absorb
 * copies the device's state into them. Between steps the host may write them itself (a
 * checkpoint load, mn_session_set_grad_accumulation); the backend sees a write as a difference
 * from what it last left there, and the next step takes the parts the host wrote. When no step
 * has run since the last absorb, the host's state is the device's, and the step takes all of
 * it. A write the backend cannot see: mn_session_set_grad_accumulation with the same count
 * while steps are in flight, when the host's guess of the round is 0 already but an overflow
 * in flight kept the device's round open (docs/precision.md). */
#include <string.h>

#include "cuda/cuda_state.h"
#include "cuda/loss_scale.h"
#include "host/error.h"

bool mn_cu_scaled(const mn_session *s) { return s->training && s->plan->loss_scale != MN_NO_NODE; }

mn_status mn_cu_scaler_declare(cuda_state *st, const mn_session *s) {
  return mn_cu_program_add_loss_scaler(&st->prog, s->plan, s->training, &st->scaler_begin,
                                       &st->scaler_unscale, &st->scaler_end);
}

mn_status mn_cu_scaler_allocate(cuda_state *st, const mn_session *s) {
  st->scaler_idle = true;
  if (!mn_cu_scaled(s)) return MN_OK;
  mn_status rc = mn_cu_check(cudaMallocHost((void **)&st->host_scaler, sizeof *st->host_scaler),
                             "pinned loss scaler");
  if (rc == MN_OK) memset(st->host_scaler, 0, sizeof *st->host_scaler);
  return rc;
}

void mn_cu_scaler_free(cuda_state *st) {
  cudaFreeHost(st->host_scaler);
  st->host_scaler = NULL;
}

mn_status mn_cu_scaler_enqueue_begin(cuda_state *st, const mn_session *s) {
  const mn_plan *p = s->plan;
  mn_ptrs io = {{&st->misc->scaler, &st->misc->scaler_host, &st->misc->scalars,
                 st->arena + mn_plan_buffer_of(p, p->loss_scale)->offset}};
  const unsigned grid[3] = {1, 1, 1};
  return mn_cu_launch_kernel(st, (uint32_t)st->scaler_begin, grid, MN_CU_SCALER_BLOCK, 0, &io);
}

mn_status mn_cu_scaler_enqueue_unscale(cuda_state *st, const mn_session *s) {
  if (st->scaler_unscale < 0) return MN_OK; /* no parameter has a gradient */
  const mn_plan *p = s->plan;
  size_t blocks = (p->update_bytes / sizeof(float) + 255) / 256;
  const unsigned grid[3] = {(unsigned)(blocks < 1 ? 1 : blocks > 4096 ? 4096 : blocks), 1, 1};
  mn_ptrs io = {{st->arena + p->update_grads_offset, &st->misc->scaler, &st->misc->error}};
  return mn_cu_launch_kernel(st, (uint32_t)st->scaler_unscale, grid, 256, 0, &io);
}

mn_status mn_cu_scaler_enqueue_end(cuda_state *st) {
  mn_ptrs io = {{&st->misc->scaler, &st->misc->error, &st->misc->scalars}};
  const unsigned grid[3] = {1, 1, 1};
  return mn_cu_launch_kernel(st, (uint32_t)st->scaler_end, grid, MN_CU_SCALER_BLOCK, 0, &io);
}

/* The session's scaler, step count and round in the device's layout. */
static mn_dev_scaler host_state(const mn_session *s) {
  return (mn_dev_scaler){.scale = s->scaler.scale,
                         .good_steps = s->scaler.good_steps,
                         .skipped = s->scaler.skipped,
                         .step = s->step_count,
                         .accum_index = s->accum_index};
}

/* The parts of the session's state (mn_dev_scaler_take bits) that differ from what the backend
 * left there: the host wrote them (a checkpoint load, a new accumulation count). */
static unsigned changed(const cuda_state *st, const mn_session *s) {
  mn_dev_scaler h = host_state(s);
  const mn_dev_scaler *v = &st->scaler_view;
  unsigned bits = 0;
  if (h.scale != v->scale || h.good_steps != v->good_steps || h.skipped != v->skipped)
    bits |= MN_DEV_TAKE_SCALER;
  if (h.step != v->step) bits |= MN_DEV_TAKE_STEP;
  if (h.accum_index != v->accum_index || s->grad_accum != st->scaler_view_accum)
    bits |= MN_DEV_TAKE_ROUND;
  return bits;
}

void mn_cu_scaler_stage(cuda_state *st, const mn_session *s) {
  if (!mn_cu_scaled(s)) return;
  *st->host_scaler = host_state(s);
  st->host_scaler->take = st->scaler_idle ? (unsigned)MN_DEV_TAKE_ALL : changed(st, s);
}

void mn_cu_scaler_launched(cuda_state *st, const mn_session *s) {
  if (!mn_cu_scaled(s)) return;
  /* The host's guess of the step count and round (cuda_step advances them as if the step were
   * finite); the scaler itself stays as last read until absorb. */
  st->scaler_view = host_state(s);
  st->scaler_view_accum = s->grad_accum;
  st->scaler_idle = false;
}

void mn_cu_scaler_absorb(cuda_state *st, mn_session *s) {
  if (!mn_cu_scaled(s) || st->launches == 0 || st->scaler_idle) return;
  /* What the host wrote since the last step stays, and the next step takes it (all of the
   * host's state, as the state is idle); the rest becomes the device's. */
  unsigned host_wrote = changed(st, s);
  const mn_dev_scaler *d = &st->host_readback->scaler;
  if (!(host_wrote & MN_DEV_TAKE_SCALER))
    s->scaler =
        (mn_loss_scaler){.scale = d->scale, .good_steps = d->good_steps, .skipped = d->skipped};
  if (!(host_wrote & MN_DEV_TAKE_STEP)) s->step_count = d->step;
  if (!(host_wrote & MN_DEV_TAKE_ROUND)) s->accum_index = d->accum_index;
  st->scaler_view = host_state(s);
  st->scaler_view_accum = s->grad_accum;
  st->scaler_idle = true;
}
