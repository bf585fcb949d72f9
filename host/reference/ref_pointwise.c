/* Reference kernels of the element-wise ops, derived from the rows of host/pointwise.h: each
 * element is computed in double by the row's element function and rounded once to float. */
#include "host/pointwise.h"
#include "host/reference/ref_shared.h"

typedef void (*row_loop)(const float *a, const float *b, const float *c, double k, double s,
                         float *o, size_t n);

/* One loop per row, so the element function inlines; operands past the row's inputs are
 * not read (they may be NULL). */
#define ROW_LOOP(name, nin, flags, factor, value)                                                  \
  static void loop_##name(const float *a, const float *b, const float *c, double k, double s,      \
                          float *o, size_t n) {                                                    \
    for (size_t i = 0; i < n; i++)                                                                 \
      o[i] = (float)mn_pw_##name((nin) > 0 ? a[i] : 0.0, (nin) > 1 ? b[i] : 0.0,                   \
                                 (nin) > 2 ? c[i] : 0.0, k, s);                                    \
  }
MN_PW_LIST(ROW_LOOP)
#undef ROW_LOOP

static const row_loop loops[MN_PW_COUNT] = {
#define ROW_ENTRY(name, nin, flags, factor, value) [MN_PW_##name] = loop_##name,
    MN_PW_LIST(ROW_ENTRY)
#undef ROW_ENTRY
};

void mn_ref_pw_loop(int code, const float *a, const float *b, const float *c, double s, float *o,
                    size_t n) {
  loops[code](a, b, c, 0.0, s, o, n);
}

/* The node's output from row `code` over its inputs. */
static mn_status run_row(const mn_ref_ctx *c, mn_pw_code code) {
  unsigned flags = mn_pw_flags(code);
  int nin = mn_pw_num_inputs(code);
  const float *in[3] = {NULL, NULL, NULL};
  for (int k = 0; k < nin; k++)
    in[k] = mn_ref_in_f32(c, k);
  size_t n = mn_ref_numel(c);
  double s = (flags & MN_PW_ATTR) ? (double)c->node->attrs.scale : 0.0;
  double k =
      (flags & MN_PW_SCALAR) ? mn_pw_factor(code, mn_ref_in_f32(c, nin)[0], s, (long long)n) : 0.0;
  loops[code](in[0], in[1], in[2], k, s, mn_ref_out_f32(c), n);
  return MN_OK;
}

#define ROW_KERNEL(name, nin, flags, factor, value)                                                \
  mn_status mn_ref_##name(const mn_ref_ctx *c) { return run_row(c, MN_PW_##name); }
MN_PW_OP_ROWS(ROW_KERNEL)
#undef ROW_KERNEL

mn_status mn_ref_BCE_GRAD(const mn_ref_ctx *c) {
  return run_row(c, c->node->attrs.variant == 0 ? MN_PW_BCE_GRAD_PRED : MN_PW_BCE_GRAD_TARGET);
}
