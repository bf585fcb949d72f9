/* Small helpers of the optimizer suites (rules, fusion, the report): CPU session options,
 * setting a hand-built graph's outputs, and counting its ops. */
#ifndef MN_TEST_GRAPH_CHECK_H
#define MN_TEST_GRAPH_CHECK_H

#include <stdbool.h>
#include <stddef.h>

#include "host/graph.h"

/* The default options on the CPU backend, with the optimizer on or off. */
mn_session_options mn_test_cpu_options(bool optimize);

/* Sets g's outputs, failing the test if the graph is in error; returns g. */
mn_graph *mn_test_with_outputs(mn_graph *g, const mn_node *outs, size_t n);
#define MN_TEST_OUTPUTS(g, ...)                                                                    \
  mn_test_with_outputs((g), (mn_node[]){__VA_ARGS__},                                              \
                       sizeof((mn_node[]){__VA_ARGS__}) / sizeof(mn_node))

/* The number of nodes of op in g. */
size_t mn_test_count_op(const mn_graph *g, mn_op op);

#endif
