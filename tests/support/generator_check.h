/* Shared by the generator suites: a tiny model's random weights written to a safetensors
 * file, and the oracle of greedy decoding, the argmax of the training graph's logits over
 * the whole window recomputed. */
#ifndef MN_TESTS_SUPPORT_GENERATOR_CHECK_H
#define MN_TESTS_SUPPORT_GENERATOR_CHECK_H

#include "meganeura.h"

/* The tiny configs of tests/support/models.h with weights of std 0.3 (logits far from flat). */
mn_model_config mn_test_gen_config(mn_model_family f);

/* Writes c's weights (seeded) to path. */
void mn_test_gen_write_weights(const mn_model_config *c, const char *path, uint64_t seed);

/* The argmax of the next-token logits after ids[0..n) of the model in path, recomputed over
 * the whole window by the training graph on the CPU. */
typedef struct mn_test_oracle mn_test_oracle;
mn_test_oracle *mn_test_oracle_new(const mn_model_config *c, const char *path, int64_t window);
uint32_t mn_test_oracle_next(mn_test_oracle *o, const uint32_t *ids, size_t n);
void mn_test_oracle_free(mn_test_oracle *o);

#endif
