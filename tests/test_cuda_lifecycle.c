/* CUDA session lifecycle: building and freeing a training session (a one-block language
 * model with AdamW and clipping, one step each time) 100 times gives back its device memory
 * and its host memory, and sessions of one graph living side by side train alike and can be
 * freed in any order, also while another one's step is in flight.
 *
 * The 100x test asserts on device-wide free memory (cudaMemGetInfo), so ctest runs this
 * suite alone (RUN_SERIAL); it prints what it measured ("LIFECYCLE ..." on stderr). */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include "tests/support/cuda_check.h"
#include "tests/support/mn_test.h"
#include "tests/support/models.h"
#include "tests/support/session_util.h"
#ifdef MN_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

/* The bounds of the 100x test, over 100 builds after two warm-up builds (which load
 * cuBLASLt, the kernels' module and the allocator's arenas, all of which stay). A leak of
 * one 2 MiB device page, or of 168 KiB of host memory per build, fails. */
enum { BUILDS = 100, WARM_UP = 2 };
#define DEVICE_BOUND_BYTES ((size_t)2 << 20)
#define RSS_BOUND_BYTES    ((size_t)16 << 20)

/* A tiny Llama-style model: one block of D 16 (4 query heads over 2 kv heads of 4, SwiGLU
 * 24), vocabulary 37, batch 2 of 16 tokens: every kind of kernel a language model runs
 * (embedding, norms, RoPE, attention, matmuls through cuBLASLt, cross-entropy, AdamW). */
enum { LM_B = 2, LM_T = 16, LM_V = 37 };

static mn_graph *tiny_lm(void) {
  mn_graph *g = mn_test_lm(&mn_test_tiny_block, LM_B, LM_T, LM_V, 1);
  cr_assert_eq(mn_graph_status(g), MN_OK, "%s", mn_graph_error(g));
  return g;
}

static void feed_tokens(mn_session *s, uint64_t seed) {
  mn_rng r = mn_rng_new(seed);
  uint32_t tokens[LM_B * LM_T], labels[LM_B * LM_T];
  mn_rng_fill_u32(&r, tokens, LM_B * LM_T, LM_V);
  mn_rng_fill_u32(&r, labels, LM_B * LM_T, LM_V);
  cr_assert_eq(mn_session_set_input_u32(s, "tokens", tokens, LM_B * LM_T), MN_OK, "%s",
               mn_last_error());
  cr_assert_eq(mn_session_set_input_u32(s, "labels", labels, LM_B * LM_T), MN_OK, "%s",
               mn_last_error());
}

/* A CUDA training session of g with the same weights (seed 5) and optimizer every time. */
static mn_session *build(const mn_graph *g) {
  mn_session *s = mn_test_session(g, MN_BACKEND_CUDA, true);
  mn_rng r = mn_rng_new(5);
  mn_test_init_normal(g, &s, 1, &r, 0.1f, true);
  cr_assert_eq(mn_session_set_adamw(s, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f), MN_OK, "%s",
               mn_last_error());
  cr_assert_eq(mn_session_set_grad_clip(s, 1.0f), MN_OK, "%s", mn_last_error());
  return s;
}

/* One step on batch `seed`; returns its loss. */
static float step(mn_session *s, uint64_t seed) {
  feed_tokens(s, seed);
  cr_assert_eq(mn_session_step(s), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_wait(s), MN_OK, "%s", mn_last_error());
  float loss = mn_session_read_loss(s);
  cr_assert(isfinite(loss), "loss %g", loss);
  return loss;
}

/* Identical sessions of identical data give the same loss; a bound well above the
 * ordering noise of a reduction, well below what a wrong buffer would give. */
static void assert_same_loss(float got, float want, const char *what) {
  double rel = fabs((double)got - want) / fmax(fabs((double)want), 1e-30);
  cr_assert(rel <= 1e-6, "%s: loss %.9g, expected %.9g", what, got, want);
}

#ifdef MN_WITH_CUDA
/* Builds a session, takes one step and frees it; returns the step's loss. */
static float build_step_free(const mn_graph *g) {
  mn_session *s = build(g);
  float loss = step(s, 1);
  mn_session_free(s);
  return loss;
}

static size_t free_device_bytes(void) {
  size_t free_b = 0, total = 0;
  cr_assert_eq(cudaMemGetInfo(&free_b, &total), cudaSuccess);
  return free_b;
}

/* Resident set size from /proc/self/statm (the second field, in pages), after handing
 * freed heap back to the system where the C library can. */
static size_t rss_bytes(void) {
#ifdef __GLIBC__
  malloc_trim(0);
#endif
  FILE *f = fopen("/proc/self/statm", "r");
  cr_assert_not_null(f, "cannot open /proc/self/statm");
  unsigned long size = 0, resident = 0;
  int n = fscanf(f, "%lu %lu", &size, &resident);
  fclose(f);
  cr_assert_eq(n, 2, "cannot read /proc/self/statm");
  return (size_t)resident * (size_t)sysconf(_SC_PAGESIZE);
}

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static double mib(double bytes) { return bytes / (1024.0 * 1024.0); }
#endif

Test(cuda_lifecycle, building_and_freeing_a_training_session_100_times_leaks_no_memory,
     .timeout = 280) {
  mn_test_require_cuda_device();
#ifdef MN_WITH_CUDA
  mn_graph *g = tiny_lm();
  float first = 0;
  for (int i = 0; i < WARM_UP; i++)
    first = build_step_free(g);
  size_t dev_before = free_device_bytes(), rss_before = rss_bytes();
  double t0 = now_ms();
  for (int i = 0; i < BUILDS; i++)
    assert_same_loss(build_step_free(g), first, "a rebuilt session");
  double ms = now_ms() - t0;
  size_t dev_after = free_device_bytes(), rss_after = rss_bytes();
  /* Signed: memory may also come back (free device memory rises, RSS falls). */
  double dev_lost = (double)dev_before - (double)dev_after;
  double rss_grown = (double)rss_after - (double)rss_before;
  fprintf(stderr,
          "LIFECYCLE %d builds (+%d warm-up) of a one-block LM training session with AdamW, "
          "one step each: %.1f ms per build+step+free\n"
          "LIFECYCLE device free memory %.2f MiB -> %.2f MiB: %+.3f MiB used (bound %.0f MiB)\n"
          "LIFECYCLE host RSS %.2f MiB -> %.2f MiB: %+.3f MiB (bound %.0f MiB)\n",
          BUILDS, WARM_UP, ms / BUILDS, mib((double)dev_before), mib((double)dev_after),
          mib(dev_lost), mib((double)DEVICE_BOUND_BYTES), mib((double)rss_before),
          mib((double)rss_after), mib(rss_grown), mib((double)RSS_BOUND_BYTES));
  cr_assert(dev_lost <= (double)DEVICE_BOUND_BYTES,
            "%d builds used %.3f MiB of device memory for good (bound %.0f MiB)", BUILDS,
            mib(dev_lost), mib((double)DEVICE_BOUND_BYTES));
  cr_assert(rss_grown <= (double)RSS_BOUND_BYTES,
            "%d builds grew the host RSS by %.3f MiB (bound %.0f MiB)", BUILDS, mib(rss_grown),
            mib((double)RSS_BOUND_BYTES));
  mn_graph_free(g);
#endif
}

/* Two sessions of one graph never share a buffer: stepped in lockstep (both steps in
 * flight at once) they give the same losses; freeing one while the other's step is in
 * flight leaves the other intact; a session built after a free starts afresh. */
Test(cuda_lifecycle, sessions_side_by_side_train_alike_and_free_in_any_order) {
  mn_test_require_cuda_device();
  mn_graph *g = tiny_lm();
  mn_session *a = build(g), *b = build(g);
  float losses[4] = {0};
  for (int k = 1; k <= 3; k++) {
    feed_tokens(a, (uint64_t)k);
    feed_tokens(b, (uint64_t)k);
    cr_assert_eq(mn_session_step(a), MN_OK, "%s", mn_last_error());
    cr_assert_eq(mn_session_step(b), MN_OK, "%s", mn_last_error());
    cr_assert_eq(mn_session_wait(a), MN_OK, "%s", mn_last_error());
    cr_assert_eq(mn_session_wait(b), MN_OK, "%s", mn_last_error());
    losses[k] = mn_session_read_loss(a);
    cr_assert(isfinite(losses[k]), "loss %g", losses[k]);
    assert_same_loss(mn_session_read_loss(b), losses[k], "the second of two sessions in lockstep");
  }
  /* b's fourth step is in flight while a goes. */
  feed_tokens(b, 4);
  cr_assert_eq(mn_session_step(b), MN_OK, "%s", mn_last_error());
  mn_session_free(a);
  cr_assert_eq(mn_session_wait(b), MN_OK, "%s", mn_last_error());
  float b4 = mn_session_read_loss(b);
  cr_assert(isfinite(b4), "loss %g", b4);
  /* A session built in a's place starts from the initial weights and retraces a's steps,
   * also once b is gone. */
  mn_session *c = build(g);
  assert_same_loss(step(c, 1), losses[1], "step 1 of a session built after a free");
  assert_same_loss(step(c, 2), losses[2], "step 2 of a session built after a free");
  mn_session_free(b);
  assert_same_loss(step(c, 3), losses[3], "step 3, after the other sessions were freed");
  mn_session_free(c);
  mn_graph_free(g);
}
