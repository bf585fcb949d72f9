/* Shared by the model builders of models/: the family builders and the checks and helpers
 * they use. Models are written against the public API (meganeura.h); the one internal they
 * use is host/error.h, to report failures through mn_last_error() like every public
 * function does. */
#ifndef MN_MODELS_MODEL_INTERNAL_H
#define MN_MODELS_MODEL_INTERNAL_H

#include <cjson/cJSON.h>

#include "meganeura.h"

/* Longest name_prefix accepted, so that every parameter name fits MN_MODEL_NAME_CAP. */
#define MN_MODEL_PREFIX_CAP 128
#define MN_MODEL_NAME_CAP   256

/* The defaults of mn_model_build's name_prefix and the candidates mn_model_name_prefix
 * tries, best first. */
#define MN_GPT2_PREFIX  "transformer."
#define MN_LLAMA_PREFIX "model."

/* A parameter named prefix + the formatted rest: "transformer." "h.3.ln_1.weight". */
mn_node mn_model_param(mn_graph *g, const char *prefix, const int64_t *shape, int rank,
                       const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* The limits that mn_model_config_load, mn_model_config_parse and mn_model_config_check
 * enforce before anything is allocated (meganeura.h states them). The layer limit keeps
 * graphs far below 2^32 nodes and their build time short; the parameter limit is the leaf
 * builders' element limit, so that no size computed from a config overflows. */
#define MN_MODEL_MAX_LAYERS     65536
#define MN_MODEL_MAX_PARAMETERS ((int64_t)1 << 40)

/* The parameters mn_model_build declares for c, counted in double (no overflow). */
double mn_model_parameter_count(const mn_model_config *c);

/* The sizes and options of a config, checked as mn_model_config_load checks the file's
 * values (a config may also be filled by hand): MN_ERR_INVALID_ARGUMENT naming the field. */
mn_status mn_model_config_check(const char *fn, const mn_model_config *c);

/* Reads a JSON file of at most 64 MiB: MN_ERR_IO when it cannot be read, MN_ERR_FORMAT when
 * it is not JSON. */
/* mn_model_config_load of a GGUF file (models/config_gguf.c). */
mn_status mn_model_config_load_gguf(const char *fn, const char *path, mn_model_config *out);
mn_status mn_model_read_json(const char *fn, const char *path, cJSON **out);

/* What the family builders build with: the graph, its config and sizes, the prefix of the
 * base model's names, and the adapters (lora NULL: none). */
typedef struct mn_model_ctx {
  mn_graph *g;
  const mn_model_config *c;
  int64_t batch, seq;
  const char *prefix;
  const mn_lora_config *lora;
  bool packed;       /* examples packed in rows: attention within each (mn_model_options) */
  mn_node positions; /* "position_ids" when the family builder has declared it */
  /* The decode graph (seq 1, models/decode.c) and the prefill graph (seq rows): RoPE at "pos"
   * and attention over the KV caches ("k_cache.{i}", "v_cache.{i}" [B, max_seq, kv_dim]) after
   * writing rows "pos" .. "pos"+seq-1; 0: training. */
  int64_t max_seq;
  mn_node pos, kv_len;
  /* Linear weights quantized (not MN_QUANT_NONE): each is a U32 input of the parameter's name
   * holding the packed rows of W [out, in] (host/quant.h), filled at load. */
  mn_quant quant;
  int group_size;
  bool no_head; /* the prefill graph: the final norm's output, no vocabulary product */
} mn_model_ctx;

/* The weight of a linear layer with in -> out features, named as mn_model_param names it: the
 * parameter ([out, in], or [in, out] for a Conv1D), or with m->quant a U32 input
 * [out, row words] that mn_model_linear multiplies through mn_matmul_quant. */
mn_node mn_model_linear_weight(const mn_model_ctx *m, bool conv1d, int64_t out, int64_t in,
                               const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* RoPE of x at positions 0..T-1, at the packed rows' position ids, or in a decode graph at
 * "pos". */
mn_node mn_model_rope(const mn_model_ctx *m, mn_node x);
/* Layer i's attention: causal, packed, or (decode graph) k and v appended to the layer's
 * caches at "pos" and q attending to their first kv_len rows. */
mn_node mn_model_attention(const mn_model_ctx *m, int i, mn_node q, mn_node k, mn_node v);

/* The decode graph of c (models/decode.c): the family graph for one new token per sequence
 * with its KV caches, then mn_sample. Inputs "input_ids" U32 [B, 1], GPT-2's "position_ids"
 * U32 [B, 1] (every row pos), "pos" and "kv_len" U32 [1], the caches, "sample_params" F32 [3]
 * and "sample_key" U32 [3]; output 0 the sampled ids U32 [B]. The step advances itself: the
 * ids become input_ids and row pos % MN_DECODE_RING of "token_ring" U32 [MN_DECODE_RING, B]
 * (output 1), and pos, kv_len, the key's position and position_ids move on by one (output 2,
 * the last of these writes), so launches follow each other with nothing set in between. */
#define MN_DECODE_RING 64
mn_status mn_model_build_decode(const mn_model_config *c, int64_t batch, int64_t max_seq,
                                const char *name_prefix, mn_graph **out);
/* The same with quantized linear weights (mn_model_ctx.quant). */
mn_status mn_model_build_decode_quant(const mn_model_config *c, int64_t batch, int64_t max_seq,
                                      const char *name_prefix, mn_quant quant, int group_size,
                                      mn_graph **out);

/* Fills the session sq of gq, a graph built with quantized linear weights (mn_model_ctx.quant),
 * from a safetensors or (gguf) GGUF file: parameters as they are, linear weights quantized
 * (models/quant_load.c). */
mn_status mn_model_load_quant(const mn_model_config *c, const char *weights_path,
                              const char *prefix, bool gguf, mn_quant q, int group_size,
                              const mn_graph *gq, mn_session *sq);
/* The prefill graph of c: the decode graph's layers for `rows` tokens per sequence at
 * positions pos .. pos+rows-1, each layer writing those rows of its caches and attending
 * causally over them (query row r sees cache rows 0 .. pos+r, kv_len = pos+rows), without the
 * head: output 0 the final norm's output [B, rows, D]. Inputs as the decode graph's, with
 * "input_ids" (and GPT-2's "position_ids") U32 [B, rows], and no sampling inputs; quantized
 * linear weights as mn_model_build_decode_quant's. */
mn_status mn_model_build_prefill(const mn_model_config *c, int64_t batch, int64_t max_seq,
                                 int64_t rows, const char *name_prefix, mn_quant quant,
                                 int group_size, mn_graph **out);

/* The family graphs, up to the logits [B, T, V]: each declares its inputs ("input_ids", and
 * GPT-2's "position_ids") and its parameters in transformers' state_dict order. Errors are
 * left in the graph (sticky), and the result is then MN_NO_NODE. */
mn_node mn_gpt2_logits(const mn_model_ctx *m);
mn_node mn_llama_logits(const mn_model_ctx *m);

/* A linear layer of the module "{prefix}{module}" with weight w: x w^T (Linear, w [out, in])
 * or, when conv1d, x w (GPT-2's Conv1D, w [in, out]), plus bias unless MN_NO_NODE; plus its
 * adapter when m->lora targets the module, declaring "{prefix}{module}.lora_A.weight" and
 * ".lora_B.weight". */
mn_node mn_model_linear(const mn_model_ctx *m, mn_node x, mn_node w, mn_node bias, bool conv1d,
                        const char *module);

/* The next comma-separated item of *list, spaces trimmed, into item (cut to cap - 1 bytes);
 * false at the end of the list. */
bool mn_lora_next_target(const char **list, char *item, size_t cap);
/* Whether target list `targets` (comma-separated, or "all-linear") names the module. */
bool mn_lora_targets_module(const char *targets, const char *module);
/* Checks a LoRA configuration against a family: MN_ERR_INVALID_ARGUMENT naming the field or
 * the target that matches no linear layer of the family. */
mn_status mn_lora_config_check(const char *fn, mn_model_family f, const mn_lora_config *l);

/* "dir/file" into out (MN_LORA_PATH_CAP bytes), or MN_ERR_INVALID_ARGUMENT when too long. */
#define MN_LORA_PATH_CAP 4096
mn_status mn_lora_path(const char *fn, const char *dir, const char *file, char *out);
/* Writes adapter_config.json at path. */
mn_status mn_lora_write_config(const char *fn, const char *path, const mn_lora_config *l,
                               bool fan_in_fan_out);

/* The session of g's decode graph, for benchmarks that profile one token's kernels. */
mn_session *mn_generator_decode_session(mn_generator *g);

#endif
