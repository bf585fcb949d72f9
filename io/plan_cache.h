/* The plan cache behind mn_build_session_cached: the lowered training graph (after optimize,
 * autodiff and toposort) as JSON, keyed by a hash of the user's graph, the options and the
 * library, so that a warm build skips lowering.
 *
 * File layout (one JSON object):
 *   format "meganeura-plan-cache", format_version, library_version,
 *   key       32 hex digits: mn_plan_cache_key of the user graph and options,
 *   checksum  32 hex digits: hash of the lowered graph as deserialized (catches damage that
 *             still parses, such as a changed digit in a shape),
 *   checksum  32 hex digits: hash of the lowered graph as deserialized (catches damage that
 *             still parses, such as a changed digit in a shape), its outputs and param_grads,
 *             and param_sources,
 *   num_user_outputs, outputs [node...], param_grads [[parameter node, output index]...],
 *   param_sources [{name (a parameter of the user graph), param (the derived parameter node
 *           that holds it), offset (its first element there), dtype, shape (its own type)}]:
 *           the table of derived parameters (host/param_layout.h), in param and offset order,
 *   nodes [{op (name from the op table), in [...], dtype, shape [...], attrs {non-zero
 *           fields}, name (inputs, parameters), user_constant (index of the user graph's
 *           constant with the same data) or data [...] (constants made by lowering)}].
 * A derived parameter (a parameter node with attrs variant 1, made by the optimizer out of
 * several of the user's) carries a name of its own for reports, which must be no user leaf's;
 * which of the user's parameters it holds, and where, is param_sources alone. The reader
 * checks each source against the user graph (a parameter of exactly that type, named once in
 * the whole file) and the table against the nodes (mn_param_layout_bind: the sources of each
 * derived parameter tile it).
 * Floats are numbers printed with %.9g (exact for f32); non-finite ones are strings with
 * their bits ("0x7fc00000"), since JSON has no literal for them. */
#ifndef MN_IO_PLAN_CACHE_H
#define MN_IO_PLAN_CACHE_H

#include <stddef.h>

#include "host/plan.h"
#include "io/graph_hash.h"

#define MN_PLAN_CACHE_FORMAT         "meganeura-plan-cache"
#define MN_PLAN_CACHE_FORMAT_VERSION 2

enum {
  /* The fuzzer clears it to reach the validation behind the checksum. */
  MN_PLAN_CACHE_VERIFY_CHECKSUM = 1u << 0,
};

/* Serializes the lowered training plan that was built from `user` with options o into a new
 * NUL-terminated JSON string (free with free()). */
mn_status mn_plan_cache_serialize(const mn_plan *plan, const mn_graph *user,
                                  const mn_session_options *o, char **json);

/* Reads a cache image of len bytes (no NUL needed) for user graph `user` and options o; on
 * success *out is the plan, built with mn_plan_build. Otherwise *out is NULL, `why` (when not
 * NULL) holds the reason, and the status says which kind of miss it is:
 *   MN_ERR_STATE   stale: another graph, other options, another library version;
 *   MN_ERR_FORMAT  corrupt: not JSON, a missing or ill-typed field, a value that fails
 *                  validation, a checksum mismatch;
 *   MN_ERR_OUT_OF_MEMORY.
 * A miss is reported through `why`, not the thread's last error: it is not the caller's
 * failure (only running out of memory sets both). */
mn_status mn_plan_cache_parse(const char *json, size_t len, const mn_graph *user,
                              const mn_session_options *o, unsigned flags, mn_plan **out, char *why,
                              size_t why_size);

/* The checksum stored in a cache file: the lowered graph, the number of user outputs, the
 * parameter -> gradient output pairs (grad_output[i] for parameter node i, -1 for others) and
 * the table of derived parameters (each source's node as given, unbound or bound). */
mn_hash128 mn_plan_cache_checksum(const mn_graph *lowered, size_t num_user_outputs,
                                  const int32_t *grad_output, const mn_param_layout *layout);

#endif
