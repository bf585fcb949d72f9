/* The step graph built from data dependencies (schedule.c): which stream each command of the
 * program is captured on and which earlier commands it waits for (cuda_state.lanes). */
#ifndef MN_CUDA_SCHEDULE_H
#define MN_CUDA_SCHEDULE_H

#include "cuda/cuda_state.h"

#define MN_CU_DEFAULT_STREAMS 1

/* The number of streams a capture spreads the program over: MN_CUDA_STREAMS from the
 * environment (at most MN_CU_MAX_STREAMS), else MN_CU_DEFAULT_STREAMS. One chain is the
 * default because it measured faster: GPT-2 bf16 on an H100, 47.90-47.99 ms against
 * 48.82-48.93 ms with 4 streams (docs/performance.md). */
int mn_cu_schedule_streams(void);

/* Assigns the program's commands to `streams` streams from their conflicts, into st->lanes
 * (the buffers, scratch and staging must be in place: addresses are compared). */
mn_status mn_cu_schedule_build(cuda_state *st, const mn_session *s, int streams);

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

/* The most nodes of `graph` (a cudaGraph_t) at one depth: 1 for a chain. */
size_t mn_cu_graph_width(void *graph);

/* Frees what mn_cu_enqueue_program made. */
void mn_cu_lanes_free(cuda_state *st);

#endif
