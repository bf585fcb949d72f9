/* The graph optimizer's entry point, called twice by the build pipeline: on the
 * forward graph and on the forward+backward graph. */
#ifndef MN_OPTIMIZER_OPTIMIZE_H
#define MN_OPTIMIZER_OPTIMIZE_H

#include "graph.h"

typedef enum mn_optimize_stage { MN_OPTIMIZE_FORWARD, MN_OPTIMIZE_FULL } mn_optimize_stage;

/* Rewrites *g in place or replaces it (freeing the old graph). Keeps every output,
 * every named leaf and their names. With opts->optimize false it changes nothing. */
mn_status mn_optimize_graph(const char *fn, mn_graph **g, const mn_session_options *opts,
                            mn_optimize_stage stage);

#endif
