/* Session construction, stepping, outputs and the plan/memory views. */
#include "session/session.h"
#ifdef MN_WITH_CUDA
#include "cuda/cuda_backend.h"
#endif

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/data_parallel.h"
#include "host/error.h"
#include "host/memplan.h"
#include "host/storage.h"
#include "optimizer/optimize.h"
#include "optimizer/siblings.h"

mn_session_options mn_session_options_default(void) {
  return (mn_session_options){.backend = MN_BACKEND_AUTO,
                              .device = 0,
                              .allow_tf32 = false,
                              .optimize = true,
                              .fusion = MN_FUSION_AUTO,
                              .siblings = MN_SIBLINGS_AUTO};
}

/* AUTO becomes CUDA when a device is usable, else CPU; MN_BACKEND=cpu|cuda|auto in the
 * environment replaces AUTO (an explicit choice in the options wins). */
static mn_status resolve_backend(const char *fn, const mn_session_options *o,
                                 const mn_backend_ops **out) {
  mn_backend want = o->backend;
  if (want != MN_BACKEND_AUTO && want != MN_BACKEND_CPU && want != MN_BACKEND_CUDA)
    return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: unknown backend %d", fn, (int)want);
  const char *env = getenv("MN_BACKEND");
  if (want == MN_BACKEND_AUTO && env && *env) {
    if (strcmp(env, "cpu") == 0)
      want = MN_BACKEND_CPU;
    else if (strcmp(env, "cuda") == 0)
      want = MN_BACKEND_CUDA;
    else if (strcmp(env, "auto") != 0)
      return mn_fail(MN_ERR_INVALID_ARGUMENT,
                     "%s: environment MN_BACKEND=\"%s\", expected cpu, cuda or auto", fn, env);
  }
#ifdef MN_WITH_CUDA
  int devices = mn_cuda_usable_devices();
  if (want == MN_BACKEND_AUTO) want = devices > 0 ? MN_BACKEND_CUDA : MN_BACKEND_CPU;
  if (want == MN_BACKEND_CUDA && devices == 0)
    return mn_fail(MN_ERR_DEVICE,
                   "%s: CUDA backend requested (device %d) but no CUDA device is usable", fn,
                   o->device);
  if (want == MN_BACKEND_CUDA && (o->device < 0 || o->device >= devices))
    return mn_fail(MN_ERR_DEVICE,
                   "%s: CUDA backend requested (device %d) but only %d CUDA device%s usable", fn,
                   o->device, devices, devices == 1 ? " is" : "s are");
  if (want == MN_BACKEND_CUDA) {
    *out = &mn_cuda_backend;
    return MN_OK;
  }
#else
  if (want == MN_BACKEND_CUDA)
    return mn_fail(MN_ERR_DEVICE,
                   "%s: CUDA backend requested (device %d) but no CUDA device is usable: this "
                   "build of meganeura has no CUDA backend",
                   fn, o->device);
#endif
  *out = &mn_cpu_backend;
  return MN_OK;
}

mn_status mn_session_check_buildable(const char *fn, const mn_graph *g,
                                     const mn_session_options *opts, mn_session **out) {
  if (!out) return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: out is NULL", fn);
  *out = NULL;
  if (!g) return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: graph is NULL", fn);
  if (g->status != MN_OK) return mn_fail(g->status, "%s: graph is in error: %s", fn, g->error);
  if (g->num_outputs == 0)
    return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: graph has no outputs (call mn_set_outputs)", fn);
  if (opts && opts->fusion != MN_FUSION_AUTO && opts->fusion != MN_FUSION_OFF)
    return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: options: unknown fusion mode %d", fn,
                   (int)opts->fusion);
  if (opts && opts->siblings != MN_SIBLINGS_AUTO && opts->siblings != MN_SIBLINGS_ALWAYS &&
      opts->siblings != MN_SIBLINGS_NEVER)
    return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: options: unknown siblings mode %d", fn,
                   (int)opts->siblings);
  if (opts && opts->precision != MN_PRECISION_F32 && opts->precision != MN_PRECISION_BF16 &&
      opts->precision != MN_PRECISION_F16)
    return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: options: unknown precision %d", fn,
                   (int)opts->precision);
  return MN_OK;
}

/* Creates a session around an already lowered plan (taking ownership of it). */
mn_status mn_session_create(const char *fn, mn_plan *plan, const mn_session_options *opts,
                            bool training, mn_session **out) {
  return mn_session_create_sharing(fn, plan, opts, training, NULL, NULL, 0, out);
}

/* What the session reads in its owner's memory takes none of its own arena. */
static mn_status plan_without_shared(const char *fn, mn_session *s) {
  mn_plan *p = s->plan;
  if (!(p->external = calloc(p->num_buffers ? p->num_buffers : 1, sizeof *p->external)))
    return mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
  for (size_t b = 0; b < p->num_buffers; b++)
    p->external[b] = s->shared[b] != NULL;
  return mn_memplan_layout(p, MN_LAYOUT_PLANNED);
}

mn_status mn_session_create_sharing(const char *fn, mn_plan *plan, const mn_session_options *opts,
                                    bool training, mn_session *owner, const char *const *inputs,
                                    size_t n_inputs, mn_session **out) {
  mn_session_options o = opts ? *opts : mn_session_options_default();
  const mn_backend_ops *backend = NULL;
  mn_status st = resolve_backend(fn, &o, &backend);
  if (st == MN_OK) st = mn_plan_set_precision(plan, o.precision);
  if (st != MN_OK) {
    mn_plan_free(plan);
    return st;
  }
  mn_session *s = calloc(1, sizeof *s);
  if (!s) {
    mn_plan_free(plan);
    return mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
  }
  s->plan = plan;
  s->options = o;
  s->training = training;
  s->backend = backend;
  s->scaler = mn_loss_scaler_new();
  s->grad_accum = 1;
  if (owner) st = mn_session_share_parameters(fn, s, owner);
  if (owner && st == MN_OK) st = mn_session_share_inputs(fn, s, owner, inputs, n_inputs);
  if (owner && st == MN_OK) st = plan_without_shared(fn, s);
  if (st != MN_OK || (st = backend->create(s)) != MN_OK) {
    mn_plan_free(plan);
    free(s->shared);
    free(s);
    return st;
  }
  if ((st = mn_session_join_group(fn, s)) != MN_OK) {
    mn_session_free(s);
    return st;
  }
  *out = s;
  return MN_OK;
}

/* Dropout is the identity outside training: a scale by 1, which the optimizer's scale-one rule
 * removes (with optimization off it stays a copy). */
static void dropout_as_identity(mn_graph *g) {
  for (size_t i = 0; i < g->num_nodes; i++)
    if (g->nodes[i].op == MN_OP_DROPOUT) {
      g->nodes[i].op = MN_OP_SCALE;
      g->nodes[i].attrs = (mn_op_attrs){.scale = 1.0f};
    }
}

mn_status mn_lower_inference(const char *fn, const mn_graph *g, const mn_session_options *o,
                             mn_plan **out) {
  *out = NULL;
  mn_graph *sorted = NULL;
  mn_param_layout layout = {0};
  mn_status st = mn_graph_toposort_status(g, &sorted);
  if (st == MN_OK) dropout_as_identity(sorted);
  if (st == MN_OK) st = mn_optimize_graph(fn, &sorted, o, MN_OPTIMIZE_FULL);
  /* After the rules, as in training: a product they gave an epilogue stays apart. */
  if (st == MN_OK) st = mn_siblings_concat(fn, &sorted, o, false, &layout, NULL);
  if (st == MN_OK)
    st = mn_plan_build(sorted, sorted->num_outputs, NULL, &layout, out);
  else
    mn_graph_free(sorted);
  mn_param_layout_clear(&layout);
  return st;
}

mn_status mn_build_inference_session(const mn_graph *g, const mn_session_options *opts,
                                     mn_session **out) {
  const char *fn = "mn_build_inference_session";
  mn_status st = mn_session_check_buildable(fn, g, opts, out);
  if (st != MN_OK) return st;
  mn_session_options o = opts ? *opts : mn_session_options_default();
  mn_plan *plan = NULL;
  if ((st = mn_lower_inference(fn, g, &o, &plan)) != MN_OK) return st;
  return mn_session_create(fn, plan, &o, false, out);
}

void mn_session_free(mn_session *s) {
  if (!s) return;
  if (s->backend) s->backend->destroy(s);
  mn_plan_free(s->plan);
  mn_dp_free(s->dp);
  free(s->shared);
  free(s);
}

mn_status mn_session_step(mn_session *s) {
  if (!s) return mn_fail(MN_ERR_INVALID_ARGUMENT, "mn_session_step: session is NULL");
  mn_status st = s->backend->step(s);
  if (st == MN_OK) {
    s->steps++;
    if (s->training) s->micro_steps++;
  }
  return st;
}

mn_status mn_session_get_stats(const mn_session *s, mn_session_stats *out) {
  if (!s) return mn_fail(MN_ERR_INVALID_ARGUMENT, "mn_session_get_stats: session is NULL");
  if (!out) return mn_fail(MN_ERR_INVALID_ARGUMENT, "mn_session_get_stats: out is NULL");
  *out = (mn_session_stats){.backend = s->backend->name, .steps = s->steps};
  if (s->plan->loss_scale != MN_NO_NODE) {
    out->loss_scale = s->scaler.scale;
    out->skipped_steps = s->scaler.skipped;
  }
  if (s->backend->stats) s->backend->stats(s, out);
  return MN_OK;
}

mn_status mn_session_wait(mn_session *s) {
  if (!s) return mn_fail(MN_ERR_INVALID_ARGUMENT, "mn_session_wait: session is NULL");
  return s->backend->wait(s);
}

float mn_session_read_loss(mn_session *s) {
  if (!s || s->plan->loss == MN_NO_NODE) return 0.0f;
  float loss = 0.0f;
  if (s->backend->read_buffer(s, s->plan->node_buffer[s->plan->loss], &loss, sizeof loss) != MN_OK)
    return 0.0f;
  return loss;
}

size_t mn_session_num_outputs(const mn_session *s) { return s ? s->plan->num_user_outputs : 0; }

mn_status mn_session_read_output_by_index(mn_session *s, size_t index, float *out, size_t n) {
  const char *fn = "mn_session_read_output_by_index";
  if (!s) return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: session is NULL", fn);
  if (!out) return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: out is NULL", fn);
  const mn_graph *g = s->plan->graph;
  if (index >= s->plan->num_user_outputs)
    return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: index %zu out of range (%zu outputs)", fn, index,
                   s->plan->num_user_outputs);
  mn_node id = g->outputs[index];
  const mn_tensor_type *t = &g->nodes[id].type;
  size_t numel = (size_t)mn_tensor_type_numel(t);
  if (n != numel) {
    char shape[96];
    return mn_fail(MN_ERR_SHAPE, "%s: output %zu (node %u %s) has %zu elements, n is %zu", fn,
                   index, id, mn_shape_str(t, shape, sizeof shape), numel, n);
  }
  mn_status st = s->backend->read_buffer(s, s->plan->node_buffer[id], out, numel * sizeof(float));
  if (st != MN_OK || t->dtype != MN_U32) return st;
  /* U32 outputs (an index passed through) are returned as floats. */
  uint32_t *as_u32 = (uint32_t *)out;
  for (size_t i = 0; i < numel; i++)
    out[i] = (float)as_u32[i];
  return MN_OK;
}

const mn_plan *mn_session_plan(const mn_session *s) { return s ? s->plan : NULL; }

mn_memory_summary mn_session_memory_summary(const mn_session *s) {
  mn_memory_summary m = {0};
  if (!s) return m;
  const mn_plan *p = s->plan;
  m.total_buffer_bytes = p->arena_bytes;
  m.num_buffers = p->num_buffers;
  for (size_t i = 0; i < p->num_buffers; i++)
    if (p->buffers[i].bytes > m.largest_buffer_bytes) m.largest_buffer_bytes = p->buffers[i].bytes;
  /* Adam keeps two moments per trained parameter, allocated beside the arena. */
  if (s->optim.kind == MN_OPTIM_ADAM || s->optim.kind == MN_OPTIM_ADAMW)
    for (size_t i = 0; i < p->num_params; i++)
      if (p->params[i].grad != MN_NO_NODE)
        m.adam_state_bytes += 2 * mn_plan_buffer_of(p, p->params[i].param)->bytes;
  /* ZeRO-1: this rank keeps its shard's moments only. */
  if (s->dp && s->dp->zero1 && m.adam_state_bytes)
    m.adam_state_bytes = 2 * s->dp->shard * sizeof(float);
  m.total_buffer_bytes += m.adam_state_bytes;
  return m;
}

int mn_memory_summary_format(const mn_memory_summary *m, char *buf, size_t size) {
  if (!m) return snprintf(buf, size, "(no memory summary)");
  return snprintf(buf, size, "%zu %s, %.1f MB total (%.1f MB adam state), largest %.1f MB",
                  m->num_buffers, m->num_buffers == 1 ? "buffer" : "buffers",
                  (double)m->total_buffer_bytes / 1e6, (double)m->adam_state_bytes / 1e6,
                  (double)m->largest_buffer_bytes / 1e6);
}
