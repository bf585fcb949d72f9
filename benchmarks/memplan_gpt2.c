/* Reports what the memory planner saves on a GPT-2 small training step (12 layers,
 * 768 wide, 12 heads, vocab 50257): arena bytes planned vs one buffer per node, and the
 * time to lower the graph. Builds the plan only; nothing is allocated on a device.
 * Usage: memplan_gpt2 [batch] [seq] */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "benchmarks/gpt_graph.h"
#include "host/memplan.h"
#include "session/session.h"

int main(int argc, char **argv) {
  int64_t batch = argc > 1 ? atoll(argv[1]) : 16, seq = argc > 2 ? atoll(argv[2]) : 1024;
  const gpt_config c = gpt2_small(batch, seq);
  mn_graph *g = gpt_graph(&c);

  mn_session_options o = mn_session_options_default();
  mn_plan *plan = NULL;
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  mn_status st = mn_lower_training("memplan_gpt2", g, &o, &plan);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  if (st != MN_OK) {
    fprintf(stderr, "lowering failed: %s\n", mn_last_error());
    return 1;
  }
  double ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
  size_t unplanned = mn_memplan_unplanned_bytes(plan);
  printf("memplan gpt2-small training step, batch %lld seq %lld: %zu dispatches, %zu buffers; "
         "arena %.2f GB planned vs %.2f GB one buffer per node (%.1f%% saved); lowering %.0f ms\n",
         (long long)batch, (long long)seq, plan->num_dispatches, plan->num_buffers,
         (double)plan->arena_bytes / 1e9, (double)unplanned / 1e9,
         100.0 * (1.0 - (double)plan->arena_bytes / (double)unplanned), ms);
  mn_plan_free(plan);
  mn_graph_free(g);
  return 0;
}
