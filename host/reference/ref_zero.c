/* ZeRO-1 on the reference backend (ref_zero.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "host/data_parallel.h"
#include "host/error.h"
#include "host/reference/ref_update.h"
#include "host/reference/ref_zero.h"

void mn_ref_zero_free(mn_ref_zero *z) {
  free(z->m);
  free(z->v);
  free(z->all_m);
  free(z->all_v);
  *z = (mn_ref_zero){0};
}

static mn_status ensure_moments(mn_ref_zero *z, size_t shard) {
  if (z->m) return MN_OK;
  z->m = calloc(shard ? shard : 1, sizeof(float));
  z->v = calloc(shard ? shard : 1, sizeof(float));
  if (z->m && z->v) return MN_OK;
  free(z->m);
  free(z->v);
  z->m = z->v = NULL;
  return mn_fail(MN_ERR_OUT_OF_MEMORY, "mn_session_step: cannot allocate the Adam state");
}

/* torch.nn.utils.clip_grad_norm_ over every rank's shard: the sum of squares is added up over
 * ranks, so every rank scales by the same coefficient. */
static mn_status clip(mn_dp *dp, float max_norm, float *g, size_t n) {
  double sum_sq = 0;
  for (size_t k = 0; k < n; k++)
    sum_sq += (double)g[k] * g[k];
  float total = (float)sum_sq;
  mn_status st = mn_all_reduce(dp->group, dp->rank, &total, 1, MN_REDUCE_SUM);
  if (st != MN_OK) return st;
  double coef = (double)max_norm / (sqrt((double)total) + 1e-6);
  if (coef >= 1.0) return MN_OK;
  for (size_t k = 0; k < n; k++)
    g[k] = (float)(g[k] * coef);
  return MN_OK;
}

mn_status mn_ref_zero_step(mn_session *s, unsigned char *arena, mn_ref_zero *z) {
  mn_dp *dp = s->dp;
  const mn_plan *p = s->plan;
  bool adam = s->optim.kind == MN_OPTIM_ADAM || s->optim.kind == MN_OPTIM_ADAMW;
  mn_status st = adam ? ensure_moments(z, dp->shard) : MN_OK;
  if (st != MN_OK) return st;
  float *grads = (float *)(arena + p->update_grads_offset);
  float *params = (float *)(arena + p->update_params_offset);
  float *shard = calloc(dp->shard ? dp->shard : 1, sizeof *shard);
  if (!shard) return mn_fail(MN_ERR_OUT_OF_MEMORY, "mn_session_step: out of memory (ZeRO-1)");
  size_t lo, hi;
  mn_dp_shard_range(dp, &lo, &hi);
  st = mn_dp_reduce_scatter_grads(dp, grads, shard);
  if (st == MN_OK && s->optim.max_grad_norm > 0)
    st = clip(dp, s->optim.max_grad_norm, shard, hi - lo);
  if (st == MN_OK) {
    /* read_grad shows the gradient the shard was updated with. */
    memcpy(grads + lo, shard, (hi - lo) * sizeof *grads);
    mn_ref_update_range(&s->optim, s->step_count, params + lo, shard, adam ? z->m : NULL,
                        adam ? z->v : NULL, hi - lo);
    memset(shard, 0, dp->shard * sizeof *shard);
    memcpy(shard, params + lo, (hi - lo) * sizeof *shard);
    st = mn_dp_all_gather_params(dp, shard, params);
  }
  z->gathered = false;
  free(shard);
  return st;
}

static mn_status gather(mn_session *s, mn_ref_zero *z) {
  mn_dp *dp = s->dp;
  if (z->gathered && z->gathered_step == s->step_count) return MN_OK;
  size_t all = dp->shard * (size_t)dp->world;
  if (!z->all_m) {
    z->all_m = malloc((all ? all : 1) * sizeof(float));
    z->all_v = malloc((all ? all : 1) * sizeof(float));
    if (!z->all_m || !z->all_v)
      return mn_fail(MN_ERR_OUT_OF_MEMORY, "reading the optimizer state: out of memory");
  }
  float *zeros = z->m ? NULL : calloc(dp->shard ? dp->shard : 1, sizeof(float));
  if (!z->m && !zeros)
    return mn_fail(MN_ERR_OUT_OF_MEMORY, "reading the optimizer state: out of memory");
  mn_status st = mn_all_gather(dp->group, dp->rank, z->m ? z->m : zeros, z->all_m, dp->shard);
  if (st == MN_OK)
    st = mn_all_gather(dp->group, dp->rank, z->v ? z->v : zeros, z->all_v, dp->shard);
  free(zeros);
  z->gathered = st == MN_OK;
  z->gathered_step = s->step_count;
  return st;
}

mn_status mn_ref_zero_read_moment(mn_session *s, mn_ref_zero *z, size_t slot, int which, float *dst,
                                  size_t n) {
  mn_status st = gather(s, z);
  if (st != MN_OK) return st;
  memcpy(dst, (which ? z->all_v : z->all_m) + mn_dp_slot_offset(s->plan, slot), n * sizeof *dst);
  return MN_OK;
}

mn_status mn_ref_zero_write_moment(mn_session *s, mn_ref_zero *z, size_t slot, int which,
                                   const float *src, size_t n) {
  mn_status st = ensure_moments(z, s->dp->shard);
  if (st != MN_OK) return st;
  size_t lo, hi, at = mn_dp_slot_offset(s->plan, slot);
  mn_dp_shard_range(s->dp, &lo, &hi);
  size_t a = at > lo ? at : lo, b = at + n < hi ? at + n : hi;
  float *dst = which ? z->v : z->m;
  if (a < b) memcpy(dst + (a - lo), src + (a - at), (b - a) * sizeof *dst);
  z->gathered = false;
  return MN_OK;
}
