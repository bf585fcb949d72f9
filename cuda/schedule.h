/* The step graph built from data dependencies (schedule.c): which stream each command of the
 * program is captured on and which earlier commands it waits for (cuda_state.lanes). */
#ifndef MN_CUDA_SCHEDULE_H
#define MN_CUDA_SCHEDULE_H

#include "cuda/cuda_state.h"

#define MN_CU_DEFAULT_STREAMS 1
/* A small training step (emit.h MN_CU_SMALL_STEP_FLOPS) takes this many: the MLP
 * 784-512-512-10 TF32 step went from 0.0617 to 0.0584 ms with two streams and the Llama block
 * step from 1.29 to 1.25 ms, while GPT-2 bf16 (14 TFLOP) went from 32.90 to 33.45 ms (one
 * H100, 2026-11-28). */
#define MN_CU_SMALL_STEP_STREAMS 2

/* The number of streams a capture of s spreads the program over: MN_CUDA_STREAMS from the
 * environment (at most MN_CU_MAX_STREAMS); else MN_CU_SMALL_STEP_STREAMS for a small training
 * step (above); else MN_CU_DEFAULT_STREAMS. One chain is the default because it measured
 * faster for large steps: GPT-2 bf16 on an H100, 47.90-47.99 ms against 48.82-48.93 ms with 4
 * streams (docs/performance.md). */
int mn_cu_schedule_streams(const cuda_state *st, const mn_session *s);

/* Assigns the program's commands to `streams` streams from their conflicts, into st->lanes
 * (the buffers, scratch and staging must be in place: addresses are compared). */
mn_status mn_cu_schedule_build(cuda_state *st, const mn_session *s, int streams);

/* 1 + the last command of the program (skipped ones left out) that touches any of the n byte
 * ranges [lo[r], hi[r]) of the device, or, with `errors`, may report into the error record;
 * 0 when none does. */
size_t mn_cu_schedule_last_touch(const cuda_state *st, const mn_session *s, const uintptr_t *lo,
                                 const uintptr_t *hi, int n, bool errors);

/* Before a capture (nothing may be allocated while one runs): the schedule, and the streams,
 * events and cuBLASLt workspaces it needs. */
mn_status mn_cu_lanes_prepare(cuda_state *st, const mn_session *s);

/* What runs after command i is enqueued (st->stream is the session's stream again). */
typedef mn_status (*mn_cu_after_cmd)(cuda_state *st, const mn_session *s, size_t i);

/* Enqueues every command of the program during a capture on st->stream: forks the other
 * streams from it, makes each command wait for its dependencies on other streams, and joins
 * them back, so the captured graph has an edge only where the data needs one. `after` (may be
 * NULL) is called after each command, skipped ones included. */
mn_status mn_cu_enqueue_program(cuda_state *st, const mn_session *s, mn_cu_after_cmd after);

/* Makes `target` wait for every command enqueued so far: the work on st->stream (through
 * `ev`) and, while the program is being enqueued, the last command of every other stream. */
mn_status mn_cu_lanes_wait_all(cuda_state *st, cudaEvent_t ev, cudaStream_t target);

/* The most nodes of `graph` (a cudaGraph_t) at one depth: 1 for a chain; *programmatic: its
 * programmatic (overlapping launch) edges. */
size_t mn_cu_graph_width(void *graph, size_t *programmatic);

/* Frees what mn_cu_enqueue_program made. */
void mn_cu_lanes_free(cuda_state *st);

#endif
