/* The fuzz targets' seed corpora (fuzz/corpus/<target>/) still say what their names claim: every
 * valid_* seed is accepted to the end by the reader its target fuzzes, and every bad_* seed is
 * refused. A seed that went stale (a plan cache whose key no longer matches, a config or
 * tokenizer.json the readers have learned to refuse) would leave the fuzzer exploring only the
 * first check; here it fails a test instead. Each message says how to write the seeds again. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>

#include "fuzz/plan_cache_graph.h"
#include "host/error.h"
#include "io/gguf.h"
#include "io/plan_cache.h"
#include "io/safetensors.h"
#include "io/tokenizer_internal.h"
#include "tests/support/mn_test.h"
#include "tests/support/tmp_dir.h"

/* <root>/tests/this.c -> <root>/fuzz/corpus/<name> */
static void corpus_dir(const char *name, char *out, size_t size) {
  const char *me = __FILE__;
  const char *tail = strstr(me, "tests/test_fuzz_seeds.c");
  cr_assert_not_null(tail, "cannot locate the source tree from %s", me);
  snprintf(out, size, "%.*sfuzz/corpus/%s", (int)(tail - me), me, name);
}

typedef mn_status (*seed_reader)(const char *text, size_t len, const char *path);

/* Runs `read` on every seed of the corpus; returns how many were valid_* and bad_*. */
static void check_corpus(const char *name, seed_reader read, const char *regenerate, size_t *valid,
                         size_t *bad) {
  char dir_path[1024];
  corpus_dir(name, dir_path, sizeof dir_path);
  DIR *d = opendir(dir_path);
  cr_assert_not_null(d, "cannot open %s", dir_path);
  *valid = *bad = 0;
  for (struct dirent *e; (e = readdir(d));) {
    bool is_valid = strncmp(e->d_name, "valid", 5) == 0,
         is_bad = strncmp(e->d_name, "bad_", 4) == 0;
    if (!is_valid && !is_bad) continue;
    char path[2048];
    snprintf(path, sizeof path, "%s/%s", dir_path, e->d_name);
    size_t len = 0;
    char *text = mn_test_read_file(path, &len);
    mn_status st = read(text, len, path);
    free(text);
    if (is_valid)
      cr_assert_eq(st, MN_OK, "%s: the seed is no longer accepted (%s); write it again: %s", path,
                   mn_last_error(), regenerate);
    else
      cr_assert_neq(st, MN_OK, "%s: the seed is accepted, but its name says it is refused; %s",
                    path, regenerate);
    *(is_valid ? valid : bad) += 1;
  }
  closedir(d);
}

static mn_status read_plan_cache(const char *text, size_t len, const char *path) {
  (void)path;
  mn_graph *g = mn_fuzz_plan_cache_graph();
  mn_session_options o = mn_fuzz_plan_cache_options();
  mn_plan *plan = NULL;
  char why[256] = "";
  mn_status st =
      mn_plan_cache_parse(text, len, g, &o, MN_PLAN_CACHE_VERIFY_CHECKSUM, &plan, why, sizeof why);
  if (st != MN_OK) mn_set_last_error(why);
  mn_plan_free(plan);
  mn_graph_free(g);
  return st;
}

static mn_status read_model_config(const char *text, size_t len, const char *path) {
  (void)len;
  (void)path;
  mn_model_config c;
  return mn_model_config_parse(text, &c);
}

static mn_status read_tokenizer(const char *text, size_t len, const char *path) {
  mn_tokenizer *t = NULL;
  mn_status st = mn_tok_parse(text, len, path, &t);
  mn_tokenizer_free(t);
  return st;
}

static mn_status read_safetensors(const char *text, size_t len, const char *path) {
  mn_safetensors *st = NULL;
  mn_status status = mn_safetensors_open_memory(text, len, path, &st);
  mn_safetensors_close(st);
  return status;
}

Test(fuzz_seeds, safetensors_seeds) {
  size_t valid, bad;
  check_corpus("safetensors", read_safetensors, "edit fuzz/corpus/safetensors/", &valid, &bad);
  cr_assert_geq(valid, 5);
  cr_assert_geq(bad, 10);
}

static mn_status read_gguf(const char *text, size_t len, const char *path) {
  mn_gguf *g = NULL;
  mn_status status = mn_gguf_open_memory(text, len, path, &g);
  mn_gguf_close(g);
  return status;
}

Test(fuzz_seeds, gguf_seeds) {
  size_t valid, bad;
  check_corpus("gguf", read_gguf, "scripts/gen_gguf_fixtures.py, then copy", &valid, &bad);
  cr_assert_geq(valid, 4);
  cr_assert_geq(bad, 3);
}

Test(fuzz_seeds, plan_cache_valid_seed_is_a_cache_of_the_fuzzed_graph) {
  size_t valid, bad;
  check_corpus("plan_cache", read_plan_cache,
               "scripts/fuzz.sh writes fresh ones before each run; to update the checked-in "
               "ones, build fuzz/fuzz_plan_cache.c with -DMN_FUZZ_WRITE_SEEDS and run it with "
               "fuzz/corpus/plan_cache",
               &valid, &bad);
  cr_assert_geq(valid, 1, "fuzz/corpus/plan_cache has no valid* seed");
}

Test(fuzz_seeds, model_config_seeds) {
  size_t valid, bad;
  check_corpus("model_config", read_model_config, "edit fuzz/corpus/model_config/", &valid, &bad);
  cr_assert_geq(valid, 4);
  cr_assert_geq(bad, 4);
}

Test(fuzz_seeds, tokenizer_seeds) {
  size_t valid, bad;
  check_corpus("tokenizer", read_tokenizer, "fuzz/tokenizer_seeds.py", &valid, &bad);
  cr_assert_geq(valid, 5);
  cr_assert_geq(bad, 5);
}

/* mn_tok_parse is mn_tokenizer_load without the file: same results, same messages. */
Test(fuzz_seeds, tokenizer_parse_errors_name_the_label) {
  mn_tokenizer *t = (mn_tokenizer *)&t;
  mn_assert_error(mn_tok_parse("{}", 2, "seed.json", &t), MN_ERR_FORMAT,
                  "mn_tokenizer_load: seed.json: model: missing");
  cr_assert_null(t);
  mn_assert_error(mn_tok_parse("[1", 2, "seed.json", &t), MN_ERR_FORMAT, "not valid JSON");
}
