/* The CUDA runtime: kernel compilation, the cubin cache and compile errors (no device
 * needed), and on a GPU the one-launch-per-step contract, out-of-memory handling and
 * device memory returning to where it started. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/support/cuda_check.h"
#include "tests/support/mn_test.h"
#include "tests/support/session_util.h"
#include "tests/support/tmp_dir.h"
#ifdef MN_WITH_CUDA
#include <cuda_runtime_api.h>

#include "cuda/cuda_backend.h"
#include "cuda/jit.h"
#endif

static mn_graph *mlp_graph(int64_t batch, int64_t in, int64_t hidden, int64_t out) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(batch, in));
  mn_node w1 = mn_parameter(g, "w1", MN_SHAPE(in, hidden));
  mn_node b1 = mn_parameter(g, "b1", MN_SHAPE(hidden));
  mn_node w2 = mn_parameter(g, "w2", MN_SHAPE(hidden, out));
  mn_node h = mn_relu(g, mn_bias_add(g, mn_matmul(g, x, w1), b1));
  mn_node y = mn_matmul(g, h, w2);
  mn_node t = mn_input(g, "t", MN_SHAPE(batch, out));
  mn_set_outputs(g, (mn_node[]){mn_mse_loss(g, y, t), y}, 2);
  return g;
}

Test(cuda_runtime, an_mlp_training_graph_compiles_for_sm90) {
  mn_test_require_cuda_build();
  mn_graph *g = mlp_graph(4, 8, 16, 3);
  mn_test_assert_compiles(g, true);
  mn_test_assert_compiles(g, false);
  mn_graph_free(g);
}

#ifdef MN_WITH_CUDA
static const char *tiny_source =
    "extern \"C\" __global__ void k(float *x) { x[threadIdx.x] = 1; }\n";

Test(cuda_runtime, a_compile_error_is_a_device_error_with_the_log) {
  mn_cu_binary bin;
  mn_status st = mn_cu_compile("extern \"C\" __global__ void k() { undeclared_thing(); }\n",
                               "sm_90", "", &bin);
  mn_assert_error(st, MN_ERR_DEVICE, "NVRTC could not compile");
  cr_assert(strstr(mn_last_error(), "undeclared_thing") != NULL, "log missing: %s",
            mn_last_error());
}

Test(cuda_runtime, a_warm_cache_compiles_nothing_and_a_corrupt_entry_is_replaced) {
  mn_tmp_dir t = mn_tmp_dir_make("mn_cuda_cache");
  const char *dir = t.path;
  mn_cu_binary cold, warm, again;
  cr_assert_eq(mn_cu_compile(tiny_source, "sm_90", dir, &cold), MN_OK, "%s", mn_last_error());
  cr_assert(!cold.from_cache);
  cr_assert_eq(mn_cu_compile(tiny_source, "sm_90", dir, &warm), MN_OK, "%s", mn_last_error());
  cr_assert(warm.from_cache, "second compile was not served from the cache");
  cr_assert_eq(warm.compile_ms, 0.0);
  cr_assert_eq(warm.size, cold.size);
  cr_assert_eq(memcmp(warm.data, cold.data, cold.size), 0);
  /* Truncate the entry: it must be detected, recompiled and rewritten. */
  char name[256];
  snprintf(name, sizeof name, "kernels-sm_90-%s.cubin", cold.key);
  const char *path = mn_tmp_path(&t, name);
  cr_assert_eq(truncate(path, 20), 0, "cache file %s missing", path);
  cr_assert_eq(mn_cu_compile(tiny_source, "sm_90", dir, &again), MN_OK, "%s", mn_last_error());
  cr_assert(!again.from_cache, "a truncated cache entry was used");
  mn_cu_binary_free(&again);
  cr_assert_eq(mn_cu_compile(tiny_source, "sm_90", dir, &again), MN_OK, "%s", mn_last_error());
  cr_assert(again.from_cache, "the rewritten entry was not used");
  /* Another architecture or source is another entry. */
  mn_cu_binary other;
  cr_assert_eq(mn_cu_compile(tiny_source, "sm_80", dir, &other), MN_OK, "%s", mn_last_error());
  cr_assert(!other.from_cache);
  cr_assert_str_neq(other.key, cold.key);
  mn_cu_binary_free(&cold);
  mn_cu_binary_free(&warm);
  mn_cu_binary_free(&again);
  mn_cu_binary_free(&other);
  mn_tmp_dir_remove(&t);
}

Test(cuda_runtime, processes_sharing_the_cache_never_see_a_partial_file) {
  mn_tmp_dir t = mn_tmp_dir_make("mn_cuda_cache");
  const char *dir = t.path;
  enum { procs = 4, rounds = 3 };
  for (int i = 0; i < procs; i++) {
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
      int ok = 1;
      for (int r = 0; r < rounds; r++) {
        mn_cu_binary b;
        ok &= mn_cu_compile(tiny_source, "sm_90", dir, &b) == MN_OK && b.size > 0;
        mn_cu_binary_free(&b);
      }
      _exit(ok ? 0 : 1);
    }
  }
  for (int i = 0; i < procs; i++) {
    int status = 0;
    wait(&status);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "a compiling process failed");
  }
  mn_cu_binary b;
  cr_assert_eq(mn_cu_compile(tiny_source, "sm_90", dir, &b), MN_OK);
  cr_assert(b.from_cache);
  mn_cu_binary_free(&b);
  size_t left = mn_tmp_dir_count(&t, "tmp");
  cr_assert_eq(left, 0, "%zu temporary files left in the cache folder", left);
  mn_tmp_dir_remove(&t);
}

/* Random inputs and parameters for mlp_graph(batch, in, hidden, out). */
static void feed_mlp_sized(mn_session *s, mn_rng *r, size_t batch, size_t in, size_t hidden,
                           size_t out) {
  const size_t nx = batch * in, nt = batch * out, nw1 = in * hidden, nw2 = hidden * out;
  float *x = malloc(nx * sizeof *x), *t = malloc(nt * sizeof *t), *w1 = malloc(nw1 * sizeof *w1),
        *b1 = malloc(hidden * sizeof *b1), *w2 = malloc(nw2 * sizeof *w2);
  cr_assert(x && t && w1 && b1 && w2);
  mn_rng_fill(r, x, nx, -1, 1);
  mn_rng_fill(r, t, nt, -1, 1);
  mn_rng_fill(r, w1, nw1, -0.5f, 0.5f);
  mn_rng_fill(r, b1, hidden, -0.5f, 0.5f);
  mn_rng_fill(r, w2, nw2, -0.5f, 0.5f);
  cr_assert_eq(mn_session_set_input(s, "x", x, nx), MN_OK);
  cr_assert_eq(mn_session_set_input(s, "t", t, nt), MN_OK);
  cr_assert_eq(mn_session_set_parameter(s, "w1", w1, nw1), MN_OK);
  cr_assert_eq(mn_session_set_parameter(s, "b1", b1, hidden), MN_OK);
  cr_assert_eq(mn_session_set_parameter(s, "w2", w2, nw2), MN_OK);
  free(x);
  free(t);
  free(w1);
  free(b1);
  free(w2);
}

/* The same for mlp_graph(4, 8, 16, 3). */
static void feed_mlp(mn_session *s, mn_rng *r) { feed_mlp_sized(s, r, 4, 8, 16, 3); }

Test(cuda_runtime, every_step_is_one_graph_launch_and_lr_changes_never_recapture) {
  mn_test_require_cuda_device();
  mn_graph *g = mlp_graph(4, 8, 16, 3);
  mn_session *s = mn_test_session(g, MN_BACKEND_CUDA, true);
  mn_rng r = mn_rng_new(7);
  feed_mlp(s, &r);
  cr_assert_eq(mn_session_set_learning_rate(s, 0.1f), MN_OK);
  float first = 0, last = 0;
  for (int i = 0; i < 10; i++) {
    cr_assert_eq(mn_session_set_learning_rate(s, 0.1f / (float)(i + 1)), MN_OK);
    cr_assert_eq(mn_session_step(s), MN_OK, "%s", mn_last_error());
    cr_assert_eq(mn_session_wait(s), MN_OK, "%s", mn_last_error());
    last = mn_session_read_loss(s);
    if (i == 0) first = last;
  }
  cr_assert_lt(last, first, "loss did not fall: %g -> %g", first, last);
  mn_session_stats stats;
  cr_assert_eq(mn_session_get_stats(s, &stats), MN_OK);
  cr_assert_str_eq(stats.backend, "cuda");
  cr_assert_eq(stats.steps, 10u);
  cr_assert_eq(stats.graph_launches, 10u, "graph launches %llu for 10 steps",
               (unsigned long long)stats.graph_launches);
  cr_assert_eq(stats.submissions, 10u, "%llu submissions for 10 steps",
               (unsigned long long)stats.submissions);
  cr_assert_eq(stats.graph_captures, 1u, "learning-rate changes re-captured the graph");
  cr_assert_gt(stats.graph_nodes, 5u);
  /* The loss comes back through pinned memory; it equals output 0 read from the device. */
  float loss0 = 0;
  cr_assert_eq(mn_session_read_output_by_index(s, 0, &loss0, 1), MN_OK);
  cr_assert_eq(loss0, last);
  /* A different optimizer kind is a new graph (the Adam state joins it), once. */
  cr_assert_eq(mn_session_set_adamw(s, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f), MN_OK);
  for (int i = 0; i < 3; i++) {
    cr_assert_eq(mn_session_step(s), MN_OK);
    cr_assert_eq(mn_session_wait(s), MN_OK);
  }
  cr_assert_eq(mn_session_get_stats(s, &stats), MN_OK);
  cr_assert_eq(stats.graph_captures, 2u);
  cr_assert_eq(stats.graph_launches, 13u);
  mn_session_free(s);
  mn_graph_free(g);
}

/* A step copies in only the inputs written since the previous step (the others' copies are
 * disabled in the graph, their device memory unchanged): a CUDA session fed x and t, then t
 * alone, then nothing, then x alone, trains as the CPU session fed the same, loss by loss. By
 * default a small step launches the graph without copy nodes at the steps that write none; those
 * sessions train to the same bits as one without (MN_CUDA_BARE_GRAPH=0) on two streams, and as
 * the CPU on one with the scalars' copy ahead of the input copies (so the removed copies' order
 * must be kept: the learning rate changes every step; one stream may sum in another order than
 * two). */
Test(cuda_runtime, inputs_not_written_again_keep_their_values) {
  mn_test_require_cuda_device();
  mn_graph *g = mlp_graph(4, 8, 16, 3);
  setenv("MN_CUDA_BARE_GRAPH", "0", 1);
  mn_session *gpu = mn_test_session(g, MN_BACKEND_CUDA, true);
  unsetenv("MN_CUDA_BARE_GRAPH");
  mn_session *cpu = mn_test_session(g, MN_BACKEND_CPU, true);
  mn_session *bare = mn_test_session(g, MN_BACKEND_CUDA, true);
  mn_session *bare_chain = mn_test_session(g, MN_BACKEND_CUDA, true);
  enum { SESSIONS = 4 };
  mn_session *all[SESSIONS] = {gpu, cpu, bare, bare_chain};
  for (int k = 0; k < SESSIONS; k++) {
    mn_rng r = mn_rng_new(11);
    feed_mlp(all[k], &r);
  }
  float x[32], t[12];
  /* Which inputs each step writes first: 1 x, 2 t. */
  static const int writes[] = {0, 0, 2, 0, 0, 1, 0, 3, 0};
  mn_rng data = mn_rng_new(12);
  for (size_t i = 0; i < sizeof writes / sizeof writes[0]; i++) {
    mn_rng_fill(&data, x, 32, -1, 1);
    mn_rng_fill(&data, t, 12, -1, 1);
    float loss[SESSIONS];
    for (int k = 0; k < SESSIONS; k++) {
      mn_session *s = all[k];
      cr_assert_eq(mn_session_set_learning_rate(s, 0.05f + 0.01f * (float)i), MN_OK);
      if (writes[i] & 1) cr_assert_eq(mn_session_set_input(s, "x", x, 32), MN_OK);
      if (writes[i] & 2) cr_assert_eq(mn_session_set_input(s, "t", t, 12), MN_OK);
      /* Read at the capture, the first step's. */
      if (s == bare_chain) {
        setenv("MN_CUDA_STREAMS", "1", 1);
        setenv("MN_CUDA_SIDE", "0", 1);
      }
      cr_assert_eq(mn_session_step(s), MN_OK, "%s", mn_last_error());
      unsetenv("MN_CUDA_STREAMS");
      unsetenv("MN_CUDA_SIDE");
      cr_assert_eq(mn_session_wait(s), MN_OK, "%s", mn_last_error());
      loss[k] = mn_session_read_loss(s);
    }
    for (int k = 0; k < SESSIONS; k += 3)
      cr_assert_float_eq(loss[k], loss[1], 1e-5f * (1.0f + fabsf(loss[1])),
                         "step %zu (writes %d): CUDA loss (session %d) %.9g, CPU %.9g", i,
                         writes[i], k, (double)loss[k], (double)loss[1]);
    cr_assert_eq(memcmp(&loss[0], &loss[2], sizeof loss[0]), 0,
                 "step %zu: loss %.9g, without copy nodes %.9g", i, (double)loss[0],
                 (double)loss[2]);
  }
#ifdef MN_WITH_CUDA
  /* Copies left out: x and t at the 5 steps that wrote nothing, x or t at the 2 that wrote
   * one (the first step copies both: both were set after the build); those 5 steps ran the
   * graph without copy nodes unless told not to. */
  for (int k = 0; k < SESSIONS; k++) {
    if (k == 1) continue;
    cr_assert_eq(mn_cuda_input_copies_skipped(all[k]), 12u,
                 "session %d: %llu input copies skipped, not 12", k,
                 (unsigned long long)mn_cuda_input_copies_skipped(all[k]));
    cr_assert_eq(mn_cuda_bare_launches(all[k]), k == 0 ? 0u : 5u, "session %d: %llu bare launches",
                 k, (unsigned long long)mn_cuda_bare_launches(all[k]));
  }
#endif
  /* And the weights they trained agree. */
  float w[SESSIONS][128];
  for (int k = 0; k < SESSIONS; k++)
    cr_assert_eq(mn_session_read_param(all[k], "w1", w[k], 128), MN_OK);
  for (int k = 0; k < SESSIONS; k += 3)
    for (int i = 0; i < 128; i++)
      cr_assert_float_eq(w[k][i], w[1][i], 1e-5f, "w1[%d]: CUDA (session %d) %.9g, CPU %.9g", i, k,
                         (double)w[k][i], (double)w[1][i]);
  cr_assert_eq(memcmp(w[0], w[2], sizeof w[0]), 0, "w1 differs without copy nodes");
  for (int k = 0; k < SESSIONS; k++)
    mn_session_free(all[k]);
  mn_graph_free(g);
}

/* mn_cuda_profile_step: a CUDA session that has stepped, at least one repetition. */
Test(cuda_runtime, profile_step_rejects_what_it_cannot_profile) {
  mn_test_require_cuda_build();
  cr_assert_eq(mn_cuda_profile_step(NULL, 1, stdout), MN_ERR_INVALID_ARGUMENT);
  mn_graph *g = mlp_graph(4, 8, 16, 3);
  mn_session *cpu = mn_test_session(g, MN_BACKEND_CPU, true);
  cr_assert_eq(mn_cuda_profile_step(cpu, 1, stdout), MN_ERR_INVALID_ARGUMENT);
  cr_assert_not_null(strstr(mn_last_error(), "mn_cuda_profile_step"), "%s", mn_last_error());
  /* The test counters of a session not on CUDA, or of none, are 0. */
  cr_assert_eq(mn_cuda_bare_launches(cpu), 0u);
  cr_assert_eq(mn_cuda_bare_launches(NULL), 0u);
  cr_assert_eq(mn_cuda_input_copies_skipped(NULL), 0u);
  mn_session_free(cpu);
  mn_test_require_cuda_device();
  mn_session *s = mn_test_session(g, MN_BACKEND_CUDA, true);
  cr_assert_eq(mn_cuda_profile_step(s, 1, stdout), MN_ERR_INVALID_ARGUMENT,
               "a session that never stepped has no step to profile");
  mn_rng r = mn_rng_new(3);
  feed_mlp(s, &r);
  cr_assert_eq(mn_session_step(s), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_cuda_profile_step(s, 0, stdout), MN_ERR_INVALID_ARGUMENT);
  cr_assert_eq(mn_cuda_profile_step(s, 1, NULL), MN_ERR_INVALID_ARGUMENT);
  mn_session_free(s);
  mn_graph_free(g);
}

/* The report names the matmuls and the optimizer update, times add up to something, and
 * profiling launches no step graph and leaves the session usable. */
Test(cuda_runtime, profile_step_times_every_op_outside_the_step_graph) {
  mn_test_require_cuda_device();
  /* Wider than 16 on both sides of the forward products, which then stay with cuBLASLt (narrower
   * ones run as skinny kernels, lower_skinny.h). */
  mn_graph *g = mlp_graph(4, 32, 64, 24);
  mn_session *s = mn_test_session(g, MN_BACKEND_CUDA, true);
  mn_rng r = mn_rng_new(4);
  feed_mlp_sized(s, &r, 4, 32, 64, 24);
  cr_assert_eq(mn_session_set_learning_rate(s, 0.1f), MN_OK);
  cr_assert_eq(mn_session_step(s), MN_OK, "%s", mn_last_error());
  FILE *f = tmpfile();
  cr_assert_not_null(f);
  cr_assert_eq(mn_cuda_profile_step(s, 3, f), MN_OK, "%s", mn_last_error());
  char text[32768];
  rewind(f);
  size_t n = fread(text, 1, sizeof text - 1, f);
  text[n] = '\0';
  fclose(f);
  unsigned commands = 0;
  double ms = -1;
  cr_assert_eq(sscanf(text, "PROFILE %u commands, %lf ms", &commands, &ms), 2, "%s", text);
  cr_assert_gt(commands, 4u, "%s", text);
  cr_assert_gt(ms, 0.0, "%s", text);
  cr_assert_not_null(strstr(text, "PROFILE matmul "), "%s", text);
  cr_assert_not_null(strstr(text, "optimizer_update"), "%s", text);
  /* The per-kernel table: the products are cuBLASLt's. */
  const char *kernels = strstr(text, "PROFILE kernel ");
  cr_assert_not_null(kernels, "%s", text);
  cr_assert_not_null(strstr(kernels, "cublasLt"), "%s", text);
  /* The floor table: the card's measured peaks, then each op's distance to them. */
  double tflops = 0, tbps = 0;
  const char *floor = strstr(text, "FLOOR measured now");
  cr_assert_not_null(floor, "%s", text);
  cr_assert_eq(
      sscanf(floor, "FLOOR measured now: bf16 GEMM %lf TFLOP/s (8192^3), copy %lf", &tflops, &tbps),
      2, "%s", floor);
  cr_assert_gt(tflops, 1.0, "%s", floor);
  cr_assert_gt(tbps, 0.1, "%s", floor);
  cr_assert_not_null(strstr(text, "FLOOR phase backward"), "%s", text);
  cr_assert_not_null(strstr(text, "FLOOR total"), "%s", text);
  mn_session_stats st;
  cr_assert_eq(mn_session_get_stats(s, &st), MN_OK);
  cr_assert_eq(st.graph_launches, 1u, "profiling launched the step graph");
  cr_assert_eq(mn_session_step(s), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_wait(s), MN_OK, "%s", mn_last_error());
  mn_session_free(s);
  mn_graph_free(g);
}

/* Two products of one input, each with its own loss term: their forward products, their
 * weight gradients and the two loss terms are independent. */
static mn_graph *two_branch_graph(void) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(64, 32));
  mn_node w1 = mn_parameter(g, "w1", MN_SHAPE(32, 48));
  mn_node w2 = mn_parameter(g, "w2", MN_SHAPE(32, 48));
  mn_node t = mn_input(g, "t", MN_SHAPE(64, 48));
  mn_node a = mn_relu(g, mn_matmul(g, x, w1));
  mn_node b = mn_sigmoid(g, mn_matmul(g, x, w2));
  mn_set_outputs(g, (mn_node[]){mn_add(g, mn_mse_loss(g, a, t), mn_mse_loss(g, b, t))}, 1);
  return g;
}

/* streams 0: MN_CUDA_STREAMS unset (the default for a small training step); *overlapped: the
 * step graph's programmatic edges (NULL: not asked). */
static void step_two_branches_with(int streams, size_t *width, size_t *overlapped, float *w1,
                                   float *w2) {
  char value[8];
  snprintf(value, sizeof value, "%d", streams);
  if (streams > 0)
    setenv("MN_CUDA_STREAMS", value, 1);
  else
    unsetenv("MN_CUDA_STREAMS");
  mn_graph *g = two_branch_graph();
  mn_session_options o = mn_session_options_default();
  o.backend = MN_BACKEND_CUDA;
  o.siblings = MN_SIBLINGS_NEVER; /* keep the two products apart */
  mn_session *s = NULL;
  cr_assert_eq(mn_build_session(g, &o, &s), MN_OK, "%s", mn_last_error());
  mn_rng r = mn_rng_new(11);
  float x[64 * 32], t[64 * 48], p[32 * 48];
  mn_rng_fill(&r, x, 64 * 32, -1, 1);
  mn_rng_fill(&r, t, 64 * 48, 0, 1);
  cr_assert_eq(mn_session_set_input(s, "x", x, 64 * 32), MN_OK);
  cr_assert_eq(mn_session_set_input(s, "t", t, 64 * 48), MN_OK);
  mn_rng_fill(&r, p, 32 * 48, -0.3f, 0.3f);
  cr_assert_eq(mn_session_set_parameter(s, "w1", p, 32 * 48), MN_OK);
  mn_rng_fill(&r, p, 32 * 48, -0.3f, 0.3f);
  cr_assert_eq(mn_session_set_parameter(s, "w2", p, 32 * 48), MN_OK);
  cr_assert_eq(mn_session_set_learning_rate(s, 0.5f), MN_OK);
  for (int i = 0; i < 4; i++)
    cr_assert_eq(mn_session_step(s), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_wait(s), MN_OK, "%s", mn_last_error());
  mn_session_stats stats;
  cr_assert_eq(mn_session_get_stats(s, &stats), MN_OK);
  *width = stats.graph_width;
  if (overlapped) *overlapped = stats.graph_overlapped_edges;
  cr_assert_eq(stats.graph_launches, 4u);
  cr_assert_eq(mn_session_read_param(s, "w1", w1, 32 * 48), MN_OK);
  cr_assert_eq(mn_session_read_param(s, "w2", w2, 32 * 48), MN_OK);
  mn_session_free(s);
  mn_graph_free(g);
  unsetenv("MN_CUDA_STREAMS");
}

static void step_two_branches(int streams, size_t *width, float *w1, float *w2) {
  step_two_branches_with(streams, width, NULL, w1, w2);
}

/* A small training step launches its kernels as programmatic dependents of the kernels they
 * follow (sm_90 on): each waits for them first thing, so every weight is the bit it is with
 * plain launches (MN_CUDA_OVERLAP=0). */
Test(cuda_runtime, small_step_kernels_overlap_their_launches_and_change_no_bit) {
  mn_test_require_cuda_device();
  int major = 0;
  cr_assert_eq(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0), cudaSuccess);
  static float plain_w1[32 * 48], plain_w2[32 * 48], w1[32 * 48], w2[32 * 48];
  size_t width = 0, plain_edges = 1, edges = 0;
  setenv("MN_CUDA_OVERLAP", "0", 1);
  step_two_branches_with(0, &width, &plain_edges, plain_w1, plain_w2);
  unsetenv("MN_CUDA_OVERLAP");
  step_two_branches_with(0, &width, &edges, w1, w2);
  cr_assert_eq(plain_edges, 0u, "MN_CUDA_OVERLAP=0 left %zu programmatic edges", plain_edges);
  if (major >= 9)
    cr_assert_geq(edges, 3u, "the small step overlapped %zu launches", edges);
  else
    cr_assert_eq(edges, 0u, "sm_%d0 has no programmatic launches, yet %zu edges", major, edges);
  cr_assert_eq(memcmp(w1, plain_w1, sizeof w1), 0, "w1 differs from the plain launches' w1");
  cr_assert_eq(memcmp(w2, plain_w2, sizeof w2), 0, "w2 differs from the plain launches' w2");
}

/* The step graph holds the plan's data dependencies: the two branches become sibling nodes,
 * and the parameters after four steps are those of the one-chain graph (within the rounding of
 * a reduction that may add in another order). */
Test(cuda_runtime, independent_branches_become_sibling_graph_nodes) {
  mn_test_require_cuda_device();
  static float chain_w1[32 * 48], chain_w2[32 * 48], dag_w1[32 * 48], dag_w2[32 * 48];
  size_t chain_width = 0, dag_width = 0;
  step_two_branches(1, &chain_width, chain_w1, chain_w2);
  step_two_branches(4, &dag_width, dag_w1, dag_w2);
  cr_assert_eq(chain_width, 1u, "MN_CUDA_STREAMS=1 captures one chain, width %zu", chain_width);
  cr_assert_geq(dag_width, 2u, "the branches were not captured as siblings (width %zu)", dag_width);
  /* A step this small (under MN_CU_SMALL_STEP_FLOPS) takes two streams by default. */
  static float small_w1[32 * 48], small_w2[32 * 48];
  size_t small_width = 0;
  step_two_branches(0, &small_width, small_w1, small_w2);
  cr_assert_geq(small_width, 2u, "a small step's default graph has width %zu", small_width);
  for (size_t i = 0; i < 32 * 48; i++) {
    cr_assert_leq(fabsf(small_w1[i] - chain_w1[i]), 1e-6f * fmaxf(1.0f, fabsf(chain_w1[i])),
                  "w1[%zu]: %g vs %g", i, small_w1[i], chain_w1[i]);
    cr_assert_leq(fabsf(small_w2[i] - chain_w2[i]), 1e-6f * fmaxf(1.0f, fabsf(chain_w2[i])),
                  "w2[%zu]: %g vs %g", i, small_w2[i], chain_w2[i]);
  }
  for (size_t i = 0; i < 32 * 48; i++) {
    cr_assert_leq(fabsf(dag_w1[i] - chain_w1[i]), 1e-6f * fmaxf(1.0f, fabsf(chain_w1[i])),
                  "w1[%zu]: %g vs %g", i, dag_w1[i], chain_w1[i]);
    cr_assert_leq(fabsf(dag_w2[i] - chain_w2[i]), 1e-6f * fmaxf(1.0f, fabsf(chain_w2[i])),
                  "w2[%zu]: %g vs %g", i, dag_w2[i], chain_w2[i]);
  }
}

static size_t free_device_bytes(void) {
  size_t free_b = 0, total = 0;
  cr_assert_eq(cudaMemGetInfo(&free_b, &total), cudaSuccess);
  return free_b;
}

Test(cuda_runtime, out_of_device_memory_is_reported_and_leaks_nothing) {
  mn_test_require_cuda_device();
  mn_graph *g = mn_graph_new();
  /* 64 G floats: 256 GB for the parameter alone, more than any GPU has. */
  mn_node x = mn_input(g, "x", MN_SHAPE(1, 65536));
  mn_node w = mn_parameter(g, "w", MN_SHAPE(65536, 1048576));
  mn_node t = mn_input(g, "t", MN_SHAPE(1, 1048576));
  mn_set_outputs(g, (mn_node[]){mn_mse_loss(g, mn_matmul(g, x, w), t)}, 1);
  mn_session_options o = mn_session_options_default();
  o.backend = MN_BACKEND_CUDA;
  mn_session *s = (mn_session *)&o;
  /* A first failed build may leave what the runtime keeps for the process (2 MiB on the
   * two-GPU H100 machines); a second one must leave nothing. */
  mn_assert_error(mn_build_session(g, &o, &s), MN_ERR_OUT_OF_MEMORY, "cuda backend");
  size_t before = free_device_bytes();
  mn_assert_error(mn_build_session(g, &o, &s), MN_ERR_OUT_OF_MEMORY, "cuda backend");
  cr_assert_null(s);
  size_t after = free_device_bytes();
  cr_assert_eq(after, before, "device memory went from %zu to %zu free bytes", before, after);
  mn_graph_free(g);
}

Test(cuda_runtime, building_and_freeing_a_session_100_times_returns_all_device_memory) {
  mn_test_require_cuda_device();
  mn_graph *g = mlp_graph(4, 8, 16, 3);
  /* The first session loads libraries (cuBLASLt, the kernels' module) that stay, and its first
   * step captures a graph, whose runtime resources the process keeps. */
  mn_session *first = mn_test_session(g, MN_BACKEND_CUDA, true);
  cr_assert_eq(mn_session_step(first), MN_OK);
  cr_assert_eq(mn_session_wait(first), MN_OK);
  mn_session_free(first);
  size_t start = free_device_bytes();
  for (int i = 0; i < 100; i++) {
    mn_session *s = mn_test_session(g, MN_BACKEND_CUDA, true);
    cr_assert_eq(mn_session_step(s), MN_OK);
    cr_assert_eq(mn_session_wait(s), MN_OK);
    mn_session_free(s);
  }
  size_t end = free_device_bytes();
  cr_assert_eq(end, start, "free device memory %zu before, %zu after 100 sessions", start, end);
  mn_graph_free(g);
}
#endif
