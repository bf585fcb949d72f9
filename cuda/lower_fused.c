/* Lowering of fused nodes: CUDA source generated from the node's program (host/graph.h).
 *
 * Each instruction becomes a call of the element function that the unfused op's kernel
 * uses (mn_pw_apply of cuda/kernels/pointwise.cuh), so every op keeps its float or double
 * math. Between instructions the result passes through an empty asm statement: NVRTC runs
 * with --fmad=true and would otherwise contract one op's product with the next op's sum
 * into an FMA, skipping the rounding to float that the unfused graph does when it stores
 * the value; with the barrier a fused node computes exactly what its ops compute apart.
 * The kernel is the grid-stride float4 loop of mn_pw_map over one lambda per element. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../host/error.h"
#include "emit.h"

#define PW_BLOCK      256
#define PW_MAX_BLOCKS 4096
/* The longest program (MN_FUSED_MAX_INSTRS lines of under 160 characters) and the loop. */
#define CODE_CAP 16384

typedef struct text {
  char *s;
  size_t len;
  bool full;
} text;

static void put(text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(text *t, const char *fmt, ...) {
  if (t->full) return;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(t->s + t->len, CODE_CAP - t->len, fmt, ap);
  va_end(ap);
  if (n < 0 || (size_t)n >= CODE_CAP - t->len)
    t->full = true;
  else
    t->len += (size_t)n;
}

/* Each op's code in pointwise.cuh is MN_PW_<ENUM>; the program holds pointwise ops only. */
static const char *const pw_code[MN_OP_COUNT] = {
#define PW_CODE(e, name, arity, flags) [MN_OP_##e] = "MN_PW_" #e,
    MN_OP_LIST(PW_CODE)
#undef PW_CODE
};

static unsigned float_bits(float f) {
  unsigned u;
  memcpy(&u, &f, sizeof u);
  return u;
}

/* Operand a: input a (the lambda's x<a>) or result a - ni (t<a - ni>). */
static void operand(text *t, int a, int ni) {
  if (a < ni)
    put(t, "x%d", a);
  else
    put(t, "t%d", a - ni);
}

/* The lambda f(x0, .., x<ni-1>) computing one element. */
static void element_function(text *t, const mn_fused_prog *p, int ni) {
  put(t, "  auto f = [](");
  for (int k = 0; k < ni; k++)
    put(t, "%sfloat x%d", k ? ", " : "", k);
  put(t, ") -> float {\n");
  for (int r = 0; r < p->num_instrs; r++) {
    const mn_fused_instr *in = &p->instrs[r];
    int arity = mn_op_table[in->op].arity;
    put(t, "    float t%d = mn_pw_apply<%s>(", r, pw_code[in->op]);
    for (int k = 0; k < 3; k++) {
      if (k) put(t, ", ");
      if (k < arity)
        operand(t, in->args[k], ni);
      else
        put(t, "0.0f");
    }
    put(t, ", 0.0, __uint_as_float(0x%08xu));\n", float_bits(in->scale));
    if (r + 1 < p->num_instrs) put(t, "    asm(\"\" : \"+f\"(t%d));\n", r);
  }
  put(t, "    return t%d;\n  };\n", p->num_instrs - 1);
}

/* f applied to component `comp` of every input's float4 (or to element i of each input). */
static void call(text *t, int ni, const char *comp) {
  put(t, "f(");
  for (int k = 0; k < ni; k++)
    put(t, comp[0] == '[' ? "%sin%d%s" : "%sa%d%s", k ? ", " : "", k, comp);
  put(t, ")");
}

static void kernel(text *t, const mn_fused_prog *p, int ni) {
  put(t, "template <long long N> __device__ void MN_GEN(const mn_ptrs &io) {\n");
  element_function(t, p, ni);
  put(t, "  float *out = mn_arg<float>(io, 0);\n");
  for (int k = 0; k < ni; k++)
    put(t, "  const float *in%d = mn_arg<const float>(io, %d);\n", k, k + 1);
  put(t, "  constexpr long long NQ = N / 4;\n  MN_FOR_EACH(q, NQ) {\n");
  for (int k = 0; k < ni; k++)
    put(t, "    const float4 a%d = reinterpret_cast<const float4 *>(in%d)[q];\n", k, k);
  put(t, "    reinterpret_cast<float4 *>(out)[q] = make_float4(");
  static const char *const comps[] = {".x", ".y", ".z", ".w"};
  for (int c = 0; c < 4; c++) {
    if (c) put(t, ", ");
    call(t, ni, comps[c]);
  }
  put(t, ");\n  }\n  if constexpr (N %% 4 != 0) {\n");
  put(t, "    const long long i = NQ * 4 + (long long)blockIdx.x * blockDim.x + threadIdx.x;\n");
  put(t, "    if (i < N) out[i] = ");
  call(t, ni, "[i]");
  put(t, ";\n  }\n}\n");
}

mn_status mn_cu_lower_FUSED(const mn_cu_op_ctx *c) {
  const mn_fused_prog *p = c->node->fused;
  int ni = c->node->num_inputs;
  char why[128];
  if (!p || !mn_fused_prog_check(p, ni, why, sizeof why))
    return mn_fail(MN_ERR_STATE, "cuda backend: node %u (fused): bad program: %s", c->id,
                   p ? why : "none");
  text t = {.s = malloc(CODE_CAP)};
  if (!t.s) return mn_cu_oom(c);
  kernel(&t, p, ni);
  int64_t n = mn_cu_numel(c);
  char targs[32];
  snprintf(targs, sizeof targs, "<%lldLL>", (long long)n);
  int k = t.full ? -1 : mn_cu_kernel_generated(c, PW_BLOCK, t.s, targs);
  free(t.s);
  mn_cu_arg args[1 + MN_MAX_INPUTS] = {mn_cu_out(c)};
  for (int i = 0; i < ni; i++)
    args[1 + i] = mn_cu_in(c, i);
  unsigned blocks = mn_cu_blocks((n + 3) / 4, PW_BLOCK);
  if (blocks > PW_MAX_BLOCKS) blocks = PW_MAX_BLOCKS;
  return mn_cu_launch(c, k, blocks, 1, 1, 0, 1 + ni, args);
}
