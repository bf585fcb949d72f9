/* Turning optimizer passes off for A/B runs: MN_OPTIMIZE_OFF lists pass names, comma-separated
 * (attention_qkv, gelu_bgrad, drelu_bgrad, recompute, recompute_gelu_in_gradient; README
 * "Environment"). */
#ifndef MN_OPTIMIZER_PASS_SWITCH_H
#define MN_OPTIMIZER_PASS_SWITCH_H

#include <stdbool.h>

/* Whether MN_OPTIMIZE_OFF names `pass` (a whole item of the list). */
bool mn_optimize_pass_off(const char *pass);

#endif
