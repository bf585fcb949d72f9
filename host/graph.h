/* The graph IR: a flat array of nodes, each naming its inputs by index. */
#ifndef MN_HOST_GRAPH_H
#define MN_HOST_GRAPH_H

#include "host/ops.h"
#include "meganeura.h"

/* Inputs of one node: a Llama decode layer takes fourteen (ops.h). */
#define MN_MAX_INPUTS 14
/* Values one fused node reads (optimizer/fusion.c groups no more, and the kernels it generates
 * take no more). */
#define MN_FUSED_MAX_INPUTS 4
#define MN_ERROR_CAP        512

/* Op attributes. Unused fields stay zero so that two nodes with equal attributes
 * compare and hash equal byte for byte. */
typedef struct mn_op_attrs {
  float scale;      /* scale */
  float eps;        /* rms_norm, layer_norm, group_norm */
  float theta;      /* rope */
  int pos_offset;   /* rope with a static offset; slice_last(_grad), increment_u32: the start */
  int head_dim;     /* rope, attention */
  int num_heads;    /* attention */
  int num_kv_heads; /* attention */
  int stride;       /* conv2d */
  int padding;      /* conv2d */
  int groups;       /* group_norm */
  int channels_a;   /* split_a, split_b */
  int variant;      /* backward ops shared by several forward ops (e.g. causal or not) */
  int act;          /* matmul_bias_act, group_norm: an mn_act applied to the result */
  int64_t num_rows; /* scatter_add */
  int64_t seed;     /* dropout, dropout_grad: the mask's key (host/pointwise.h) */
} mn_op_attrs;

/* Activations that epilogues apply (mn_op_attrs.act). */
typedef enum mn_act { MN_ACT_NONE, MN_ACT_RELU, MN_ACT_GELU, MN_ACT_SILU, MN_ACT_COUNT } mn_act;

/* Values a node writes besides its own (MN_OPF_MULTI_OUTPUT in ops.h). */
#define MN_MAX_EXTRA_OUTPUTS 3

/* The element program of a fused node (MN_OP_FUSED, made by optimizer/fusion.c): ops applied
 * in order, each to the node's inputs or to earlier results, every result rounded to F32 as
 * the ops it replaces store theirs; the last result is the node's value, and a result whose
 * `out` is k >= 1 is also written as the node's extra value k (read through an extra_output
 * node, plan.h). Operand a names input a when a < the node's num_inputs, else result
 * a - num_inputs.
 *
 * Every op is pointwise except at most one row op (mn_fused_is_row_op: a norm or a norm's x
 * gradient over the last axis of the node's shape). Instructions before it that it reads are
 * its prologue, computed as its input is loaded; instructions after it that read it are its
 * epilogue, applied before its result is stored. A row op's weight and bias operands are node
 * inputs of shape [N] (the last axis) that nothing else reads; every other input has the
 * node's shape. */
#define MN_FUSED_MAX_INSTRS 64
#define MN_FUSED_MAX_ARGS   3

typedef struct mn_fused_instr {
  mn_op op;    /* its arity is the number of operands */
  float scale; /* scale's attribute, else 0 */
  float eps;   /* a norm's attribute, else 0 */
  uint8_t args[MN_FUSED_MAX_ARGS];
  uint8_t out; /* k >= 1: also written as extra value k; else 0 */
} mn_fused_instr;

typedef struct mn_fused_prog {
  int num_instrs;
  mn_fused_instr instrs[MN_FUSED_MAX_INSTRS]; /* [num_instrs, MAX) are zero */
} mn_fused_prog;

typedef struct mn_node_rec {
  mn_op op;
  int num_inputs;
  mn_node inputs[MN_MAX_INPUTS];
  mn_tensor_type type;
  mn_op_attrs attrs;
  char *name;           /* inputs and parameters; owned */
  float *data;          /* constants; owned, numel floats */
  mn_fused_prog *fused; /* fused nodes; owned */
} mn_node_rec;

/* The attention forward ops, which a training plan may have write their row statistics. */
static inline bool mn_op_is_attention(mn_op op) {
  return op == MN_OP_CAUSAL_ATTENTION || op == MN_OP_FULL_ATTENTION ||
         op == MN_OP_CROSS_ATTENTION || op == MN_OP_CAUSAL_ATTENTION_PACKED;
}

/* Attention ops whose variant 1 writes row statistics as extra value 1 (ops.h). */
static inline bool mn_op_writes_attention_stats(mn_op op) {
  return mn_op_is_attention(op) || op == MN_OP_QKV_CAUSAL_ATTENTION;
}

/* The gradients of causal_attention_packed, whose last input is the positions. */
static inline bool mn_op_is_packed_attention_grad(mn_op op) {
  switch (op) {
  case MN_OP_PACKED_ATTENTION_GRAD_Q:
  case MN_OP_PACKED_ATTENTION_GRAD_K:
  case MN_OP_PACKED_ATTENTION_GRAD_V:
  case MN_OP_PACKED_ATTENTION_GRAD_KV:
  case MN_OP_PACKED_ATTENTION_GRAD_Q_SAVED:
  case MN_OP_PACKED_ATTENTION_GRAD_KV_SAVED: return true;
  default: return false;
  }
}

/* The attention gradients that read the forward's output (input 4) and statistics (input 5). */
static inline bool mn_op_is_saved_attention_grad(mn_op op) {
  return op == MN_OP_ATTENTION_GRAD_Q_SAVED || op == MN_OP_ATTENTION_GRAD_KV_SAVED ||
         op == MN_OP_PACKED_ATTENTION_GRAD_Q_SAVED || op == MN_OP_PACKED_ATTENTION_GRAD_KV_SAVED;
}

/* attrs.variant of a parameter that mn_set_trainable froze (host/param_layout.h's
 * MN_PARAM_DERIVED is 1; a derived parameter stacks trainable ones only). */
#define MN_PARAM_FROZEN 2

static inline bool mn_param_is_frozen(const mn_node_rec *n) {
  return n->op == MN_OP_PARAMETER && n->attrs.variant == MN_PARAM_FROZEN;
}

struct mn_graph {
  mn_node_rec *nodes;
  size_t num_nodes, cap_nodes;
  mn_node *outputs;
  size_t num_outputs;
  mn_status status;
  char error[MN_ERROR_CAP];
  /* mn_graph_find_leaf's hash of the named nodes; owned. A cache: NULL or out of date is
   * fine (the next lookup rebuilds it), so code that fills nodes by hand needs no care. */
  struct mn_name_index *names;
};

/* Appends a node (inputs, type and attrs copied; name copied when not NULL).
 * Returns MN_NO_NODE and records an out-of-memory error in g on failure. */
mn_node mn_graph_append(mn_graph *g, mn_op op, const mn_node *inputs, int num_inputs,
                        const mn_tensor_type *type, const mn_op_attrs *attrs, const char *name);

static inline const mn_node_rec *mn_graph_at(const mn_graph *g, mn_node id) {
  return &g->nodes[id];
}

/* Records the sticky builder error: the first failure wins, later ones are dropped.
 * Also sets the thread's last error. Returns MN_NO_NODE for tail calls. */
mn_node mn_graph_fail(mn_graph *g, mn_status s, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Builder preamble: NULL graph, a graph already in error, or MN_NO_NODE / unknown
 * node ids in `ins` all make the builder return MN_NO_NODE. `fn` names the builder
 * in messages. Returns true when the builder may proceed. */
bool mn_graph_check_inputs(mn_graph *g, const char *fn, const mn_node *ins, int n);

/* "[2,3,4]" (U32 tensors get a "u32" suffix); returns buf. */
const char *mn_shape_str(const mn_tensor_type *t, char *buf, size_t size);

/* "f32", "u32", "bf16", "f16" ("?" for anything else), and back (false if unknown). */
const char *mn_dtype_name(mn_dtype dt);
bool mn_dtype_from_name(const char *s, mn_dtype *out);

mn_tensor_type mn_type_make(mn_dtype dt, const int64_t *shape, int rank);
bool mn_type_same_shape(const mn_tensor_type *a, const mn_tensor_type *b);

/* Copies a node, duplicating its owned name, constant data and fused program; false on
 * allocation failure (dst then owns whatever was copied and must still be freed). */
bool mn_node_rec_copy(mn_node_rec *dst, const mn_node_rec *src);

/* Deep copy (names, constant data, fused programs, outputs, error). NULL on allocation
 * failure. */
mn_graph *mn_graph_clone(const mn_graph *g);

/* mn_graph_toposort with its status (the public function returns only the graph). */
mn_status mn_graph_toposort_status(const mn_graph *g, mn_graph **sorted);

/* The end of a rewriting pass: *g becomes `work` sorted (a pass appends nodes that earlier
 * ones now read) and both old graphs are freed; on failure *g stays and work is freed. */
mn_status mn_graph_replace_sorted(mn_graph **g, mn_graph *work);

/* Node index by input/parameter name, or MN_NO_NODE. op restricts the search
 * (MN_OP_INPUT or MN_OP_PARAMETER); with several matches, the first. A hash lookup: the index
 * follows nodes appended (mn_graph_append) or written past the indexed ones, and a graph whose
 * node array was replaced or shrunk is indexed again; a named node renamed in place after a
 * lookup is the one change it does not see. A lookup on a graph whose nodes were written by
 * hand may build the index, so concurrent first lookups need such a graph to be indexed first
 * (one lookup). */
mn_node mn_graph_find_leaf(const mn_graph *g, mn_op op, const char *name);

/* Names mn_graph_find_leaf has compared on this thread so far: tests count them to prove
 * that lookups do not scan the graph. */
size_t mn_graph_name_compares(void);

/* How many extra outputs (each read through an extra_output node) node n writes. */
int mn_node_num_extra_outputs(const mn_node_rec *n);

/* A malloc'd copy of p, or NULL (out of memory). */
mn_fused_prog *mn_fused_prog_dup(const mn_fused_prog *p);
bool mn_fused_prog_equal(const mn_fused_prog *a, const mn_fused_prog *b);
/* Whether p is a well-formed program over num_inputs inputs: 1 to MN_FUSED_MAX_INSTRS
 * instructions of pointwise ops (not fused) and at most one row op, each with its arity, every
 * operand an input or an earlier result, a row op's weight and bias node inputs read by
 * nothing else, every input read, every result but the last read or written out, the extra
 * values numbered 1 .. n (n <= MN_MAX_EXTRA_OUTPUTS) once each and not on the last result,
 * attributes only where the op has them. On false, a reason goes to why. */
bool mn_fused_prog_check(const mn_fused_prog *p, int num_inputs, char *why, size_t why_size);
/* The ops a fused program may hold as its row op: layer_norm, rms_norm and their x
 * gradients. */
bool mn_fused_is_row_op(mn_op op);
/* The index of p's row op, or -1. */
int mn_fused_prog_row(const mn_fused_prog *p);
/* Whether input k is read as a row vector of the last axis (a row op's weight or bias). */
bool mn_fused_input_is_row(const mn_fused_prog *p, int k);
/* How many extra values p writes (the largest out). */
int mn_fused_prog_num_extra(const mn_fused_prog *p);

#endif
