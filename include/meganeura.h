/* meganeura: a training framework for NVIDIA GPUs with a C host API.
 *
 * A model is described once as a graph of nodes; a session built from it runs the
 * forward pass (and, for training sessions, the backward pass and the optimizer
 * update) as one submission per step. The contract of every name below is in
 * API.md; this header is its C form. */
#ifndef MEGANEURA_H
#define MEGANEURA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define MN_API
#else
#define MN_API __attribute__((visibility("default")))
#endif

#define MN_VERSION_MAJOR  0
#define MN_VERSION_MINOR  1
#define MN_VERSION_PATCH  0
#define MN_VERSION_STRING "0.1.0"
MN_API const char *mn_version(void);

/* ---------------------------------------------------------------- types */

typedef uint32_t mn_node;
#define MN_NO_NODE  ((mn_node)UINT32_MAX)
#define MN_MAX_RANK 6
/* A label that mn_sparse_cross_entropy_loss does not count: -100 as a uint32, the
 * ignore_index that PyTorch's cross-entropy and transformers' labels use (e.g. for the prompt
 * tokens of an instruction example, so that only the completion is trained). */
#define MN_IGNORE_LABEL 0xFFFFFF9Cu

/* A shape literal and its rank, for the (shape, rank) argument pairs:
 * mn_input(g, "x", MN_SHAPE(32, 784)). */
#define MN_SHAPE(...)                                                                              \
  ((const int64_t[]){__VA_ARGS__}),                                                                \
      ((int)(sizeof((const int64_t[]){__VA_ARGS__}) / sizeof(int64_t)))

typedef enum mn_dtype { MN_F32, MN_U32, MN_BF16, MN_F16 } mn_dtype;
MN_API size_t mn_dtype_size(mn_dtype dt);

typedef struct mn_tensor_type {
  mn_dtype dtype;
  int rank;
  int64_t shape[MN_MAX_RANK];
} mn_tensor_type;
MN_API int64_t mn_tensor_type_numel(const mn_tensor_type *t);
MN_API size_t mn_tensor_type_bytes(const mn_tensor_type *t);

typedef enum mn_status {
  MN_OK = 0,
  MN_ERR_INVALID_ARGUMENT,
  MN_ERR_SHAPE,
  MN_ERR_NOT_FOUND,
  MN_ERR_IO,
  MN_ERR_FORMAT,
  MN_ERR_UNSUPPORTED,
  MN_ERR_OUT_OF_MEMORY,
  MN_ERR_DEVICE,
  MN_ERR_STATE
} mn_status;
MN_API const char *mn_status_string(mn_status s);
/* The message of the last failure on the calling thread ("" when none yet). */
MN_API const char *mn_last_error(void);

/* ---------------------------------------------------------------- graph */

typedef struct mn_graph mn_graph;
MN_API mn_graph *mn_graph_new(void);
MN_API void mn_graph_free(mn_graph *g);
MN_API mn_status mn_graph_status(const mn_graph *g);
MN_API const char *mn_graph_error(const mn_graph *g);

/* leaves: names are non-empty and unique among inputs and parameters; a name starting with
 * '#' is the library's (its own leaves use such names) and is refused. */
MN_API mn_node mn_input(mn_graph *g, const char *name, const int64_t *shape, int rank);
MN_API mn_node mn_input_u32(mn_graph *g, const char *name, const int64_t *shape, int rank);
MN_API mn_node mn_parameter(mn_graph *g, const char *name, const int64_t *shape, int rank);
MN_API mn_node mn_constant(mn_graph *g, const float *data, const int64_t *shape, int rank);
MN_API mn_node mn_scalar(mn_graph *g, float value);

/* matrix products: a [.., M, K] rows flattened; b 2-D */
MN_API mn_node mn_matmul(mn_graph *g, mn_node a, mn_node b);
MN_API mn_node mn_matmul_at(mn_graph *g, mn_node a, mn_node b);
MN_API mn_node mn_matmul_bt(mn_graph *g, mn_node a, mn_node b);

/* element-wise, identical shapes unless named otherwise */
MN_API mn_node mn_add(mn_graph *g, mn_node a, mn_node b);
MN_API mn_node mn_mul(mn_graph *g, mn_node a, mn_node b);
MN_API mn_node mn_div(mn_graph *g, mn_node a, mn_node b);
MN_API mn_node mn_greater(mn_graph *g, mn_node a, mn_node b);
MN_API mn_node mn_bias_add(mn_graph *g, mn_node x, mn_node bias);
MN_API mn_node mn_broadcast_add(mn_graph *g, mn_node x, mn_node row);
MN_API mn_node mn_scale(mn_graph *g, mn_node x, float s);
MN_API mn_node mn_relu(mn_graph *g, mn_node x);
MN_API mn_node mn_sigmoid(mn_graph *g, mn_node x);
MN_API mn_node mn_tanh(mn_graph *g, mn_node x);
MN_API mn_node mn_neg(mn_graph *g, mn_node x);
MN_API mn_node mn_abs(mn_graph *g, mn_node x);
MN_API mn_node mn_log(mn_graph *g, mn_node x);
MN_API mn_node mn_exp(mn_graph *g, mn_node x);
MN_API mn_node mn_recip(mn_graph *g, mn_node x);
MN_API mn_node mn_silu(mn_graph *g, mn_node x);
MN_API mn_node mn_gelu(mn_graph *g, mn_node x);
/* Inverted dropout, p in [0, 1): in a training session (mn_build_session) each element is
 * zeroed with probability p and the kept ones are scaled by 1 / (1 - p), with a fresh mask
 * every micro-step (every mn_session_step, grad-accumulation steps included); in an inference
 * session it is the identity. The mask is a pure function of the node, the micro-step and the
 * element, so the CPU and CUDA backends draw the same one and a run resumed from a checkpoint
 * draws the masks the uninterrupted run would. p == 0 returns x itself (no node); p outside
 * [0, 1) is MN_ERR_INVALID_ARGUMENT. */
MN_API mn_node mn_dropout(mn_graph *g, mn_node x, float p);

/* reductions */
MN_API mn_node mn_sum_all(mn_graph *g, mn_node x);
MN_API mn_node mn_mean_all(mn_graph *g, mn_node x);
MN_API mn_node mn_softmax(mn_graph *g, mn_node x);
MN_API mn_node mn_log_softmax(mn_graph *g, mn_node x);

/* losses, each -> [1] */
MN_API mn_node mn_cross_entropy_loss(mn_graph *g, mn_node logits, mn_node target_probs);
/* logits [.., C], labels U32 [..] (logits' shape without C; [1] for logits [C]): the mean over
 * the counted rows of -log_softmax(logits)[label]. A row whose label is MN_IGNORE_LABEL counts
 * for nothing, as PyTorch's F.cross_entropy(..., ignore_index=-100, reduction='mean') has it:
 * the mean divides by the number of the other rows, and the logits' gradient is zero on the
 * ignored rows and (softmax - onehot(label)) / count on the counted ones. Any other label >= C,
 * or a batch in which every label is MN_IGNORE_LABEL (a mean over no rows), fails the step, the
 * forward or the evaluation with MN_ERR_INVALID_ARGUMENT. */
MN_API mn_node mn_sparse_cross_entropy_loss(mn_graph *g, mn_node logits, mn_node labels);
MN_API mn_node mn_bce_loss(mn_graph *g, mn_node pred, mn_node target);
MN_API mn_node mn_mse_loss(mn_graph *g, mn_node pred, mn_node target);
MN_API mn_node mn_l1_loss(mn_graph *g, mn_node pred, mn_node target);

/* transformer; activations are [T, D] or [B, T, D]; positions count within T */
MN_API mn_node mn_swiglu(mn_graph *g, mn_node gate, mn_node up);
MN_API mn_node mn_rms_norm(mn_graph *g, mn_node x, mn_node weight, float eps);
MN_API mn_node mn_layer_norm(mn_graph *g, mn_node x, mn_node weight, mn_node bias, float eps);
MN_API mn_node mn_rope(mn_graph *g, mn_node x, float theta, int head_dim);
MN_API mn_node mn_rope_with_offset(mn_graph *g, mn_node x, float theta, int pos_offset,
                                   int head_dim);
MN_API mn_node mn_rope_dynamic_offset(mn_graph *g, mn_node x, float theta, mn_node offset_u32,
                                      int head_dim);
/* mn_rope (rotate-half) of x [T, D] or [B, T, D] with token t rotated by the angles of
 * position positions[t] instead of t: positions_u32 is U32 [T] or [B, T] (x's shape without
 * its last dim), e.g. the per-example positions of packed sequences (mn_causal_attention_packed).
 * positions gets no gradient. */
MN_API mn_node mn_rope_positions(mn_graph *g, mn_node x, float theta, mn_node positions_u32,
                                 int head_dim);
MN_API mn_node mn_causal_attention(mn_graph *g, mn_node q, mn_node k, mn_node v, int num_heads,
                                   int num_kv_heads, int head_dim);
/* Packed sequences (several examples in one window of T tokens, as HF's
 * DataCollatorWithFlattening and flash-attn's varlen make them): positions_u32 is U32 [B, T]
 * ([T] for rank-2 activations) holding t minus the index of the first token of t's example, so
 * it restarts at 0 where each example starts. Query t sees key s iff s <= t and
 * s >= t - positions[t]; positions 0 .. T-1 in a row is mn_causal_attention's masking. q
 * [B, T, H*hd], k and v [B, T, KVH*hd] (or all rank 2) as for mn_causal_attention (grouped
 * query heads included); the result has q's shape. positions gets no gradient. */
MN_API mn_node mn_causal_attention_packed(mn_graph *g, mn_node q, mn_node k, mn_node v,
                                          mn_node positions_u32, int num_heads, int num_kv_heads,
                                          int head_dim);
MN_API mn_node mn_full_attention(mn_graph *g, mn_node q, mn_node k, mn_node v, int num_heads,
                                 int num_kv_heads, int head_dim);
MN_API mn_node mn_cross_attention(mn_graph *g, mn_node q, mn_node k, mn_node v, int num_heads,
                                  int num_kv_heads, int head_dim);
MN_API mn_node mn_multi_head_attn(mn_graph *g, mn_node q, mn_node k, mn_node v, int num_heads,
                                  int num_kv_heads, int head_dim, bool is_cross);
MN_API mn_node mn_embedding(mn_graph *g, mn_node indices_u32, mn_node table);
MN_API mn_node mn_scatter_add(mn_graph *g, mn_node indices_u32, mn_node src, int64_t num_rows);

/* vision: real 4-D NCHW tensors */
MN_API mn_node mn_conv2d(mn_graph *g, mn_node x, mn_node kernel, int stride, int padding);
MN_API mn_node mn_group_norm(mn_graph *g, mn_node x, mn_node weight, mn_node bias, int groups,
                             float eps);
MN_API mn_node mn_concat(mn_graph *g, mn_node a, mn_node b);
MN_API mn_node mn_split_a(mn_graph *g, mn_node x, int channels_a);
MN_API mn_node mn_split_b(mn_graph *g, mn_node x, int channels_a);
MN_API mn_node mn_upsample_2x(mn_graph *g, mn_node x);
MN_API mn_node mn_add_per_channel(mn_graph *g, mn_node x, mn_node bias);

/* layout: columns [start, start + len) of the last axis, x [.., N] -> [.., len]
 * (e.g. q, k and v out of GPT-2's fused c_attn output [B, T, 3D]) */
MN_API mn_node mn_slice_last(mn_graph *g, mn_node x, int64_t start, int64_t len);

/* KV cache (inference). A cache is an mn_input [S, D] (one sequence) or [B, S, D] (B
 * sequences decoded together); kv_pos and kv_len are U32 [1], the same for every sequence.
 * mn_cache_write writes new_kv [B, D] or [B, P, D] (B = 1 for an [S, D] cache) into rows
 * kv_pos .. kv_pos+P-1 of each sequence in place; mn_cached_attention attends q [B, H*hd] or
 * [B, P, H*hd] to each sequence's caches, causally: with kv_len the rows known after the
 * write, query row r sees rows 0 .. kv_len-P+r (P = 1: rows 0 .. kv_len-1), so a prompt of P
 * tokens (a prefill) runs as one pass (grouped query heads as mn_causal_attention). kv_pos + P
 * past the cache, or kv_len outside P .. S, fails the step. */
MN_API mn_node mn_cache_write(mn_graph *g, mn_node new_kv, mn_node cache, mn_node kv_pos_u32);
MN_API mn_node mn_cached_attention(mn_graph *g, mn_node q, mn_node k_cache, mn_node v_cache,
                                   mn_node kv_len_u32, int num_heads, int num_kv_heads,
                                   int head_dim);
/* One token id per row of logits [B, V] or [B, 1, V], drawn on the device: ids U32 [B].
 * params F32 [3] = (temperature, top_k, top_p); key U32 [3] = (seed low 32 bits, seed high 32
 * bits, position). Temperature <= 0 or top_k 1 is the argmax (the lowest index among equal
 * maxima). Otherwise the weights exp((l - max) / temperature) of the top_k largest logits
 * (0: all; ties at the k-th value kept), then of the smallest set of the largest ones whose
 * weight reaches top_p of their sum (top_p >= 1: all), are sampled from with u uniform in
 * [0, 1): the first id, in index order, whose running weight passes u times the kept sum. u is a
 * counter-based hash of (seed, position, row) (docs/generation.md), so both backends draw the
 * same u, and the same seed gives the same tokens. */
MN_API mn_node mn_sample(mn_graph *g, mn_node logits, mn_node params, mn_node key_u32);
/* Decode state (inference), for a graph launched once per token whose position, cache length,
 * sampling key and next input advance on the device. Both write in place into a U32 mn_input
 * (or the result of one of these ops on it), which keeps the new values for the next step, and
 * return it. mn_store_row_u32 writes src into row (row mod R) of dst seen as R rows of src's
 * size (e.g. ids [B] into input_ids [B, 1], R = 1, or into a ring [R, B]); mn_increment_u32 adds 1
 * to elements first .. N-1 of counter (N elements in index order). The graph keeps no
 * order but its data: give each write, through src or `after`, a dependency on everything that
 * reads the value it overwrites (e.g. the sampled ids, which come after the whole model), and
 * make the last write an output so that it runs. */
MN_API mn_node mn_store_row_u32(mn_graph *g, mn_node src, mn_node dst, mn_node row_u32);
MN_API mn_node mn_increment_u32(mn_graph *g, mn_node after, mn_node counter, int64_t first);

/* Whether parameter `param` is trained (the default). A frozen parameter (trainable false) gets
 * no gradient buffer, no optimizer state and no update, and the backward computes only what the
 * trainable parameters need; mn_session_read_grad gives zeros for it, and its values are read,
 * written, loaded and saved as any parameter's; a checkpoint holds optimizer state for the
 * trainable ones only, so mn_session_load_checkpoint needs a session with the same parameters
 * frozen (MN_ERR_NOT_FOUND names the first state that differs). Call before building sessions of g.
 * A node that is not a parameter is MN_ERR_INVALID_ARGUMENT, recorded as the graph's sticky error.
 */
MN_API void mn_set_trainable(mn_graph *g, mn_node param, bool trainable);

/* outputs and inspection */
MN_API void mn_set_outputs(mn_graph *g, const mn_node *outputs, size_t n);
MN_API size_t mn_graph_outputs(const mn_graph *g, const mn_node **outputs);
MN_API size_t mn_graph_num_nodes(const mn_graph *g);
typedef struct mn_node_info {
  mn_node id;
  const char *op;
  const char *name; /* inputs and parameters, else NULL */
  const mn_node *inputs;
  int num_inputs;
  mn_tensor_type type;
} mn_node_info;
MN_API mn_status mn_graph_node(const mn_graph *g, mn_node id, mn_node_info *out);
MN_API mn_graph *mn_graph_toposort(const mn_graph *g);

/* ---------------------------------------------------------------- session */

typedef enum mn_backend { MN_BACKEND_AUTO, MN_BACKEND_CUDA, MN_BACKEND_CPU } mn_backend;
/* Pointwise fusion, the optimizer's last pass (with optimize on): OFF keeps every pointwise
 * op its own dispatch, for comparing an optimized graph with and without fusion (the rewrite
 * rules change rounding, so the optimizer off is not always a bitwise baseline). */
typedef enum mn_fusion_mode {
  MN_FUSION_AUTO = 0, /* fuse every group the cost model prices cheaper (default) */
  MN_FUSION_OFF,
} mn_fusion_mode;
/* Sibling matmuls (with optimize on): products of one input with several nn.Linear weights
 * become one product with a weight the optimizer concatenates from theirs; users still name
 * each weight by its own name. */
typedef enum mn_siblings_mode {
  MN_SIBLINGS_AUTO = 0, /* groups that the cost model prices cheaper (default) */
  MN_SIBLINGS_ALWAYS,   /* every group the rules allow */
  MN_SIBLINGS_NEVER,
} mn_siblings_mode;
/* How a session computes; the graph does not change. F32: every value fp32 (matmuls may use
 * TF32 with allow_tf32). BF16 / F16: mixed precision as PyTorch autocast and llm.c: values
 * the step computes (activations, their gradients) are stored in bf16 / fp16 and matmuls
 * read low-precision operands (parameters through a rounded copy) and accumulate in fp32;
 * parameters (master weights), their gradients, optimizer state, inputs, constants, losses
 * and scalars stay fp32. An output stored in low precision reads back exactly as stored.
 * One table (host/storage.h) decides which value is stored how, for every backend; the CPU
 * backend rounds (to nearest even) wherever a low-precision value is stored. */
typedef enum mn_precision {
  MN_PRECISION_F32 = 0,
  MN_PRECISION_BF16,
  MN_PRECISION_F16,
} mn_precision;
/* Zero-initialized fields other than optimize give the defaults; a value outside an enum is
 * MN_ERR_INVALID_ARGUMENT naming the field. fusion, siblings and precision are part of the
 * plan-cache key. */
typedef struct mn_session_options {
  mn_backend backend; /* AUTO: CUDA when a device is usable, else CPU; env MN_BACKEND overrides */
  int device;         /* CUDA device ordinal */
  bool allow_tf32;    /* matmuls may use TF32 tensor cores */
  bool optimize;      /* run the graph optimizer (default true) */
  mn_fusion_mode fusion;     /* default MN_FUSION_AUTO */
  mn_siblings_mode siblings; /* default MN_SIBLINGS_AUTO */
  mn_precision precision;    /* default MN_PRECISION_F32 */
  /* Data parallelism (docs/distributed.md): with group set, the session is rank `rank` of
   * `world_size` ranks (which must be the group's size) that each step on their own batch and
   * update as one: the update uses the mean of the ranks' gradients and
   * mn_session_read_loss the mean of their losses. zero1 shards the optimizer state (ZeRO
   * stage 1). Every rank builds its session of the same graph with the same options at the
   * same time; a world size or graph that differs between ranks is refused by every rank
   * (MN_ERR_INVALID_ARGUMENT). The first step makes every rank's trained parameters rank 0's
   * (as PyTorch DDP does); frozen ones, the optimizer and its settings must be set alike on
   * every rank. After an update mn_session_read_grad gives the mean over ranks (with zero1,
   * in the rank's shard only). A CPU session joins an in-process group (mn_group_new_local), a
   * CUDA session an NCCL group (mn_group_new_nccl) on its device; any other pairing is
   * MN_ERR_UNSUPPORTED (naming libnccl.so.2 when NCCL is missing). In F16 the ranks skip
   * together every step whose gradients overflow on any rank, so they keep one loss scale. NULL
   * group: a plain session (rank, world_size, zero1 unused). */
  struct mn_group *group;
  int rank, world_size;
  bool zero1;
} mn_session_options;
MN_API mn_session_options mn_session_options_default(void);

typedef struct mn_session mn_session;
typedef struct mn_plan mn_plan;
typedef struct mn_optimize_report mn_optimize_report;

/* opts may be NULL for the defaults */
MN_API mn_status mn_build_session(const mn_graph *g, const mn_session_options *opts,
                                  mn_session **out);
MN_API mn_status mn_build_inference_session(const mn_graph *g, const mn_session_options *opts,
                                            mn_session **out);
/* An inference session of g that reads its parameters where `owner` (a session of any graph
 * with parameters of the same names and types) keeps them: it sees every update of the owner
 * with no copy and, on CUDA, no new capture, e.g. for evaluating held-out loss during
 * training. It runs on the owner's backend and device; writing a parameter through it writes
 * the owner's. The two take turns: step, read or write it only while the owner has no step in
 * flight (after mn_session_wait), and step the owner only after waiting for it; free it before
 * the owner. MN_ERR_NOT_FOUND or MN_ERR_SHAPE name a parameter the owner
 * lacks or holds in another shape. */
MN_API mn_status mn_build_inference_session_shared(const mn_graph *g,
                                                   const mn_session_options *opts,
                                                   mn_session *owner, mn_session **out);
MN_API mn_status mn_build_session_cached(const mn_graph *g, const char *cache_path,
                                         const mn_session_options *opts, mn_session **out);
MN_API mn_status mn_build_session_with_report(const mn_graph *g, const mn_session_options *opts,
                                              mn_session **out, mn_optimize_report **report);
MN_API void mn_session_free(mn_session *s);

MN_API mn_status mn_session_set_input(mn_session *s, const char *name, const float *data, size_t n);
MN_API mn_status mn_session_set_input_u32(mn_session *s, const char *name, const uint32_t *data,
                                          size_t n);
MN_API mn_status mn_session_set_parameter(mn_session *s, const char *name, const float *data,
                                          size_t n);
MN_API mn_status mn_session_read_param(mn_session *s, const char *name, float *out, size_t n);
MN_API mn_status mn_session_read_grad(mn_session *s, const char *name, float *out, size_t n);

MN_API mn_status mn_session_set_learning_rate(mn_session *s, float lr);
MN_API mn_status mn_session_set_adam(mn_session *s, float lr, float beta1, float beta2, float eps);
MN_API mn_status mn_session_set_adamw(mn_session *s, float lr, float beta1, float beta2, float eps,
                                      float weight_decay);
MN_API mn_status mn_session_set_grad_clip(mn_session *s, float max_global_norm);
/* Gradient accumulation: with k > 1 each step adds its gradients to a running sum and every
 * k-th step applies one update with their mean (clipping, when set, clips that mean), so k
 * steps of batch B update as one step of batch k*B does; the steps in between leave the
 * parameters and optimizer state alone. k = 1, the default, updates every step; setting k
 * starts a new round (a partial sum is dropped). read_grad gives the last step's gradient, or
 * after an updating step the mean it applied. On CUDA it stays one graph launch per step.
 * MN_ERR_INVALID_ARGUMENT for k < 1, MN_ERR_STATE for an inference session. */
MN_API mn_status mn_session_set_grad_accumulation(mn_session *s, int k);

MN_API mn_status mn_session_step(mn_session *s);
MN_API mn_status mn_session_wait(mn_session *s);
MN_API float mn_session_read_loss(mn_session *s);
MN_API size_t mn_session_num_outputs(const mn_session *s);
MN_API mn_status mn_session_read_output_by_index(mn_session *s, size_t index, float *out, size_t n);

MN_API const mn_plan *mn_session_plan(const mn_session *s);
MN_API size_t mn_plan_num_dispatches(const mn_plan *p);
MN_API size_t mn_plan_num_buffers(const mn_plan *p);

typedef struct mn_memory_summary {
  size_t total_buffer_bytes, adam_state_bytes, num_buffers, largest_buffer_bytes;
} mn_memory_summary;
MN_API mn_memory_summary mn_session_memory_summary(const mn_session *s);
/* "4 buffers, 12.3 MB total (8.2 MB adam state), largest 4.1 MB" (MB = 10^6 bytes);
 * returns snprintf's count. */
MN_API int mn_memory_summary_format(const mn_memory_summary *m, char *buf, size_t size);

/* What a session did: proves one device launch per step and reports build costs. */
typedef struct mn_session_stats {
  const char *backend;     /* "cpu" or "cuda" */
  uint64_t steps;          /* mn_session_step calls that submitted work */
  uint64_t graph_launches; /* CUDA graph launches (0 on the CPU) */
  uint64_t submissions;    /* every device submission made by steps, launches included */
  size_t kernels;          /* distinct compiled kernels */
  size_t graph_nodes;      /* nodes of the captured step graph */
  /* The most nodes of the step graph at one depth (longest path from its start): 1 for a
   * chain, the default. With MN_CUDA_STREAMS=N (2..8) in the environment the capture spreads
   * the program over N streams, each command waiting only for the earlier ones whose memory it
   * reads or overwrites, so independent commands (q/k/v products, a weight gradient beside
   * its input gradient) become siblings that may run at once and this is above 1. */
  size_t graph_width;
  /* Edges of the step graph along which a kernel is launched before the kernel it follows has
   * ended (programmatic dependent launch, sm_90 and later): in a small training step every
   * kernel of ours that follows only kernels starts this way and waits for them first thing.
   * 0 with MN_CUDA_OVERLAP=0 in the environment, on older cards, and on the CPU. */
  size_t graph_overlapped_edges;
  uint64_t graph_captures;     /* captures of the step graph: 1 unless the optimizer kind changed */
  bool kernel_cache_hit;       /* the kernels came from the disk cache: nothing compiled */
  double build_ms, compile_ms; /* backend creation, and the NVRTC part of it */
  /* F16 training sessions (0 otherwise): the dynamic loss scale the next step seeds the loss
   * gradient with, and the steps whose gradients overflowed and updated nothing. The scale
   * starts at 65536, halves on such a step and doubles after 2000 finite steps in a row, as
   * PyTorch's GradScaler. */
  float loss_scale;
  uint64_t skipped_steps;
} mn_session_stats;
MN_API mn_status mn_session_get_stats(const mn_session *s, mn_session_stats *out);

/* ---------------------------------------------------------------- data parallelism */

/* A data-parallel group: the ranks whose sessions reduce their gradients together (set
 * mn_session_options.group). Every collective the sessions make waits for the other ranks at
 * most timeout_s seconds (<= 0: 300); a rank that never joins or stops stepping makes the
 * others fail with MN_ERR_STATE naming the missing ranks, and the group stays broken. Steps
 * and checkpoint saves are collective: every rank calls them, in the same order. */
typedef struct mn_group mn_group;
/* world_size ranks in this process, one thread each with its own session, for the CPU backend
 * (a CUDA session of it is MN_ERR_UNSUPPORTED: CUDA ranks use mn_group_new_nccl).
 * world_size < 1: MN_ERR_INVALID_ARGUMENT. */
MN_API mn_status mn_group_new_local(int world_size, double timeout_s, mn_group **out);
/* Breaks the group on behalf of a rank that cannot go on: every collective waiting or yet to
 * come fails at once with MN_ERR_STATE naming why, instead of waiting for the timeout. */
MN_API void mn_group_abort(mn_group *g, const char *why);
/* Frees the group once every session of it has been freed. */
MN_API void mn_group_free(mn_group *g);

/* Where this process sits in a job started by a launcher, read from its environment:
 * torchrun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), srun (SLURM_PROCID,
 * SLURM_NTASKS, SLURM_LOCALID) or mpirun (OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE,
 * OMPI_COMM_WORLD_LOCAL_RANK), first found in that order. MN_ERR_NOT_FOUND when none is set,
 * MN_ERR_INVALID_ARGUMENT naming the variable for a value that is not a number or a rank
 * outside [0, world_size). master_addr is empty and master_port 0 when not given. */
typedef struct mn_launch_env {
  const char *launcher; /* "torchrun", "slurm" or "mpi" */
  int rank, world_size, local_rank;
  char master_addr[256];
  int master_port;
} mn_launch_env;
MN_API mn_status mn_launch_env_read(mn_launch_env *out);

/* The id every rank of an NCCL group passes to create it (ncclUniqueId's 128 bytes). NCCL is
 * loaded at run time (libnccl.so.2, or the path in MN_NCCL_LIBRARY): without it this is
 * MN_ERR_UNSUPPORTED naming the library. */
typedef struct mn_group_id {
  unsigned char bytes[128];
} mn_group_id;
MN_API mn_status mn_group_id_new(mn_group_id *out);
/* Shares an id through a file on a file system every rank sees: rank 0 writes *id to path
 * (whole or not at all: a temporary file renamed), the others wait for it at most timeout_s
 * seconds (<= 0: 300) and read it into *id. MN_ERR_IO naming the path on failure, MN_ERR_STATE
 * on the timeout. */
MN_API mn_status mn_group_id_share_file(const char *path, int rank, double timeout_s,
                                        mn_group_id *id);
/* Shares an id the way torchrun's TCP store does: rank 0 listens on master_port (all
 * interfaces) and sends *id to each of the world_size - 1 other ranks, which connect to
 * master_addr:master_port (retrying until rank 0 listens) and read it into *id. Every rank
 * returns within timeout_s seconds (<= 0: 300): MN_ERR_STATE naming the ranks or the address
 * that did not answer, MN_ERR_IO for a name that does not resolve or a port in use,
 * MN_ERR_INVALID_ARGUMENT when a rank connects twice or the world sizes differ (each peer
 * tells rank 0 its rank and world size first). world_size 1 returns at once. */
MN_API mn_status mn_group_id_share_tcp(const char *master_addr, int master_port, int rank,
                                       int world_size, double timeout_s, mn_group_id *id);
/* One rank of an NCCL group, one process (or thread) per GPU: every rank calls it at the same
 * time with the same id, world_size, its own rank and the CUDA device its session will use
 * (mn_session_options.device must be the same). A rank that does not join within timeout_s
 * seconds (<= 0: 300) makes the others fail with MN_ERR_STATE, and a collective that does
 * not finish within it aborts the communicator (a watchdog, as PyTorch's), so a dead rank is
 * an error, not a hang. MN_ERR_UNSUPPORTED when NCCL cannot be loaded or the library was
 * built without CUDA; MN_ERR_INVALID_ARGUMENT for a rank outside [0, world_size) or a NULL
 * argument; MN_ERR_DEVICE for a device that is not usable. */
MN_API mn_status mn_group_new_nccl(const mn_group_id *id, int world_size, int rank, int device,
                                   double timeout_s, mn_group **out);

/* For a session of a data-parallel group, saving is collective: every rank calls it with the
 * same path, rank 0 writes the whole state (ZeRO-1 shards of the optimizer state gathered
 * first; written to a temporary file and renamed, never half-written), and every rank returns
 * rank 0's outcome once the file is in place. Every rank loads the same file, whatever number
 * of ranks wrote it. */
MN_API mn_status mn_session_save_checkpoint(mn_session *s, const char *path);
MN_API mn_status mn_session_load_checkpoint(mn_session *s, const char *path);
/* A checkpoint with the caller's own entries in its __metadata__ (a training program's step,
 * sampler state, config, hyper-parameters), read back with mn_safetensors_open and
 * mn_safetensors_metadata; mn_session_load_checkpoint ignores them. Keys must be non-empty,
 * unique and none of the library's own (checkpoint_format, checkpoint_version,
 * library_version, optimizer, step, lr, beta1, beta2, eps, weight_decay, max_grad_norm);
 * values are any strings. MN_ERR_INVALID_ARGUMENT naming the entry, before anything is
 * written; otherwise as mn_session_save_checkpoint. */
typedef struct mn_checkpoint_entry {
  const char *key, *value;
} mn_checkpoint_entry;
MN_API mn_status mn_session_save_checkpoint_with(mn_session *s, const char *path,
                                                 const mn_checkpoint_entry *extra, size_t n_extra);

MN_API mn_status mn_session_load_safetensors(mn_session *s, const char *path, bool strict);
/* mn_session_load_safetensors with flags: MN_LOAD_STRICT is strict above. Both refuse a tensor
 * holding a NaN or infinity with MN_ERR_FORMAT naming it, loading nothing, unless
 * MN_LOAD_ALLOW_NONFINITE is given (for inspecting a broken checkpoint). Unknown flags:
 * MN_ERR_INVALID_ARGUMENT. */
/* MN_LOAD_STRICT_FROZEN is strict for the frozen parameters only (mn_set_trainable): a base
 * checkpoint under adapters that it does not hold. */
typedef enum mn_load_flags {
  MN_LOAD_STRICT = 1,
  MN_LOAD_ALLOW_NONFINITE = 2,
  MN_LOAD_STRICT_FROZEN = 4,
} mn_load_flags;
MN_API mn_status mn_session_load_safetensors_flags(mn_session *s, const char *path, unsigned flags);
/* The parameters from a llama.cpp GGUF file (general.architecture "llama" or "gpt2"), with the
 * same flags and the same all-or-nothing checks as mn_session_load_safetensors_flags. Tensors
 * are matched under transformers' names (token_embd.weight is model.embed_tokens.weight or
 * transformer.wte.weight, blk.N.attn_q.weight model.layers.N.self_attn.q_proj.weight, ...;
 * without the base prefix for a graph built with name_prefix ""), in transformers' layouts:
 * Llama's q_proj/k_proj rows un-permuted (llama.cpp's converter permutes them for its RoPE),
 * GPT-2's Conv1D weights transposed back to [in, out]. F32, F16, BF16, Q8_0, Q4_0 and Q4_1
 * tensors convert to f32 (as gguf-py dequantizes them); another type is MN_ERR_UNSUPPORTED
 * naming the tensor and its type, another architecture MN_ERR_UNSUPPORTED naming it, a
 * malformed file MN_ERR_FORMAT naming the byte offset, each before anything changes. */
MN_API mn_status mn_session_load_gguf(mn_session *s, const char *path, unsigned flags);
MN_API mn_status mn_session_save_safetensors(mn_session *s, const char *path);
/* Saves n parameters, F32: names[i] under the tensor name keys[i] (keys NULL: their own names),
 * with the __metadata__ {"format": "pt"} that transformers asks for. MN_ERR_NOT_FOUND names a
 * parameter the session lacks; MN_ERR_INVALID_ARGUMENT a key given twice or empty. */
MN_API mn_status mn_session_save_parameters(mn_session *s, const char *path,
                                            const char *const *names, const char *const *keys,
                                            size_t n);

typedef struct mn_safetensors mn_safetensors;
typedef struct mn_safetensors_info {
  const char *dtype;
  int rank;
  int64_t shape[MN_MAX_RANK];
  size_t bytes;
} mn_safetensors_info;
MN_API mn_status mn_safetensors_open(const char *path, mn_safetensors **out);
MN_API void mn_safetensors_close(mn_safetensors *st);
MN_API size_t mn_safetensors_count(const mn_safetensors *st);
MN_API const char *mn_safetensors_name(const mn_safetensors *st, size_t i);
MN_API mn_status mn_safetensors_info_of(const mn_safetensors *st, const char *name,
                                        mn_safetensors_info *out);
MN_API mn_status mn_safetensors_read_f32(const mn_safetensors *st, const char *name, float *out,
                                         size_t n);
MN_API const char *mn_safetensors_metadata(const mn_safetensors *st, const char *key);

MN_API size_t mn_optimize_report_format(const mn_optimize_report *r, char *buf, size_t size);
MN_API void mn_optimize_report_free(mn_optimize_report *r);

/* ---------------------------------------------------------------- tokenizer */

/* Byte-level BPE tokenizers read from a HuggingFace tokenizer.json (GPT-2, SmolLM2 and Llama-3
 * styles): encode gives the ids that the HF tokenizers library gives for
 * encode(text, add_special_tokens=False), decode gives back the bytes.
 *
 * Read: model BPE (vocab, merges as "a b" or ["a", "b"], unk_token, fuse_unk, ignore_merges);
 * added_tokens (matched in the text before pre-tokenization; lstrip, rstrip, normalized);
 * pre_tokenizer ByteLevel (add_prefix_space, use_regex), alone or last in a Sequence after
 * Digits and Split steps (Split patterns: literal strings, the GPT-2, Llama-3 and Qwen2 split
 * regexes, and \p{N}; all five behaviors, invert); decoder ByteLevel. Anything else that would
 * change the ids (a normalizer, other pre-tokenizers or regexes, byte_fallback, dropout,
 * single_word added tokens) fails to load with MN_ERR_UNSUPPORTED naming it. The
 * post_processor is not applied, so no BOS/EOS is added; truncation and padding are ignored.
 * Unicode classes (letters, numbers) come from Unicode 14 tables.
 *
 * A loaded tokenizer is read-only: encode and decode may run on several threads at once. */
typedef struct mn_tokenizer mn_tokenizer;
/* MN_ERR_IO when the file cannot be read, MN_ERR_FORMAT (naming the field) for bad JSON or
 * missing fields, MN_ERR_UNSUPPORTED for unsupported components. */
MN_API mn_status mn_tokenizer_load(const char *tokenizer_json_path, mn_tokenizer **out);
MN_API void mn_tokenizer_free(mn_tokenizer *t);
/* One more than the largest id (model vocabulary and added tokens): the rows an embedding
 * table needs. */
MN_API size_t mn_tokenizer_vocab_size(const mn_tokenizer *t);
/* Encodes len bytes of text (any bytes: invalid UTF-8 is kept byte for byte). *n_out gets the
 * number of ids. Two calls size the buffer: with ids NULL and cap 0 only *n_out is set (MN_OK);
 * with a buffer too small the first cap ids are written, *n_out still gets the full count,
 * and the result is MN_ERR_INVALID_ARGUMENT. */
MN_API mn_status mn_tokenizer_encode(const mn_tokenizer *t, const char *text, size_t len,
                                     uint32_t *ids, size_t cap, size_t *n_out);
/* Decodes n ids into out: *len_out gets the length of the text (its bytes, without a NUL; it
 * may hold NUL bytes); out gets the text and a NUL, so cap must be at least *len_out + 1. With
 * out NULL and cap 0 only *len_out is set (MN_OK); with cap too small out gets the first
 * cap - 1 bytes and a NUL, and the result is MN_ERR_INVALID_ARGUMENT. An id that is not a token
 * is MN_ERR_INVALID_ARGUMENT. Special tokens decode to their text. */
MN_API mn_status mn_tokenizer_decode(const mn_tokenizer *t, const uint32_t *ids, size_t n,
                                     char *out, size_t cap, size_t *len_out);
/* The id of a token given by its text as stored in the file (added tokens such as
 * "<|endoftext|>" first, then the model's vocabulary, where a space is U+0120), or -1. */
MN_API int64_t mn_tokenizer_token_id(const mn_tokenizer *t, const char *token);
/* The stored text of an id (owned by the tokenizer), or NULL when the id is not a token. */
MN_API const char *mn_tokenizer_token(const mn_tokenizer *t, uint32_t id);

/* ---------------------------------------------------------------- models */

/* GPT-2 and Llama-family causal language models configured from a HuggingFace config.json,
 * with transformers' parameter names and layouts, so that mn_session_load_safetensors reads a
 * hub checkpoint as is and mn_session_save_safetensors writes one that transformers loads.
 *
 * The graph of mn_model_build (batch B, sequence T, vocabulary V):
 *   inputs   "input_ids" U32 [B, T]; "labels" U32 [B, T], the token each position should
 *            predict (already shifted: unlike transformers' labels argument, position t is
 *            scored against labels[t]), or MN_IGNORE_LABEL for a position the loss does not
 *            count (the mean is over the others); GPT-2 also "position_ids" U32 [B, T], which
 *            mn_model_prepare_session sets to 0..T-1
 *   output 0 the mean cross-entropy of the logits against the counted labels, [1] (the loss)
 *   output 1 the logits [B, T, V]
 * GPT-2 (GPT2LMHeadModel): learned positions, layer_norm, gelu (tanh), Conv1D weights
 * [in, out] through mn_matmul, q, k and v cut from c_attn's output by mn_slice_last; the head
 * is wte unless tie_word_embeddings is false ("lm_head.weight" [V, D]).
 * Llama (LlamaForCausalLM; SmolLM2, TinyLlama, Llama 2): rms_norm, rotate-half RoPE, SwiGLU,
 * grouped-query attention, nn.Linear weights [out, in] through mn_matmul_bt; "lm_head.weight"
 * unless tie_word_embeddings. */
typedef enum mn_model_family { MN_MODEL_GPT2 = 1, MN_MODEL_LLAMA = 2 } mn_model_family;

/* Each field names its config.json key (GPT-2 | Llama) and the default used when it is
 * absent or null; keys without a default are required. */
typedef struct mn_model_config {
  mn_model_family family;    /* model_type: "gpt2" | "llama" */
  int64_t vocab_size;        /* vocab_size */
  int64_t hidden_size;       /* n_embd | hidden_size */
  int64_t num_layers;        /* n_layer | num_hidden_layers */
  int64_t num_heads;         /* n_head | num_attention_heads */
  int64_t num_kv_heads;      /* = num_heads | num_key_value_heads (num_heads) */
  int64_t head_dim;          /* hidden_size / num_heads | head_dim (hidden_size / num_heads) */
  int64_t intermediate_size; /* n_inner (4 * n_embd) | intermediate_size */
  int64_t max_positions;     /* n_positions | max_position_embeddings (2048; not enforced) */
  float norm_eps;            /* layer_norm_epsilon (1e-5) | rms_norm_eps (1e-6) */
  float rope_theta;          /* 0 | rope_theta (10000) */
  float initializer_range;   /* initializer_range (0.02): std of mn_model_init_parameters */
  bool tie_word_embeddings;  /* tie_word_embeddings (GPT-2 true, Llama false) */
} mn_model_config;

/* Reads a config.json (load: a file; parse: its text). *out changes only on success.
 * MN_ERR_IO: the file cannot be read. MN_ERR_FORMAT: not JSON, a required key missing, or a
 * value of the wrong type or range (the message names the key). MN_ERR_UNSUPPORTED: a
 * model_type other than "gpt2" and "llama", or an option these models do not implement
 * (GPT-2: activation_function other than gelu_new / gelu_pytorch_tanh, unscaled or per-layer
 * scaled attention, cross-attention; Llama: hidden_act other than silu, attention_bias,
 * mlp_bias, rope_scaling). Other keys are ignored. Limits, checked before anything is
 * allocated (MN_ERR_FORMAT naming the key; mn_model_build gives MN_ERR_INVALID_ARGUMENT naming
 * the field for a config filled by hand): at most 65536 layers, and at most 2^40 parameters
 * (the weights alone would be 4 TiB in fp32). */
MN_API mn_status mn_model_config_load(const char *config_json_path, mn_model_config *out);
MN_API mn_status mn_model_config_parse(const char *json_text, mn_model_config *out);

/* Builds the model's training graph (see above) into a new graph. name_prefix goes before
 * the base model's parameter names: GPT-2 "transformer." or "", Llama "model." or ""; NULL
 * picks the prefix that transformers' LM classes save ("transformer.", "model."). The untied
 * "lm_head.weight" is never prefixed. MN_ERR_INVALID_ARGUMENT for a bad config field, batch or
 * seq below 1, or (GPT-2) seq above n_positions. */
MN_API mn_status mn_model_build(const mn_model_config *c, int64_t batch, int64_t seq,
                                const char *name_prefix, mn_graph **out);

/* The name_prefix under which a safetensors file (or a sharded checkpoint's
 * model.safetensors.index.json) stores the model: the prefix with which its token embedding
 * (wte.weight, embed_tokens.weight) is found. *prefix gets a static string. MN_ERR_NOT_FOUND
 * when the file has neither name. */
MN_API mn_status mn_model_name_prefix(const mn_model_config *c, const char *weights_path,
                                      const char **prefix);

/* Sets the inputs of a model graph that never change: GPT-2's position_ids to 0..T-1 in each
 * row (nothing for Llama). Call it once on every session of the graph, since a session starts
 * with zeros there; mn_model_init_parameters calls it too. */
MN_API mn_status mn_model_prepare_session(const mn_graph *g, mn_session *s);

/* Sets every parameter of g in s as transformers' _init_weights does, for training from
 * scratch: norm weights 1, biases 0, every other weight normal(0, initializer_range), and
 * GPT-2's attn.c_proj and mlp.c_proj weights normal(0, initializer_range / sqrt(2 * n_layer)),
 * and as PEFT does LoRA's lora_A uniform(-1/sqrt(in), 1/sqrt(in)) and lora_B zeros.
 * Draws are seeded (same seed, same values, on every platform) in the graph's parameter
 * order. Then runs mn_model_prepare_session. */
MN_API mn_status mn_model_init_parameters(const mn_model_config *c, const mn_graph *g,
                                          mn_session *s, uint64_t seed);

/* ---------------------------------------------------------------- LoRA adapters
 *
 * Low-rank adapters as PEFT's LoraConfig (task_type CAUSAL_LM, bias "none"): every targeted
 * linear layer y = x W^T (GPT-2's Conv1D: x W + b) gains (alpha / r) B A dropout(x), with
 * "{module}.lora_A.weight" A [r, in] and "{module}.lora_B.weight" B [out, r] trainable and
 * every other parameter frozen. Modules are named as transformers names them
 * ("model.layers.0.self_attn.q_proj", "transformer.h.0.attn.c_attn"), and a target matches a
 * module whose name is the target or ends with "." and the target, as in PEFT:
 *   Llama  q_proj k_proj v_proj o_proj gate_proj up_proj down_proj
 *   GPT-2  c_attn, attn.c_proj, mlp.c_proj (both by c_proj), c_fc
 * "all-linear" targets all of them (never the output head). */
#define MN_LORA_TEXT_CAP 512
typedef struct mn_lora_config {
  int64_t rank;                          /* r */
  float alpha;                           /* lora_alpha: the product is scaled by alpha / r */
  float dropout;                         /* lora_dropout, on the adapter's input in training */
  char target_modules[MN_LORA_TEXT_CAP]; /* comma-separated targets, or "all-linear" */
  char base_model[MN_LORA_TEXT_CAP];     /* base_model_name_or_path ("" when unknown) */
} mn_lora_config;

/* PEFT's defaults: r 8, lora_alpha 8, lora_dropout 0, "all-linear". */
MN_API mn_lora_config mn_lora_config_default(void);
/* Reads ADAPTER_DIR/adapter_config.json: peft_type "LORA" with r, lora_alpha, lora_dropout,
 * target_modules (a list, or the string "all-linear") and base_model_name_or_path. MN_ERR_IO:
 * unreadable; MN_ERR_FORMAT naming the key: not JSON, a key missing or of the wrong type;
 * MN_ERR_UNSUPPORTED naming the option: another peft_type, bias other than "none", a regular
 * expression for target_modules, use_dora, use_rslora, rank_pattern or alpha_pattern,
 * layers_to_transform. */
MN_API mn_status mn_lora_config_load(const char *adapter_dir, mn_lora_config *out);

/* What mn_model_build_with builds besides the graph of mn_model_build. Zeros are
 * mn_model_build's defaults. */
typedef struct mn_model_options {
  const char *name_prefix;    /* as mn_model_build's */
  const mn_lora_config *lora; /* adapters on the targeted layers, the rest frozen; NULL: none */
  bool loss_only;             /* output 0 only (no logits output: less memory in training) */
  /* Several examples per row: input "position_ids" U32 [B, T] (both families) restarts at 0
   * at each example's first token, and each token attends only to its own example's earlier
   * tokens (mn_causal_attention_packed), so a packed row trains as its examples would one by
   * one. mn_model_prepare_session sets 0..T-1 (one example per row). */
  bool packed;
} mn_model_options;
/* mn_model_build with options (o NULL: none). A LoRA configuration with r < 1, alpha <= 0,
 * dropout outside [0, 1), or a target that matches no module of the family is
 * MN_ERR_INVALID_ARGUMENT naming it. */
MN_API mn_status mn_model_build_with(const mn_model_config *c, int64_t batch, int64_t seq,
                                     const mn_model_options *o, mn_graph **out);

/* Writes ADAPTER_DIR (created when missing) as PEFT saves an adapter: adapter_config.json
 * (lora's values, peft_type LORA, task_type CAUSAL_LM, bias none, fan_in_fan_out true for
 * GPT-2's Conv1D layers) and adapter_model.safetensors holding every adapter of g under
 * "base_model.model.{module}.lora_A.weight" / ".lora_B.weight", read from s. A graph without
 * adapters is MN_ERR_INVALID_ARGUMENT. */
MN_API mn_status mn_lora_save(mn_session *s, const mn_graph *g, const mn_lora_config *lora,
                              const char *adapter_dir);
/* Loads ADAPTER_DIR/adapter_model.safetensors (PEFT's names, F32/F16/BF16) into the adapters
 * of g in s. Every adapter of g must be in the file with its shape (MN_ERR_NOT_FOUND,
 * MN_ERR_SHAPE naming it); a file tensor for a module without an adapter in g is
 * MN_ERR_NOT_FOUND too (other targets, or another rank). */
MN_API mn_status mn_lora_load(mn_session *s, const mn_graph *g, const char *adapter_dir);
/* Writes a safetensors file of the base model with every adapter merged into its layer
 * (W += alpha / r * B A, transposed for Conv1D) under transformers' names, without adapter
 * tensors: transformers loads it without peft. s is left as it was. */
MN_API mn_status mn_lora_save_merged(mn_session *s, const mn_graph *g, const mn_lora_config *lora,
                                     const char *path);

/* ---------------------------------------------------------------- generation
 *
 * A generator owns an inference session of a model's decode graph with its KV cache: the
 * prompt is written into the cache in chunks of rows (a prefill graph sharing the weights and
 * the cache, docs/generation.md), then each new token is one graph launch
 * (embedding, every layer with the cache append, the head and the sampling on the device)
 * that appends to the cache. Weights come from a HuggingFace safetensors file (or a sharded
 * checkpoint's index), loaded strictly (docs/generation.md). */
typedef enum mn_quant {
  MN_QUANT_NONE, /* weights in the session's precision */
  MN_QUANT_Q8_0, /* GGML block formats: 32 weights per block, one f16 scale */
  MN_QUANT_Q4_0,
  MN_QUANT_AFFINE_INT8, /* group-wise affine (MLX style): per group a scale and a bias */
  MN_QUANT_AFFINE_INT4,
  MN_QUANT_Q4_1 /* GGML: 32 weights per block, f16 scale and f16 minimum */
} mn_quant;
/* x [.., in_features] W^T -> [.., out_features], W held quantized in wq (U32, the packed rows
 * of W [out_features, in_features] in `format`, docs/generation.md gives the layouts) and
 * dequantized on the fly; group_size is read by the affine formats (32, 64 or 128). Forward
 * only: a graph that differentiates through it is MN_ERR_UNSUPPORTED. */
MN_API mn_node mn_matmul_quant(mn_graph *g, mn_node x, mn_node wq, mn_quant format, int group_size,
                               int64_t out_features, int64_t in_features);
typedef struct mn_generator_options {
  mn_session_options session; /* backend, device, precision */
  int64_t max_seq; /* cache rows: prompt plus new tokens (default: the model's positions) */
  int64_t batch;   /* sequences decoded together (default 1); prompts of equal length */
  mn_quant quant;  /* format of the linear layers' weights (embeddings, norms stay) */
  int group_size;  /* affine formats: weights per scale/bias, 32, 64 or 128 (default 64) */
} mn_generator_options;
MN_API mn_generator_options mn_generator_options_default(void);

typedef struct mn_sampling {
  float temperature; /* 0: greedy (argmax) */
  int top_k;         /* 0: off */
  float top_p;       /* 1: off */
  uint64_t seed;     /* same seed, same tokens */
} mn_sampling;

typedef struct mn_generator mn_generator;
/* With quant other than MN_QUANT_NONE every linear layer's weight is quantized at load (a
 * GGUF tensor already in that GGML format is kept as it is); embeddings, norms, biases and a
 * tied head stay in the session's precision. An unknown quant, a group_size other than 32, 64
 * or 128, or one that does not divide a layer's in_features is MN_ERR_INVALID_ARGUMENT before
 * any work. */
MN_API mn_status mn_generator_new(const mn_model_config *c, const char *weights_path,
                                  const mn_generator_options *o, mn_generator **out);
MN_API void mn_generator_free(mn_generator *g);
/* Appends the prompt (n_prompt ids per sequence; 0 continues where the last call stopped)
 * to the cache, then samples n_new tokens per sequence into out (batch x n_new, row-major).
 * An id past the vocabulary, or a cache that would pass max_seq, is MN_ERR_INVALID_ARGUMENT
 * before any work, and the generator is unchanged. s NULL is greedy. */
MN_API mn_status mn_generator_generate(mn_generator *g, const uint32_t *prompt, size_t n_prompt,
                                       const mn_sampling *s, uint32_t *out, size_t n_new);
MN_API mn_status mn_generator_reset(mn_generator *g); /* empties the cache */
typedef struct mn_generator_stats {
  double prefill_ms, ms_per_token; /* of the last generate call */
  uint64_t launches_per_token;     /* graph launches per decoded token: 1 on CUDA */
  size_t cache_len, weight_bytes;  /* rows in the cache; device bytes of the weights */
  /* Of the last generate call: graph launches (one per prefill chunk of up to 32 prompt tokens,
   * one per prompt token that no chunk takes, and one per new token), and reads of the new tokens,
   * each of which waits for the device: one per 64 new tokens and one at the end, never one per
   * token. */
  uint64_t launches, host_reads;
} mn_generator_stats;
MN_API mn_status mn_generator_get_stats(const mn_generator *g, mn_generator_stats *out);

#ifdef __cplusplus
}
#endif
#endif
