/* Gradient checks against central finite differences on the reference backend.
 *
 * Each F32 leaf becomes a parameter p multiplied by a random positive constant, so the
 * op under test reads a computed value (it sits mid-graph), and its output y enters the
 * loss as sum(y * R) with R random: a VJP that drops or mis-scales its upstream
 * gradient fails. The analytic gradient (mn_session_read_grad) is compared with
 * (L(p + h) - L(p - h)) / 2h, differences formed in double. */
#ifndef MN_TEST_GRADCHECK_H
#define MN_TEST_GRADCHECK_H

#include "tests/support/mn_test.h"

typedef struct mn_gc_leaf {
  const char *name;
  int rank;
  int64_t shape[MN_MAX_RANK];
  float lo, hi;              /* F32: values of the op's input drawn from [lo, hi] */
  float min_abs;             /* F32: redraw values closer than this to 0 (kinks of relu, abs) */
  bool u32;                  /* an mn_input_u32 leaf (indices, labels, offsets): no gradient */
  uint32_t below;            /* U32: values drawn from [0, below) */
  const uint32_t *fixed_u32; /* U32: exact values instead of random ones */
} mn_gc_leaf;

/* Leaf specs by shape: an F32 leaf drawn from [lo, hi], a U32 leaf with fixed values, and U32
 * labels drawn from [0, below). */
#define MN_GC_LEAF(nm, lo_, hi_, ...)                                                              \
  {                                                                                                \
    .name = nm, .rank = (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)),                 \
    .shape = {__VA_ARGS__}, .lo = lo_, .hi = hi_                                                   \
  }
#define MN_GC_U32_LEAF(nm, values, ...)                                                            \
  {                                                                                                \
    .name = nm, .rank = (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)),                 \
    .shape = {__VA_ARGS__}, .u32 = true, .fixed_u32 = values                                       \
  }
#define MN_GC_LABELS(nm, below_, ...)                                                              \
  {                                                                                                \
    .name = nm, .rank = (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)),                 \
    .shape = {__VA_ARGS__}, .u32 = true, .below = below_                                           \
  }

/* Builds the expression under test from the leaves' nodes (in leaf order); returns
 * its output node. */
typedef mn_node (*mn_gc_build)(mn_graph *g, const mn_node *leaves, void *user);

typedef struct mn_gc_options {
  double h;   /* finite-difference step (default 1e-3) */
  double tol; /* max relative error ||ad - fd|| / ||fd|| (default 2e-3) */
  uint64_t seed;
  size_t max_probes; /* elements probed per leaf (default: all, up to 64) */
} mn_gc_options;

/* The element count of a leaf, and one value drawn for it (uniform in [lo, hi], redrawn
 * while closer than min_abs to 0); shared with the precision checks. */
size_t mn_gc_leaf_numel(const mn_gc_leaf *l);
float mn_gc_leaf_draw(mn_rng *r, const mn_gc_leaf *l);

/* The graph of a check: each F32 leaf is a parameter times a constant in [0.5, 1.5] (so the
 * op reads a computed tensor), each U32 leaf an input; y = build(...) and loss = sum(y * R)
 * with R uniform in [r_lo, r_hi]; no outputs are set. params[i] gets the parameter values
 * (malloc'd; NULL for U32 leaves). Draws from rng in leaf order, then R. */
mn_graph *mn_gc_graph(const char *what, const mn_gc_leaf *leaves, int num_leaves, mn_gc_build build,
                      void *user, mn_rng *rng, float r_lo, float r_hi, float **params, mn_node *y,
                      mn_node *loss);

/* Runs the check and fails the Criterion test on a mismatch, naming the leaf, its
 * worst element and the relative error. Returns the worst relative error seen. */
double mn_gradcheck(const char *what, const mn_gc_leaf *leaves, int num_leaves, mn_gc_build build,
                    void *user, const mn_gc_options *opts);

#endif
