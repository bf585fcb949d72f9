/* The multi-row KV-cache ops (a prefill): a sequence of T tokens written into the caches in
 * chunks of P rows by mn_cache_write, each chunk's queries attending causally over the cache
 * by mn_cached_attention, the last chunk padded, against mn_causal_attention over the whole
 * sequence at once. test_cache_rows runs it on the CPU, test_cuda_cache_rows on CUDA. */
#ifndef MN_TESTS_SUPPORT_CACHE_ROWS_H
#define MN_TESTS_SUPPORT_CACHE_ROWS_H

#include "meganeura.h"

typedef struct mn_test_rows_case {
  int64_t batch, max_seq, t, p; /* t tokens per sequence, p rows per chunk */
  int heads, kv_heads, head_dim;
} mn_test_rows_case;

/* Random q [B, T, H*hd], k and v [B, T, KVH*hd] of the case (seeded). */
typedef struct mn_test_rows_data {
  float *q, *k, *v;
} mn_test_rows_data;
mn_test_rows_data mn_test_rows_data_new(const mn_test_rows_case *c, uint64_t seed);
void mn_test_rows_data_free(mn_test_rows_data *d);

/* The chunks through a session built with `opts`: out [B, T, H*hd] (the real rows of each
 * chunk) and the k and v caches afterwards [B, max_seq, KVH*hd], written row for row. */
void mn_test_rows_chunked(const mn_test_rows_case *c, const mn_test_rows_data *d,
                          const mn_session_options *opts, float *out, float *k_cache,
                          float *v_cache);
/* mn_causal_attention over the whole sequence on the CPU: out [B, T, H*hd]. */
void mn_test_rows_full(const mn_test_rows_case *c, const mn_test_rows_data *d, float *out);

#endif
