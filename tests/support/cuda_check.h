/* GPU test helpers: skipping without a device, checking that a graph's kernels compile
 * (NVRTC, no device needed), and running a graph on the CPU and on CUDA with the same
 * random data to compare every output and gradient. */
#ifndef MN_TEST_CUDA_CHECK_H
#define MN_TEST_CUDA_CHECK_H

#include <stdbool.h>
#include <stdint.h>

#include "meganeura.h"

/* Skips the calling Criterion test unless the CUDA backend was built. */
void mn_test_require_cuda_build(void);
/* Skips the calling test with "no CUDA device" unless a device is usable. */
void mn_test_require_cuda_device(void);

/* Lowers g (a training session's graph when `training`, else inference) and compiles
 * every kernel for sm_90 with NVRTC, failing the test with the compiler log. Needs the
 * CUDA build but no device; call mn_test_require_cuda_build first. */
void mn_test_assert_compiles(const mn_graph *g, bool training);
/* The same for one precision (the check above does F32 and BF16). */
void mn_test_assert_compiles_precision(const mn_graph *g, bool training, mn_precision precision);
/* The CUDA source of g's plan in `precision` as a session would compile it (mn_cuda_plan_source;
 * malloc'd), asserting that it lowers; NULL in a build without the CUDA backend. */
char *mn_test_plan_source(const mn_graph *g, bool training, mn_precision precision);
const char *mn_test_precision_name(mn_precision p);

/* Value range of one named leaf: F32 uniform in [lo, hi); U32 integers in [lo, hi).
 * Defaults: inputs F32 [-1, 1), parameters F32 [-0.5, 0.5), U32 [0, 2). */
typedef struct mn_test_range {
  const char *name;
  double lo, hi;
} mn_test_range;

/* Builds g on the CPU and on CUDA (training sessions when `training`, with no
 * optimizer: one step computes outputs and gradients), feeds both the same random
 * inputs and parameters, poisons the CUDA buffers with NaN, runs one step and asserts
 * that every output and every parameter's gradient agree: ||cuda - cpu|| / ||cpu|| <=
 * tol. `ranges` ends with a NULL name (or is NULL). Returns the largest error seen. */
double mn_test_compare_cuda(const mn_graph *g, bool training, double tol,
                            const mn_test_range *ranges, uint64_t seed);
/* The same with the CUDA session's matmuls allowed to use TF32 (allow_tf32). */
double mn_test_compare_cuda_tf32(const mn_graph *g, bool training, double tol,
                                 const mn_test_range *ranges, uint64_t seed);

/* The same in a low-precision session on both backends: the CPU emulates the storage table
 * that the CUDA kernels obey, so they differ only where one rounding went the other way. */
double mn_test_compare_cuda_precision(const mn_graph *g, bool training, mn_precision precision,
                                      double tol, const mn_test_range *ranges, uint64_t seed);
/* The same with the U32 leaf `labels` (a sparse cross-entropy's labels) set to MN_IGNORE_LABEL
 * at each position with probability `ignored`, the same positions in both sessions. */
double mn_test_compare_cuda_ignoring(const mn_graph *g, bool training, mn_precision precision,
                                     double tol, const mn_test_range *ranges, const char *labels,
                                     double ignored, uint64_t seed);
/* Two bf16 units of roundoff (u = 2^-8, docs/precision.md), norm-wise: a stored value that
 * rounds the other way is off by one ulp, at most 2u relative. */
#define MN_TEST_BF16_TOL 0x1p-7
/* Eight units (2^-5), norm-wise, for whole models (layers of products, norms, attention). A
 * rounding that went the other way reaches a parameter's gradient through every op behind it, and
 * the backward ops on that path (layer norm and attention: projections, 15 and 19 u for one op
 * against fp32 in docs/precision.md's per-op table) carry a difference in their inputs on amplified
 * before adding their own, so the 2u of one op compounds over depth: the ln_1.bias gradient of a
 * two-block GPT stack came out 0.00965 (2.5u) apart on an H100. 8u keeps about three times
 * that for other seeds and shapes; a wrong kernel is off by far more (order 1). */
#define MN_TEST_BF16_MODEL_TOL 0x1p-5

/* A U32 input fed exact values (packed positions, say) instead of random ones. */
typedef struct mn_test_u32_values {
  const char *name;
  const uint32_t *values; /* the input's element count */
} mn_test_u32_values;
/* mn_test_compare_cuda_precision with the inputs named in `fixed` (ends with a NULL name, or is
 * NULL) set to their values on both backends. */
double mn_test_compare_cuda_fixed(const mn_graph *g, bool training, mn_precision precision,
                                  double tol, const mn_test_range *ranges,
                                  const mn_test_u32_values *fixed, uint64_t seed);

/* True when this build has the CUDA backend and a device is usable. */
bool mn_test_cuda_device_present(void);

/* The op-suite routine: compiles g's kernels in fp32 and bf16 (no device needed) and, when a
 * device is usable, compares g on both backends at 1e-5, then in bf16 at MN_TEST_BF16_TOL. */
void mn_test_check_cuda(const mn_graph *g, bool training, const mn_test_range *ranges,
                        uint64_t seed);
/* The same for a whole model rather than one op: bf16 at MN_TEST_BF16_MODEL_TOL. */
void mn_test_check_cuda_model(const mn_graph *g, bool training, const mn_test_range *ranges,
                              uint64_t seed);

/* Makes y the subject of a training graph: loss = mse(y * c, t) with inputs c and t of
 * y's shape (c makes the upstream gradient differ per element); outputs loss, then y. */
void mn_test_finish_training_graph(mn_graph *g, mn_node y);

/* f(parameter "a" of the given shape, values in [lo, hi)) through mn_test_check_cuda. */
void mn_test_check_cuda_unary(mn_node (*f)(mn_graph *, mn_node), const int64_t *shape, int rank,
                              double lo, double hi, uint64_t seed);

#endif
