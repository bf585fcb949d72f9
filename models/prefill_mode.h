/* The generator's prefill mode, for tests and benchmarks: an internal of models/generator.c
 * that needs none of model_internal.h's dependencies (cJSON). */
#ifndef MN_MODELS_PREFILL_MODE_H
#define MN_MODELS_PREFILL_MODE_H

#include "meganeura.h"

/* How the generator feeds a prompt: MN_PREFILL_AUTO (the default) in chunks of the prefill
 * graph, except a short last chunk on the CPU (prefill_pays in models/generator.c); CHUNKS pads
 * every last chunk; TOKENS goes one token per launch through the decode graph, the reference
 * that tests compare the chunks with. */
typedef enum mn_prefill_mode {
  MN_PREFILL_AUTO,
  MN_PREFILL_CHUNKS,
  MN_PREFILL_TOKENS
} mn_prefill_mode;
/* Sets g's mode; returns whether g has the chunks (false: its weights could not be shared, and
 * it always goes token by token). */
bool mn_generator_set_prefill_mode(mn_generator *g, mn_prefill_mode mode);

#endif
