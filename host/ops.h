/* The op table: every op named once. Builders, shape rules, the reference backend,
 * autodiff, code generation and reports all index by mn_op.
 *
 * X(ENUM, "printable name", number of inputs, flags)
 *   number of inputs: -1 only for leaves that take none but carry data;
 *     MN_ARITY_VARIADIC: 1 to MN_FUSED_MAX_INPUTS (fused, whose program says how many).
 *   flags: MN_OPF_* below. */
#ifndef MN_HOST_OPS_H
#define MN_HOST_OPS_H

enum {
  MN_OPF_LEAF = 1 << 0,      /* input, parameter or constant: no kernel */
  MN_OPF_POINTWISE = 1 << 1, /* out[i] depends only on inputs[i] (same shapes) */
  MN_OPF_REDUCTION = 1 << 2, /* reduces over one or more axes */
  MN_OPF_DIFF = 1 << 3,      /* has a VJP rule (gradients flow through it) */
  MN_OPF_LOSS = 1 << 4,      /* scalar [1] mean loss */
  MN_OPF_INPLACE = 1 << 5,   /* writes into the buffer of its second input */
  MN_OPF_BACKWARD = 1 << 6,  /* appears only in graphs produced by autodiff */
  /* Writes values besides its own: value k >= 1 goes to the buffer of the extra_output node
   * of attrs.variant k that reads it (mn_node_num_extra_outputs in graph.h says how many). */
  MN_OPF_MULTI_OUTPUT = 1 << 7,
  MN_OPF_EXTRA_OUTPUT = 1 << 8, /* extra_output: a value its input writes; no kernel of its own */
  /* May write its value (for a multi-output op, its extra value 1) over input 0 when nothing
   * reads that input after it and the two have the same size and layout (host/memplan.c): its
   * kernels read each element of input 0 before they write that element, and nothing else. */
  MN_OPF_MAY_OVERWRITE = 1 << 9,
  /* Reads the session's micro-step counter besides its inputs (dropout's mask, host/pointwise.h):
   * not a function of its inputs alone, so never folded to a constant. */
  MN_OPF_RANDOM = 1 << 10,
};

#define MN_ARITY_VARIADIC (-2)

#define MN_FORWARD_OP_LIST(X)                                                                      \
  X(INPUT, "input", 0, MN_OPF_LEAF)                                                                \
  X(PARAMETER, "parameter", 0, MN_OPF_LEAF)                                                        \
  X(CONSTANT, "constant", 0, MN_OPF_LEAF)                                                          \
  /* matrix products; attrs.scale, when not 0, multiplies the result (optimizer/scale_fold.h) */   \
  X(MATMUL, "matmul", 2, MN_OPF_DIFF)                                                              \
  X(MATMUL_AT, "matmul_at", 2, MN_OPF_DIFF)                                                        \
  X(MATMUL_BT, "matmul_bt", 2, MN_OPF_DIFF)                                                        \
  X(ADD, "add", 2, MN_OPF_POINTWISE | MN_OPF_DIFF)                                                 \
  X(MUL, "mul", 2, MN_OPF_POINTWISE | MN_OPF_DIFF)                                                 \
  X(DIV, "div", 2, MN_OPF_POINTWISE | MN_OPF_DIFF)                                                 \
  X(GREATER, "greater", 2, MN_OPF_POINTWISE)                                                       \
  X(BIAS_ADD, "bias_add", 2, MN_OPF_DIFF)                                                          \
  X(BROADCAST_ADD, "broadcast_add", 2, MN_OPF_DIFF)                                                \
  X(SCALE, "scale", 1, MN_OPF_POINTWISE | MN_OPF_DIFF)                                             \
  X(RELU, "relu", 1, MN_OPF_POINTWISE | MN_OPF_DIFF)                                               \
  X(SIGMOID, "sigmoid", 1, MN_OPF_POINTWISE | MN_OPF_DIFF)                                         \
  X(TANH, "tanh", 1, MN_OPF_POINTWISE | MN_OPF_DIFF)                                               \
  X(NEG, "neg", 1, MN_OPF_POINTWISE | MN_OPF_DIFF)                                                 \
  X(ABS, "abs", 1, MN_OPF_POINTWISE | MN_OPF_DIFF)                                                 \
  X(LOG, "log", 1, MN_OPF_POINTWISE | MN_OPF_DIFF)                                                 \
  X(EXP, "exp", 1, MN_OPF_POINTWISE | MN_OPF_DIFF)                                                 \
  X(RECIP, "recip", 1, MN_OPF_POINTWISE | MN_OPF_DIFF)                                             \
  X(SILU, "silu", 1, MN_OPF_POINTWISE | MN_OPF_DIFF)                                               \
  X(GELU, "gelu", 1, MN_OPF_POINTWISE | MN_OPF_DIFF)                                               \
  /* p in attrs.scale, the mask's seed in attrs.seed. Not MN_OPF_POINTWISE: its value depends */   \
  /* on the element's index and the step, which the element functions of fused programs       */   \
  /* (host/pointwise.h rows) do not see, so it runs as a kernel of its own                    */   \
  X(DROPOUT, "dropout", 1, MN_OPF_DIFF | MN_OPF_RANDOM)                                            \
  X(SUM_ALL, "sum_all", 1, MN_OPF_REDUCTION | MN_OPF_DIFF)                                         \
  X(MEAN_ALL, "mean_all", 1, MN_OPF_REDUCTION | MN_OPF_DIFF)                                       \
  X(SOFTMAX, "softmax", 1, MN_OPF_REDUCTION | MN_OPF_DIFF)                                         \
  X(LOG_SOFTMAX, "log_softmax", 1, MN_OPF_REDUCTION | MN_OPF_DIFF)                                 \
  X(CROSS_ENTROPY_LOSS, "cross_entropy_loss", 2, MN_OPF_REDUCTION | MN_OPF_DIFF | MN_OPF_LOSS)     \
  X(SPARSE_CROSS_ENTROPY_LOSS, "sparse_cross_entropy_loss", 2,                                     \
    MN_OPF_REDUCTION | MN_OPF_DIFF | MN_OPF_LOSS)                                                  \
  X(BCE_LOSS, "bce_loss", 2, MN_OPF_REDUCTION | MN_OPF_DIFF | MN_OPF_LOSS)                         \
  X(MSE_LOSS, "mse_loss", 2, MN_OPF_REDUCTION | MN_OPF_DIFF | MN_OPF_LOSS)                         \
  X(L1_LOSS, "l1_loss", 2, MN_OPF_REDUCTION | MN_OPF_DIFF | MN_OPF_LOSS)                           \
  X(SWIGLU, "swiglu", 2, MN_OPF_POINTWISE | MN_OPF_DIFF)                                           \
  X(RMS_NORM, "rms_norm", 2, MN_OPF_REDUCTION | MN_OPF_DIFF)                                       \
  X(LAYER_NORM, "layer_norm", 3, MN_OPF_REDUCTION | MN_OPF_DIFF)                                   \
  X(ROPE, "rope", 1, MN_OPF_DIFF)                                                                  \
  X(ROPE_DYNAMIC, "rope_dynamic_offset", 2, MN_OPF_DIFF)                                           \
  X(ROPE_POSITIONS, "rope_positions", 2, MN_OPF_DIFF) /* (x, positions U32 [B, T] or [T]) */       \
  /* attention: (q, k, v); variant 1 (set by optimizer/attention_stats.c) also writes the      */  \
  /* row statistics as extra value 1: F32 [2, B * H * T], base-2 row maxima then 1 / sums       */ \
  X(CAUSAL_ATTENTION, "causal_attention", 3, MN_OPF_DIFF)                                          \
  X(FULL_ATTENTION, "full_attention", 3, MN_OPF_DIFF)                                              \
  X(CROSS_ATTENTION, "cross_attention", 3, MN_OPF_DIFF)                                            \
  /* (q, k, v, positions U32 [B, T] or [T]): causal within the packed examples that positions */   \
  /* delimit (meganeura.h); variant 1 as above                                                 */  \
  X(CAUSAL_ATTENTION_PACKED, "causal_attention_packed", 4, MN_OPF_DIFF)                            \
  /* (qkv): causal_attention of the column blocks q | k | v of each row of qkv               */    \
  /* [.., T, (H + 2 KVH) hd]; made by optimizer/attention_qkv.c, variant 1 as above          */    \
  X(QKV_CAUSAL_ATTENTION, "qkv_causal_attention", 1, 0)                                            \
  X(EMBEDDING, "embedding", 2, MN_OPF_DIFF)                                                        \
  X(SCATTER_ADD, "scatter_add", 2, MN_OPF_DIFF)                                                    \
  X(CONV2D, "conv2d", 2, MN_OPF_DIFF)                                                              \
  X(GROUP_NORM, "group_norm", 3, MN_OPF_REDUCTION | MN_OPF_DIFF)                                   \
  X(CONCAT, "concat", 2, MN_OPF_DIFF)                                                              \
  X(SPLIT_A, "split_a", 1, MN_OPF_DIFF)                                                            \
  X(SPLIT_B, "split_b", 1, MN_OPF_DIFF)                                                            \
  X(SLICE_LAST, "slice_last", 1, MN_OPF_DIFF)                                                      \
  X(UPSAMPLE_2X, "upsample_2x", 1, MN_OPF_DIFF)                                                    \
  X(ADD_PER_CHANNEL, "add_per_channel", 2, MN_OPF_DIFF)                                            \
  X(CACHE_WRITE, "cache_write", 3, MN_OPF_INPLACE)                                                 \
  X(CACHED_ATTENTION, "cached_attention", 4, 0)                                                    \
  X(SAMPLE, "sample", 3, 0) /* (logits, params F32 [3], key U32 [3]) -> ids U32 [B] */             \
  /* a group of pointwise ops as one kernel (optimizer/fusion.h); only the optimizer's       */    \
  /* full stage makes it, after autodiff, so it needs no VJP rule                            */    \
  X(FUSED, "fused", MN_ARITY_VARIADIC, MN_OPF_POINTWISE)                                           \
  /* matrix products with a cuBLASLt epilogue, made by the optimizer's full stage; variant */      \
  /* picks op(b): 0 b, 1 b transposed (as matmul_bt)                                       */      \
  X(MATMUL_BIAS_ACT, "matmul_bias_act", 3, 0) /* act(a op(b) + bias[N]), act: attrs.act */         \
  X(MATMUL_DGELU, "matmul_dgelu", 3, 0)       /* (a, b, pre): gelu_grad(pre, a op(b)) */           \
  X(MATMUL_DRELU, "matmul_drelu", 3, 0)       /* (a, b, x): relu_grad(x, a op(b)) */               \
  /* a^T b, and as value 1 the column sums of a (variant 0) or of b (variant 1): the bias    */    \
  /* gradient that cuBLASLt's BGRAD epilogues reduce while reading that operand             */     \
  X(MATMUL_AT_BGRAD, "matmul_at_bgrad", 2, MN_OPF_MULTI_OUTPUT)                                    \
  /* gelu_grad(x, dy), and as value 1 its column sums (of the value as stored): the          */    \
  /* bias gradient of the product that fed the GELU, summed while the gradient is made; with */    \
  /* variant 1 also gelu(x) as value 2 (the recomputed activation, optimizer/recompute.h)    */    \
  X(GELU_GRAD_BGRAD, "gelu_grad_bgrad", 2, MN_OPF_MULTI_OUTPUT)                                    \
  /* (a, b, x): relu_grad(x, a op(b)) as matmul_drelu, and as value 1 its column sums (of the */   \
  /* value as stored): the bias gradient of the layer whose ReLU this is                   */      \
  X(MATMUL_DRELU_BGRAD, "matmul_drelu_bgrad", 3, MN_OPF_MULTI_OUTPUT)                              \
  X(EXTRA_OUTPUT, "extra_output", 1, MN_OPF_EXTRA_OUTPUT) /* value attrs.variant of input 0 */

/* Ops emitted only by autodiff: gradients that are not a short chain of forward ops.
 * "dy" is the upstream gradient. Unless stated, the result has the type of the forward
 * input it is the gradient of, which the emitting VJP rule passes as the node type. */
#define MN_BWD (MN_OPF_BACKWARD)

#define MN_BACKWARD_OP_LIST(X)                                                                     \
  /* generic: copy with a new shape (same numel); zeros; row/scalar broadcasts */                  \
  X(RESHAPE, "reshape", 1, MN_BWD)                                                                 \
  X(ZEROS, "zeros", 0, MN_BWD)                                                                     \
  X(SUM_ROWS, "sum_rows", 1, MN_BWD | MN_OPF_REDUCTION) /* [.., N] -> [N] or [1,N] */              \
  X(EXPAND_SCALAR, "expand_scalar", 1, MN_BWD)          /* dy[0] * attrs.scale */                  \
  X(SLICE_LAST_GRAD, "slice_last_grad", 1, MN_BWD)      /* dy into zeros of x's type at start */   \
  X(DROPOUT_GRAD, "dropout_grad", 1, MN_BWD | MN_OPF_RANDOM) /* (dy): its forward's mask again */  \
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
  X(SPARSE_CROSS_ENTROPY_GRAD, "sparse_cross_entropy_grad", 3,                                     \
    MN_BWD | MN_OPF_MAY_OVERWRITE) /* (logits, labels, dy): the logits' gradient over them */      \
  /* (logits, labels, dy): the loss, and as value 1 its gradient, from one pass over the logits */ \
  /* (optimizer/loss_grad.c); the gradient may overwrite the logits */                             \
  X(SPARSE_CROSS_ENTROPY_LOSS_GRAD, "sparse_cross_entropy_loss_grad", 3,                           \
    MN_BWD | MN_OPF_REDUCTION | MN_OPF_LOSS | MN_OPF_MULTI_OUTPUT | MN_OPF_MAY_OVERWRITE)          \
  X(BCE_GRAD, "bce_grad", 3, MN_BWD) /* (p, t, dy); variant 0: d pred, 1: d target */              \
  X(MSE_GRAD, "mse_grad", 3, MN_BWD) /* (p, t, dy) -> d pred */                                    \
  X(L1_GRAD, "l1_grad", 3, MN_BWD)   /* (p, t, dy) -> d pred */                                    \
  /* transformer */                                                                                \
  X(SWIGLU_GRAD_GATE, "swiglu_grad_gate", 3, MN_BWD | MN_OPF_POINTWISE) /* (gate, up, dy) */       \
  X(RMS_NORM_GRAD_X, "rms_norm_grad_x", 3, MN_BWD)                      /* (x, w, dy) */           \
  X(RMS_NORM_GRAD_W, "rms_norm_grad_w", 2, MN_BWD)                      /* (x, dy) -> [N] */       \
  X(LAYER_NORM_GRAD_X, "layer_norm_grad_x", 3, MN_BWD)                  /* (x, w, dy) */           \
  X(LAYER_NORM_GRAD_W, "layer_norm_grad_w", 2, MN_BWD)                  /* (x, dy) -> [N] */       \
  X(ROPE_GRAD, "rope_grad", 1, MN_BWD)                     /* (dy): the inverse rotation */        \
  X(ROPE_DYNAMIC_GRAD, "rope_dynamic_grad", 2, MN_BWD)     /* (dy, offset) */                      \
  X(ROPE_POSITIONS_GRAD, "rope_positions_grad", 2, MN_BWD) /* (dy, positions) */                   \
  /* attention: (q, k, v, dy); variant 1 when causal */                                            \
  X(ATTENTION_GRAD_Q, "attention_grad_q", 4, MN_BWD)                                               \
  X(ATTENTION_GRAD_K, "attention_grad_k", 4, MN_BWD)                                               \
  X(ATTENTION_GRAD_V, "attention_grad_v", 4, MN_BWD)                                               \
  /* dK and dV of one pass, packed per row: [.., S, 2 * KVH * hd] = [dK row | dV row] */           \
  X(ATTENTION_GRAD_KV, "attention_grad_kv", 4, MN_BWD)                                             \
  /* dQ, and packed dK | dV, from (q, k, v, dy, y, stats): y the forward's output and stats its */ \
  /* row statistics (its extra value 1, graph.h), made by optimizer/attention_stats.c: no       */ \
  /* statistics pre-pass, and delta = dy . y per query row                                      */ \
  X(ATTENTION_GRAD_Q_SAVED, "attention_grad_q_saved", 6, MN_BWD)                                   \
  X(ATTENTION_GRAD_KV_SAVED, "attention_grad_kv_saved", 6, MN_BWD)                                 \
  /* the same six for causal_attention_packed, with its positions as one more input, last:    */   \
  /* (q, k, v, dy, positions) and (q, k, v, dy, y, stats, positions)                           */  \
  X(PACKED_ATTENTION_GRAD_Q, "packed_attention_grad_q", 5, MN_BWD)                                 \
  X(PACKED_ATTENTION_GRAD_K, "packed_attention_grad_k", 5, MN_BWD)                                 \
  X(PACKED_ATTENTION_GRAD_V, "packed_attention_grad_v", 5, MN_BWD)                                 \
  X(PACKED_ATTENTION_GRAD_KV, "packed_attention_grad_kv", 5, MN_BWD)                               \
  X(PACKED_ATTENTION_GRAD_Q_SAVED, "packed_attention_grad_q_saved", 7, MN_BWD)                     \
  X(PACKED_ATTENTION_GRAD_KV_SAVED, "packed_attention_grad_kv_saved", 7, MN_BWD)                   \
  /* (qkv, dy, y, stats) of a qkv_causal_attention: dQ | dK | dV in qkv's layout             */    \
  X(QKV_ATTENTION_GRAD_SAVED, "qkv_attention_grad_saved", 4, MN_BWD)                               \
  /* vision */                                                                                     \
  X(CONV2D_GRAD_INPUT, "conv2d_grad_input", 2, MN_BWD)   /* (dy, kernel) -> [N,Ci,H,W] */          \
  X(CONV2D_GRAD_KERNEL, "conv2d_grad_kernel", 2, MN_BWD) /* (x, dy) -> [Co,Ci,kh,kw] */            \
  X(GROUP_NORM_GRAD_X, "group_norm_grad_x", 3, MN_BWD)   /* (x, w, dy) */                          \
  X(GROUP_NORM_GRAD_W, "group_norm_grad_w", 2, MN_BWD)   /* (x, dy) -> [C] */                      \
  X(SUM_PER_CHANNEL, "sum_per_channel", 1, MN_BWD | MN_OPF_REDUCTION) /* [N,C,H,W] -> [C] */       \
  X(DOWNSAMPLE_SUM_2X, "downsample_sum_2x", 1, MN_BWD) /* [N,C,2H,2W] -> [N,C,H,W] */              \
  /* (x, wq U32): x W^T with W quantized (host/quant.h), format in attrs.variant, the affine */    \
  /* group size in attrs.groups; inference only, so no VJP rule                              */    \
  X(MATMUL_QUANT, "matmul_quant", 2, 0)

/* State a graph launched again and again advances on the device (the generator's decode loop,
 * models/decode.c): in-place writes to U32 inputs. Each is ordered after every reader of the
 * value it overwrites through its inputs alone, since the optimizer keeps no other order. */
#define MN_STATE_OP_LIST(X)                                                                        \
  /* (src U32, dst U32, row U32 [1]): src into row (row mod R) of dst as R rows of src    */       \
  X(STORE_ROW_U32, "store_row_u32", 3, MN_OPF_INPLACE)                                             \
  /* (after, counter U32): elements attrs.pos_offset .. of counter (flat) plus 1; after is    */   \
  /* read by nothing but the order                                                              */ \
  X(INCREMENT_U32, "increment_u32", 2, MN_OPF_INPLACE)

/* Whole layers at decode time, one op each, so that a backend can run a layer in a few fused
 * kernels instead of a dozen small ones (host/decode_layer.h). Inference only: no VJP rule. */
#define MN_DECODE_OP_LIST(X)                                                                       \
  /* (x, input_layernorm, q, k, v, o, post_attention_layernorm, gate, up, down, k_cache,      */   \
  /*  v_cache, pos, kv_len): a Llama decoder layer for one token a sequence, writing row pos */    \
  /*  of both caches and attending rows 0 .. kv_len - 1                                       */   \
  X(LLAMA_DECODE_LAYER, "llama_decode_layer", 14, 0)

#define MN_OP_LIST(X)                                                                              \
  MN_FORWARD_OP_LIST(X) MN_BACKWARD_OP_LIST(X) MN_STATE_OP_LIST(X) MN_DECODE_OP_LIST(X)

typedef enum mn_op {
#define MN_OP_ENUM(e, name, arity, flags) MN_OP_##e,
  MN_OP_LIST(MN_OP_ENUM)
#undef MN_OP_ENUM
      MN_OP_COUNT
} mn_op;

typedef struct mn_op_desc {
  const char *name;
  int arity;
  unsigned flags;
} mn_op_desc;

extern const mn_op_desc mn_op_table[MN_OP_COUNT];

static inline const char *mn_op_name(mn_op op) {
  return (unsigned)op < MN_OP_COUNT ? mn_op_table[op].name : "?";
}
static inline unsigned mn_op_flags(mn_op op) {
  return (unsigned)op < MN_OP_COUNT ? mn_op_table[op].flags : 0u;
}

#endif
