/* Optimizer updates on the reference backend, written to match torch.optim exactly:
 * SGD, Adam and AdamW (decoupled decay), after optional global-norm clipping as
 * torch.nn.utils.clip_grad_norm_ does it. */
#include <math.h>

#include "host/reference/ref_update.h"

static float *f32_at(unsigned char *arena, const mn_plan *p, mn_node id) {
  return (float *)(arena + mn_plan_buffer_of(p, id)->offset);
}

static size_t numel_of(const mn_plan *p, mn_node id) {
  return (size_t)mn_tensor_type_numel(&p->graph->nodes[id].type);
}

/* Scales every gradient by max_norm / (norm + 1e-6) when that is below 1. */
static void clip_gradients(const mn_plan *p, float max_norm, unsigned char *arena) {
  double sum_sq = 0;
  for (size_t i = 0; i < p->num_params; i++) {
    if (p->params[i].grad == MN_NO_NODE) continue;
    const float *g = f32_at(arena, p, p->params[i].grad);
    for (size_t k = 0, n = numel_of(p, p->params[i].grad); k < n; k++)
      sum_sq += (double)g[k] * g[k];
  }
  double coef = (double)max_norm / (sqrt(sum_sq) + 1e-6);
  if (coef >= 1.0) return;
  for (size_t i = 0; i < p->num_params; i++) {
    if (p->params[i].grad == MN_NO_NODE) continue;
    float *g = f32_at(arena, p, p->params[i].grad);
    for (size_t k = 0, n = numel_of(p, p->params[i].grad); k < n; k++)
      g[k] = (float)(g[k] * coef);
  }
}

void mn_ref_update_range(const mn_optimizer_config *o, uint64_t step, float *w, const float *g,
                         float *m, float *v, size_t n) {
  if (o->kind == MN_OPTIM_SGD) {
    for (size_t k = 0; k < n; k++)
      w[k] = (float)(w[k] - (double)o->lr * g[k]);
    return;
  }
  double bc1 = 1.0 - pow(o->beta1, (double)step), bc2 = 1.0 - pow(o->beta2, (double)step);
  double decay = o->kind == MN_OPTIM_ADAMW ? 1.0 - (double)o->lr * o->weight_decay : 1.0;
  double step_size = o->lr / bc1, bc2_sqrt = sqrt(bc2);
  for (size_t k = 0; k < n; k++) {
    double mk = (double)o->beta1 * m[k] + (1.0 - o->beta1) * g[k];
    double vk = (double)o->beta2 * v[k] + (1.0 - o->beta2) * (double)g[k] * g[k];
    m[k] = (float)mk;
    v[k] = (float)vk;
    double denom = sqrt((double)v[k]) / bc2_sqrt + o->eps;
    w[k] = (float)(w[k] * decay - step_size * m[k] / denom);
  }
}

void mn_ref_optimizer_step(const mn_plan *p, const mn_optimizer_config *o, uint64_t step,
                           unsigned char *arena, float *const *m, float *const *v) {
  if (o->max_grad_norm > 0) clip_gradients(p, o->max_grad_norm, arena);
  for (size_t i = 0; i < p->num_params; i++) {
    if (p->params[i].grad == MN_NO_NODE) continue;
    float *w = f32_at(arena, p, p->params[i].param);
    const float *g = f32_at(arena, p, p->params[i].grad);
    size_t n = numel_of(p, p->params[i].param);
    mn_ref_update_range(o, step, w, g, m ? m[i] : NULL, v ? v[i] : NULL, n);
  }
}
