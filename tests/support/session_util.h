/* Session helpers shared by the training and comparison suites: building a session with
 * default options, seeding every parameter of a graph, and reading or comparing all of them.
 * Each walks the graph's parameters in node order, so every session of one graph sees the
 * same sequence of names and random draws. */
#ifndef MN_TEST_SESSION_UTIL_H
#define MN_TEST_SESSION_UTIL_H

#include <stdbool.h>
#include <stddef.h>

#include "tests/support/mn_test.h"

/* A session of g on `backend` with otherwise default options: a training session when
 * `training`, else an inference one. Fails the test with the library's message on error. */
mn_session *mn_test_session(const mn_graph *g, mn_backend backend, bool training);
/* The same in a given precision (mn_session_options.precision). */
mn_session *mn_test_session_precision(const mn_graph *g, mn_backend backend, mn_precision prec,
                                      bool training);

/* Sets every parameter of g, in each of the n sessions, to std * N(0, 1) drawn from r in node
 * order (the sessions get the same values). With norms_at_one, a parameter whose name contains
 * "norm" is all ones instead and draws nothing. */
void mn_test_init_normal(const mn_graph *g, mn_session *const *sessions, size_t n, mn_rng *r,
                         float std, bool norms_at_one);

/* Sets every parameter of g, and every input too when with_inputs (F32 inputs only), to values
 * uniform in [lo, hi) drawn from r in node order. */
void mn_test_init_uniform(const mn_graph *g, mn_session *s, mn_rng *r, float lo, float hi,
                          bool with_inputs);

/* The number of parameter elements in g. */
size_t mn_test_param_count(const mn_graph *g);

/* One step and its wait, asserted to succeed; returns the loss. */
float mn_test_step_loss(mn_session *s);

/* Every parameter of g read from s, concatenated in node order (mn_test_param_count(g)
 * floats); free() it. */
float *mn_test_read_params(const mn_graph *g, mn_session *s);

/* Asserts that every parameter of g holds the same values in a and b: bit for bit when tol is
 * 0, else ||a - b|| / ||b|| <= tol. A failure names the parameter, followed by `when` (for
 * instance "after resuming"). */
void mn_test_assert_same_params(const mn_graph *g, mn_session *a, mn_session *b, double tol,
                                const char *when);

/* The gradient of parameter `name` (n elements) that one step of s computes, against central
 * differences of the step's loss (steps of +-h) at the `count` elements listed: the relative
 * error ||analytic - numeric|| / ||numeric|| over them. The parameter keeps its values; s should
 * not update (learning rate 0), or its values are restored before each probe anyway. */
double mn_test_fd_gradient_error(mn_session *s, const char *name, size_t n, const size_t *at,
                                 size_t count, double h);

#endif
