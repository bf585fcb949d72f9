#ifndef MN_HOST_REF_UPDATE_H
#define MN_HOST_REF_UPDATE_H

#include "host/backend.h"

/* Applies one update to every parameter that has a gradient. `step` counts this update
 * (1 for the first). m and v hold, per plan parameter slot, the Adam moments (unused,
 * may be NULL, for SGD). */
void mn_ref_optimizer_step(const mn_plan *p, const mn_optimizer_config *o, uint64_t step,
                           unsigned char *arena, float *const *m, float *const *v);

/* The update of n elements: parameters w, gradients g, Adam moments m and v (unused for SGD). */
void mn_ref_update_range(const mn_optimizer_config *o, uint64_t step, float *w, const float *g,
                         float *m, float *v, size_t n);

#endif
