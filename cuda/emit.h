/* Lowering a plan to device work, without touching a device.
 *
 * Every dispatch of the plan is lowered by the function of its op (mn_cu_lower_<ENUM>,
 * table in lower_table.c) into commands: launches of NVRTC-compiled kernel instances,
 * matmuls (cuBLASLt), memsets and copies. The result is plain data that cuda_backend.c
 * turns into one CUDA Graph, and that the offline compile check (no GPU needed) turns
 * into one NVRTC translation unit. Nothing here includes CUDA headers.
 *
 * Kernel instances: a kernel template in cuda/kernels/<area>.cuh is a device function
 *
 *   template <int N, ..., class IO> __device__ void mn_<name>(const IO &io)
 *
 * reading its pointers from io.p[0..] in the order the launch lists them (float ones through
 * mn_in / mn_out, kernels/common.cuh). The emitter wraps each distinct (call expression,
 * block size, storage mask) in
 *
 *   extern "C" __global__ void __launch_bounds__(B) mn_kI(mn_ptrs io) { <call>(mn_io<M>{io}); }
 *
 * so shapes and storage types are compile-time constants and identical instances are
 * compiled once. */
#ifndef MN_CUDA_EMIT_H
#define MN_CUDA_EMIT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "cuda/device_abi.h"
#include "host/plan.h"

#define MN_CU_MAX_ARGS MN_DEV_MAX_ARGS

/* A device pointer named before the arena exists. */
typedef enum mn_cu_arg_kind {
  MN_CU_ARG_NONE,    /* a null pointer */
  MN_CU_ARG_NODE,    /* the buffer of a node, plus a byte offset */
  MN_CU_ARG_SCRATCH, /* the session scratch region, plus a byte offset */
  MN_CU_ARG_ERROR,   /* the device error record (mn_dev_error in device_abi.h) */
  MN_CU_ARG_SCALARS, /* the per-step scalars (mn_dev_scalars in device_abi.h) */
  /* Low-precision sessions: the low-precision copy of a parameter node that matrix products
   * read (kept by the optimizer), and the staging region where an fp32 product operand is
   * rounded before the product reads it; both plus a byte offset. */
  MN_CU_ARG_SHADOW,
  MN_CU_ARG_STAGE,
  /* A number in place of a pointer (the offset): a node id that a kernel reports errors as,
   * so that the layers of a model share one kernel instead of one each. */
  MN_CU_ARG_VALUE,
} mn_cu_arg_kind;

/* offset counts bytes of the node's dtype: for a node stored in bf16 / fp16 the backend
 * halves it, so lowering code computes offsets as if every float value were fp32. */
typedef struct mn_cu_arg {
  mn_cu_arg_kind kind;
  mn_node node;
  size_t offset;
} mn_cu_arg;

/* What a matmul does to its product before (or besides) storing it, in row-major terms;
 * matmul_lt.c maps each to its cuBLASLt epilogue. The bias is a packed vector in its argument's
 * storage (bf16 / fp16 for a low-precision session's matmul_bias_act, fp32 otherwise). */
typedef enum mn_cu_epilogue {
  MN_CU_EPI_NONE,
  MN_CU_EPI_BIAS,      /* C = P + bias[n] */
  MN_CU_EPI_BIAS_RELU, /* C = relu(P + bias[n]) */
  MN_CU_EPI_BIAS_GELU, /* C = gelu(P + bias[n]), the tanh approximation */
  MN_CU_EPI_DGELU,     /* C = P * gelu'(aux), aux [m,n] with row pitch aux_ld */
  MN_CU_EPI_BGRAD_A,   /* also bias[m] = the column sums of the stored A [k,m] (trans_a) */
  MN_CU_EPI_BGRAD_B,   /* also bias[n] = the column sums of the stored B [k,n] (!trans_b) */
} mn_cu_epilogue;

/* "bias+gelu" and so on, for messages and profiles. */
const char *mn_cu_epilogue_name(mn_cu_epilogue e);

/* Row-major matmul C[m,n] = alpha * op(A)[m,k] . op(B)[k,n] + beta * C, repeated
 * `batch` times at the given element strides. A is stored [m,k] (or [k,m] when
 * trans_a), B [k,n] (or [n,k] when trans_b), C [m,n], densely unless a row pitch is given. beta 1
 * accumulates into C (gradient sums); beta 0 overwrites it.
 *
 * An epilogue other than none is an offer: the `fallback_cmds` commands that follow this one
 * compute the same thing with kernels from the plain product. When cuBLASLt has an
 * algorithm for the epilogue at session build, it runs fused and those commands are
 * skipped; otherwise this command runs as a plain product and they run. */
typedef struct mn_cu_matmul_desc {
  mn_cu_arg a, b, c;
  bool trans_a, trans_b;
  int64_t m, n, k;
  int64_t lda, ldb, ldc; /* row pitch of the stored matrix in elements; 0: dense */
  int64_t batch, stride_a, stride_b, stride_c;
  float alpha, beta;
  mn_cu_epilogue epilogue;
  mn_cu_arg bias; /* read by the bias epilogues, written by the bias-gradient ones */
  mn_cu_arg aux;  /* dgelu: the gelu input */
  int64_t aux_ld; /* row pitch of aux in elements */
  /* Where the plain product goes when the epilogue is not fused (kind NONE: c). A
   * low-precision session puts it in fp32 scratch (mn_cu_fallback_scratch), so that the
   * fallback rounds once, after the epilogue, as the fused product does; those
   * fallback_scratch bytes count only when the epilogue does not fuse
   * (mn_cu_program_scratch_bytes). */
  mn_cu_arg c_fallback;
  size_t fallback_scratch;
  uint32_t fallback_cmds;
} mn_cu_matmul_desc;

typedef enum mn_cu_cmd_kind {
  MN_CU_CMD_LAUNCH,
  MN_CU_CMD_MATMUL,
  MN_CU_CMD_MEMSET, /* bytes of zeros */
  MN_CU_CMD_COPY,   /* device to device */
} mn_cu_cmd_kind;

typedef struct mn_cu_cmd {
  mn_cu_cmd_kind kind;
  mn_node node; /* the dispatch it belongs to, for messages and profiles */
  /* LAUNCH */
  uint32_t kernel;
  unsigned grid[3];
  size_t smem;
  int num_args;
  mn_cu_arg args[MN_CU_MAX_ARGS];
  /* MATMUL */
  mn_cu_matmul_desc mm;
  /* MEMSET, COPY (args[0] destination, args[1] source) */
  size_t bytes;
} mn_cu_cmd;

typedef struct mn_cu_kernel_desc {
  char *call;       /* e.g. "mn_softmax_fwd<64, 1000>" */
  unsigned block;   /* threads per block (1-D), also its __launch_bounds__ */
  unsigned storage; /* the storage mask of its arguments (mn_dev_storage, 2 bits each) */
  /* Launched as a programmatic dependent of the kernel before it (mn_cu_kernel_overlaps). */
  bool overlaps;
  /* Its wrapper waits for the kernels before it first thing (mn_cu_program_overlap_small_step). */
  bool waits_at_entry;
  /* Blocks an SM must be able to hold (the second __launch_bounds__ argument; 0: no bound). */
  unsigned min_blocks;
} mn_cu_kernel_desc;

/* The lowered program of a plan. */
typedef struct mn_cu_program {
  mn_cu_cmd *cmds;
  size_t num_cmds, cap_cmds;
  mn_cu_kernel_desc *kernels;
  size_t num_kernels, cap_kernels;
  char **generated; /* kernel templates generated while lowering (mn_cu_kernel_generated) */
  size_t num_generated, cap_generated;
  /* Largest scratch any dispatch needs whatever cuBLASLt decides; the plain products of
   * epilogues that do not fuse may need more (mn_cu_program_scratch_bytes). */
  size_t scratch_bytes;
  size_t stage_bytes;  /* largest staging of rounded product operands */
  size_t stage_cursor; /* staging taken by the dispatch being lowered */
} mn_cu_program;

/* What a lowering function sees. */
typedef struct mn_cu_op_ctx {
  mn_cu_program *prog;
  const mn_plan *plan;
  const mn_graph *g;
  mn_node id;
  const mn_node_rec *node;
  bool allow_tf32;
} mn_cu_op_ctx;

typedef mn_status (*mn_cu_lower_fn)(const mn_cu_op_ctx *c);

/* Declares a kernel instance. `fmt` is printf-style and yields the call expression;
 * returns its index (instances are shared), or -1 when out of memory (the caller
 * returns mn_cu_oom(c)). */
int mn_cu_kernel(const mn_cu_op_ctx *c, unsigned block, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Marks kernel k (and its storage instances) as one whose template starts with
 * mn_overlap_begin() and calls mn_overlap_wait() before it touches memory that an earlier
 * kernel writes or reads (kernels/common.cuh): the backend launches it with programmatic
 * stream serialization, so that its blocks start, and run up to the wait, while the kernel
 * before it finishes. */
void mn_cu_kernel_overlaps(const mn_cu_op_ctx *c, int k);
/* Asks the compiler to fit `blocks` blocks of kernel k (and its storage instances) on an SM,
 * capping its registers where the free choice would leave fewer. */
void mn_cu_kernel_min_blocks(const mn_cu_op_ctx *c, int k, unsigned blocks);
/* The instance of kernel k's call compiled for storage mask `storage` (2 bits per argument,
 * an mn_dev_storage), declared on first use; -1 when out of memory. */
int mn_cu_instance(mn_cu_program *prog, int k, unsigned storage);
/* Declares an instance of generated code. `code` defines one kernel template named by
 * the macro MN_GEN, e.g. "template <long long N, class IO> __device__ void MN_GEN(const IO &io)
 * {..}"; each distinct text joins the translation unit once, as mn_gen<j>, after the
 * kernel sources (whose helpers it may call). The instance is the call mn_gen<j><targs>,
 * e.g. targs "<4096LL>". Returns the kernel index, or -1 when out of memory. */
int mn_cu_kernel_generated(const mn_cu_op_ctx *c, unsigned block, const char *code,
                           const char *targs);
/* Appends a launch of kernel `k` on a 1-D or 3-D grid; MN_OK or out of memory. The instance
 * launched is k's call compiled for the storage of `args` (mn_cu_arg_storage): a low-precision
 * session gets bf16 / fp16 instances of the same templates without the lowering asking. */
mn_status mn_cu_launch(const mn_cu_op_ctx *c, int k, unsigned gx, unsigned gy, unsigned gz,
                       size_t smem, int nargs, const mn_cu_arg *args);
mn_status mn_cu_matmul(const mn_cu_op_ctx *c, const mn_cu_matmul_desc *d);
mn_status mn_cu_memset_zero(const mn_cu_op_ctx *c, mn_cu_arg dst, size_t bytes);
mn_status mn_cu_copy(const mn_cu_op_ctx *c, mn_cu_arg dst, mn_cu_arg src, size_t bytes);
/* Reserves `bytes` of scratch for this dispatch (shared by all dispatches, which run in
 * order); returns the argument for offset 0 of it. */
mn_cu_arg mn_cu_scratch(const mn_cu_op_ctx *c, size_t bytes);
/* The scratch where the plain product of d goes (d->c_fallback) when its epilogue is not
 * fused: `bytes` of it, which the session reserves only if the epilogue falls back. */
void mn_cu_fallback_scratch(mn_cu_matmul_desc *d, size_t bytes);
/* The scratch a session of this program needs once it is known which products fused their
 * epilogue (fused[cmd], per command; NULL: none did, the most it can need). A product
 * without an epilogue to offer always runs its fallback. */
size_t mn_cu_program_scratch_bytes(const mn_cu_program *prog, const bool *fused);
mn_status mn_cu_oom(const mn_cu_op_ctx *c);
/* In a low-precision session: `bytes` of the staging region (stored in the session's low
 * precision, like the values a product reads), for this dispatch only. */
mn_cu_arg mn_cu_stage(const mn_cu_op_ctx *c, size_t bytes);
/* An operand that a low-precision session reads in low precision (a product operand, a
 * matmul_bias_act bias): a parameter through its low-precision copy, any other fp32 value (an
 * input, scratch) rounded into the staging region first; a low-precision value as it is.
 * rows x cols with row pitch ld (0: dense), `batch` of them `stride` apart. */
mn_status mn_cu_low_operand(const mn_cu_op_ctx *c, mn_cu_arg *a, int64_t rows, int64_t cols,
                            int64_t ld, int64_t batch, int64_t stride);

/* How argument a stores float values: an mn_dev_storage. */
int mn_cu_arg_storage(const mn_plan *p, mn_cu_arg a);
/* The byte offset of a into its buffer as stored (offset halved for a low-precision node). */
size_t mn_cu_stored_offset(const mn_plan *p, mn_cu_arg a);
/* Values per row of node n as stored: its buffer's pitch, or its last dimension. */
int64_t mn_cu_row_pitch(const mn_plan *p, mn_node n);
/* The storage of the plan's low-precision values (MN_DEV_F32 in an fp32 session). */
int mn_cu_low_storage(const mn_plan *p);

static inline mn_cu_arg mn_cu_node_arg(mn_node n) {
  return (mn_cu_arg){.kind = MN_CU_ARG_NODE, .node = n, .offset = 0};
}
static inline mn_cu_arg mn_cu_in(const mn_cu_op_ctx *c, int i) {
  return mn_cu_node_arg(c->node->inputs[i]);
}
static inline mn_cu_arg mn_cu_out(const mn_cu_op_ctx *c) { return mn_cu_node_arg(c->id); }
static inline mn_cu_arg mn_cu_error_arg(void) { return (mn_cu_arg){.kind = MN_CU_ARG_ERROR}; }
/* c's node id as a kernel argument (MN_CU_ARG_VALUE). */
static inline mn_cu_arg mn_cu_node_id_arg(const mn_cu_op_ctx *c) {
  return (mn_cu_arg){.kind = MN_CU_ARG_VALUE, .offset = c->id};
}
static inline mn_cu_arg mn_cu_scalars_arg(void) { return (mn_cu_arg){.kind = MN_CU_ARG_SCALARS}; }
static inline const mn_tensor_type *mn_cu_in_type(const mn_cu_op_ctx *c, int i) {
  return &c->g->nodes[c->node->inputs[i]].type;
}
static inline int64_t mn_cu_numel(const mn_cu_op_ctx *c) {
  return mn_tensor_type_numel(&c->node->type);
}
/* Blocks of `block` threads covering n items (at least one). */
static inline unsigned mn_cu_blocks(int64_t n, unsigned block) {
  int64_t b = (n + block - 1) / block;
  return b < 1 ? 1u : (unsigned)b;
}
/* The bits of f, for a kernel template argument read back with __uint_as_float. */
static inline unsigned mn_cu_float_bits(float f) {
  unsigned u;
  memcpy(&u, &f, sizeof u);
  return u;
}
/* The FLOPs of product d: a multiply-add per output element and reduced element, per batch. */
static inline double mn_cu_matmul_flops(const mn_cu_matmul_desc *d) {
  return 2.0 * (double)d->m * (double)d->n * (double)d->k * (double)(d->batch > 1 ? d->batch : 1);
}
/* The FLOPs of the program's cuBLASLt products. */
static inline double mn_cu_program_product_flops(const mn_cu_program *prog) {
  double flops = 0;
  for (size_t i = 0; i < prog->num_cmds; i++)
    if (prog->cmds[i].kind == MN_CU_CMD_MATMUL) flops += mn_cu_matmul_flops(&prog->cmds[i].mm);
  return flops;
}
/* Training steps whose products add up to fewer FLOPs than this wait on launches and
 * latencies, not on the card (schedule.h, update_split.h, mn_cu_program_overlap_small_step). */
#define MN_CU_SMALL_STEP_FLOPS 1e11
/* Whether the program of plan p is such a step: parameters to update, products under the line. */
static inline bool mn_cu_small_step(const mn_cu_program *prog, const mn_plan *p) {
  return p->update_bytes > 0 && mn_cu_program_product_flops(prog) < MN_CU_SMALL_STEP_FLOPS;
}

#define MN_CU_DECLARE_LOWER(e, name, arity, flags) mn_status mn_cu_lower_##e(const mn_cu_op_ctx *c);
MN_OP_LIST(MN_CU_DECLARE_LOWER)
#undef MN_CU_DECLARE_LOWER

extern const mn_cu_lower_fn mn_cu_lowerers[MN_OP_COUNT];

/* Lowers every dispatch of the plan. */
mn_status mn_cu_program_build(const mn_plan *p, bool allow_tf32, mn_cu_program *out);
void mn_cu_program_free(mn_cu_program *prog);
/* Declares the step graph's last kernel, mn_step_readback (kernels/readback.cuh), as *kernel;
 * it runs with MN_CU_READBACK_BLOCK threads. */
#define MN_CU_READBACK_BLOCK 32
mn_status mn_cu_program_add_readback(mn_cu_program *prog, const mn_plan *p, int *kernel);
/* Declares the optimizer kernels (kernels/optimizer.cuh) of a training plan that has
 * parameters to update; sets *sumsq, *update and *accumulate to their indices, or -1. */
mn_status mn_cu_program_add_optimizer(mn_cu_program *prog, const mn_plan *p, bool training,
                                      int *sumsq, int *update, int *accumulate);
/* Declares the kernels that refresh the 2-byte copy of a plan stored in 2 bytes
 * (low_precision.c): *block converts the update block's parameters, per_buffer[b] (when not NULL)
 * parameter buffer b outside it; -2 where there is nothing to convert. */
mn_status mn_cu_program_add_converts(mn_cu_program *prog, const mn_plan *p, int *block,
                                     int *per_buffer);

/* In a small training step (MN_CU_SMALL_STEP_FLOPS) every kernel declared so far that does not
 * overlap by itself gets a wrapper that waits (mn_overlap_wait) before its template runs and is
 * launched as a programmatic dependent: its launch is no longer on the chain between the kernel
 * before it and its own work. The wait keeps every order of a plain launch. */
void mn_cu_program_overlap_small_step(mn_cu_program *prog, const mn_plan *p, bool training);

#define MN_CU_NORM_BLOCKS 256
/* The NVRTC translation unit: every kernel template source, the generated templates,
 * then one wrapper per instance named mn_k<index>. Returns a malloc'd string or NULL. */
char *mn_cu_program_source(const mn_cu_program *prog);

#endif
