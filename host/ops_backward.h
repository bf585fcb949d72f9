/* Ops emitted only by autodiff: gradients that are not a short chain of forward ops.
 * Same row format as MN_FORWARD_OP_LIST in ops.h. "dy" is the upstream gradient.
 * Unless stated, the result has the type of the forward input it is the gradient of,
 * which the emitting VJP rule passes as the node type. */
#ifndef MN_HOST_OPS_BACKWARD_H
#define MN_HOST_OPS_BACKWARD_H

#define MN_BWD (MN_OPF_BACKWARD)

#define MN_BACKWARD_OP_LIST(X)                                                                     \
  /* generic: copy with a new shape (same numel); zeros; row/scalar broadcasts */                  \
  X(RESHAPE, "reshape", 1, MN_BWD)                                                                 \
  X(ZEROS, "zeros", 0, MN_BWD)                                                                     \
  X(SUM_ROWS, "sum_rows", 1, MN_BWD | MN_OPF_REDUCTION) /* [.., N] -> [N] or [1,N] */              \
  X(EXPAND_SCALAR, "expand_scalar", 1, MN_BWD)          /* dy[0] * attrs.scale */                  \
  X(SLICE_LAST_GRAD, "slice_last_grad", 1, MN_BWD)      /* dy into zeros of x's type at start */   \
  /* element-wise: (forward input or output, dy) */                                                \
  X(RELU_GRAD, "relu_grad", 2, MN_BWD | MN_OPF_POINTWISE)       /* (x, dy) */                      \
  X(SIGMOID_GRAD, "sigmoid_grad", 2, MN_BWD | MN_OPF_POINTWISE) /* (y, dy) */                      \
  X(TANH_GRAD, "tanh_grad", 2, MN_BWD | MN_OPF_POINTWISE)       /* (y, dy) */                      \
  X(ABS_GRAD, "abs_grad", 2, MN_BWD | MN_OPF_POINTWISE)         /* (x, dy) */                      \
  X(SILU_GRAD, "silu_grad", 2, MN_BWD | MN_OPF_POINTWISE)       /* (x, dy) */                      \
  X(GELU_GRAD, "gelu_grad", 2, MN_BWD | MN_OPF_POINTWISE)       /* (x, dy) */                      \
  /* reductions and losses */                                                                      \
  X(SOFTMAX_GRAD, "softmax_grad", 2, MN_BWD | MN_OPF_REDUCTION)         /* (y, dy) */              \
  X(LOG_SOFTMAX_GRAD, "log_softmax_grad", 2, MN_BWD | MN_OPF_REDUCTION) /* (y, dy) */              \
  X(CROSS_ENTROPY_GRAD, "cross_entropy_grad", 3, MN_BWD)                /* (logits, t, dy[1]) */   \
  X(SPARSE_CROSS_ENTROPY_GRAD, "sparse_cross_entropy_grad", 3, MN_BWD)  /* (logits, labels, dy) */ \
  X(BCE_GRAD, "bce_grad", 3, MN_BWD) /* (p, t, dy); variant 0: d pred, 1: d target */              \
  X(MSE_GRAD, "mse_grad", 3, MN_BWD) /* (p, t, dy) -> d pred */                                    \
  X(L1_GRAD, "l1_grad", 3, MN_BWD)   /* (p, t, dy) -> d pred */                                    \
  /* transformer */                                                                                \
  X(SWIGLU_GRAD_GATE, "swiglu_grad_gate", 3, MN_BWD | MN_OPF_POINTWISE) /* (gate, up, dy) */       \
  X(RMS_NORM_GRAD_X, "rms_norm_grad_x", 3, MN_BWD)                      /* (x, w, dy) */           \
  X(RMS_NORM_GRAD_W, "rms_norm_grad_w", 2, MN_BWD)                      /* (x, dy) -> [N] */       \
  X(LAYER_NORM_GRAD_X, "layer_norm_grad_x", 3, MN_BWD)                  /* (x, w, dy) */           \
  X(LAYER_NORM_GRAD_W, "layer_norm_grad_w", 2, MN_BWD)                  /* (x, dy) -> [N] */       \
  X(ROPE_GRAD, "rope_grad", 1, MN_BWD)                 /* (dy): the inverse rotation */            \
  X(ROPE_DYNAMIC_GRAD, "rope_dynamic_grad", 2, MN_BWD) /* (dy, offset) */                          \
  /* attention: (q, k, v, dy); variant 1 when causal */                                            \
  X(ATTENTION_GRAD_Q, "attention_grad_q", 4, MN_BWD)                                               \
  X(ATTENTION_GRAD_K, "attention_grad_k", 4, MN_BWD)                                               \
  X(ATTENTION_GRAD_V, "attention_grad_v", 4, MN_BWD)                                               \
  /* dK and dV of one pass, packed per row: [.., S, 2 * KVH * hd] = [dK row | dV row] */            \
  X(ATTENTION_GRAD_KV, "attention_grad_kv", 4, MN_BWD)                                             \
  /* vision */                                                                                     \
  X(CONV2D_GRAD_INPUT, "conv2d_grad_input", 2, MN_BWD)   /* (dy, kernel) -> [N,Ci,H,W] */          \
  X(CONV2D_GRAD_KERNEL, "conv2d_grad_kernel", 2, MN_BWD) /* (x, dy) -> [Co,Ci,kh,kw] */            \
  X(GROUP_NORM_GRAD_X, "group_norm_grad_x", 3, MN_BWD)   /* (x, w, dy) */                          \
  X(GROUP_NORM_GRAD_W, "group_norm_grad_w", 2, MN_BWD)   /* (x, dy) -> [C] */                      \
  X(SUM_PER_CHANNEL, "sum_per_channel", 1, MN_BWD | MN_OPF_REDUCTION) /* [N,C,H,W] -> [C] */       \
  X(DOWNSAMPLE_SUM_2X, "downsample_sum_2x", 1, MN_BWD)                /* [N,C,2H,2W] -> [N,C,H,W] */

#endif
