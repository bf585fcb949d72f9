/* VJP rules of the attention ops are registered by this area's owner; until then the ops have
 * no rule, and building a training session through them reports that. */
#include "autodiff.h"

void mn_vjp_register_attention(mn_vjp_rule *rules) { (void)rules; }
