/* Pretrained weights: mn_session_load_safetensors from one file or from shards behind a
 * model.safetensors.index.json, F16/BF16/F64 converted, extra tensors skipped and named,
 * strict and non-strict handling of missing parameters, and refusals that change nothing;
 * mn_session_save_safetensors round trips, and (when Python has safetensors and numpy)
 * interoperates with safetensors.numpy in both directions. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/safetensors.h"
#include "tests/support/mn_test.h"
#include "tests/support/session_util.h"
#include "tests/support/tmp_dir.h"

#define LEN(a) (sizeof(a) / sizeof((a)[0]))

/* ---------------------------------------------------------------- files */

static void write_text(const char *path, const char *text) {
  mn_test_write_file(path, text, strlen(text));
}

/* ---------------------------------------------------------------- the model */

/* A GPT-2-flavoured toy: embedding, a Conv1D-style linear, a final layer norm. */
typedef struct param_desc {
  const char *name;
  int rank;
  int64_t shape[2];
} param_desc;

static const param_desc params[] = {
    {"wte.weight", 2, {10, 4}},
    {"h.0.attn.c_attn.weight", 2, {4, 12}},
    {"h.0.attn.c_attn.bias", 1, {12}},
    {"ln_f.weight", 1, {12}},
    {"ln_f.bias", 1, {12}},
};

static size_t numel_of(const param_desc *p) {
  return (size_t)(p->rank == 1 ? p->shape[0] : p->shape[0] * p->shape[1]);
}

static mn_graph *toy_graph(void) {
  mn_graph *g = mn_graph_new();
  mn_node tokens = mn_input_u32(g, "tokens", MN_SHAPE(3));
  mn_node wte = mn_parameter(g, "wte.weight", MN_SHAPE(10, 4));
  mn_node w = mn_parameter(g, "h.0.attn.c_attn.weight", MN_SHAPE(4, 12));
  mn_node b = mn_parameter(g, "h.0.attn.c_attn.bias", MN_SHAPE(12));
  mn_node lw = mn_parameter(g, "ln_f.weight", MN_SHAPE(12));
  mn_node lb = mn_parameter(g, "ln_f.bias", MN_SHAPE(12));
  mn_node h = mn_bias_add(g, mn_matmul(g, mn_embedding(g, tokens, wte), w), b);
  mn_node loss = mn_mean_all(g, mn_layer_norm(g, h, lw, lb, 1e-5f));
  mn_set_outputs(g, &loss, 1);
  cr_assert_eq(mn_graph_status(g), MN_OK, "%s", mn_graph_error(g));
  return g;
}

static mn_session *toy_session(mn_graph **g_out) {
  mn_graph *g = toy_graph();
  mn_session *s = mn_test_session(g, MN_BACKEND_CPU, true);
  /* Known values that a refused load must leave in place. */
  for (size_t i = 0; i < LEN(params); i++) {
    size_t n = numel_of(&params[i]);
    float *v = malloc(n * sizeof *v);
    for (size_t k = 0; k < n; k++)
      v[k] = -100.0f - (float)k;
    cr_assert_eq(mn_session_set_parameter(s, params[i].name, v, n), MN_OK);
    free(v);
  }
  *g_out = g;
  return s;
}

/* The values a file gives parameter i: distinct per element and per tensor, and exact in every
 * dtype used here (multiples of 1/8 below 32). */
static float file_value(size_t i, size_t k) { return (float)i + 0.125f * (float)(k % 64) - 4.0f; }

static void assert_param_is(mn_session *s, size_t i, float (*value)(size_t, size_t)) {
  size_t n = numel_of(&params[i]);
  float *got = malloc(n * sizeof *got);
  cr_assert_eq(mn_session_read_param(s, params[i].name, got, n), MN_OK);
  for (size_t k = 0; k < n; k++)
    cr_assert(got[k] == value(i, k), "%s[%zu] = %g, expected %g", params[i].name, k, (double)got[k],
              (double)value(i, k));
  free(got);
}

static float untouched_value(size_t i, size_t k) {
  (void)i;
  return -100.0f - (float)k;
}

static void assert_untouched(mn_session *s) {
  for (size_t i = 0; i < LEN(params); i++)
    assert_param_is(s, i, untouched_value);
}

/* ---------------------------------------------------------------- writing test files */

/* One tensor to write: a parameter's values in `dtype`, with an optional other shape. */
typedef struct file_tensor {
  const char *name;
  const char *dtype;
  size_t param; /* index into params for values and shape */
  int rank;     /* 0: the parameter's shape */
  int64_t shape[2];
} file_tensor;

static void write_file(const char *path, const file_tensor *ts, size_t n) {
  mn_st_tensor *out = calloc(n, sizeof *out);
  void **bufs = calloc(n, sizeof *bufs);
  for (size_t i = 0; i < n; i++) {
    const param_desc *p = &params[ts[i].param];
    size_t numel = numel_of(p), size = mn_st_dtype_size(ts[i].dtype);
    unsigned char *b = malloc(numel * size);
    for (size_t k = 0; k < numel; k++) {
      float v = file_value(ts[i].param, k);
      if (strcmp(ts[i].dtype, "F32") == 0) {
        memcpy(b + 4 * k, &v, 4);
      } else if (strcmp(ts[i].dtype, "F64") == 0) {
        double d = v;
        memcpy(b + 8 * k, &d, 8);
      } else if (strcmp(ts[i].dtype, "I32") == 0) {
        int32_t x = (int32_t)k;
        memcpy(b + 4 * k, &x, 4);
      } else {
        uint16_t h = strcmp(ts[i].dtype, "F16") == 0 ? mn_f32_to_f16(v) : mn_f32_to_bf16(v);
        memcpy(b + 2 * k, &h, 2);
      }
    }
    out[i] =
        (mn_st_tensor){.name = ts[i].name, .dtype = ts[i].dtype, .data = b, .bytes = numel * size};
    out[i].rank = ts[i].rank ? ts[i].rank : p->rank;
    memcpy(out[i].shape, ts[i].rank ? ts[i].shape : p->shape, sizeof ts[i].shape);
    bufs[i] = b;
  }
  const mn_st_meta meta[] = {{"format", "pt"}};
  cr_assert_eq(mn_safetensors_write(path, out, n, meta, 1), MN_OK, "%s", mn_last_error());
  for (size_t i = 0; i < n; i++)
    free(bufs[i]);
  free(bufs);
  free(out);
}

/* Every parameter in `dtype`, plus GPT-2's two attention-mask buffers. */
static void write_full(const char *path, const char *dtype) {
  file_tensor ts[LEN(params) + 2];
  for (size_t i = 0; i < LEN(params); i++)
    ts[i] = (file_tensor){.name = params[i].name, .dtype = dtype, .param = i};
  ts[LEN(params)] = (file_tensor){.name = "h.0.attn.bias", .dtype = "F32", .param = 3};
  ts[LEN(params) + 1] = (file_tensor){.name = "h.1.attn.bias", .dtype = "F32", .param = 3};
  write_file(path, ts, LEN(ts));
}

/* ---------------------------------------------------------------- loading */

static void check_dtype(const char *dtype) {
  mn_tmp_dir t = mn_tmp_dir_make("mn_pretrained");
  const char *path = mn_tmp_path(&t, "model.safetensors");
  write_full(path, dtype);
  mn_graph *g;
  mn_session *s = toy_session(&g);
  cr_assert_eq(mn_session_load_safetensors(s, path, true), MN_OK, "%s", mn_last_error());
  char want[256];
  snprintf(want, sizeof want,
           "mn_session_load_safetensors: %s: skipped 2 tensors not in the graph: h.0.attn.bias, "
           "h.1.attn.bias",
           path);
  cr_assert_str_eq(mn_last_error(), want);
  for (size_t i = 0; i < LEN(params); i++)
    assert_param_is(s, i, file_value);
  mn_session_free(s);
  mn_graph_free(g);
  mn_tmp_dir_remove(&t);
}

Test(pretrained, single_file_f32) { check_dtype("F32"); }
Test(pretrained, single_file_bf16) { check_dtype("BF16"); }
Test(pretrained, single_file_f16) { check_dtype("F16"); }
Test(pretrained, single_file_f64) { check_dtype("F64"); }

Test(pretrained, nothing_skipped_clears_the_message) {
  mn_tmp_dir t = mn_tmp_dir_make("mn_pretrained");
  const char *path = mn_tmp_path(&t, "model.safetensors");
  file_tensor ts[LEN(params)];
  for (size_t i = 0; i < LEN(params); i++)
    ts[i] = (file_tensor){.name = params[i].name, .dtype = "F32", .param = i};
  write_file(path, ts, LEN(ts));
  mn_graph *g;
  mn_session *s = toy_session(&g);
  mn_session_set_parameter(NULL, "x", NULL, 0); /* leaves a message behind */
  cr_assert_eq(mn_session_load_safetensors(s, path, true), MN_OK, "%s", mn_last_error());
  cr_assert_str_eq(mn_last_error(), "");
  mn_session_free(s);
  mn_graph_free(g);
  mn_tmp_dir_remove(&t);
}

/* A file without ln_f.bias: strict refuses it whole, non-strict keeps ln_f.bias. */
static void write_without_ln_f_bias(const char *path) {
  file_tensor ts[LEN(params) - 1];
  for (size_t i = 0; i < LEN(params) - 1; i++)
    ts[i] = (file_tensor){.name = params[i].name, .dtype = "BF16", .param = i};
  write_file(path, ts, LEN(ts));
}

Test(pretrained, strict_refuses_a_missing_parameter) {
  mn_tmp_dir t = mn_tmp_dir_make("mn_pretrained");
  const char *path = mn_tmp_path(&t, "model.safetensors");
  write_without_ln_f_bias(path);
  mn_graph *g;
  mn_session *s = toy_session(&g);
  mn_assert_error(mn_session_load_safetensors(s, path, true), MN_ERR_NOT_FOUND,
                  "strict load, but 1 parameter is not in the file: ln_f.bias");
  assert_untouched(s);
  mn_session_free(s);
  mn_graph_free(g);
  mn_tmp_dir_remove(&t);
}

Test(pretrained, non_strict_keeps_a_missing_parameter) {
  mn_tmp_dir t = mn_tmp_dir_make("mn_pretrained");
  const char *path = mn_tmp_path(&t, "model.safetensors");
  write_without_ln_f_bias(path);
  mn_graph *g;
  mn_session *s = toy_session(&g);
  cr_assert_eq(mn_session_load_safetensors(s, path, false), MN_OK, "%s", mn_last_error());
  cr_assert(strstr(mn_last_error(), "1 parameter not in the file kept its value: ln_f.bias"), "%s",
            mn_last_error());
  for (size_t i = 0; i < LEN(params) - 1; i++)
    assert_param_is(s, i, file_value);
  assert_param_is(s, LEN(params) - 1, untouched_value);
  mn_session_free(s);
  mn_graph_free(g);
  mn_tmp_dir_remove(&t);
}

/* A file that is right except for one tensor: every parameter keeps its value. */
static void check_refused(const file_tensor *bad, mn_status want, const char *fragment) {
  mn_tmp_dir t = mn_tmp_dir_make("mn_pretrained");
  const char *path = mn_tmp_path(&t, "model.safetensors");
  file_tensor ts[LEN(params)];
  for (size_t i = 0; i < LEN(params); i++)
    ts[i] = strcmp(params[i].name, bad->name) == 0
                ? *bad
                : (file_tensor){.name = params[i].name, .dtype = "F32", .param = i};
  write_file(path, ts, LEN(ts));
  mn_graph *g;
  mn_session *s = toy_session(&g);
  mn_assert_error(mn_session_load_safetensors(s, path, false), want, fragment);
  assert_untouched(s);
  mn_session_free(s);
  mn_graph_free(g);
  mn_tmp_dir_remove(&t);
}

Test(pretrained, shape_mismatch_changes_nothing) {
  /* The last parameter is the bad one, so every other was already matched when it fails. */
  file_tensor bad = {.name = "ln_f.bias", .dtype = "F32", .param = 4, .rank = 2, .shape = {3, 4}};
  check_refused(&bad, MN_ERR_SHAPE,
                "tensor \"ln_f.bias\" is [3,4] in the file, the parameter is [12]");
  file_tensor transposed = {
      .name = "h.0.attn.c_attn.weight", .dtype = "F32", .param = 1, .rank = 2, .shape = {12, 4}};
  check_refused(&transposed, MN_ERR_SHAPE, "is [12,4] in the file, the parameter is [4,12]");
}

Test(pretrained, integer_tensor_for_a_parameter_is_refused) {
  file_tensor bad = {.name = "ln_f.weight", .dtype = "I32", .param = 3};
  check_refused(&bad, MN_ERR_FORMAT,
                "tensor \"ln_f.weight\" is I32; parameters load from F32, F16, BF16 or F64");
}

Test(pretrained, missing_and_corrupt_files) {
  mn_graph *g;
  mn_session *s = toy_session(&g);
  mn_assert_error(mn_session_load_safetensors(s, "/tmp/mn_no_such_model.safetensors", false),
                  MN_ERR_IO,
                  "mn_session_load_safetensors: mn_safetensors_open: "
                  "/tmp/mn_no_such_model.safetensors: cannot open");
  mn_tmp_dir t = mn_tmp_dir_make("mn_pretrained");
  const char *path = mn_tmp_path(&t, "model.safetensors");
  write_text(path, "definitely not safetensors");
  mn_assert_error(mn_session_load_safetensors(s, path, false), MN_ERR_FORMAT,
                  "mn_session_load_safetensors: mn_safetensors_open: ");
  assert_untouched(s);
  mn_tmp_dir_remove(&t);
  mn_session_free(s);
  mn_graph_free(g);
}

Test(pretrained, argument_errors) {
  mn_graph *g;
  mn_session *s = toy_session(&g);
  mn_assert_error(mn_session_load_safetensors(NULL, "x", true), MN_ERR_INVALID_ARGUMENT,
                  "mn_session_load_safetensors: session is NULL");
  mn_assert_error(mn_session_load_safetensors(s, NULL, true), MN_ERR_INVALID_ARGUMENT,
                  "mn_session_load_safetensors: path is NULL");
  mn_assert_error(mn_session_save_safetensors(NULL, "x"), MN_ERR_INVALID_ARGUMENT,
                  "mn_session_save_safetensors: session is NULL");
  mn_assert_error(mn_session_save_safetensors(s, NULL), MN_ERR_INVALID_ARGUMENT,
                  "mn_session_save_safetensors: path is NULL");
  mn_assert_error(mn_session_save_safetensors(s, "/nonexistent_mn_dir/model.safetensors"),
                  MN_ERR_IO, "mn_session_save_safetensors: mn_safetensors_write: ");
  mn_session_free(s);
  mn_graph_free(g);
}

/* ---------------------------------------------------------------- sharded */

/* Two shards (BF16 and F16) and an index that also lists the skipped mask buffer. */
static const char *write_sharded(const mn_tmp_dir *t) {
  file_tensor a[] = {{.name = "wte.weight", .dtype = "BF16", .param = 0},
                     {.name = "h.0.attn.c_attn.weight", .dtype = "BF16", .param = 1},
                     {.name = "h.0.attn.bias", .dtype = "F32", .param = 3}};
  file_tensor b[] = {{.name = "h.0.attn.c_attn.bias", .dtype = "F16", .param = 2},
                     {.name = "ln_f.weight", .dtype = "F16", .param = 3},
                     {.name = "ln_f.bias", .dtype = "F64", .param = 4}};
  write_file(mn_tmp_path(t, "model-00001-of-00002.safetensors"), a, LEN(a));
  write_file(mn_tmp_path(t, "model-00002-of-00002.safetensors"), b, LEN(b));
  const char *index = mn_tmp_path(t, "model.safetensors.index.json");
  write_text(index, "{\"metadata\": {\"total_size\": 1000}, \"weight_map\": {"
                    "\"wte.weight\": \"model-00001-of-00002.safetensors\", "
                    "\"h.0.attn.c_attn.weight\": \"model-00001-of-00002.safetensors\", "
                    "\"h.0.attn.bias\": \"model-00001-of-00002.safetensors\", "
                    "\"h.0.attn.c_attn.bias\": \"model-00002-of-00002.safetensors\", "
                    "\"ln_f.weight\": \"model-00002-of-00002.safetensors\", "
                    "\"ln_f.bias\": \"model-00002-of-00002.safetensors\"}}");
  return index;
}

Test(pretrained, sharded_checkpoint) {
  mn_tmp_dir t = mn_tmp_dir_make("mn_pretrained");
  const char *index = write_sharded(&t);
  mn_graph *g;
  mn_session *s = toy_session(&g);
  cr_assert_eq(mn_session_load_safetensors(s, index, true), MN_OK, "%s", mn_last_error());
  cr_assert(strstr(mn_last_error(), "skipped 1 tensor not in the graph: h.0.attn.bias"), "%s",
            mn_last_error());
  for (size_t i = 0; i < LEN(params); i++)
    assert_param_is(s, i, file_value);
  mn_session_free(s);
  mn_graph_free(g);
  mn_tmp_dir_remove(&t);
}

Test(pretrained, sharded_missing_shard_changes_nothing) {
  mn_tmp_dir t = mn_tmp_dir_make("mn_pretrained");
  const char *index = write_sharded(&t);
  unlink(mn_tmp_path(&t, "model-00002-of-00002.safetensors"));
  mn_graph *g;
  mn_session *s = toy_session(&g);
  mn_assert_error(mn_session_load_safetensors(s, index, false), MN_ERR_IO,
                  "shard \"model-00002-of-00002.safetensors\": mn_safetensors_open: ");
  assert_untouched(s);
  mn_session_free(s);
  mn_graph_free(g);
  mn_tmp_dir_remove(&t);
}

Test(pretrained, bad_indexes) {
  mn_tmp_dir t = mn_tmp_dir_make("mn_pretrained");
  write_sharded(&t);
  const char *index = mn_tmp_path(&t, "bad.index.json");
  mn_graph *g;
  mn_session *s = toy_session(&g);
  write_text(index, "{\"weight_map\": {\"ln_f.bias\": \"model-00001-of-00002.safetensors\"}}");
  mn_assert_error(mn_session_load_safetensors(s, index, false), MN_ERR_FORMAT,
                  "weight_map puts \"ln_f.bias\" in model-00001-of-00002.safetensors, which has "
                  "no such tensor");
  write_text(index, "{\"weight_map\": {\"ln_f.bias\": \"../model.safetensors\"}}");
  mn_assert_error(mn_session_load_safetensors(s, index, false), MN_ERR_FORMAT,
                  "weight_map entry \"ln_f.bias\" is not a file name in the index's folder");
  write_text(index, "{\"weight_map\": [1, 2]}");
  mn_assert_error(mn_session_load_safetensors(s, index, false), MN_ERR_FORMAT,
                  "not a safetensors index (no \"weight_map\" object)");
  write_text(index, "{\"weight_map\": ");
  mn_assert_error(mn_session_load_safetensors(s, index, false), MN_ERR_FORMAT,
                  "not a safetensors index");
  mn_assert_error(mn_session_load_safetensors(s, mn_tmp_path(&t, "none.index.json"), false),
                  MN_ERR_IO, "cannot open");
  assert_untouched(s);
  mn_session_free(s);
  mn_graph_free(g);
  mn_tmp_dir_remove(&t);
}

/* ---------------------------------------------------------------- saving */

Test(pretrained, save_round_trips) {
  mn_tmp_dir t = mn_tmp_dir_make("mn_pretrained");
  const char *path = mn_tmp_path(&t, "model.safetensors"),
             *src = mn_tmp_path(&t, "src.safetensors");
  write_full(src, "F32");
  mn_graph *g;
  mn_session *s = toy_session(&g);
  cr_assert_eq(mn_session_load_safetensors(s, src, true), MN_OK);
  cr_assert_eq(mn_session_save_safetensors(s, path), MN_OK, "%s", mn_last_error());
  mn_safetensors *st = NULL;
  cr_assert_eq(mn_safetensors_open(path, &st), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_safetensors_count(st), LEN(params));
  cr_assert_str_eq(mn_safetensors_metadata(st, "format"), "pt");
  for (size_t i = 0; i < LEN(params); i++) {
    mn_safetensors_info info;
    cr_assert_eq(mn_safetensors_info_of(st, params[i].name, &info), MN_OK);
    cr_assert_str_eq(info.dtype, "F32");
    cr_assert_eq(info.rank, params[i].rank);
    for (int d = 0; d < info.rank; d++)
      cr_assert_eq(info.shape[d], params[i].shape[d]);
  }
  mn_safetensors_close(st);
  mn_graph *g2;
  mn_session *s2 = toy_session(&g2);
  cr_assert_eq(mn_session_load_safetensors(s2, path, true), MN_OK, "%s", mn_last_error());
  cr_assert_str_eq(mn_last_error(), "");
  for (size_t i = 0; i < LEN(params); i++)
    assert_param_is(s2, i, file_value);
  mn_session_free(s);
  mn_session_free(s2);
  mn_graph_free(g);
  mn_graph_free(g2);
  mn_tmp_dir_remove(&t);
}

/* ---------------------------------------------------------------- Python interop */

static bool python_has_safetensors(void) {
  return system("python3 -c 'import safetensors.numpy, numpy' >/dev/null 2>&1") == 0;
}

/* Our file read by safetensors.numpy.load_file (values dumped back as raw f32 bytes in
 * params order), and a file written by safetensors.numpy.save_file (F32, F16, F64) loaded by
 * us. */
Test(pretrained, python_interop) {
  if (!python_has_safetensors())
    cr_skip_test("python3 with safetensors and numpy is not available");
  mn_tmp_dir t = mn_tmp_dir_make("mn_pretrained");
  const char *ours = mn_tmp_path(&t, "ours.safetensors"), *dump = mn_tmp_path(&t, "dump.bin");
  const char *theirs = mn_tmp_path(&t, "theirs.safetensors"), *script = mn_tmp_path(&t, "check.py");
  write_text(script,
             "import sys, numpy as np\n"
             "from safetensors import safe_open\n"
             "from safetensors.numpy import load_file, save_file\n"
             "ours, dump, theirs = sys.argv[1:4]\n"
             "names = sys.argv[4:]\n"
             "d = load_file(ours)\n"
             "assert sorted(d) == sorted(names), sorted(d)\n"
             "with safe_open(ours, 'np') as f:\n"
             "    assert f.metadata() == {'format': 'pt'}, f.metadata()\n"
             "with open(dump, 'wb') as out:\n"
             "    for n in names:\n"
             "        assert d[n].dtype == np.float32, (n, d[n].dtype)\n"
             "        out.write(np.ascontiguousarray(d[n]).tobytes())\n"
             "dtypes = [np.float32, np.float16, np.float64, np.float32, np.float16]\n"
             "save_file({n: (d[n] * 2).astype(dt) for n, dt in zip(names, dtypes)}, theirs,\n"
             "          metadata={'format': 'pt'})\n"
             "print(' '.join(str(d[n].shape) for n in names))\n");

  mn_graph *g;
  mn_session *s = toy_session(&g);
  const char *src = mn_tmp_path(&t, "src.safetensors");
  write_full(src, "F32");
  cr_assert_eq(mn_session_load_safetensors(s, src, true), MN_OK);
  cr_assert_eq(mn_session_save_safetensors(s, ours), MN_OK, "%s", mn_last_error());
  char cmd[2048];
  int w = snprintf(cmd, sizeof cmd, "python3 %s %s %s %s", script, ours, dump, theirs);
  for (size_t i = 0; i < LEN(params); i++)
    w += snprintf(cmd + w, sizeof cmd - (size_t)w, " %s", params[i].name);
  snprintf(cmd + w, sizeof cmd - (size_t)w, " >%s/shapes.txt", t.path);
  cr_assert_eq(system(cmd), 0, "python check failed: %s", cmd);

  FILE *f = fopen(dump, "rb");
  cr_assert_not_null(f);
  for (size_t i = 0; i < LEN(params); i++) {
    size_t n = numel_of(&params[i]);
    float *py = malloc(n * sizeof *py), *ours_v = malloc(n * sizeof *ours_v);
    cr_assert_eq(fread(py, sizeof *py, n, f), n);
    cr_assert_eq(mn_session_read_param(s, params[i].name, ours_v, n), MN_OK);
    cr_assert(memcmp(py, ours_v, n * sizeof *py) == 0, "%s differs in Python", params[i].name);
    free(py);
    free(ours_v);
  }
  fclose(f);

  /* Twice the values, in mixed dtypes, all exact: loads back as 2 x file_value. */
  cr_assert_eq(mn_session_load_safetensors(s, theirs, true), MN_OK, "%s", mn_last_error());
  for (size_t i = 0; i < LEN(params); i++) {
    size_t n = numel_of(&params[i]);
    float *got = malloc(n * sizeof *got);
    cr_assert_eq(mn_session_read_param(s, params[i].name, got, n), MN_OK);
    for (size_t k = 0; k < n; k++)
      cr_assert(got[k] == 2 * file_value(i, k), "%s[%zu] = %g", params[i].name, k, (double)got[k]);
    free(got);
  }
  mn_session_free(s);
  mn_graph_free(g);
  mn_tmp_dir_remove(&t);
}
