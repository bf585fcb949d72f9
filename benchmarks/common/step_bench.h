/* The frame shared by the step benchmarks (block_step, mlp_step): the options from the
 * command line, the cold and warm build times, the session being timed, and the one BENCH
 * line that scripts/gpu-test.sh parses. A header of static functions because CMake builds
 * every .c file in benchmarks/ as its own program. */
#ifndef MN_BENCH_STEP_BENCH_H
#define MN_BENCH_STEP_BENCH_H

#include "benchmarks/bench_util.h"

typedef struct bench_step {
  mn_session_options o;
  double cold_ms, warm_ms;
  bool warm_hit;
  mn_graph *g;
  mn_session *s;
  bool profile;
} bench_step;

/* "--tf32" allows TF32 matmuls; "--no-optimize" turns the graph optimizer off, to measure
 * what it buys; "--profile" prints each op's time after the timing (mn_cuda_profile_step),
 * whose sum beside the step's time shows what the graph's launches and gaps cost. Times a cold and
 * a warm build of make()'s graph, then builds the training session that the benchmark feeds and
 * times. */
static inline bench_step bench_step_begin(int argc, char **argv, bench_graph_fn make) {
  bench_step b = {.o = mn_session_options_default()};
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--tf32") == 0)
      b.o.allow_tf32 = true;
    else if (strcmp(argv[i], "--no-optimize") == 0)
      b.o.optimize = false;
    else if (strcmp(argv[i], "--profile") == 0)
      b.profile = true;
    else {
      fprintf(stderr, "%s: unknown argument %s (--tf32, --no-optimize, --profile)\n", argv[0],
              argv[i]);
      exit(2);
    }
  }
  bench_build_times(make, &b.o, &b.cold_ms, &b.warm_ms, &b.warm_hit);
  b.g = make();
  bench_check(mn_build_session(b.g, &b.o, &b.s), "build");
  return b;
}

/* Prints the BENCH line of `name` (with "_tf32" when allowed, "_noopt" with the optimizer
 * off) for `step_ms` per step, then frees the session and the graph. */
static inline void bench_step_end(bench_step *b, const char *name, double step_ms) {
  mn_session_stats st;
  mn_session_get_stats(b->s, &st);
  printf("BENCH %s%s%s backend=%s step_ms=%.4f dispatches=%zu launches_per_step=%.2f "
         "build_cold_ms=%.1f build_warm_ms=%.1f warm_cache_hit=%d kernels=%zu graph_nodes=%zu "
         "overlapped_edges=%zu loss=%.4f\n",
         name, b->o.allow_tf32 ? "_tf32" : "", b->o.optimize ? "" : "_noopt", st.backend, step_ms,
         mn_plan_num_dispatches(mn_session_plan(b->s)),
         st.steps ? (double)st.submissions / (double)st.steps : 0.0, b->cold_ms, b->warm_ms,
         b->warm_hit ? 1 : 0, st.kernels, st.graph_nodes, st.graph_overlapped_edges,
         mn_session_read_loss(b->s));
#ifdef MN_WITH_CUDA
  if (b->profile && mn_cuda_session_stream(b->s))
    bench_check(mn_cuda_profile_step(b->s, 20, stdout), "profile");
#else
  if (b->profile) printf("--profile needs a CUDA build\n");
#endif
  mn_session_free(b->s);
  mn_graph_free(b->g);
}

#endif
