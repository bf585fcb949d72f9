#include "optimizer/readers.h"

#include <stdlib.h>

bool mn_readers_init(mn_readers *r, const mn_graph *g) {
  size_t n = g->num_nodes, edges = 0;
  for (size_t i = 0; i < n; i++)
    edges += (size_t)g->nodes[i].num_inputs;
  r->start = calloc(n + 1, sizeof *r->start);
  r->readers = malloc((edges ? edges : 1) * sizeof *r->readers);
  size_t *fill = calloc(n ? n : 1, sizeof *fill);
  bool ok = r->start && r->readers && fill;
  if (ok) {
    for (size_t i = 0; i < n; i++)
      for (int k = 0; k < g->nodes[i].num_inputs; k++)
        r->start[g->nodes[i].inputs[k] + 1]++;
    for (size_t i = 0; i < n; i++)
      r->start[i + 1] += r->start[i];
    /* Readers are visited in node order, so each list comes out sorted. */
    for (size_t i = 0; i < n; i++)
      for (int k = 0; k < g->nodes[i].num_inputs; k++) {
        mn_node in = g->nodes[i].inputs[k];
        r->readers[r->start[in] + fill[in]++] = (mn_node)i;
      }
  }
  free(fill);
  return ok;
}

void mn_readers_free(mn_readers *r) {
  free(r->start);
  free(r->readers);
  r->start = NULL;
  r->readers = NULL;
}
