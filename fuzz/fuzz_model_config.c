/* libFuzzer target for the config.json reader: the input is the text of a config. The reader must
 * refuse it or accept it without crashes, leaks or undefined behavior; an accepted config must
 * pass the checks that mn_model_build repeats, stay within the stated limits, and, when small
 * enough to build quickly, build into a graph whose parameters are the ones counted for the
 * limit (so a config the reader lets through never fails or overflows later).
 *
 * Seeds (fuzz/corpus/model_config/): the configs of the tests (GPT-2 124M and SmolLM2-135M as
 * the hub ships them, the tiny configs of the command's tests) and refused variants;
 * tests/test_fuzz_seeds.c checks that valid_* parse and bad_* do not. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "models/model_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int ok) {
  if (!ok) __builtin_trap();
}

static void check_builds(const mn_model_config *c) {
  mn_graph *g = NULL;
  check(mn_model_build(c, 1, 1, NULL, &g) == MN_OK);
  double params = 0;
  mn_node_info info;
  for (size_t i = 0; i < mn_graph_num_nodes(g); i++)
    if (mn_graph_node(g, (mn_node)i, &info) == MN_OK && strcmp(info.op, "parameter") == 0)
      params += (double)mn_tensor_type_numel(&info.type);
  check(params == mn_model_parameter_count(c));
  mn_graph_free(g);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = malloc(size + 1);
  if (!text) return 0;
  memcpy(text, data, size);
  text[size] = '\0';
  mn_model_config c, before;
  memset(&c, 0xA5, sizeof c);
  before = c;
  mn_status st = mn_model_config_parse(text, &c);
  free(text);
  check(st == MN_OK || st == MN_ERR_FORMAT || st == MN_ERR_UNSUPPORTED);
  if (st != MN_OK) {
    check(memcmp(&c, &before, sizeof c) == 0); /* *out changes only on success */
    check(mn_last_error()[0] != '\0');
    return 0;
  }
  check(mn_model_config_check("fuzz", &c) == MN_OK);
  check(c.num_layers <= MN_MODEL_MAX_LAYERS);
  check(mn_model_parameter_count(&c) <= (double)MN_MODEL_MAX_PARAMETERS);
  if (c.num_layers <= 4) check_builds(&c);
  return 0;
}
