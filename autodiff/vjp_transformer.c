/* VJP rules of the transformer ops are registered by this area's owner; until then the ops have
 * no rule, and building a training session through them reports that. */
#include "autodiff.h"

void mn_vjp_register_transformer(mn_vjp_rule *rules) { (void)rules; }
