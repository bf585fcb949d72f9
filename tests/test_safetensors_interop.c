/* Interoperability with the official safetensors Python package (scripts/fixtures/st_interop.py):
 * files it writes are read here bit for bit, files written here load there, and for the same
 * tensors and metadata both writers produce the same bytes. Skipped without python3, numpy and
 * safetensors. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L /* mkdtemp, popen, getline */
#endif
#include <stdio.h>
#include <stdlib.h>

#include "io/safetensors.h"
#include "tests/support/mn_test.h"

#define LEN(a) (sizeof(a) / sizeof((a)[0]))

/* ---------------------------------------------------------------- running the script */

static void require_python(void) {
  if (system("python3 -c 'import safetensors, numpy' >/dev/null 2>&1") != 0)
    cr_skip_test("python safetensors package not available");
}

/* The script lies next to this file's folder: <root>/tests/this.c -> <root>/scripts/... */
static void script_path(char *out, size_t size) {
  const char *me = __FILE__;
  const char *tail = strstr(me, "tests/test_safetensors_interop.c");
  cr_assert_not_null(tail, "cannot locate the source tree from %s", me);
  snprintf(out, size, "%.*sscripts/fixtures/st_interop.py", (int)(tail - me), me);
}

/* Runs the script with the arguments (paths under /tmp, no quoting needed) and fails the test,
 * showing its output, unless it exits with 0. */
static void run_script(const char *args) {
  char script[512], cmd[1024];
  script_path(script, sizeof script);
  snprintf(cmd, sizeof cmd, "python3 '%s' %s 2>&1", script, args);
  FILE *p = popen(cmd, "r");
  cr_assert_not_null(p, "popen failed");
  char out[4096];
  size_t n = fread(out, 1, sizeof out - 1, p);
  out[n] = '\0';
  int status = pclose(p);
  cr_assert_eq(status, 0, "`%s` failed (status %d):\n%s", cmd, status, out);
}

typedef struct work_dir {
  char s[64];
} work_dir;

static work_dir make_work_dir(void) {
  work_dir d;
  snprintf(d.s, sizeof d.s, "/tmp/mn_st_interop_XXXXXX");
  cr_assert_not_null(mkdtemp(d.s));
  return d;
}

static void remove_work_dir(const work_dir *d) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", d->s);
  cr_assert_eq(system(cmd), 0);
}

/* ---------------------------------------------------------------- hex and manifests */

static int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  cr_assert_fail("bad hex digit '%c'", c);
  return 0;
}

/* Decodes hex into a fresh buffer (NUL-terminated, so names can be used as strings). */
static unsigned char *unhex(const char *h, size_t *n) {
  size_t len = strlen(h);
  cr_assert_eq(len % 2, 0);
  unsigned char *b = malloc(len / 2 + 1);
  for (size_t i = 0; i < len / 2; i++)
    b[i] = (unsigned char)(hex_digit(h[2 * i]) << 4 | hex_digit(h[2 * i + 1]));
  b[len / 2] = 0;
  if (n) *n = len / 2;
  return b;
}

static void put_hex(FILE *f, const void *data, size_t n) {
  for (size_t i = 0; i < n; i++)
    fprintf(f, "%02x", ((const unsigned char *)data)[i]);
}

/* Splits a manifest line at tabs in place; returns the number of fields. */
static int split_tabs(char *line, char **fields, int max) {
  int n = 0;
  line[strcspn(line, "\n")] = '\0';
  for (char *s = line; n < max;) {
    fields[n++] = s;
    char *tab = strchr(s, '\t');
    if (!tab) break;
    *tab = '\0';
    s = tab + 1;
  }
  return n;
}

static void parse_shape(const char *s, int *rank, int64_t *shape) {
  *rank = 0;
  while (*s) {
    char *end;
    shape[(*rank)++] = strtoll(s, &end, 10);
    s = *end == ',' ? end + 1 : end;
  }
}

/* ---------------------------------------------------------------- files written by Python */

typedef struct opened {
  char name[64];
  mn_safetensors *st;
  size_t tensors_seen;
} opened;

static mn_safetensors *open_cached(const work_dir *d, opened *cache, size_t *n, const char *file,
                                   size_t **seen) {
  for (size_t i = 0; i < *n; i++)
    if (strcmp(cache[i].name, file) == 0) {
      *seen = &cache[i].tensors_seen;
      return cache[i].st;
    }
  cr_assert_lt(*n, 4);
  char path[160];
  snprintf(path, sizeof path, "%s/%s", d->s, file);
  opened *o = &cache[(*n)++];
  snprintf(o->name, sizeof o->name, "%s", file);
  cr_assert_eq(mn_safetensors_open(path, &o->st), MN_OK, "%s", mn_last_error());
  *seen = &o->tensors_seen;
  return o->st;
}

static bool is_float_dtype(const char *dt) {
  return !strcmp(dt, "F32") || !strcmp(dt, "F64") || !strcmp(dt, "F16") || !strcmp(dt, "BF16");
}

/* fields: tensor FILE NAME DTYPE SHAPE RAW F32 */
static void check_tensor_line(mn_safetensors *st, char **f) {
  char *name = (char *)unhex(f[2], NULL);
  mn_safetensors_info info;
  cr_assert_eq(mn_safetensors_info_of(st, name, &info), MN_OK, "%s", mn_last_error());
  cr_assert_str_eq(info.dtype, f[3], "tensor '%s'", name);
  int rank;
  int64_t shape[MN_MAX_RANK];
  parse_shape(f[4], &rank, shape);
  cr_assert_eq(info.rank, rank, "tensor '%s'", name);
  for (int k = 0; k < rank; k++)
    cr_assert_eq(info.shape[k], shape[k], "tensor '%s' dim %d", name, k);
  size_t nraw;
  unsigned char *raw = unhex(f[5], &nraw);
  const void *data;
  size_t bytes;
  cr_assert_eq(mn_safetensors_raw(st, name, &data, &bytes, NULL), MN_OK);
  cr_assert_eq(bytes, nraw, "tensor '%s'", name);
  cr_assert(nraw == 0 || memcmp(data, raw, nraw) == 0, "tensor '%s': bytes differ", name);
  size_t numel = nraw / mn_st_dtype_size(f[3]);
  float *out = malloc((numel ? numel : 1) * sizeof *out);
  if (strcmp(f[6], "-") != 0) {
    size_t nwant;
    unsigned char *want = unhex(f[6], &nwant);
    cr_assert_eq(nwant, numel * 4);
    cr_assert_eq(mn_safetensors_read_f32(st, name, out, numel), MN_OK, "%s", mn_last_error());
    cr_assert(memcmp(out, want, nwant) == 0, "tensor '%s' (%s): read_f32 differs from numpy", name,
              f[3]);
    free(want);
  } else {
    cr_assert_not(is_float_dtype(f[3]));
    mn_assert_error(mn_safetensors_read_f32(st, name, out, numel), MN_ERR_UNSUPPORTED, f[3]);
  }
  free(out);
  free(raw);
  free(name);
}

/* fields: meta FILE KEY VALUE */
static void check_meta_line(mn_safetensors *st, char **f) {
  char *key = (char *)unhex(f[2], NULL), *value = (char *)unhex(f[3], NULL);
  const char *got = mn_safetensors_metadata(st, key);
  cr_assert_not_null(got, "metadata '%s' missing", key);
  cr_assert_str_eq(got, value, "metadata '%s'", key);
  free(key);
  free(value);
}

Test(safetensors_interop, reads_files_written_by_python) {
  require_python();
  work_dir d = make_work_dir();
  char args[128], path[160];
  snprintf(args, sizeof args, "write '%s'", d.s);
  run_script(args);
  snprintf(path, sizeof path, "%s/manifest.txt", d.s);
  FILE *m = fopen(path, "r");
  cr_assert_not_null(m);
  opened cache[4] = {0};
  size_t ncache = 0, lines = 0;
  char *line = NULL;
  size_t cap = 0;
  while (getline(&line, &cap, m) > 0) {
    char *f[8] = {0};
    int n = split_tabs(line, f, 8);
    size_t *seen;
    mn_safetensors *st = open_cached(&d, cache, &ncache, f[1], &seen);
    if (strcmp(f[0], "tensor") == 0) {
      cr_assert_eq(n, 7, "manifest line %zu", lines);
      check_tensor_line(st, f);
      (*seen)++;
    } else {
      cr_assert_eq(n, 4, "manifest line %zu", lines);
      check_meta_line(st, f);
    }
    lines++;
  }
  free(line);
  fclose(m);
  cr_assert_eq(ncache, 2, "both files are described");
  cr_assert_gt(lines, 40);
  for (size_t i = 0; i < ncache; i++) {
    cr_assert_eq(mn_safetensors_count(cache[i].st), cache[i].tensors_seen, "%s", cache[i].name);
    mn_safetensors_close(cache[i].st);
  }
  remove_work_dir(&d);
}

/* ---------------------------------------------------------------- files written here */

typedef struct tensor_set {
  mn_st_tensor t[64];
  unsigned char data[64][96];
  size_t n;
} tensor_set;

static void add(tensor_set *s, const char *name, const char *dtype, int rank,
                const int64_t *shape) {
  cr_assert_lt(s->n, LEN(s->t));
  mn_st_tensor *t = &s->t[s->n];
  t->name = name;
  t->dtype = dtype;
  t->rank = rank;
  size_t numel = 1;
  for (int k = 0; k < rank; k++) {
    t->shape[k] = shape[k];
    numel *= (size_t)shape[k];
  }
  t->bytes = numel * mn_st_dtype_size(dtype);
  cr_assert_leq(t->bytes, sizeof s->data[0]);
  bool boolean = strcmp(dtype, "BOOL") == 0;
  for (size_t i = 0; i < t->bytes; i++)
    s->data[s->n][i] = boolean ? (unsigned char)(i % 3 == 0) : (unsigned char)(i * 29 + s->n * 7);
  t->data = s->data[s->n];
  s->n++;
}

static const char *const NUMPY_DTYPES[] = {"F64", "F32", "F16", "I64", "U64",  "I32", "U32",
                                           "I16", "U16", "I8",  "U8",  "BOOL", "C64"};
static const char *const OTHER_DTYPES[] = {"BF16",    "F8_E4M3",     "F8_E5M2",
                                           "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ"};

/* Each dtype as a scalar, an empty [0, 2] and a [2, 3] tensor, named "<dtype>.<k>". */
static void add_dtypes(tensor_set *s, const char *const *dtypes, size_t n, char (*names)[32]) {
  static const int64_t empty[] = {0, 2}, mat[] = {2, 3};
  for (size_t i = 0; i < n; i++)
    for (int k = 0; k < 3; k++) {
      char *name = names[3 * i + (size_t)k];
      snprintf(name, 32, "%s.%d", dtypes[i], k);
      add(s, name, dtypes[i], k == 0 ? 0 : 2, k == 1 ? empty : mat);
    }
}

static void write_manifest(const char *path, const char *file, const tensor_set *s,
                           const mn_st_meta *meta, size_t nmeta) {
  FILE *f = fopen(path, "w");
  cr_assert_not_null(f);
  for (size_t i = 0; i < s->n; i++) {
    const mn_st_tensor *t = &s->t[i];
    fprintf(f, "tensor\t%s\t", file);
    put_hex(f, t->name, strlen(t->name));
    fprintf(f, "\t%s\t", t->dtype);
    for (int k = 0; k < t->rank; k++)
      fprintf(f, k ? ",%lld" : "%lld", (long long)t->shape[k]);
    fprintf(f, "\t");
    put_hex(f, t->data, t->bytes);
    fprintf(f, "\t-\n");
  }
  for (size_t i = 0; i < nmeta; i++) {
    fprintf(f, "meta\t%s\t", file);
    put_hex(f, meta[i].key, strlen(meta[i].key));
    fprintf(f, "\t");
    put_hex(f, meta[i].value, strlen(meta[i].value));
    fprintf(f, "\n");
  }
  fclose(f);
}

Test(safetensors_interop, python_loads_files_written_here) {
  require_python();
  work_dir d = make_work_dir();
  static tensor_set s;
  char names[3 * (LEN(NUMPY_DTYPES) + LEN(OTHER_DTYPES))][32];
  add_dtypes(&s, NUMPY_DTYPES, LEN(NUMPY_DTYPES), names);
  add_dtypes(&s, OTHER_DTYPES, LEN(OTHER_DTYPES), names + 3 * LEN(NUMPY_DTYPES));
  mn_st_meta meta[] = {{"format", "pt"}, {"b", "two"}, {"é\"\n", "\x01 v\\"}};
  char path[160], manifest[160], args[400];
  snprintf(path, sizeof path, "%s/c.safetensors", d.s);
  snprintf(manifest, sizeof manifest, "%s/manifest.txt", d.s);
  cr_assert_eq(mn_safetensors_write(path, s.t, s.n, meta, LEN(meta)), MN_OK, "%s", mn_last_error());
  write_manifest(manifest, "c.safetensors", &s, meta, LEN(meta));
  snprintf(args, sizeof args, "check '%s' '%s'", path, manifest);
  run_script(args);
  remove_work_dir(&d);
}

static unsigned char *read_all(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  cr_assert_not_null(f, "cannot open %s", path);
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *b = malloc((size_t)size + 1);
  cr_assert_eq(fread(b, 1, (size_t)size, f), (size_t)size);
  fclose(f);
  *n = (size_t)size;
  return b;
}

/* Writes the set here, has the package write the same tensors and metadata, and compares. */
static void assert_same_bytes_as_python(const tensor_set *s, const mn_st_meta *meta, size_t nmeta) {
  require_python();
  work_dir d = make_work_dir();
  char mine[160], theirs[160], args[400];
  snprintf(mine, sizeof mine, "%s/c.safetensors", d.s);
  snprintf(theirs, sizeof theirs, "%s/py.safetensors", d.s);
  cr_assert_eq(mn_safetensors_write(mine, s->t, s->n, meta, nmeta), MN_OK, "%s", mn_last_error());
  snprintf(args, sizeof args, "rewrite '%s' '%s'", mine, theirs);
  run_script(args);
  size_t na, nb;
  unsigned char *a = read_all(mine, &na), *b = read_all(theirs, &nb);
  size_t at = 0;
  while (at < na && at < nb && a[at] == b[at])
    at++;
  cr_assert(na == nb && at == na,
            "files differ at byte %zu (sizes %zu and %zu)\nhere:   %.*s\npython: %.*s", at, na, nb,
            (int)(na < 400 ? na : 400), a + 8, (int)(nb < 400 ? nb : 400), b + 8);
  free(a);
  free(b);
  remove_work_dir(&d);
}

Test(safetensors_interop, same_bytes_as_python_numpy_dtypes_and_metadata) {
  static tensor_set s;
  char names[3 * LEN(NUMPY_DTYPES)][32];
  add_dtypes(&s, NUMPY_DTYPES, LEN(NUMPY_DTYPES), names);
  static const int64_t three[] = {3};
  /* Names that exercise JSON escaping and the byte order of the name sort. */
  add(&s, "q\"uote\\", "F32", 1, three);
  add(&s, "ctl\x01\x1f\x7f\b\f\n\r\t", "F32", 1, three);
  add(&s, "\xc3\xa9\xe2\x86\x92\xf0\x9f\x98\x80", "F32", 1, three);
  add(&s, "Z", "F32", 1, three);
  add(&s, "layer.10.weight", "F32", 1, three);
  add(&s, "layer.9.weight", "F32", 1, three);
  add(&s, "", "U8", 1, three);
  /* One key only: the package keeps metadata in a hash map, so several keys come out in an
   * arbitrary order there. */
  mn_st_meta meta[] = {{"format", "pt \"x\"\n\x02"}};
  assert_same_bytes_as_python(&s, meta, 1);
}

Test(safetensors_interop, same_bytes_as_python_without_metadata) {
  static tensor_set s;
  char names[3 * LEN(NUMPY_DTYPES)][32];
  add_dtypes(&s, NUMPY_DTYPES, LEN(NUMPY_DTYPES), names);
  assert_same_bytes_as_python(&s, NULL, 0);
}

Test(safetensors_interop, same_bytes_as_python_bf16_and_f8) {
  static tensor_set s;
  char names[3 * (LEN(NUMPY_DTYPES) + LEN(OTHER_DTYPES))][32];
  add_dtypes(&s, OTHER_DTYPES, LEN(OTHER_DTYPES), names);
  add_dtypes(&s, NUMPY_DTYPES, LEN(NUMPY_DTYPES), names + 3 * LEN(OTHER_DTYPES));
  mn_st_meta meta[] = {{"k", "v"}};
  assert_same_bytes_as_python(&s, meta, 1);
}

Test(safetensors_interop, same_bytes_as_python_empty) {
  static tensor_set s;
  assert_same_bytes_as_python(&s, NULL, 0);
}
