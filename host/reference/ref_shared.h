/* Math shared by forward and backward reference kernels, so that a gradient is the
 * derivative of exactly what the forward kernel computed. */
#ifndef MN_HOST_REF_SHARED_H
#define MN_HOST_REF_SHARED_H

#include "ref_kernels.h"

/* A row's max and log(sum(exp(x - max))): softmax and log_softmax of the row follow. */
typedef struct mn_ref_row_stats {
  double max, log_sum;
} mn_ref_row_stats;
mn_ref_row_stats mn_ref_row_stats_of(const float *x, size_t n);

/* Rotate-half RoPE of input 0 (x [T, D] or [B, T, D]) into the node's output with the
 * node's attrs; positions restart at `offset` in each batch. direction +1 rotates by
 * the angle (the forward op), -1 by its negative (the gradient). */
void mn_ref_rope_rotate(const mn_ref_ctx *c, double offset, int direction);

/* p[s] = softmax over the n_keys visible keys of scale * q.k[s], for one query head;
 * k points at the head's slice of row 0 and rows are kv_stride floats apart. */
void mn_ref_attention_probs(const float *qh, const float *k, size_t kv_stride, size_t n_keys,
                            size_t head_dim, double scale, double *p);

#endif
