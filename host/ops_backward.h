/* Ops emitted only by autodiff (gradients of forward ops that are not expressible as
 * a short chain of forward ops). Same row format as MN_FORWARD_OP_LIST in ops.h. */
#ifndef MN_HOST_OPS_BACKWARD_H
#define MN_HOST_OPS_BACKWARD_H

#define MN_BACKWARD_OP_LIST(X)

#endif
