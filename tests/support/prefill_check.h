/* The generator's batched prefill against its token-by-token prefill: the same tokens from
 * the same prompts (test_generator_prefill on the CPU, test_cuda_generator on CUDA). */
#ifndef MN_TESTS_SUPPORT_PREFILL_CHECK_H
#define MN_TESTS_SUPPORT_PREFILL_CHECK_H

#include "meganeura.h"

/* The tiny config of family f with room for prompts longer than a prefill chunk, and its
 * weights (seeded) at path. */
mn_model_config mn_test_prefill_config(mn_model_family f);

/* n_new tokens per sequence after prompts [batch, n_prompt] (a deterministic pattern), then
 * 4 more in a second call, from a generator of the model at path, max_seq rows, on backend be
 * in precision prec,
 * its prompt fed in chunks, the last one padded (MN_PREFILL_CHUNKS), or (token_path) one token
 * per launch; out [batch, n_new + 4]. */
void mn_test_prefill_tokens(const mn_model_config *c, const char *path, mn_backend be,
                            mn_precision prec, int64_t batch, int64_t max_seq, size_t n_prompt,
                            size_t n_new, const mn_sampling *s, bool token_path, uint32_t *out);

#endif
