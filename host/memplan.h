/* Memory planning: arena offsets for the buffers of a plan. Pinned buffers (inputs,
 * parameters, constants, outputs, gradients, KV caches) each keep memory of their own
 * for the whole session; activations share memory with any other activation whose
 * lifetime (first write to last read, in dispatch order) does not overlap. An activation
 * whose last reader is the element-wise op that writes a parameter gradient of its size (a
 * tied weight's partial gradient) lives in that gradient's memory, which is free within a
 * step until the gradient is written (mn_plan_in_update_block says which). */
#ifndef MN_HOST_MEMPLAN_H
#define MN_HOST_MEMPLAN_H

#include "host/plan.h"

typedef enum mn_layout_mode {
  MN_LAYOUT_PLANNED,        /* activations reuse memory by lifetime */
  MN_LAYOUT_ONE_PER_BUFFER, /* every buffer its own memory (the reference for tests) */
} mn_layout_mode;

/* Sets every buffer's offset and p->arena_bytes. External buffers (p->external) take no
 * space: their offset is 0 and never read. */
mn_status mn_memplan_layout(mn_plan *p, mn_layout_mode mode);

/* The dispatch that first writes each buffer, its node's (for an extra output, that of the
 * node whose value it is), and the last one that writes or reads it; SIZE_MAX where there is
 * none (first: a leaf). Activations whose [first, last] do not overlap may share memory.
 * first and last have num_buffers entries. */
void mn_memplan_lifetimes(const mn_plan *p, size_t *first, size_t *last);

/* Sum of all buffers' aligned sizes: what the arena would be without reuse. */
size_t mn_memplan_unplanned_bytes(const mn_plan *p);

#endif
