/* The binary interface between the C code of cuda/ and its kernel templates: the argument
 * block of a launch, the per-step scalars, the error record, and the numbers that the
 * lowering passes as template arguments and the kernels interpret.
 *
 * Both the C compiler and NVRTC compile this header (MN_KERNEL_SHARED_HEADERS in
 * CMakeLists.txt embeds it ahead of kernels/common.cuh), so each layout and value is
 * defined once. It is C that is also CUDA C++ and includes nothing, since NVRTC has no
 * headers: fixed widths come from builtin types, whose sizes both compilers check below. */
#ifndef MN_CUDA_DEVICE_ABI_H
#define MN_CUDA_DEVICE_ABI_H

#ifdef __cplusplus
#define MN_ABI_ASSERT(cond, why) static_assert(cond, why)
#define MN_ABI_ALIGNOF(type)     alignof(type)
#else
#define MN_ABI_ASSERT(cond, why) _Static_assert(cond, why)
#define MN_ABI_ALIGNOF(type)     _Alignof(type)
#endif

/* The only kernel parameter, passed by value: the pointers of one launch, in the order
 * the kernel reads them (io.p[i]). Twelve: the first kernel of a Llama decode layer reads the
 * row, its norm, three weights, two caches and the position, writes q, the error record and the
 * attention's counters, and takes its node id as a value. */
#define MN_DEV_MAX_ARGS 12
typedef struct mn_ptrs {
  void *p[MN_DEV_MAX_ARGS];
} mn_ptrs;

/* How a kernel argument stores its values (host/storage.h): two bits per argument of a launch
 * form the storage mask that the kernel template reads through mn_io (kernels/common.cuh). */
enum mn_dev_storage {
  MN_DEV_F32 = 0,
  MN_DEV_BF16 = 1,
  MN_DEV_F16 = 2,
};
#define MN_DEV_STORAGE_BITS 2

/* mn_dev_scalars.kind: which update mn_opt_update (kernels/optimizer.cuh) applies. */
enum mn_dev_optim_kind {
  MN_DEV_OPTIM_NONE = 0,
  MN_DEV_OPTIM_SGD = 1,
  MN_DEV_OPTIM_ADAM = 2,
  MN_DEV_OPTIM_ADAMW = 3,
};

/* Scalars that change between steps without re-capturing the graph: the host writes them
 * to pinned memory before each launch and the graph's first node copies them in. */
typedef struct mn_dev_scalars {
  float lr, beta1, beta2, eps, weight_decay, max_grad_norm;
  unsigned int step;                         /* optimizer steps including this one */
  unsigned int kind;                         /* an mn_dev_optim_kind */
  double bias_correction1, bias_correction2; /* 1 - beta^step, computed on the host */
  /* Gradient accumulation over accum_k steps (mn_opt_accumulate): accum_first starts a new sum,
   * accum_apply is set on the step that updates (always, without accumulation). accum_steps is
   * accum_k as an integer (at least 1). In an F16 training session mn_scaler_begin replaces
   * accum_first, accum_apply, step and the bias corrections by the device's own values. */
  unsigned int accum_first, accum_apply;
  float accum_k;
  unsigned int accum_steps;
  /* The session's micro-step counter (mn_session.micro_steps) as this step reads it: dropout's
   * masks are drawn from it on the device, so the captured graph draws a new one each step. */
  unsigned long long micro_step;
} mn_dev_scalars;

/* The first runtime failure since the last mn_session_wait (an index out of range).
 * Kernels never read or write out of bounds: they record the failure, write NaN (or skip)
 * and go on; the optimizer then leaves the weights alone, as the reference does, and the
 * host formats the message and clears the record in mn_session_wait. */
enum mn_dev_error_what {
  MN_DEV_ERR_NONE = 0,
  MN_DEV_ERR_INDEX = 1,  /* embedding or scatter index >= rows */
  MN_DEV_ERR_LABEL = 2,  /* class label >= number of classes */
  MN_DEV_ERR_KV_POS = 3, /* cache_write position >= cache rows */
  MN_DEV_ERR_KV_LEN = 4, /* cached_attention length 0 or > cache rows */
  /* every label of a sparse cross-entropy is the ignore label: value is the labels node,
   * limit the number of rows */
  MN_DEV_ERR_ALL_IGNORED = 5,
};
typedef struct mn_dev_error {
  unsigned int what; /* an mn_dev_error_what */
  unsigned int node;
  long long value, position, limit;
  unsigned int skipped_step; /* the first optimizer step skipped because of the failure */
  /* F16 training: set by mn_scaler_unscale when a gradient is infinite or NaN, so that the
   * accumulation and update kernels of the step change nothing; mn_scaler_end clears it. It is
   * no failure: mn_session_wait reports nothing for it. */
  unsigned int nonfinite;
} mn_dev_error;

/* The label that a sparse cross-entropy does not count: MN_IGNORE_LABEL of meganeura.h, which
 * NVRTC does not see (cuda/lower_reduce.c asserts that the two agree). */
#define MN_DEV_IGNORE_LABEL 0xFFFFFF9Cu

/* F16's dynamic loss scaler (host/storage.h, mn_loss_scaler) as the device keeps it, with the
 * optimizer's step count and the gradient accumulation round, which a skipped step leaves
 * alone (kernels/optimizer.cuh, mn_scaler_*). The host sends its own state in the same layout
 * before each step; the step takes the parts that `take` names (those the host changed, or
 * all when no step has run since the host last read the device's) and keeps the rest. */
enum mn_dev_scaler_take {
  MN_DEV_TAKE_SCALER = 1, /* scale, good_steps, skipped */
  MN_DEV_TAKE_STEP = 2,
  MN_DEV_TAKE_ROUND = 4, /* accum_index */
  MN_DEV_TAKE_ALL = 7,
};
typedef struct mn_dev_scaler {
  float scale;
  unsigned int good_steps; /* finite steps since the scale last changed */
  unsigned long long skipped;
  unsigned long long step;  /* optimizer steps applied (Adam's bias correction) */
  unsigned int accum_index; /* steps of the current accumulation round that ran */
  unsigned int take;        /* the host's copy only: mn_dev_scaler_take bits */
} mn_dev_scaler;

/* Attention (kernels/attention.cuh, attention_mma.cuh). Every attention kernel but the
 * decode ones runs MN_ATTN_BLOCK threads, and a decode split covers as many cache rows; the
 * decode split kernel runs MN_ATTN_DECODE_THREADS threads. A tensor-core kernel owns
 * MN_ATTN_MMA_ROWS rows (queries, or keys for dK / dV). */
#define MN_ATTN_BLOCK          128
#define MN_ATTN_DECODE_THREADS 256
#define MN_ATTN_MMA_ROWS       64

/* What a forward kernel (template argument MODE) writes: the output, or for the backward
 * ops the per-row statistics into scratch, with or without delta = sum_s P_s dP_s, or both the
 * output and the statistics (a training plan's forward, read by the _saved gradients). */
enum mn_attn_mode {
  MN_ATTN_OUTPUT = 0,
  MN_ATTN_STATS_DELTA = 1,
  MN_ATTN_STATS = 2,
  MN_ATTN_OUTPUT_STATS = 3, /* the output and the statistics (no delta), for the _saved gradients */
};
/* Which keys a query row sees (template argument MASK): all of them, those up to its own
 * index, or those of its own packed example: from r - positions[r] up to r, the U32 [B, T]
 * positions being argument MN_ATTN_POSITIONS_ARG of every launch. MN_ATTN_MASK_CACHE: the T
 * query rows of a prefill over a KV cache of S rows see keys up to r + kv_len - T, kv_len (U32
 * [1]) being argument MN_ATTN_POSITIONS_ARG and the error record argument 4. */
enum mn_attn_mask {
  MN_ATTN_MASK_NONE = 0,
  MN_ATTN_MASK_CAUSAL = 1,
  MN_ATTN_MASK_SEGMENTS = 2,
  MN_ATTN_MASK_CACHE = 3,
};
#define MN_ATTN_POSITIONS_ARG 8
/* Operand precision of the tensor-core kernels (template argument PREC). */
enum mn_attn_prec {
  MN_ATTN_TF32 = 1,   /* each operand rounded to TF32 once */
  MN_ATTN_3XTF32 = 3, /* hi/lo TF32 split, about FP32 accuracy */
};
/* What a tensor-core dK / dV kernel writes (template argument OUT). */
enum mn_attn_kv_out {
  MN_ATTN_DV = 0,
  MN_ATTN_DK = 1,
  MN_ATTN_DK_DV = 2,
};

/* Both compilers lay structs out by the same rules, so they agree on every offset when they
 * agree on the width and alignment of each field type; each checks that here (NVRTC has no
 * offsetof). LP64 hosts and the device do. */
MN_ABI_ASSERT(sizeof(void *) == 8 && MN_ABI_ALIGNOF(void *) == 8, "64-bit pointers");
MN_ABI_ASSERT(sizeof(unsigned int) == 4 && MN_ABI_ALIGNOF(unsigned int) == 4, "32-bit unsigned");
MN_ABI_ASSERT(sizeof(float) == 4 && MN_ABI_ALIGNOF(float) == 4, "32-bit float");
MN_ABI_ASSERT(sizeof(long long) == 8 && MN_ABI_ALIGNOF(long long) == 8, "64-bit long long");
MN_ABI_ASSERT(sizeof(unsigned long long) == 8 && MN_ABI_ALIGNOF(unsigned long long) == 8,
              "64-bit unsigned long long");
MN_ABI_ASSERT(sizeof(double) == 8 && MN_ABI_ALIGNOF(double) == 8, "64-bit double");
MN_ABI_ASSERT(sizeof(mn_ptrs) == 8 * MN_DEV_MAX_ARGS, "mn_ptrs: the pointers, no padding");
MN_ABI_ASSERT(MN_ATTN_POSITIONS_ARG < MN_DEV_MAX_ARGS, "the attention positions are an argument");
MN_ABI_ASSERT(sizeof(mn_dev_scalars) == 72, "mn_dev_scalars: no padding");
MN_ABI_ASSERT(sizeof(mn_dev_error) == 40, "mn_dev_error: no padding");
MN_ABI_ASSERT(sizeof(mn_dev_scaler) == 32, "mn_dev_scaler: no padding");

#endif
