/* The CPU reference backend: interprets the plan with the reference kernels over one
 * arena. It is the oracle the CUDA backend is tested against, so it favors clarity. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "host/backend.h"
#include "host/data_parallel.h"
#include "host/error.h"
#include "host/reference/ref_kernels.h"
#include "host/reference/ref_update.h"
#include "host/reference/ref_zero.h"
#include "host/storage.h"

#define MN_ARENA_ALIGN 256

typedef struct cpu_state {
  unsigned char *arena;
  /* Low-precision sessions: the rounded copies of fp32 product operands (parameters, inputs)
   * that the products read, as the CUDA backend reads the weights' low-precision copy. */
  /* rounded copies of fp32 product operands (a, b, a bias; a decode layer's weights) */
  float *operand[MN_MAX_INPUTS];
  size_t operand_cap[MN_MAX_INPUTS];
  float *accum;             /* gradient accumulation: the running sum, update_bytes */
  float **adam_m, **adam_v; /* per plan parameter slot, allocated on the first Adam step */
  mn_ref_zero zero;         /* ZeRO-1 sessions: the shard's moments instead of adam_m/adam_v */
  mn_status pending;        /* failure of the last step, reported by wait */
  char pending_error[1024];
} cpu_state;

static unsigned char *buffer_ptr(const mn_session *s, uint32_t buffer) {
  void *shared = mn_session_shared_buffer(s, buffer);
  if (shared) return shared;
  const cpu_state *st = s->backend_state;
  return st->arena + s->plan->buffers[buffer].offset;
}

static void *cpu_buffer_address(const mn_session *s, uint32_t buffer) {
  return buffer_ptr(s, buffer);
}

/* Fills computed buffers with NaN (F32) or all-ones (U32) so that a kernel that leaves
 * part of its output unwritten shows up in tests instead of passing on stale zeros. */
static void poison(mn_session *s) {
  const mn_plan *p = s->plan;
  for (size_t i = 0; i < p->num_buffers; i++) {
    const mn_buffer_desc *b = &p->buffers[i];
    if ((b->role != MN_BUF_ACTIVATION && b->role != MN_BUF_OUTPUT) || mn_plan_in_update_block(p, b))
      continue;
    unsigned char *dst = buffer_ptr(s, (uint32_t)i);
    if (p->graph->nodes[b->node].type.dtype == MN_F32) {
      float *f = (float *)dst;
      for (size_t k = 0; k < b->bytes / sizeof(float); k++)
        f[k] = NAN;
    } else {
      memset(dst, 0xff, b->bytes);
    }
  }
}

static mn_status cpu_create(mn_session *s) {
  cpu_state *st = calloc(1, sizeof *st);
  size_t bytes = s->plan->arena_bytes ? s->plan->arena_bytes : MN_ARENA_ALIGN;
  bytes = (bytes + MN_ARENA_ALIGN - 1) / MN_ARENA_ALIGN * MN_ARENA_ALIGN;
  if (st) st->arena = aligned_alloc(MN_ARENA_ALIGN, bytes);
  if (!st || !st->arena) {
    free(st);
    return mn_fail(MN_ERR_OUT_OF_MEMORY, "cpu backend: cannot allocate the %zu-byte arena", bytes);
  }
  memset(st->arena, 0, bytes);
  s->backend_state = st;
  poison(s);
  const mn_graph *g = s->plan->graph;
  for (size_t i = 0; i < g->num_nodes; i++)
    if (g->nodes[i].op == MN_OP_CONSTANT)
      memcpy(buffer_ptr(s, s->plan->node_buffer[i]), g->nodes[i].data,
             mn_tensor_type_bytes(&g->nodes[i].type));
  return MN_OK;
}

static void free_adam_state(const mn_plan *p, cpu_state *st) {
  for (size_t i = 0; st->adam_m && i < p->num_params; i++)
    free(st->adam_m[i]);
  for (size_t i = 0; st->adam_v && i < p->num_params; i++)
    free(st->adam_v[i]);
  free(st->adam_m);
  free(st->adam_v);
  st->adam_m = st->adam_v = NULL;
}

/* Zeroed moments for every parameter that has a gradient. */
static mn_status ensure_adam_state(const mn_plan *p, cpu_state *st) {
  if (st->adam_m) return MN_OK;
  st->adam_m = calloc(p->num_params ? p->num_params : 1, sizeof *st->adam_m);
  st->adam_v = calloc(p->num_params ? p->num_params : 1, sizeof *st->adam_v);
  bool ok = st->adam_m && st->adam_v;
  for (size_t i = 0; ok && i < p->num_params; i++) {
    if (p->params[i].grad == MN_NO_NODE) continue;
    size_t n = (size_t)mn_tensor_type_numel(&p->graph->nodes[p->params[i].param].type);
    st->adam_m[i] = calloc(n, sizeof(float));
    st->adam_v[i] = calloc(n, sizeof(float));
    ok = st->adam_m[i] && st->adam_v[i];
  }
  if (ok) return MN_OK;
  free_adam_state(p, st);
  return mn_fail(MN_ERR_OUT_OF_MEMORY, "mn_session_step: cannot allocate the Adam state");
}

static void cpu_destroy(mn_session *s) {
  cpu_state *st = s->backend_state;
  if (!st) return;
  free_adam_state(s->plan, st);
  mn_ref_zero_free(&st->zero);
  free(st->accum);
  for (int k = 0; k < MN_MAX_INPUTS; k++)
    free(st->operand[k]);
  free(st->arena);
  free(st);
  s->backend_state = NULL;
}

static mn_status cpu_write(mn_session *s, uint32_t buffer, const void *src, size_t bytes) {
  memcpy(buffer_ptr(s, buffer), src, bytes);
  return MN_OK;
}

static mn_status cpu_read(mn_session *s, uint32_t buffer, void *dst, size_t bytes) {
  memcpy(dst, buffer_ptr(s, buffer), bytes);
  return MN_OK;
}

/* Product operand k of node id read in the session's low precision: an fp32 buffer is rounded
 * into a copy (low-precision buffers hold rounded values already). */
static mn_status low_precision_operand(mn_session *s, const mn_node_rec *node, int k,
                                       const void **in) {
  cpu_state *st = s->backend_state;
  const mn_plan *p = s->plan;
  mn_dtype low = mn_precision_storage(p->precision);
  if (low == MN_F32 || !mn_storage_reads_low(node->op, k) ||
      mn_plan_buffer_of(p, node->inputs[k])->storage != MN_F32)
    return MN_OK;
  const mn_tensor_type *t = &p->graph->nodes[node->inputs[k]].type;
  size_t n = (size_t)mn_tensor_type_numel(t);
  if (t->dtype != MN_F32) return MN_OK;
  if (st->operand_cap[k] < n) {
    float *grown = realloc(st->operand[k], n * sizeof *grown);
    if (!grown) return mn_fail(MN_ERR_OUT_OF_MEMORY, "mn_session_step: out of memory");
    st->operand[k] = grown;
    st->operand_cap[k] = n;
  }
  memcpy(st->operand[k], *in, n * sizeof(float));
  mn_storage_round_n(low, st->operand[k], n);
  *in = st->operand[k];
  return MN_OK;
}

/* Rounds the values node id stored in low-precision buffers, as the CUDA backend stores them. */
static void store_low_precision(mn_session *s, mn_node id, const mn_node_rec *node) {
  const mn_plan *p = s->plan;
  const mn_buffer_desc *b = mn_plan_buffer_of(p, id);
  mn_storage_round_n(b->storage, (float *)buffer_ptr(s, p->node_buffer[id]),
                     (size_t)mn_tensor_type_numel(&node->type));
  for (int k = 1; k <= mn_node_num_extra_outputs(node); k++) {
    mn_node e = mn_plan_extra_output(p, id, k);
    mn_storage_round_n(mn_plan_buffer_of(p, e)->storage, (float *)buffer_ptr(s, p->node_buffer[e]),
                       (size_t)mn_tensor_type_numel(&p->graph->nodes[e].type));
  }
}

/* F16: divides every parameter gradient by the loss scale the step was seeded with and
 * records whether they are all finite (in a group: on every rank, so that all of them skip
 * the same steps and keep one loss scale); *apply false skips the update (host/storage.h). */
static mn_status unscale_gradients(mn_session *s, bool *apply) {
  const mn_plan *p = s->plan;
  float inv = 1.0f / s->scaler.scale;
  bool finite = true;
  for (size_t i = 0; i < p->num_params; i++) {
    mn_node gn = p->params[i].grad;
    if (gn == MN_NO_NODE) continue;
    float *g = (float *)buffer_ptr(s, p->node_buffer[gn]);
    for (size_t k = 0, n = (size_t)mn_tensor_type_numel(&p->graph->nodes[gn].type); k < n; k++) {
      finite = finite && isfinite(g[k]);
      g[k] *= inv;
    }
  }
  if (s->dp) {
    float overflowed = finite ? 0.0f : 1.0f;
    mn_status rc = mn_all_reduce(s->dp->group, s->dp->rank, &overflowed, 1, MN_REDUCE_MAX);
    if (rc != MN_OK) return rc;
    finite = overflowed == 0.0f;
  }
  *apply = mn_loss_scaler_record(&s->scaler, finite);
  return MN_OK;
}

/* Gradient accumulation over the flat gradient vector, in the float arithmetic of
 * mn_opt_accumulate (cuda/kernels/optimizer.cuh): the first step of a round starts the sum,
 * later ones add to it, and the updating step replaces the gradients by sum / k. */
static mn_status accumulate(mn_session *s, bool apply) {
  cpu_state *st = s->backend_state;
  const mn_plan *p = s->plan;
  size_t n = p->update_bytes / sizeof(float);
  if (!st->accum && !(st->accum = malloc((n ? n : 1) * sizeof(float))))
    return mn_fail(MN_ERR_OUT_OF_MEMORY, "mn_session_step: cannot allocate the gradient sum");
  float *g = (float *)(st->arena + p->update_grads_offset);
  bool first = s->accum_index == 0;
  float k = (float)s->grad_accum;
  for (size_t i = 0; i < n; i++) {
    float a = first ? g[i] : st->accum[i] + g[i];
    if (apply)
      g[i] = a / k;
    else
      st->accum[i] = a;
  }
  return MN_OK;
}

static mn_status cpu_step(mn_session *s) {
  cpu_state *st = s->backend_state;
  const mn_plan *p = s->plan;
  const mn_graph *g = p->graph;
  char msg[sizeof st->pending_error - 64];
  if (p->loss_scale != MN_NO_NODE)
    memcpy(buffer_ptr(s, p->node_buffer[p->loss_scale]), &s->scaler.scale, sizeof(float));
  if (s->dp) {
    mn_status rc = mn_dp_sync_params(s->dp, (float *)(st->arena + p->update_params_offset));
    if (rc != MN_OK) return rc;
  }
  for (size_t d = 0; d < p->num_dispatches; d++) {
    mn_node id = p->dispatches[d].node;
    const mn_node_rec *node = &g->nodes[id];
    mn_ref_ctx c = {.g = g,
                    .id = id,
                    .node = node,
                    .error = msg,
                    .error_size = sizeof msg,
                    .micro_step = s->micro_steps,
                    .out_storage = mn_plan_buffer_of(p, id)->storage};
    c.out = buffer_ptr(s, p->node_buffer[id]);
    mn_status rc = MN_OK;
    for (int k = 0; k < node->num_inputs; k++) {
      c.in[k] = buffer_ptr(s, p->node_buffer[node->inputs[k]]);
      if (rc == MN_OK) rc = low_precision_operand(s, node, k, &c.in[k]);
    }
    if (rc != MN_OK) return rc;
    for (int k = 1; k <= mn_node_num_extra_outputs(node); k++)
      c.extra_out[k - 1] = buffer_ptr(s, p->node_buffer[mn_plan_extra_output(p, id, k)]);
    msg[0] = '\0';
    rc = mn_ref_kernels[node->op](&c);
    if (rc == MN_OK) store_low_precision(s, id, node);
    if (rc != MN_OK) {
      /* Keep the first failure until wait reports it; later steps do not overwrite. */
      /* A failed step contributes nothing: the accumulation round starts again, as on CUDA. */
      s->accum_index = 0;
      if (st->pending == MN_OK) {
        st->pending = rc;
        snprintf(st->pending_error, sizeof st->pending_error, "mn_session_wait: %s", msg);
      }
      /* The other ranks would wait for this one's gradients until the timeout. */
      if (s->dp) mn_group_abort(s->dp->group, st->pending_error);
      return MN_OK;
    }
  }
  /* Data parallelism: the loss every rank reports is the mean over ranks. */
  if (s->dp && p->loss != MN_NO_NODE) {
    mn_status rc =
        mn_all_reduce(s->dp->group, s->dp->rank, (float *)buffer_ptr(s, p->node_buffer[p->loss]), 1,
                      MN_REDUCE_MEAN);
    if (rc != MN_OK) return rc;
  }
  if (p->loss_scale != MN_NO_NODE) {
    bool finite = true;
    mn_status rc = unscale_gradients(s, &finite);
    if (rc != MN_OK || !finite) return rc;
  }
  if (!s->training || s->optim.kind == MN_OPTIM_NONE) return MN_OK;
  bool apply = mn_session_accumulation_step(s);
  if (s->grad_accum > 1) {
    mn_status rc = accumulate(s, apply);
    if (rc != MN_OK) return rc;
  }
  mn_session_accumulation_advance(s, apply);
  if (!apply) return MN_OK;
  /* Once per update, after accumulation: the gradients become the mean over ranks. */
  if (s->dp && s->dp->zero1) {
    s->step_count++;
    return mn_ref_zero_step(s, st->arena, &st->zero);
  }
  if (s->dp) {
    mn_status rc = mn_dp_all_reduce_grads(s->dp, (float *)(st->arena + p->update_grads_offset));
    if (rc != MN_OK) return rc;
  }
  bool adam = s->optim.kind == MN_OPTIM_ADAM || s->optim.kind == MN_OPTIM_ADAMW;
  if (adam) {
    mn_status rc = ensure_adam_state(p, st);
    if (rc != MN_OK) return rc;
  }
  s->step_count++;
  mn_ref_optimizer_step(p, &s->optim, s->step_count, st->arena, st->adam_m, st->adam_v);
  return MN_OK;
}

static mn_status cpu_read_optim_state(mn_session *s, size_t slot, int which, float *dst, size_t n) {
  cpu_state *st = s->backend_state;
  if (s->dp && s->dp->zero1) return mn_ref_zero_read_moment(s, &st->zero, slot, which, dst, n);
  float **moments = which ? st->adam_v : st->adam_m;
  if (!moments || !moments[slot])
    memset(dst, 0, n * sizeof *dst);
  else
    memcpy(dst, moments[slot], n * sizeof *dst);
  return MN_OK;
}

static mn_status cpu_write_optim_state(mn_session *s, size_t slot, int which, const float *src,
                                       size_t n) {
  cpu_state *st = s->backend_state;
  if (s->dp && s->dp->zero1) return mn_ref_zero_write_moment(s, &st->zero, slot, which, src, n);
  mn_status rc = ensure_adam_state(s->plan, st);
  if (rc != MN_OK) return rc;
  float *dst = (which ? st->adam_v : st->adam_m)[slot];
  if (!dst)
    return mn_fail(MN_ERR_INVALID_ARGUMENT, "parameter slot %zu has no gradient, so no Adam state",
                   slot);
  memcpy(dst, src, n * sizeof *dst);
  return MN_OK;
}

static mn_status cpu_wait(mn_session *s) {
  cpu_state *st = s->backend_state;
  mn_status rc = st->pending;
  if (rc != MN_OK) {
    mn_set_last_error(st->pending_error);
    st->pending = MN_OK;
    st->pending_error[0] = '\0';
  }
  return rc;
}

const mn_backend_ops mn_cpu_backend = {
    .name = "cpu",
    .create = cpu_create,
    .destroy = cpu_destroy,
    .write_buffer = cpu_write,
    .read_buffer = cpu_read,
    .step = cpu_step,
    .wait = cpu_wait,
    .read_optim_state = cpu_read_optim_state,
    .write_optim_state = cpu_write_optim_state,
    .buffer_address = cpu_buffer_address,
};
