/* Helpers shared by the test suites: tolerances, seeded random data, running a graph's
 * forward pass on the reference backend, and asserting error statuses and messages. */
#ifndef MN_TEST_H
#define MN_TEST_H

#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "meganeura.h"

/* ||a - b|| / ||b|| (or ||a|| when b is all zeros). NaN anywhere gives +inf. */
double mn_test_rel_err(const float *a, const float *b, size_t n);
double mn_test_max_abs_diff(const float *a, const float *b, size_t n);

/* Deterministic xorshift generator so failures reproduce; seed 0 is replaced by 1. */
typedef struct mn_rng {
  uint64_t state;
} mn_rng;
mn_rng mn_rng_new(uint64_t seed);
double mn_rng_uniform(mn_rng *r); /* [0, 1) */
double mn_rng_normal(mn_rng *r);  /* N(0, 1) */
void mn_rng_fill(mn_rng *r, float *x, size_t n, float lo, float hi);
void mn_rng_fill_u32(mn_rng *r, uint32_t *x, size_t n, uint32_t below);

/* A forward pass on the CPU backend: builds an inference session of g (outputs must be
 * set), feeds `inputs` then runs one step and returns the session for reading, failing
 * the test on any error. Input i is named names[i]; u32 inputs go through u32_data. */
typedef struct mn_test_feed {
  const char *name;
  const float *data;        /* F32 inputs and parameters */
  const uint32_t *u32_data; /* U32 inputs */
  size_t n;
  bool parameter; /* set_parameter instead of set_input */
} mn_test_feed;
mn_session *mn_test_run(const mn_graph *g, const mn_test_feed *feeds, size_t num_feeds);
/* Reads output `index` (n elements) into a fresh malloc'd buffer. */
float *mn_test_read_output(mn_session *s, size_t index, size_t n);

/* Asserts that `st` equals `want` and that mn_last_error() contains `fragment`. */
#define mn_assert_error(st, want, fragment)                                                        \
  do {                                                                                             \
    mn_status mn_st_ = (st);                                                                       \
    cr_assert_eq(mn_st_, (want), "status %s (%d), expected %s; message: %s",                       \
                 mn_status_string(mn_st_), (int)mn_st_, mn_status_string(want), mn_last_error());  \
    cr_assert(strstr(mn_last_error(), (fragment)) != NULL, "message \"%s\" lacks \"%s\"",          \
              mn_last_error(), (fragment));                                                        \
  } while (0)

/* Asserts that the graph is in error with `want` and that its message contains
 * `fragment`. */
#define mn_assert_graph_error(g, want, fragment)                                                   \
  do {                                                                                             \
    cr_assert_eq(mn_graph_status(g), (want), "graph status %s, expected %s; message: %s",          \
                 mn_status_string(mn_graph_status(g)), mn_status_string(want), mn_graph_error(g)); \
    cr_assert(strstr(mn_graph_error(g), (fragment)) != NULL, "message \"%s\" lacks \"%s\"",        \
              mn_graph_error(g), (fragment));                                                      \
  } while (0)

/* Asserts rel_err(got, want) <= tol, printing the first differing element. */
void mn_assert_close_impl(const float *got, const float *want, size_t n, double tol,
                          const char *what);
#define mn_assert_close(got, want, n, tol) mn_assert_close_impl((got), (want), (n), (tol), #got)

#endif
