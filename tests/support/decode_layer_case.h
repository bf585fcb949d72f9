/* llama_decode_layer test cases (host/decode_layer.h): the layer as the op and as the chain of
 * ops it replaces, run for a few decode steps on one backend from the same random weights,
 * inputs and cache rows, so that the two can be compared. */
#ifndef MN_TEST_DECODE_LAYER_CASE_H
#define MN_TEST_DECODE_LAYER_CASE_H

#include <stdbool.h>
#include <stdint.h>

#include "meganeura.h"

typedef struct mn_test_dl_case {
  int64_t batch, dim, heads, kv_heads, head_dim, ff, max_seq;
  int64_t pos;    /* the first step writes this row; rows before it hold random keys and values */
  mn_quant quant; /* MN_QUANT_NONE (0): f32 Linear weights; else packed U32 inputs */
  int group_size;
} mn_test_dl_case;

/* The initializer of a case of those shapes, from row `pos` on, plain weights. */
#define MN_TEST_DL_SHAPE(batch_, dim_, heads_, kv_heads_, head_dim_, ff_, max_seq_, pos_)          \
  {                                                                                                \
    .batch = (batch_), .dim = (dim_), .heads = (heads_), .kv_heads = (kv_heads_),                  \
    .head_dim = (head_dim_), .ff = (ff_), .max_seq = (max_seq_), .pos = (pos_)                     \
  }
/* The same with quantized weights of format quant_ (group_ for the affine ones). */
#define MN_TEST_DL_QUANT(batch_, dim_, heads_, kv_heads_, head_dim_, ff_, max_seq_, pos_, quant_,  \
                         group_)                                                                   \
  {                                                                                                \
    .batch = (batch_), .dim = (dim_), .heads = (heads_), .kv_heads = (kv_heads_),                  \
    .head_dim = (head_dim_), .ff = (ff_), .max_seq = (max_seq_), .pos = (pos_), .quant = (quant_), \
    .group_size = (group_)                                                                         \
  }

/* The layer of case c on inputs "x" [B, 1, C], "k_cache", "v_cache", "pos", "kv_len" and the
 * parameters "ln1", "wq", "wk", "wv", "wo", "ln2", "wgate", "wup", "wdown" (with c->quant the
 * seven Linear weights are U32 inputs of their packed rows): the op when fused, else the ops of
 * models/llama.c's decode layer. Output 0 is the layer's value. */
mn_graph *mn_test_dl_graph(const mn_test_dl_case *c, bool fused);

/* Runs `steps` steps of g (from mn_test_dl_graph of c) in a session with options o: step s
 * writes row c->pos + s with a fresh random x. out gets every step's value [steps, B, C]. The
 * random values depend on c and seed only. */
void mn_test_dl_run(const mn_test_dl_case *c, const mn_graph *g, const mn_session_options *o,
                    int steps, uint64_t seed, float *out);

/* One step of c's fused layer on `backend` with inputs pos and kv_len as given (the rest
 * unset), the status of the step and its wait. */
mn_status mn_test_dl_step_at(const mn_test_dl_case *c, mn_backend backend, uint32_t pos,
                             uint32_t kv_len);

#endif
