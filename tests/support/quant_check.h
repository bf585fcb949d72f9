/* Shared by the quantized-product suites: random weights packed in a format, and one run of
 * mn_matmul_quant on a backend. */
#ifndef MN_TESTS_SUPPORT_QUANT_CHECK_H
#define MN_TESTS_SUPPORT_QUANT_CHECK_H

#include <stdint.h>

#include "meganeura.h"

typedef struct mn_test_qcase {
  mn_quant format;
  int group;
} mn_test_qcase;
/* Every format, the affine ones with each group size. */
extern const mn_test_qcase mn_test_qcases[];
extern const int mn_test_num_qcases;

/* W [out, in] of N(0, 0.5) values (seeded), packed: *words U32 per row, malloc'd. */
uint32_t *mn_test_qweights(mn_quant q, int group, int64_t out, int64_t in, uint64_t seed,
                           size_t *row_words);
/* x [rows, in] (seeded) times W^T through mn_matmul_quant on the given backend and precision;
 * returns the malloc'd [rows, out], or NULL when the session cannot be built (no device). */
float *mn_test_qproduct(mn_backend b, mn_precision p, mn_quant q, int group, const uint32_t *wq,
                        int64_t rows, int64_t in, int64_t out, uint64_t seed, float **x_out);

#endif
