/* llama.cpp's tensor names -> transformers' names and layouts, for the two architectures the
 * model builders implement. What llama.cpp's convert_hf_to_gguf.py does, undone here:
 *   Llama: q_proj and k_proj rows permuted for llama.cpp's interleaved RoPE (LlamaModel.permute:
 *     reshape(n_head, 2, rows / n_head / 2, cols).swapaxes(1, 2), with n_head the kv head count
 *     for k_proj), so that GGUF row h*hd + 2j + p is transformers' row h*hd + p*hd/2 + j.
 *   GPT-2: Conv1D weights (c_attn, c_proj, c_fc) transposed from [in, out] to [out, in]; the
 *     converter may also write output.weight, a copy of token_embd (the tied head). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/error.h"
#include "io/gguf.h"

mn_status mn_gguf_arch_of(const char *fn, const mn_gguf *g, mn_gguf_arch *out) {
  const mn_gguf_kv *a = mn_gguf_find(g, "general.architecture");
  if (!a || a->type != MN_GGUF_STRING)
    return mn_fail(MN_ERR_FORMAT, "%s: %s: general.architecture is %s", fn, mn_gguf_label(g),
                   a ? "not a string" : "missing");
  const char *s = a->v.str.ptr;
  uint64_t n = a->v.str.len;
  if (n == 5 && memcmp(s, "llama", 5) == 0) return (*out = MN_GGUF_ARCH_LLAMA), MN_OK;
  if (n == 4 && memcmp(s, "gpt2", 4) == 0) return (*out = MN_GGUF_ARCH_GPT2), MN_OK;
  return mn_fail(MN_ERR_UNSUPPORTED,
                 "%s: %s: general.architecture \"%.*s\" is not supported (supported: \"llama\", "
                 "\"gpt2\")",
                 fn, mn_gguf_label(g), (int)(n > 64 ? 64 : n), s);
}

bool mn_gguf_output_tied(const mn_gguf *g) {
  const mn_gguf_tensor *out = mn_gguf_tensor_find(g, "output.weight");
  const mn_gguf_tensor *emb = mn_gguf_tensor_find(g, "token_embd.weight");
  if (!out) return true;
  return emb && emb->type == out->type && emb->rank == out->rank &&
         memcmp(emb->ne, out->ne, sizeof emb->ne) == 0 && emb->bytes == out->bytes &&
         memcmp(emb->data, out->data, emb->bytes) == 0;
}

typedef struct name_rule {
  const char *gguf, *hf; /* per-block names: "attn_q.weight" -> "self_attn.q_proj.weight" */
  mn_gguf_layout layout;
  const char *heads_key; /* MN_GGUF_UNPERMUTE: the metadata key of the head count */
} name_rule;

static const name_rule llama_global[] = {
    {"token_embd.weight", "model.embed_tokens.weight", MN_GGUF_SAME, NULL},
    {"output_norm.weight", "model.norm.weight", MN_GGUF_SAME, NULL},
    {"output.weight", "lm_head.weight", MN_GGUF_SAME, NULL},
};
static const name_rule llama_block[] = {
    {"attn_q.weight", "self_attn.q_proj.weight", MN_GGUF_UNPERMUTE, "llama.attention.head_count"},
    {"attn_k.weight", "self_attn.k_proj.weight", MN_GGUF_UNPERMUTE,
     "llama.attention.head_count_kv"},
    {"attn_v.weight", "self_attn.v_proj.weight", MN_GGUF_SAME, NULL},
    {"attn_output.weight", "self_attn.o_proj.weight", MN_GGUF_SAME, NULL},
    {"ffn_gate.weight", "mlp.gate_proj.weight", MN_GGUF_SAME, NULL},
    {"ffn_up.weight", "mlp.up_proj.weight", MN_GGUF_SAME, NULL},
    {"ffn_down.weight", "mlp.down_proj.weight", MN_GGUF_SAME, NULL},
    {"attn_norm.weight", "input_layernorm.weight", MN_GGUF_SAME, NULL},
    {"ffn_norm.weight", "post_attention_layernorm.weight", MN_GGUF_SAME, NULL},
};
static const name_rule gpt2_global[] = {
    {"token_embd.weight", "transformer.wte.weight", MN_GGUF_SAME, NULL},
    {"position_embd.weight", "transformer.wpe.weight", MN_GGUF_SAME, NULL},
    {"output_norm.weight", "transformer.ln_f.weight", MN_GGUF_SAME, NULL},
    {"output_norm.bias", "transformer.ln_f.bias", MN_GGUF_SAME, NULL},
    {"output.weight", "lm_head.weight", MN_GGUF_SAME, NULL},
};
static const name_rule gpt2_block[] = {
    {"attn_qkv.weight", "attn.c_attn.weight", MN_GGUF_TRANSPOSE, NULL},
    {"attn_qkv.bias", "attn.c_attn.bias", MN_GGUF_SAME, NULL},
    {"attn_output.weight", "attn.c_proj.weight", MN_GGUF_TRANSPOSE, NULL},
    {"attn_output.bias", "attn.c_proj.bias", MN_GGUF_SAME, NULL},
    {"ffn_up.weight", "mlp.c_fc.weight", MN_GGUF_TRANSPOSE, NULL},
    {"ffn_up.bias", "mlp.c_fc.bias", MN_GGUF_SAME, NULL},
    {"ffn_down.weight", "mlp.c_proj.weight", MN_GGUF_TRANSPOSE, NULL},
    {"ffn_down.bias", "mlp.c_proj.bias", MN_GGUF_SAME, NULL},
    {"attn_norm.weight", "ln_1.weight", MN_GGUF_SAME, NULL},
    {"attn_norm.bias", "ln_1.bias", MN_GGUF_SAME, NULL},
    {"ffn_norm.weight", "ln_2.weight", MN_GGUF_SAME, NULL},
    {"ffn_norm.bias", "ln_2.bias", MN_GGUF_SAME, NULL},
};

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

/* "blk.N.REST" -> N and REST; false for other names. */
static bool block_name(const char *name, long *layer, const char **rest) {
  if (strncmp(name, "blk.", 4) != 0) return false;
  const char *p = name + 4;
  if (*p < '0' || *p > '9' || (*p == '0' && p[1] != '.')) return false;
  long n = 0;
  for (; *p >= '0' && *p <= '9'; p++) {
    if (n > 100000000) return false;
    n = n * 10 + (*p - '0');
  }
  if (*p != '.') return false;
  *layer = n;
  *rest = p + 1;
  return true;
}

static mn_status head_count(const char *fn, const mn_gguf *g, const mn_gguf_tensor *t,
                            const char *key, int *heads) {
  int64_t h = 0;
  const mn_gguf_kv *kv = mn_gguf_find(g, key);
  /* head_count_kv defaults to head_count, as in llama.cpp */
  if (!kv && strstr(key, "_kv")) kv = mn_gguf_find(g, "llama.attention.head_count");
  if (!mn_gguf_kv_int(kv, &h) || h < 1 || h > 1 << 20)
    return mn_fail(MN_ERR_FORMAT, "%s: %s: %s is missing or not a positive integer", fn,
                   mn_gguf_label(g), key);
  int64_t rows = t->rank == 2 ? t->shape[0] : 0;
  if (rows % (2 * h) || rows == 0)
    return mn_fail(MN_ERR_FORMAT,
                   "%s: %s: tensor \"%s\" has %lld rows, not a positive multiple of 2 x %s (%lld)",
                   fn, mn_gguf_label(g), t->name, (long long)rows, key, (long long)h);
  *heads = (int)h;
  return MN_OK;
}

mn_status mn_gguf_hf_tensor(const char *fn, const mn_gguf *g, mn_gguf_arch arch,
                            const mn_gguf_tensor *t, mn_gguf_hf *out, bool *known) {
  bool llama = arch == MN_GGUF_ARCH_LLAMA;
  const name_rule *rules = llama ? llama_global : gpt2_global;
  size_t n = llama ? COUNT(llama_global) : COUNT(gpt2_global);
  const name_rule *hit = NULL;
  long layer = -1;
  const char *rest = t->name;
  if (block_name(t->name, &layer, &rest)) {
    rules = llama ? llama_block : gpt2_block;
    n = llama ? COUNT(llama_block) : COUNT(gpt2_block);
  }
  for (size_t i = 0; i < n && !hit; i++)
    if (strcmp(rest, rules[i].gguf) == 0) hit = &rules[i];
  *known = hit != NULL;
  if (!hit) return MN_OK;
  memset(out, 0, sizeof *out);
  if (layer < 0)
    snprintf(out->name, sizeof out->name, "%s", hit->hf);
  else
    snprintf(out->name, sizeof out->name, "%s.%s.%ld.%s", llama ? "model" : "transformer",
             llama ? "layers" : "h", layer, hit->hf);
  out->layout = hit->layout;
  out->rank = t->rank;
  memcpy(out->shape, t->shape, sizeof out->shape);
  if (hit->layout == MN_GGUF_TRANSPOSE) {
    if (t->rank != 2)
      return mn_fail(MN_ERR_FORMAT, "%s: %s: tensor \"%s\" has rank %d, expected 2", fn,
                     mn_gguf_label(g), t->name, t->rank);
    out->shape[0] = t->shape[1];
    out->shape[1] = t->shape[0];
  }
  if (hit->layout == MN_GGUF_UNPERMUTE) return head_count(fn, g, t, hit->heads_key, &out->heads);
  return MN_OK;
}

bool mn_gguf_unpermute_rows(const void *src, void *dst, uint64_t rows, uint64_t row_bytes,
                            int heads) {
  if (heads < 1 || rows % (2 * (uint64_t)heads)) return false;
  uint64_t hd = rows / (uint64_t)heads, half = hd / 2;
  const unsigned char *s = src;
  unsigned char *d = dst;
  for (uint64_t h = 0; h < (uint64_t)heads; h++)
    for (uint64_t j = 0; j < half; j++)
      for (uint64_t p = 0; p < 2; p++)
        memcpy(d + (h * hd + p * half + j) * row_bytes, s + (h * hd + 2 * j + p) * row_bytes,
               row_bytes);
  return true;
}

mn_status mn_gguf_read_hf_f32(const mn_gguf *g, const mn_gguf_tensor *t, const mn_gguf_hf *hf,
                              float *out, uint64_t n) {
  if (hf->layout == MN_GGUF_SAME) return mn_gguf_read_f32(g, t, out, n);
  mn_status st = mn_gguf_check_convertible(g, t);
  if (st != MN_OK) return st;
  float *tmp = malloc((n ? n : 1) * sizeof *tmp);
  if (!tmp)
    return mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: tensor \"%s\": out of memory", mn_gguf_label(g),
                   t->name);
  st = mn_gguf_read_f32(g, t, tmp, n);
  uint64_t rows = (uint64_t)t->shape[0], cols = t->rank == 2 ? (uint64_t)t->shape[1] : 1;
  if (st == MN_OK && hf->layout == MN_GGUF_TRANSPOSE) {
    for (uint64_t r = 0; r < rows; r++)
      for (uint64_t c = 0; c < cols; c++)
        out[c * rows + r] = tmp[r * cols + c];
  } else if (st == MN_OK &&
             !mn_gguf_unpermute_rows(tmp, out, rows, cols * sizeof(float), hf->heads)) {
    st = mn_fail(MN_ERR_FORMAT, "%s: tensor \"%s\": %llu rows do not split into %d heads",
                 mn_gguf_label(g), t->name, (unsigned long long)rows, hf->heads);
  }
  free(tmp);
  return st;
}
