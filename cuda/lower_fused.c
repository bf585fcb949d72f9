/* Lowering of fused nodes: CUDA source generated from the node's program (host/graph.h).
 *
 * Each pointwise instruction becomes a call of the element function that the unfused op's
 * kernel uses (its row of host/pointwise.h, through mn_pw_apply), so every op keeps its float or
 * double math. Between instructions the result passes through an empty asm statement: NVRTC
 * runs with --fmad=true and would otherwise contract one op's product with the next op's sum
 * into an FMA, skipping the rounding to float that the unfused graph does when it stores the
 * value; with the barrier a fused node computes exactly what its ops compute apart.
 *
 * A program without a row op is the grid-stride float4 loop of mn_pw_map over one element
 * function that returns the node's value and its extra values. A program with a row op (a
 * norm or its x gradient) instantiates that op's kernel (norm.cuh) over a loader and a
 * storer generated here: the loader computes the row op's x and dy from the node's inputs
 * (the prologue) and writes the prologue's extra values when the kernel says so (once per
 * element); the storer applies the epilogue to the row op's results and stores the node's
 * value and the other extra values. Pointwise results that the epilogue reads without
 * depending on the row op are computed again in the storer: they are the same function of
 * the same inputs, so they are the same bits.
 *
 * Storage: the generated templates take `const IO &io` and reach every buffer through
 * mn_out / mn_in (cuda/kernels/common.cuh), so each input, the node's value and each extra
 * value may be stored as bf16 / fp16: values widen to float as they are loaded, the
 * intermediates stay in float registers, and only stored values are rounded (once). Nothing
 * the kernel stores is read back. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "cuda/emit.h"
#include "cuda/lower_norm.h"
#include "host/error.h"
#include "host/pointwise.h"

#define PW_BLOCK      256
#define PW_MAX_BLOCKS 4096
/* Two element functions of at most MN_FUSED_MAX_INSTRS lines of under 160 characters each,
 * and the loops around them. */
#define CODE_CAP 32768

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

static int arity(const mn_fused_instr *in) { return mn_op_table[in->op].arity; }

/* One element function: f(x0, .., x<ni-1>[, r], o0, o1, ..) computes the instructions in
 * need and returns operands outs[] through o0, o1, ..; when row >= 0 that instruction's
 * result comes in as r. */
typedef struct elem_fn {
  bool need[MN_FUSED_MAX_INSTRS];
  bool reads[MN_FUSED_MAX_INPUTS];
  int row;
  int num_outs;
  int outs[MN_MAX_EXTRA_OUTPUTS + 3];
} elem_fn;

/* Marks operand a and everything it depends on (stopping at f's row op). */
static void mark(const mn_fused_prog *p, int ni, int a, elem_fn *f) {
  if (a < ni) {
    f->reads[a] = true;
    return;
  }
  int i = a - ni;
  if (f->need[i]) return;
  f->need[i] = true;
  if (i == f->row) return;
  for (int k = 0; k < arity(&p->instrs[i]); k++)
    mark(p, ni, p->instrs[i].args[k], f);
}

static void add_out(const mn_fused_prog *p, int ni, int a, elem_fn *f) {
  f->outs[f->num_outs++] = a;
  mark(p, ni, a, f);
}

/* Operand a: input a (the function's x<a>) or result a - ni (t<a - ni>). */
static void operand(text *t, int a, int ni) {
  if (a < ni)
    put(t, "x%d", a);
  else
    put(t, "t%d", a - ni);
}

static void element_function(text *t, const char *name, const mn_fused_prog *p, int ni,
                             const elem_fn *f) {
  put(t, "  auto %s = [](", name);
  for (int k = 0; k < ni; k++)
    put(t, "%sfloat x%d", k ? ", " : "", k);
  if (f->row >= 0) put(t, ", float r");
  for (int o = 0; o < f->num_outs; o++)
    put(t, ", float &o%d", o);
  put(t, ") {\n");
  for (int r = 0; r < p->num_instrs; r++) {
    if (!f->need[r]) continue;
    const mn_fused_instr *in = &p->instrs[r];
    if (r == f->row) {
      put(t, "    float t%d = r;\n", r);
      continue;
    }
    /* mn_fused_prog_check admits only pointwise ops, and each has a row (host/pointwise.h). */
    put(t, "    float t%d = mn_pw_apply<%d>(", r, mn_pw_code_of_op(in->op));
    for (int k = 0; k < 3; k++) {
      if (k) put(t, ", ");
      if (k < arity(in))
        operand(t, in->args[k], ni);
      else
        put(t, "0.0f");
    }
    put(t, ", 0.0, __uint_as_float(0x%08xu));\n", mn_cu_float_bits(in->scale));
    if (r + 1 < p->num_instrs) put(t, "    asm(\"\" : \"+f\"(t%d));\n", r);
  }
  for (int o = 0; o < f->num_outs; o++) {
    put(t, "    o%d = ", o);
    operand(t, f->outs[o], ni);
    put(t, ";\n");
  }
  put(t, "  };\n");
}

/* The node's output, inputs and extra values as out, in<k>, ex<k> (extra k at argument
 * ni + k, after the inputs): float pointers or low-precision views, by their storage. */
static void pointers(text *t, const mn_fused_prog *p, int ni) {
  put(t, "  auto out = mn_out<0>(io);\n");
  for (int k = 0; k < ni; k++)
    put(t, "  auto in%d = mn_in<%d>(io);\n", k, k + 1);
  for (int k = 1; k <= mn_fused_prog_num_extra(p); k++)
    put(t, "  auto ex%d = mn_out<%d>(io);\n", k, ni + k);
}

/* ---- programs without a row op */

/* f applied to component `comp` of every input's float4 (or element i of each input), its
 * results into component `comp` of r0, r1, ... */
static void call(text *t, int ni, int num_outs, const char *comp) {
  bool elem = comp[0] == '[';
  put(t, "f(");
  for (int k = 0; k < ni; k++)
    put(t, elem ? "%sin%d%s" : "%sa%d%s", k ? ", " : "", k, comp);
  for (int o = 0; o < num_outs; o++)
    put(t, elem ? ", r%d" : ", r%d%s", o, comp);
  put(t, ");\n");
}

/* The stores of the results: r0 to out, r<o> to the buffer of extra value outs[o]. */
static void stores(text *t, const mn_fused_prog *p, int ni, const elem_fn *f, const char *at,
                   bool vec) {
  for (int o = 0; o < f->num_outs; o++) {
    int k = o ? p->instrs[f->outs[o] - ni].out : 0;
    char dst[16];
    snprintf(dst, sizeof dst, k ? "ex%d" : "out", k);
    if (vec)
      put(t, "    mn_st4(%s, %s, r%d);\n", dst, at, o);
    else
      put(t, "      %s[%s] = r%d;\n", dst, at, o);
  }
}

static void pointwise_kernel(text *t, const mn_fused_prog *p, int ni) {
  elem_fn f = {.row = -1};
  add_out(p, ni, ni + p->num_instrs - 1, &f);
  for (int r = 0; r < p->num_instrs; r++)
    if (p->instrs[r].out) add_out(p, ni, ni + r, &f);
  put(t, "template <long long N, class IO> __device__ void MN_GEN(const IO &io) {\n");
  element_function(t, "f", p, ni, &f);
  pointers(t, p, ni);
  put(t, "  constexpr long long NQ = N / 4;\n  MN_FOR_EACH(q, NQ) {\n");
  for (int k = 0; k < ni; k++)
    put(t, "    const float4 a%d = mn_ld4(in%d, q);\n", k, k);
  for (int o = 0; o < f.num_outs; o++)
    put(t, "    float4 r%d;\n", o);
  static const char *const comps[] = {".x", ".y", ".z", ".w"};
  for (int c = 0; c < 4; c++) {
    put(t, "    ");
    call(t, ni, f.num_outs, comps[c]);
  }
  stores(t, p, ni, &f, "q", true);
  put(t, "  }\n  if constexpr (N %% 4 != 0) {\n");
  put(t, "    const long long i = NQ * 4 + (long long)blockIdx.x * blockDim.x + threadIdx.x;\n");
  put(t, "    if (i < N) {\n");
  for (int o = 0; o < f.num_outs; o++)
    put(t, "      float r%d;\n", o);
  put(t, "      ");
  call(t, ni, f.num_outs, "[i]");
  stores(t, p, ni, &f, "i", false);
  put(t, "    }\n  }\n}\n");
}

static mn_status lower_pointwise(const mn_cu_op_ctx *c, text *t, int nargs, const mn_cu_arg *args) {
  pointwise_kernel(t, c->node->fused, c->node->num_inputs);
  int64_t n = mn_cu_numel(c);
  char targs[32];
  snprintf(targs, sizeof targs, "<%lldLL>", (long long)n);
  int k = t->full ? -1 : mn_cu_kernel_generated(c, PW_BLOCK, t->s, targs);
  unsigned blocks = mn_cu_blocks((n + 3) / 4, PW_BLOCK);
  if (blocks > PW_MAX_BLOCKS) blocks = PW_MAX_BLOCKS;
  return mn_cu_launch(c, k, blocks, 1, 1, 0, nargs, args);
}

/* ---- programs with a row op */

/* The lambda body that runs element function `name` over the VEC components of element e:
 * loads the inputs it reads, passes `extra_args` (the row op's operands or results), and
 * stores results outs[first..] to the extra values' buffers (or out, for the node's value),
 * guarded by `when` unless it is NULL. */
static void run_elem(text *t, const char *name, const mn_fused_prog *p, int ni, const elem_fn *f,
                     int first, const char *const *extra_args, int num_extra_args,
                     const char *when) {
  for (int k = 0; k < ni; k++)
    if (f->reads[k])
      put(t, "        float a%d[VEC];\n        mn_ld_vec<VEC>(in%d + e, a%d);\n", k, k, k);
  for (int o = first; o < f->num_outs; o++)
    put(t, "        float v%d[VEC];\n", o);
  put(t, "#pragma unroll\n        for (int c = 0; c < VEC; c++)\n          %s(", name);
  for (int k = 0; k < ni; k++)
    put(t, f->reads[k] ? "%sa%d[c]" : "%s0.0f", k ? ", " : "", k);
  for (int a = 0; a < num_extra_args; a++)
    put(t, ", %s", extra_args[a]);
  for (int o = first; o < f->num_outs; o++)
    put(t, ", v%d[c]", o);
  put(t, ");\n");
  if (when && first < f->num_outs) put(t, "        if (%s) {\n", when);
  for (int o = first; o < f->num_outs; o++) {
    int a = f->outs[o], k = a == ni + p->num_instrs - 1 ? 0 : p->instrs[a - ni].out;
    char dst[16];
    snprintf(dst, sizeof dst, k ? "ex%d" : "out", k);
    put(t,
        when ? "          mn_st_vec<VEC>(%s + e, v%d);\n"
             : "        mn_st_vec<VEC>(%s + e, v%d);\n",
        dst, o);
  }
  if (when && first < f->num_outs) put(t, "        }\n");
}

/* Whether each result depends on the row op's. */
static void depends_on_row(const mn_fused_prog *p, int ni, int row, bool *dep) {
  for (int r = 0; r < p->num_instrs; r++) {
    dep[r] = r == row;
    for (int k = 0; k < arity(&p->instrs[r]); k++) {
      int a = p->instrs[r].args[k];
      dep[r] |= a >= ni && dep[a - ni];
    }
  }
}

static void row_kernel(text *t, const mn_fused_prog *p, int ni, int row) {
  const mn_fused_instr *op = &p->instrs[row];
  bool grad = op->op == MN_OP_LAYER_NORM_GRAD_X || op->op == MN_OP_RMS_NORM_GRAD_X;
  bool center = op->op == MN_OP_LAYER_NORM || op->op == MN_OP_LAYER_NORM_GRAD_X;
  bool dep[MN_FUSED_MAX_INSTRS];
  depends_on_row(p, ni, row, dep);
  /* Prologue: x and dy, then the extra values that do not wait for the row op. */
  elem_fn pro = {.row = -1}, epi = {.row = row};
  add_out(p, ni, op->args[0], &pro);
  if (grad) add_out(p, ni, op->args[2], &pro);
  int operands = pro.num_outs;
  for (int r = 0; r < p->num_instrs; r++)
    if (p->instrs[r].out && !dep[r]) add_out(p, ni, ni + r, &pro);
  add_out(p, ni, ni + p->num_instrs - 1, &epi);
  for (int r = 0; r < p->num_instrs; r++)
    if (p->instrs[r].out && dep[r]) add_out(p, ni, ni + r, &epi);

  put(t, "template <int BLOCK, int RPB, long long ROWS, int VEC, long long N, int ITEMS, bool "
         "CACHE, class IO>\n__device__ void MN_GEN(const IO &io) {\n");
  element_function(t, "pro", p, ni, &pro);
  element_function(t, "epi", p, ni, &epi);
  pointers(t, p, ni);
  put(t, "  %s<BLOCK, RPB, ROWS, VEC, N, ITEMS, CACHE, %s, 0x%08xu>(\n      in%d, ",
      grad ? "mn_norm_grad_x_with" : "mn_norm_fwd_with", center ? "true" : "false",
      mn_cu_float_bits(op->eps), op->args[1]);
  if (!grad) {
    if (center)
      put(t, "in%d, ", op->args[2]);
    else
      put(t, "nullptr, ");
  }
  put(t, "\n      [&](long long e, float *x, float *dy, bool write) {\n");
  if (operands == pro.num_outs) put(t, "        (void)write;\n");
  if (!grad) put(t, "        (void)dy;\n");
  static const char *const xdy[] = {"x[c]", "dy[c]"};
  run_elem(t, "pro", p, ni, &pro, operands, xdy, operands, "write");
  put(t, "      },\n      [&](long long e, const float *r) {\n");
  static const char *const rc[] = {"r[c]"};
  run_elem(t, "epi", p, ni, &epi, 0, rc, 1, NULL);
  put(t, "      });\n}\n");
}

mn_status mn_cu_lower_FUSED(const mn_cu_op_ctx *c) {
  const mn_fused_prog *p = c->node->fused;
  int ni = c->node->num_inputs;
  char why[128];
  if (!p || !mn_fused_prog_check(p, ni, why, sizeof why))
    return mn_fail(MN_ERR_STATE, "cuda backend: node %u (fused): bad program: %s", c->id,
                   p ? why : "none");
  int extra = mn_fused_prog_num_extra(p);
  mn_cu_arg args[1 + MN_FUSED_MAX_INPUTS + MN_MAX_EXTRA_OUTPUTS] = {mn_cu_out(c)};
  for (int i = 0; i < ni; i++)
    args[1 + i] = mn_cu_in(c, i);
  for (int k = 1; k <= extra; k++)
    args[ni + k] = mn_cu_node_arg(mn_plan_extra_output(c->plan, c->id, k));
  text t = {.s = malloc(CODE_CAP)};
  if (!t.s) return mn_cu_oom(c);
  int row = mn_fused_prog_row(p);
  mn_status st;
  if (row < 0) {
    st = lower_pointwise(c, &t, 1 + ni + extra, args);
  } else {
    row_kernel(&t, p, ni, row);
    st = t.full ? mn_cu_oom(c)
                : mn_cu_launch_norm_rows(c, &c->node->type, t.s, 1 + ni + extra, args);
  }
  free(t.s);
  return st;
}
