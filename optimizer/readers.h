/* Who reads each node of a graph: the index the rewriting passes (recompute.c,
 * attention_qkv.c) walk from a value to its readers. */
#ifndef MN_OPTIMIZER_READERS_H
#define MN_OPTIMIZER_READERS_H

#include <stdbool.h>
#include <stddef.h>

#include "host/graph.h"

/* Readers of node i: readers[start[i] .. start[i + 1]), in increasing node order; a node reading
 * a value in two input slots appears twice. */
typedef struct mn_readers {
  size_t *start;
  mn_node *readers;
} mn_readers;

/* Builds the index of g; false when out of memory (free it anyway). */
bool mn_readers_init(mn_readers *r, const mn_graph *g);
void mn_readers_free(mn_readers *r);

static inline size_t mn_readers_count(const mn_readers *r, mn_node i) {
  return r->start[i + 1] - r->start[i];
}

#endif
