/* Measured algorithm choice for cuBLASLt products. Each unbatched product of at least
 * MN_TUNE_MIN_FLOPS runs every candidate cuBLASLt's heuristic offers for it (up to
 * MN_TUNE_CANDIDATES) a few times at session build and keeps the fastest; smaller products keep
 * the heuristic's first choice. A choice is remembered by the card (name, SM count), the cuBLASLt
 * version and the product (shape, layouts, types, epilogue, alignments, alpha and beta): per
 * process, and in matmul-tune-v1.txt of the kernel cache folder (jit.h), so a later build of the
 * same products on the same kind of card times nothing, and every session and process that
 * finds a choice there runs the same algorithm (the same bits). A remembered algorithm is
 * checked against the product before it is used (cublasLtMatmulAlgoCheck) and timed again when
 * it no longer applies. MN_MATMUL_TUNE=0 keeps the heuristic's first choices;
 * MN_MATMUL_TUNE_CANDIDATES=N asks for N candidates instead of MN_TUNE_CANDIDATES;
 * MN_MATMUL_TUNE=all times every unbatched product, small ones too (their choices are remembered
 * under the same keys, so a later default build keeps them). docs/performance.md has what it
 * measured. */
#ifndef MN_CUDA_MATMUL_TUNE_H
#define MN_CUDA_MATMUL_TUNE_H

#include <stdbool.h>

#include "cuda/cuda_state.h"

#define MN_TUNE_CANDIDATES     8
#define MN_TUNE_MAX_CANDIDATES 32
#define MN_TUNE_MIN_FLOPS      (1e9)

/* The FLOPs of the smallest product timed, from MN_MATMUL_TUNE (read at each call):
 * MN_TUNE_MIN_FLOPS, 0 with "all", INFINITY (none) with "0". */
double mn_cu_tune_min_flops(void);
/* How many of the heuristic's candidates to time: MN_TUNE_CANDIDATES, or MN_MATMUL_TUNE_CANDIDATES
 * (1 .. MN_TUNE_MAX_CANDIDATES) for experiments (read at each call). */
int mn_cu_tune_candidates(void);

/* One run of the product with `algo` on the session stream. */
typedef cublasStatus_t (*mn_cu_tune_run)(void *ctx, const cublasLtMatmulAlgo_t *algo);
/* Whether `algo` applies to the product (cublasLtMatmulAlgoCheck). */
typedef bool (*mn_cu_tune_applies)(void *ctx, const cublasLtMatmulAlgo_t *algo);

/* The algorithm for the product described by `key` into *algo: the one remembered for the key
 * (when it applies), else the fastest of the n candidates (*timed set; *algo kept when none
 * runs), which is then remembered. */
mn_status mn_cu_tune_pick(cuda_state *st, const char *key,
                          const cublasLtMatmulHeuristicResult_t *cand, int n, mn_cu_tune_run run,
                          mn_cu_tune_applies applies, void *ctx, cublasLtMatmulAlgo_t *algo,
                          bool *timed);

/* The card and library part of every key: "<card name>/<SMs>/<cuBLASLt version>". */
void mn_cu_tune_card(int device, char *out, size_t size);

/* Products timed in this process so far. */
size_t mn_cu_tune_timings(void);

/* Forgets what this process remembered, and reads the cache file again on the next pick (for
 * tests of the file). */
void mn_cu_tune_forget(void);

#endif
