#include "optimize.h"

/* No rewrite rules exist yet (the e-graph optimizer is its own milestone), so both
 * stages return the graph unchanged; the pipeline already calls them where they run. */
mn_status mn_optimize_graph(const char *fn, mn_graph **g, const mn_session_options *opts,
                            mn_optimize_stage stage) {
  (void)fn;
  (void)g;
  (void)opts;
  (void)stage;
  return MN_OK;
}
