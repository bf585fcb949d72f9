/* Timing cuBLASLt's candidates for a product (MN_MATMUL_TUNE=1; off by default). The heuristic's
 * first choice is what a session runs; with the switch, each product of at least
 * MN_TUNE_MIN_FLOPS (one not batched) runs every candidate the heuristic offers (up to
 * MN_TUNE_CANDIDATES) a few times at session build and keeps the fastest. The choice is kept
 * per process, by the product's shape, layouts, types, epilogue and alignments, so every session
 * of a process runs the same algorithm for the same product (two sessions of one graph give the
 * same bits). Timing runs write garbage into the product's output buffer at build, before any
 * step: an activation or gradient that every step writes again. docs/performance.md has what it
 * measured. */
#ifndef MN_CUDA_MATMUL_TUNE_H
#define MN_CUDA_MATMUL_TUNE_H

#include <stdbool.h>

#include "cuda/cuda_state.h"

#define MN_TUNE_CANDIDATES 8
#define MN_TUNE_MIN_FLOPS  (1e9)

/* Whether MN_MATMUL_TUNE=1 (read at each call). */
bool mn_cu_tune_on(void);

/* One run of the product with `algo` on the session stream. */
typedef cublasStatus_t (*mn_cu_tune_run)(void *ctx, const cublasLtMatmulAlgo_t *algo);

/* The fastest of the n candidates into *algo (kept there when none runs), or the one chosen
 * before for the same key in this process. */
mn_status mn_cu_tune_pick(cuda_state *st, const char *key,
                          const cublasLtMatmulHeuristicResult_t *cand, int n, mn_cu_tune_run run,
                          void *ctx, cublasLtMatmulAlgo_t *algo);

#endif
