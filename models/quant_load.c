/* Weights of a graph built with quantized linear layers (mn_model_ctx.quant): the file is read
 * once into an f32 CPU session of the plain decode graph (so that safetensors, sharded
 * checkpoints and GGUF load through their one loader, with its checks, names and layouts), and
 * the graph's session gets every parameter as it is and every linear weight quantized. A GGUF
 * tensor already in the requested GGML format is copied block for block instead, its rows
 * un-permuted as the loader un-permutes values. */
#include <stdlib.h>
#include <string.h>

#include "host/error.h"
#include "host/quant.h"
#include "io/gguf.h"
#include "models/model_internal.h"

static uint32_t ggml_type_of(mn_quant q) {
  return q == MN_QUANT_Q8_0   ? MN_GGML_Q8_0
         : q == MN_QUANT_Q4_0 ? MN_GGML_Q4_0
         : q == MN_QUANT_Q4_1 ? MN_GGML_Q4_1
                              : UINT32_MAX;
}

/* The GGUF tensor holding `name` in the requested block format, or NULL. */
static const mn_gguf_tensor *gguf_blocks(const char *fn, const mn_gguf *gf, mn_quant q,
                                         const char *name, mn_gguf_hf *hf) {
  mn_gguf_arch arch;
  if (!gf || mn_gguf_arch_of(fn, gf, &arch) != MN_OK) return NULL;
  for (size_t i = 0; i < mn_gguf_tensor_count(gf); i++) {
    const mn_gguf_tensor *t = mn_gguf_tensor_at(gf, i);
    bool known = false;
    if (t->type != ggml_type_of(q) || mn_gguf_hf_tensor(fn, gf, arch, t, hf, &known) != MN_OK ||
        !known || strcmp(hf->name, name) != 0)
      continue;
    return t;
  }
  return NULL;
}

/* The packed rows [out, words] of one linear weight, held as f32 `w` in the staging session
 * ([in, out] for GPT-2's Conv1D, else [out, in]). */
static mn_status pack_weight(const char *fn, const mn_gguf *gf, bool conv1d, mn_quant q, int gs,
                             const char *name, float *w, int64_t out, int64_t in, uint32_t *dst) {
  size_t words = mn_quant_row_words(q, gs, in), row_bytes = mn_quant_row_bytes(q, gs, in);
  mn_gguf_hf hf;
  const mn_gguf_tensor *t = gguf_blocks(fn, gf, q, name, &hf);
  if (t) {
    const unsigned char *src = t->data;
    unsigned char *tmp = NULL;
    if (hf.layout == MN_GGUF_UNPERMUTE) {
      if (!(tmp = malloc((size_t)out * row_bytes)))
        return mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: out of memory for \"%s\"", fn, name);
      if (!mn_gguf_unpermute_rows(src, tmp, (uint64_t)out, row_bytes, hf.heads)) {
        free(tmp);
        return mn_fail(MN_ERR_FORMAT, "%s: tensor \"%s\": %lld rows do not split into %d heads", fn,
                       t->name, (long long)out, hf.heads);
      }
      src = tmp;
    }
    memset(dst, 0, (size_t)out * words * 4);
    for (int64_t r = 0; r < out; r++)
      memcpy((unsigned char *)dst + (size_t)r * words * 4, src + (size_t)r * row_bytes, row_bytes);
    free(tmp);
    return MN_OK;
  }
  float *rows = w;
  if (conv1d) {
    if (!(rows = malloc((size_t)out * (size_t)in * sizeof *rows)))
      return mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: out of memory for \"%s\"", fn, name);
    for (int64_t i = 0; i < in; i++)
      for (int64_t o = 0; o < out; o++)
        rows[o * in + i] = w[i * out + o];
  }
  mn_quantize(q, gs, rows, (size_t)out, (size_t)in, dst);
  if (rows != w) free(rows);
  return MN_OK;
}

static bool find_node(const mn_graph *g, const char *name, mn_node_info *info) {
  for (size_t i = 0; i < mn_graph_num_nodes(g); i++)
    if (mn_graph_node(g, (mn_node)i, info) == MN_OK && info->name && strcmp(info->name, name) == 0)
      return true;
  return false;
}

static mn_status copy_all(const char *fn, const mn_model_config *c, const mn_gguf *gf, mn_quant q,
                          int gs, const mn_graph *g0, mn_session *s0, const mn_graph *gq,
                          mn_session *sq) {
  mn_status st = MN_OK;
  for (size_t i = 0; st == MN_OK && i < mn_graph_num_nodes(gq); i++) {
    mn_node_info info, src;
    if (mn_graph_node(gq, (mn_node)i, &info) != MN_OK || !info.name) continue;
    bool param = strcmp(info.op, "parameter") == 0;
    bool packed = strcmp(info.op, "input") == 0 && info.type.dtype == MN_U32 && info.type.rank == 2;
    if (!(param || packed) || !find_node(g0, info.name, &src) || strcmp(src.op, "parameter") != 0)
      continue;
    size_t n = (size_t)mn_tensor_type_numel(&src.type);
    float *w = malloc(n * sizeof *w);
    if (!w) return mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: out of memory for \"%s\"", fn, info.name);
    st = mn_session_read_param(s0, info.name, w, n);
    if (st == MN_OK && param) st = mn_session_set_parameter(sq, info.name, w, n);
    if (st == MN_OK && packed) {
      int64_t out = info.type.shape[0], in = (int64_t)n / out;
      size_t words = (size_t)mn_tensor_type_numel(&info.type);
      uint32_t *dst = malloc(words * sizeof *dst);
      if (!dst) st = mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: out of memory for \"%s\"", fn, info.name);
      if (st == MN_OK)
        st = pack_weight(fn, gf, c->family == MN_MODEL_GPT2, q, gs, info.name, w, out, in, dst);
      if (st == MN_OK) st = mn_session_set_input_u32(sq, info.name, dst, words);
      free(dst);
    }
    free(w);
  }
  return st;
}

mn_status mn_model_load_quant(const mn_model_config *c, const char *weights_path,
                              const char *prefix, bool gguf, mn_quant q, int group_size,
                              const mn_graph *gq, mn_session *sq) {
  const char *fn = "mn_generator_new";
  mn_graph *g0 = NULL;
  mn_session *s0 = NULL;
  mn_gguf *gf = NULL;
  mn_session_options cpu = mn_session_options_default();
  cpu.backend = MN_BACKEND_CPU;
  mn_status st = mn_model_build_decode(c, 1, 1, prefix, &g0);
  if (st == MN_OK) st = mn_build_inference_session(g0, &cpu, &s0);
  if (st == MN_OK)
    st = gguf ? mn_session_load_gguf(s0, weights_path, MN_LOAD_STRICT)
              : mn_session_load_safetensors(s0, weights_path, true);
  if (st == MN_OK && gguf && ggml_type_of(q) != UINT32_MAX) st = mn_gguf_open(weights_path, &gf);
  if (st == MN_OK) st = copy_all(fn, c, gf, q, group_size, g0, s0, gq, sq);
  mn_gguf_close(gf);
  mn_session_free(s0);
  mn_graph_free(g0);
  return st;
}
