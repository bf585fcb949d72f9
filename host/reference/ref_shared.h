/* Math shared by forward and backward reference kernels, so that a gradient is the
 * derivative of exactly what the forward kernel computed. */
#ifndef MN_HOST_REF_SHARED_H
#define MN_HOST_REF_SHARED_H

#include "host/reference/ref_kernels.h"

static inline size_t mn_ref_last_dim(const mn_tensor_type *t) {
  return (size_t)t->shape[t->rank - 1];
}

/* The four sizes of an NCHW tensor. */
typedef struct mn_ref_nchw {
  size_t n, c, h, w;
} mn_ref_nchw;
static inline mn_ref_nchw mn_ref_nchw_of(const mn_tensor_type *t) {
  return (mn_ref_nchw){(size_t)t->shape[0], (size_t)t->shape[1], (size_t)t->shape[2],
                       (size_t)t->shape[3]};
}

/* C[M,N] = op(A) op(B) with double accumulation; strides pick the transposes.
 * a(i,k) = a[i*a_row + k*a_col], b(k,j) = b[k*b_row + j*b_col]. */
/* y [rows, out] = x [rows, in] W^T with W [out, in] quantized (host/quant.h), each row of W
 * dequantized once and dotted in double, threaded over the output features; false when out of
 * memory. */
bool mn_ref_quant_product(const float *x, size_t rows, const void *w, mn_quant format, int group,
                          size_t in, size_t out, float *y);
void mn_ref_gemm(const float *a, size_t a_row, size_t a_col, const float *b, size_t b_row,
                 size_t b_col, float *c, size_t m, size_t n, size_t k);
/* Threads for `work` multiply-adds over `items` independent items: MN_CPU_THREADS, else the
 * cores online, at most MN_REF_MAX_THREADS and `items`; one for work too small to pay for
 * starting a thread. */
#define MN_REF_MAX_THREADS 16
size_t mn_ref_threads(double work, size_t items);
/* run(part t) for t < threads (parts `part_size` bytes apart), part 0 on the calling thread and
 * each other on a thread of its own; a thread that cannot start leaves its part to the caller. */
void mn_ref_run_parts(void (*run)(const void *part), const void *parts, size_t part_size,
                      size_t threads);
/* The same product on the calling thread alone, c [m, n] at row pitch ldc: each element the
 * same double sum as mn_ref_gemm's. */
void mn_ref_gemm_serial(const float *a, size_t a_row, size_t a_col, const float *b, size_t b_row,
                        size_t b_col, float *c, size_t ldc, size_t m, size_t n, size_t k);

/* out[j] = sum over the rows r of x[r * cols + j], in double, rounded once (sum_rows and the
 * bias gradient of matmul_at_bgrad, which must agree bit for bit). */
void mn_ref_column_sums(const float *x, size_t rows, size_t cols, float *out);

/* x[i] = act(x[i]) in place, each result rounded to float as the activation op's own
 * kernel stores it (so an epilogue gives what the separate op gives). */
void mn_ref_apply_act(float *x, size_t n, mn_act act);

/* o[i] = row `code` of host/pointwise.h over a[i], b[i], c[i] with attribute s, for a row
 * that reads no scalar (the fused-group interpreter runs one instruction at a time). */
void mn_ref_pw_loop(int code, const float *a, const float *b, const float *c, double s, float *o,
                    size_t n);

/* A row's max and log(sum(exp(x - max))): softmax and log_softmax of the row follow. */
typedef struct mn_ref_row_stats {
  double max, log_sum;
} mn_ref_row_stats;
mn_ref_row_stats mn_ref_row_stats_of(const float *x, size_t n);

/* The failure of a sparse cross-entropy (labels: input 1) whose every label is
 * MN_IGNORE_LABEL: its mean would be over no rows. */
mn_status mn_ref_all_labels_ignored(const mn_ref_ctx *c);

/* Rotate-half RoPE of one row x [width] (heads of hd values) into out (may be x) at position
 * pos, by the angle (direction +1) or its negative (-1); angles, sines and cosines in double. */
void mn_ref_rope_row(const float *x, float *out, size_t width, size_t hd, double pos, double theta,
                     int direction);
/* out [n] = x / sqrt(mean(x^2) + eps) * w, accumulated in double. */
void mn_ref_rms_norm_row(const float *x, const float *w, size_t n, double eps, float *out);

/* Rotate-half RoPE of input 0 (x [T, D] or [B, T, D]) into the node's output with the
 * node's attrs; positions restart at `offset` in each batch, or when `positions` is not NULL
 * row r (of B * T) is at positions[r]. direction +1 rotates by the angle (the forward op), -1 by
 * its negative (the gradient). */
void mn_ref_rope_rotate(const mn_ref_ctx *c, double offset, const uint32_t *positions,
                        int direction);

/* The first key query t sees in a packed row whose position at t is pos: t - pos, or key 0
 * when pos exceeds t. */
static inline size_t mn_ref_segment_start(size_t t, uint32_t pos) {
  return (size_t)pos < t ? t - (size_t)pos : 0;
}

/* p[s] = softmax over the n_keys visible keys of scale * q.k[s], for one query head;
 * k points at the head's slice of row 0 and rows are kv_stride floats apart. stats, when not
 * NULL, gets the row's statistics as the CUDA kernels keep them: the base-2 maximum of the
 * scaled scores and 1 / the sum of exp(score - maximum). */
void mn_ref_attention_probs(const float *qh, const float *k, size_t kv_stride, size_t n_keys,
                            size_t head_dim, double scale, double *p, float stats[2]);

/* One query head's attention over n_keys keys: p = mn_ref_attention_probs (stats as there),
 * then out [head_dim] = sum_s p[s] v[s] accumulated in double in acc [head_dim]; k and v point
 * at the head's slice of row 0, rows kv_stride floats apart. */
void mn_ref_attend_head(const float *qh, const float *k, const float *v, size_t kv_stride,
                        size_t n_keys, size_t head_dim, double scale, double *p, double *acc,
                        float *out, float stats[2]);

/* The blocks q | k | v of each of `rows` rows of x (q_width, kv_width, kv_width floats a row)
 * copied apart into dense q [rows, q_width], k and v [rows, kv_width] (qkv_causal_attention
 * and its gradient). */
void mn_ref_split_qkv(const float *x, size_t rows, size_t q_width, size_t kv_width, float *q,
                      float *k, float *v);

#endif
