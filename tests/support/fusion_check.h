/* Fusion test helpers: sessions of one graph built unoptimized, optimized without fusion
 * and fused, fed the same values, and asserted to agree bit for bit. */
#ifndef MN_TEST_FUSION_CHECK_H
#define MN_TEST_FUSION_CHECK_H

#include <stdbool.h>
#include <stdint.h>

#include "host/graph.h"
#include "host/plan.h"

typedef enum mn_fz_mode {
  MN_FZ_UNOPTIMIZED,       /* mn_session_options.optimize false */
  MN_FZ_OPTIMIZED_UNFUSED, /* the optimizer with mn_session_options.fusion off */
  MN_FZ_FUSED,             /* the default build */
  MN_FZ_NUM_MODES
} mn_fz_mode;

/* CPU backend options with the optimizer on or off. */
mn_session_options mn_fz_cpu(bool optimize);

/* A CPU session of g in mode m (training when `training`). */
mn_session *mn_fz_build(const mn_graph *g, mn_fz_mode m, bool training);

/* g lowered with the default (fused) pipeline; mn_plan_free it. */
mn_plan *mn_fz_lower(const mn_graph *g, bool training);

size_t mn_fz_count_op(const mn_graph *g, mn_op op);

/* Inference sessions of every mode from `from` on, fed uniform values in [lo, hi) from
 * `seed`, run once: every output equals the fused session's bit for bit (two NaNs count as
 * equal whatever their payloads). */
void mn_fz_agree_inference(const mn_graph *g, mn_fz_mode from, uint64_t seed, float lo, float hi);

/* Training sessions of every mode from `from` on, fed as above, then `steps` AdamW steps with
 * gradient clipping: after each step the loss, every output, gradient and parameter equal the
 * fused session's bit for bit. */
void mn_fz_agree_training(const mn_graph *g, mn_fz_mode from, int steps, uint64_t seed, float lo,
                          float hi);

#endif
