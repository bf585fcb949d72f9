/* The safetensors reader and writer: round trips of every dtype, metadata, the f16/bf16
 * conversions, the error paths of every function, and one malformed file per rule of the
 * format, each asserting MN_ERR_FORMAT and its own message. Malformed files are built here,
 * byte by byte, into /tmp. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L /* mkstemp, mkdtemp */
#endif
#include <dirent.h>
#include <float.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/safetensors.h"
#include "tests/support/mn_test.h"

#define LEN(a) (sizeof(a) / sizeof((a)[0]))

/* ---------------------------------------------------------------- helpers */

/* A path under /tmp that the test owns; removed by the helpers that create files. */
typedef struct tmp_path {
  char s[64];
} tmp_path;

static tmp_path write_temp(const void *bytes, size_t n) {
  tmp_path p;
  snprintf(p.s, sizeof p.s, "/tmp/mn_st_test_XXXXXX");
  int fd = mkstemp(p.s);
  cr_assert(fd >= 0, "mkstemp failed");
  cr_assert_eq(write(fd, bytes, n), (ssize_t)n, "short write to %s", p.s);
  close(fd);
  return p;
}

/* A file of the given header-length field, header bytes, and data_len bytes of data. */
static tmp_path write_st_raw(uint64_t len_field, const char *header, size_t header_bytes,
                             size_t data_len) {
  size_t n = 8 + header_bytes + data_len;
  unsigned char *b = calloc(1, n);
  cr_assert_not_null(b);
  for (int i = 0; i < 8; i++)
    b[i] = (unsigned char)(len_field >> (8 * i));
  memcpy(b + 8, header, header_bytes);
  for (size_t i = 0; i < data_len; i++)
    b[8 + header_bytes + i] = (unsigned char)(i * 7 + 1);
  tmp_path p = write_temp(b, n);
  free(b);
  return p;
}

/* Headers in these tests are written with ' for " to stay readable; no name here needs a '. */
static char *dq(const char *header) {
  char *h = strdup(header);
  cr_assert_not_null(h);
  for (char *c = h; *c; c++)
    if (*c == '\'') *c = '"';
  return h;
}

static tmp_path write_st(const char *header, size_t data_len) {
  char *h = dq(header);
  tmp_path p = write_st_raw(strlen(h), h, strlen(h), data_len);
  free(h);
  return p;
}

/* Opens the file, removes it, and asserts MN_ERR_FORMAT with a message that names the file
 * and contains `fragment`. */
static void expect_rejected_path(tmp_path p, const char *fragment) {
  static char sentinel;
  mn_safetensors *st = (mn_safetensors *)(void *)&sentinel; /* a failed open must reset it */
  mn_status s = mn_safetensors_open(p.s, &st);
  unlink(p.s);
  mn_assert_error(s, MN_ERR_FORMAT, fragment);
  cr_assert_null(st, "a failed open left *out set");
  cr_assert(strstr(mn_last_error(), p.s) != NULL, "message \"%s\" does not name the file",
            mn_last_error());
  cr_assert(strstr(mn_last_error(), "mn_safetensors_open: ") == mn_last_error(),
            "message \"%s\" does not start with the function name", mn_last_error());
}

static void expect_rejected(const char *header, size_t data_len, const char *fragment) {
  expect_rejected_path(write_st(header, data_len), fragment);
}

/* Opens a file that must be valid; the caller closes the handle. */
static mn_safetensors *open_ok(tmp_path p) {
  mn_safetensors *st = NULL;
  mn_status s = mn_safetensors_open(p.s, &st);
  unlink(p.s);
  cr_assert_eq(s, MN_OK, "open failed: %s", mn_last_error());
  cr_assert_not_null(st);
  return st;
}

static mn_safetensors *open_header(const char *header, size_t data_len) {
  return open_ok(write_st(header, data_len));
}

static tmp_path fresh_path(void) {
  tmp_path p;
  snprintf(p.s, sizeof p.s, "/tmp/mn_st_test_XXXXXX");
  int fd = mkstemp(p.s);
  cr_assert(fd >= 0);
  close(fd);
  return p;
}

static uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static float bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* ---------------------------------------------------------------- round trips */

typedef struct dtype_case {
  const char *dtype;
  size_t size;
} dtype_case;

static const dtype_case ALL_DTYPES[] = {
    {"BOOL", 1},    {"U8", 1},  {"I8", 1},          {"F8_E5M2", 1},     {"F8_E4M3", 1},
    {"F8_E8M0", 1}, {"I16", 2}, {"U16", 2},         {"F16", 2},         {"BF16", 2},
    {"I32", 4},     {"U32", 4}, {"F32", 4},         {"C64", 8},         {"F64", 8},
    {"I64", 8},     {"U64", 8}, {"F8_E4M3FNUZ", 1}, {"F8_E5M2FNUZ", 1},
};

static void fill_pattern(unsigned char *b, size_t n, unsigned seed, bool boolean) {
  for (size_t i = 0; i < n; i++)
    b[i] = boolean ? (unsigned char)((i + seed) % 2) : (unsigned char)(i * 37 + seed * 11 + 5);
}

static void assert_tensor(const mn_safetensors *st, const mn_st_tensor *t) {
  mn_safetensors_info info;
  cr_assert_eq(mn_safetensors_info_of(st, t->name, &info), MN_OK, "%s", mn_last_error());
  cr_assert_str_eq(info.dtype, t->dtype, "tensor %s", t->name);
  cr_assert_eq(info.rank, t->rank, "tensor %s", t->name);
  for (int k = 0; k < t->rank; k++)
    cr_assert_eq(info.shape[k], t->shape[k], "tensor %s dim %d", t->name, k);
  cr_assert_eq(info.bytes, t->bytes, "tensor %s", t->name);
  const void *data = NULL;
  size_t bytes = 0;
  const char *dtype = NULL;
  cr_assert_eq(mn_safetensors_raw(st, t->name, &data, &bytes, &dtype), MN_OK, "%s",
               mn_last_error());
  cr_assert_eq(bytes, t->bytes);
  cr_assert_str_eq(dtype, t->dtype);
  cr_assert(t->bytes == 0 || memcmp(data, t->data, t->bytes) == 0, "tensor %s bytes differ",
            t->name);
}

Test(safetensors, round_trip_every_dtype_and_shape) {
  /* For each dtype: a scalar, an empty [3, 0] tensor and a rank-4 tensor. */
  enum { PER = 3 };
  size_t n = LEN(ALL_DTYPES) * PER;
  mn_st_tensor *t = calloc(n, sizeof *t);
  char(*names)[32] = calloc(n, sizeof *names);
  unsigned char(*data)[2 * 1 * 3 * 2 * 8] = calloc(n, sizeof *data);
  for (size_t d = 0; d < LEN(ALL_DTYPES); d++) {
    const dtype_case *c = &ALL_DTYPES[d];
    bool boolean = strcmp(c->dtype, "BOOL") == 0;
    for (int k = 0; k < PER; k++) {
      size_t i = d * PER + (size_t)k;
      snprintf(names[i], sizeof names[i], "%s.%s", c->dtype, k == 0 ? "s" : k == 1 ? "e" : "r4");
      t[i].name = names[i];
      t[i].dtype = c->dtype;
      if (k == 0) t[i].rank = 0;
      if (k == 1) t[i] = (mn_st_tensor){names[i], c->dtype, 2, {3, 0}, NULL, 0};
      if (k == 2) t[i] = (mn_st_tensor){names[i], c->dtype, 4, {2, 1, 3, 2}, NULL, 0};
      size_t numel = k == 0 ? 1 : k == 1 ? 0 : 12;
      t[i].bytes = numel * c->size;
      fill_pattern(data[i], t[i].bytes, (unsigned)i, boolean);
      t[i].data = data[i];
    }
  }
  tmp_path p = fresh_path();
  mn_st_meta meta[] = {{"format", "pt"}};
  cr_assert_eq(mn_safetensors_write(p.s, t, n, meta, 1), MN_OK, "%s", mn_last_error());
  mn_safetensors *st = open_ok(p);
  cr_assert_eq(mn_safetensors_count(st), n);
  for (size_t i = 0; i < n; i++)
    assert_tensor(st, &t[i]);
  mn_safetensors_close(st);
  free(t);
  free(names);
  free(data);
}

/* The writer's layout: dtype by the reference's enum order descending, then name; and the
 * reader lists tensors in that (offset) order. */
Test(safetensors, layout_order_and_name_order) {
  unsigned char z[16] = {0};
  mn_st_tensor t[] = {
      {"b", "U8", 1, {2}, z, 2},   {"a", "F32", 1, {1}, z, 4}, {"c", "BOOL", 1, {1}, z, 1},
      {"Z", "F32", 1, {1}, z, 4},  {"d", "F64", 1, {1}, z, 8}, {"e", "I64", 1, {1}, z, 8},
      {"f", "BF16", 1, {1}, z, 2}, {"g", "F16", 1, {1}, z, 2},
  };
  const char *want[] = {"e", "d", "Z", "a", "f", "g", "b", "c"};
  tmp_path p = fresh_path();
  cr_assert_eq(mn_safetensors_write(p.s, t, LEN(t), NULL, 0), MN_OK, "%s", mn_last_error());
  mn_safetensors *st = open_ok(p);
  cr_assert_eq(mn_safetensors_count(st), LEN(want));
  for (size_t i = 0; i < LEN(want); i++)
    cr_assert_str_eq(mn_safetensors_name(st, i), want[i], "position %zu", i);
  cr_assert_null(mn_safetensors_name(st, LEN(want)));
  mn_safetensors_close(st);
}

Test(safetensors, header_is_padded_to_8_bytes_with_spaces) {
  float one = 1;
  mn_st_tensor t = {"attn0", "F32", 4, {1, 1, 1, 1}, &one, 4};
  tmp_path p = fresh_path();
  cr_assert_eq(mn_safetensors_write(p.s, &t, 1, NULL, 0), MN_OK, "%s", mn_last_error());
  FILE *f = fopen(p.s, "rb");
  unsigned char b[256];
  size_t n = fread(b, 1, sizeof b, f);
  fclose(f);
  unlink(p.s);
  const char *json = "{\"attn0\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1],\"data_offsets\":[0,4]}}";
  size_t hl = (strlen(json) + 7) / 8 * 8;
  cr_assert_eq(n, 8 + hl + 4, "file is %zu bytes", n);
  cr_assert_eq(b[0], hl);
  cr_assert(memcmp(b + 8, json, strlen(json)) == 0, "header differs: %.*s", (int)hl, b + 8);
  for (size_t i = strlen(json); i < hl; i++)
    cr_assert_eq(b[8 + i], ' ', "padding byte %zu is 0x%02x", i, b[8 + i]);
  cr_assert(memcmp(b + 8 + hl, &one, 4) == 0);
}

Test(safetensors, metadata_round_trip) {
  mn_st_meta meta[] = {
      {"format", "pt"}, {"quote\"back\\slash", "tab\tnl\nctl\x01 del\x7f"}, {"utf8", "é→😀"}};
  float x[2] = {1, 2};
  mn_st_tensor t = {"x", "F32", 1, {2}, x, sizeof x};
  tmp_path p = fresh_path();
  cr_assert_eq(mn_safetensors_write(p.s, &t, 1, meta, LEN(meta)), MN_OK, "%s", mn_last_error());
  mn_safetensors *st = open_ok(p);
  for (size_t i = 0; i < LEN(meta); i++) {
    const char *v = mn_safetensors_metadata(st, meta[i].key);
    cr_assert_not_null(v, "key %s missing", meta[i].key);
    cr_assert_str_eq(v, meta[i].value);
  }
  cr_assert_null(mn_safetensors_metadata(st, "absent"));
  cr_assert_null(mn_safetensors_metadata(st, "x"), "a tensor name is not a metadata key");
  cr_assert_null(mn_safetensors_metadata(st, NULL));
  cr_assert_null(mn_safetensors_metadata(NULL, "format"));
  mn_safetensors_close(st);
}

Test(safetensors, no_metadata_and_no_tensors) {
  tmp_path p = fresh_path();
  cr_assert_eq(mn_safetensors_write(p.s, NULL, 0, NULL, 0), MN_OK, "%s", mn_last_error());
  struct stat sb;
  cr_assert_eq(stat(p.s, &sb), 0);
  cr_assert_eq(sb.st_size, 16, "an empty file is the length, '{}' and 6 spaces");
  mn_safetensors *st = open_ok(p);
  cr_assert_eq(mn_safetensors_count(st), 0);
  cr_assert_null(mn_safetensors_name(st, 0));
  cr_assert_null(mn_safetensors_metadata(st, "format"));
  mn_safetensors_close(st);
}

/* ---------------------------------------------------------------- conversions */

Test(safetensors, f32_to_bf16_rounds_to_nearest_even) {
  static const struct {
    uint32_t in;
    uint16_t out;
  } cases[] = {
      {0x3F800000u, 0x3F80}, /* 1 */
      {0x3F808000u, 0x3F80}, /* tie, even below */
      {0x3F818000u, 0x3F82}, /* tie, odd below: up */
      {0x3F808001u, 0x3F81}, /* just above half */
      {0x3F807FFFu, 0x3F80}, /* just below half */
      {0xBF818000u, 0xBF82}, /* negative tie */
      {0x7F800000u, 0x7F80}, /* +inf */
      {0xFF800000u, 0xFF80}, /* -inf */
      {0x7F7FFFFFu, 0x7F80}, /* FLT_MAX rounds up to inf */
      {0x7F7F7FFFu, 0x7F7F}, /* stays at the largest bf16 */
      {0x80000000u, 0x8000}, /* -0 */
      {0x00008000u, 0x0000}, /* subnormal tie to even (0) */
      {0x00018000u, 0x0002}, /* subnormal tie to even (2) */
      {0x00000001u, 0x0000}, /* smallest subnormal */
      {0x7FC00000u, 0x7FC0}, /* quiet NaN */
      {0xFFC00000u, 0xFFC0}, /* negative NaN keeps its sign */
  };
  for (size_t i = 0; i < LEN(cases); i++) {
    uint16_t got = mn_f32_to_bf16(bits_f32(cases[i].in));
    cr_assert_eq(got, cases[i].out, "0x%08x -> 0x%04x, expected 0x%04x", cases[i].in, got,
                 cases[i].out);
  }
  /* A NaN whose payload lies only in the dropped bits must not become infinity. */
  uint16_t nan = mn_f32_to_bf16(bits_f32(0x7F800001u));
  cr_assert(isnan(mn_bf16_to_f32(nan)), "0x7f800001 -> 0x%04x is not a NaN", nan);
  cr_assert_eq(f32_bits(mn_bf16_to_f32(0x3F81)), 0x3F810000u);
}

Test(safetensors, f32_to_f16_rounds_to_nearest_even) {
  static const struct {
    uint32_t in;
    uint16_t out;
  } cases[] = {
      {0x3F800000u, 0x3C00}, /* 1 */
      {0x3F801000u, 0x3C00}, /* 1 + 2^-11: tie, even below */
      {0x3F803000u, 0x3C02}, /* 1 + 3*2^-11: tie, odd below: up */
      {0x3F801001u, 0x3C01}, /* just above half */
      {0x477FE000u, 0x7BFF}, /* 65504, the largest half */
      {0x477FEFFFu, 0x7BFF}, /* just below 65520 */
      {0x477FF000u, 0x7C00}, /* 65520: tie, rounds to inf */
      {0x49742400u, 0x7C00}, /* 1e6 */
      {0x7F800000u, 0x7C00}, /* inf */
      {0xFF800000u, 0xFC00}, /* -inf */
      {0x80000000u, 0x8000}, /* -0 */
      {0x38800000u, 0x0400}, /* 2^-14, the smallest normal */
      {0x387FE000u, 0x0400}, /* 1023.5 * 2^-24: tie, rounds up into the normals */
      {0x387FC000u, 0x03FF}, /* 1023 * 2^-24, the largest subnormal */
      {0x387F8000u, 0x03FE}, /* 1022 * 2^-24 */
      {0x33800000u, 0x0001}, /* 2^-24, the smallest subnormal */
      {0x33000000u, 0x0000}, /* 2^-25: tie between 0 and 1, even is 0 */
      {0x33000001u, 0x0001}, /* just above 2^-25 */
      {0x33C00000u, 0x0002}, /* 1.5 * 2^-24: tie, up to 2 */
      {0x34200000u, 0x0002}, /* 2.5 * 2^-24: tie, down to 2 */
      {0xB3C00000u, 0x8002}, /* negative subnormal */
      {0x32800000u, 0x0000}, /* 2^-26 */
      {0x00000001u, 0x0000}, /* f32 subnormal */
      {0x7FC00000u, 0x7E00}, /* quiet NaN */
  };
  for (size_t i = 0; i < LEN(cases); i++) {
    uint16_t got = mn_f32_to_f16(bits_f32(cases[i].in));
    cr_assert_eq(got, cases[i].out, "0x%08x -> 0x%04x, expected 0x%04x", cases[i].in, got,
                 cases[i].out);
  }
  uint16_t nan = mn_f32_to_f16(bits_f32(0xFF800001u));
  cr_assert(isnan(mn_f16_to_f32(nan)) && (nan & 0x8000), "0xff800001 -> 0x%04x", nan);
}

Test(safetensors, f16_to_f32_exact) {
  cr_assert_eq(mn_f16_to_f32(0x0001), 0x1p-24f);
  cr_assert_eq(mn_f16_to_f32(0x03FF), 1023 * 0x1p-24f);
  cr_assert_eq(mn_f16_to_f32(0x0400), 0x1p-14f);
  cr_assert_eq(mn_f16_to_f32(0x7BFF), 65504.0f);
  cr_assert_eq(mn_f16_to_f32(0xC000), -2.0f);
  cr_assert(isinf(mn_f16_to_f32(0x7C00)) && mn_f16_to_f32(0x7C00) > 0);
  cr_assert(isnan(mn_f16_to_f32(0x7E00)));
  cr_assert_eq(f32_bits(mn_f16_to_f32(0x8000)), 0x80000000u, "-0 keeps its sign");
}

/* Every half and every bfloat16 survives the trip through f32 unchanged. */
Test(safetensors, half_and_bfloat_round_trip_exhaustively) {
  for (uint32_t h = 0; h <= 0xFFFF; h++) {
    float f = mn_f16_to_f32((uint16_t)h);
    float b = mn_bf16_to_f32((uint16_t)h);
    if (isnan(f))
      cr_assert(isnan(mn_f16_to_f32(mn_f32_to_f16(f))), "f16 NaN 0x%04x", h);
    else
      cr_assert_eq(mn_f32_to_f16(f), h, "f16 0x%04x -> %a -> 0x%04x", h, f, mn_f32_to_f16(f));
    if (isnan(b))
      cr_assert(isnan(mn_bf16_to_f32(mn_f32_to_bf16(b))), "bf16 NaN 0x%04x", h);
    else
      cr_assert_eq(mn_f32_to_bf16(b), h, "bf16 0x%04x", h);
  }
}

Test(safetensors, read_f32_converts_every_float_type) {
  const double d[] = {0.1, -1e300, 1e-50, 3.5, 0x1.000001p0};
  const float want_d[] = {0.1f, -INFINITY, 0.0f, 3.5f, 1.0f};
  const uint16_t h[] = {0x3C00, 0x0001, 0x7BFF, 0xFC00, 0x8000};
  const uint16_t b[] = {0x3F80, 0xC049, 0x0001, 0x7F80, 0x7F7F};
  const float f[] = {1.5f, -0.0f, FLT_MAX, 1e-45f, -3.25f};
  mn_st_tensor t[] = {
      {"d", "F64", 1, {5}, d, sizeof d},
      {"h", "F16", 1, {5}, h, sizeof h},
      {"b", "BF16", 1, {5}, b, sizeof b},
      {"f", "F32", 1, {5}, f, sizeof f},
  };
  tmp_path p = fresh_path();
  cr_assert_eq(mn_safetensors_write(p.s, t, LEN(t), NULL, 0), MN_OK, "%s", mn_last_error());
  mn_safetensors *st = open_ok(p);
  float out[5];
  cr_assert_eq(mn_safetensors_read_f32(st, "d", out, 5), MN_OK, "%s", mn_last_error());
  for (int i = 0; i < 5; i++)
    cr_assert_eq(f32_bits(out[i]), f32_bits(want_d[i]), "F64 element %d: %a", i, out[i]);
  cr_assert_eq(mn_safetensors_read_f32(st, "h", out, 5), MN_OK, "%s", mn_last_error());
  for (int i = 0; i < 5; i++)
    cr_assert_eq(f32_bits(out[i]), f32_bits(mn_f16_to_f32(h[i])), "F16 element %d", i);
  cr_assert_eq(out[0], 1.0f);
  cr_assert_eq(out[1], 0x1p-24f);
  cr_assert_eq(mn_safetensors_read_f32(st, "b", out, 5), MN_OK, "%s", mn_last_error());
  cr_assert_eq(out[0], 1.0f);
  cr_assert_eq(out[1], -3.140625f);
  cr_assert(isinf(out[3]));
  cr_assert_eq(f32_bits(out[4]), 0x7F7F0000u);
  cr_assert_eq(mn_safetensors_read_f32(st, "f", out, 5), MN_OK, "%s", mn_last_error());
  cr_assert(memcmp(out, f, sizeof f) == 0, "F32 is copied bit for bit");
  mn_safetensors_close(st);
}

/* Nothing aligns tensor data in a file written by someone else: an odd header length puts
 * every element at an odd address (the sanitizer build checks the reads). */
Test(safetensors, reads_unaligned_data) {
  mn_safetensors *st = open_header("{'a':{'dtype':'F32','shape':[2],'data_offsets':[0,8]}} ", 8);
  float out[2];
  cr_assert_eq(mn_safetensors_read_f32(st, "a", out, 2), MN_OK, "%s", mn_last_error());
  const unsigned char want[8] = {1, 8, 15, 22, 29, 36, 43, 50};
  cr_assert(memcmp(out, want, 8) == 0);
  mn_safetensors_close(st);
}

/* ---------------------------------------------------------------- valid files from elsewhere */

Test(safetensors, reads_tensors_in_offset_order_whatever_the_header_order) {
  mn_safetensors *st = open_header("{'late':{'dtype':'U8','shape':[2],'data_offsets':[4,6]},"
                                   "'__metadata__':{'k':'v'},"
                                   "'empty':{'dtype':'F32','shape':[0],'data_offsets':[4,4]},"
                                   "'early':{'dtype':'I32','shape':[],'data_offsets':[0,4]}}",
                                   6);
  cr_assert_eq(mn_safetensors_count(st), 3);
  cr_assert_str_eq(mn_safetensors_name(st, 0), "early");
  cr_assert_str_eq(mn_safetensors_name(st, 1), "empty");
  cr_assert_str_eq(mn_safetensors_name(st, 2), "late");
  cr_assert_str_eq(mn_safetensors_metadata(st, "k"), "v");
  mn_safetensors_info info;
  cr_assert_eq(mn_safetensors_info_of(st, "early", &info), MN_OK);
  cr_assert_eq(info.rank, 0);
  cr_assert_eq(info.bytes, 4);
  mn_safetensors_close(st);
}

Test(safetensors, accepts_what_the_reference_accepts) {
  /* Trailing JSON whitespace, unknown members in an entry, null metadata, inner whitespace. */
  mn_safetensors *st = open_header("{ 'a' : {'dtype':'F32', 'extra':[1.5,-2], 'shape':[1],"
                                   "'data_offsets':[0,4]}, '__metadata__':null}  \n\t\r ",
                                   4);
  cr_assert_eq(mn_safetensors_count(st), 1);
  cr_assert_null(mn_safetensors_metadata(st, "k"));
  mn_safetensors_close(st);
}

Test(safetensors, rank_above_max_opens_but_info_is_unsupported) {
  mn_safetensors *st =
      open_header("{'big':{'dtype':'F32','shape':[1,1,1,1,1,1,2],'data_offsets':[0,8]}}", 8);
  mn_safetensors_info info = {.rank = 99};
  mn_assert_error(mn_safetensors_info_of(st, "big", &info), MN_ERR_UNSUPPORTED, "rank 7");
  cr_assert_eq(info.rank, 99, "a failed call wrote into out");
  float out[2];
  cr_assert_eq(mn_safetensors_read_f32(st, "big", out, 2), MN_OK, "%s", mn_last_error());
  mn_safetensors_close(st);
}

/* ---------------------------------------------------------------- reader error paths */

static mn_safetensors *small_file(void) {
  int32_t i[3] = {1, 2, 3};
  float f[6] = {1, 2, 3, 4, 5, 6};
  mn_st_tensor t[] = {{"f", "F32", 2, {2, 3}, f, sizeof f}, {"i", "I32", 1, {3}, i, sizeof i}};
  tmp_path p = fresh_path();
  cr_assert_eq(mn_safetensors_write(p.s, t, 2, NULL, 0), MN_OK, "%s", mn_last_error());
  return open_ok(p);
}

Test(safetensors, open_errors) {
  static char sentinel;
  mn_safetensors *st = (mn_safetensors *)(void *)&sentinel;
  mn_assert_error(mn_safetensors_open(NULL, &st), MN_ERR_INVALID_ARGUMENT, "path is NULL");
  cr_assert_null(st);
  mn_assert_error(mn_safetensors_open("/tmp/x", NULL), MN_ERR_INVALID_ARGUMENT, "out is NULL");
  mn_assert_error(mn_safetensors_open("/nonexistent/dir/w.safetensors", &st), MN_ERR_IO,
                  "/nonexistent/dir/w.safetensors: cannot open: No such file or directory");
  cr_assert_null(st);
  mn_assert_error(mn_safetensors_open("/tmp", &st), MN_ERR_IO, "/tmp: not a regular file");
  mn_assert_error(mn_safetensors_open_memory("", 0, "m", NULL), MN_ERR_INVALID_ARGUMENT,
                  "out is NULL");
  mn_assert_error(mn_safetensors_open_memory(NULL, 4, "m", &st), MN_ERR_INVALID_ARGUMENT,
                  "data is NULL");
  mn_safetensors_close(NULL);
}

Test(safetensors, open_memory_uses_the_label) {
  static const char file[] = "\x02\0\0\0\0\0\0\0{}";
  mn_safetensors *st = NULL;
  cr_assert_eq(mn_safetensors_open_memory(file, 10, "mem", &st), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_safetensors_count(st), 0);
  mn_safetensors_close(st);
  mn_assert_error(mn_safetensors_open_memory(file, 9, "label.st", &st), MN_ERR_FORMAT,
                  "mn_safetensors_open: label.st: header length 2 runs past the end");
}

Test(safetensors, queries_on_null_and_out_of_range) {
  cr_assert_eq(mn_safetensors_count(NULL), 0);
  cr_assert_null(mn_safetensors_name(NULL, 0));
  mn_safetensors *st = small_file();
  cr_assert_eq(mn_safetensors_count(st), 2);
  cr_assert_null(mn_safetensors_name(st, 2));
  cr_assert_null(mn_safetensors_name(st, (size_t)-1));
  mn_safetensors_close(st);
}

Test(safetensors, info_of_errors) {
  mn_safetensors *st = small_file();
  mn_safetensors_info info = {.rank = 42};
  mn_assert_error(mn_safetensors_info_of(NULL, "f", &info), MN_ERR_INVALID_ARGUMENT,
                  "mn_safetensors_info_of: st is NULL");
  mn_assert_error(mn_safetensors_info_of(st, NULL, &info), MN_ERR_INVALID_ARGUMENT, "name is NULL");
  mn_assert_error(mn_safetensors_info_of(st, "f", NULL), MN_ERR_INVALID_ARGUMENT, "out is NULL");
  mn_assert_error(mn_safetensors_info_of(st, "nope", &info), MN_ERR_NOT_FOUND,
                  "no tensor named 'nope'");
  cr_assert(strstr(mn_last_error(), "/tmp/mn_st_test_") != NULL, "message names the file: %s",
            mn_last_error());
  cr_assert_eq(info.rank, 42, "a failed call wrote into out");
  cr_assert_eq(mn_safetensors_info_of(st, "f", &info), MN_OK);
  cr_assert_eq(info.rank, 2);
  cr_assert_eq(info.shape[0], 2);
  cr_assert_eq(info.shape[1], 3);
  cr_assert_eq(info.shape[2], 0, "unused dimensions are zero");
  mn_safetensors_close(st);
}

Test(safetensors, read_f32_errors) {
  mn_safetensors *st = small_file();
  float out[7] = {-7, -7, -7, -7, -7, -7, -7};
  mn_assert_error(mn_safetensors_read_f32(NULL, "f", out, 6), MN_ERR_INVALID_ARGUMENT,
                  "mn_safetensors_read_f32: st is NULL");
  mn_assert_error(mn_safetensors_read_f32(st, NULL, out, 6), MN_ERR_INVALID_ARGUMENT,
                  "name is NULL");
  mn_assert_error(mn_safetensors_read_f32(st, "g", out, 6), MN_ERR_NOT_FOUND,
                  "no tensor named 'g'");
  mn_assert_error(mn_safetensors_read_f32(st, "f", out, 5), MN_ERR_INVALID_ARGUMENT,
                  "tensor 'f' has 6 elements, n is 5");
  mn_assert_error(mn_safetensors_read_f32(st, "f", out, 7), MN_ERR_INVALID_ARGUMENT,
                  "tensor 'f' has 6 elements, n is 7");
  mn_assert_error(mn_safetensors_read_f32(st, "f", NULL, 6), MN_ERR_INVALID_ARGUMENT,
                  "out is NULL");
  mn_assert_error(mn_safetensors_read_f32(st, "i", out, 3), MN_ERR_UNSUPPORTED,
                  "tensor 'i' is I32; only F32, F64, F16 and BF16 convert to f32");
  for (int i = 0; i < 7; i++)
    cr_assert_eq(out[i], -7, "a failed call wrote element %d", i);
  mn_safetensors_close(st);
}

Test(safetensors, raw_errors_and_optional_outputs) {
  mn_safetensors *st = small_file();
  mn_assert_error(mn_safetensors_raw(st, "nope", NULL, NULL, NULL), MN_ERR_NOT_FOUND,
                  "mn_safetensors_raw: ");
  mn_assert_error(mn_safetensors_raw(NULL, "f", NULL, NULL, NULL), MN_ERR_INVALID_ARGUMENT,
                  "st is NULL");
  size_t bytes = 0;
  cr_assert_eq(mn_safetensors_raw(st, "i", NULL, &bytes, NULL), MN_OK);
  cr_assert_eq(bytes, 12);
  mn_safetensors_close(st);
}

/* ---------------------------------------------------------------- writer error paths */

/* A folder that only the test writes to, to check that failures leave no temp files. */
static void make_dir(char *dir) {
  strcpy(dir, "/tmp/mn_st_dir_XXXXXX");
  cr_assert_not_null(mkdtemp(dir));
}

static int count_entries(const char *dir) {
  DIR *d = opendir(dir);
  cr_assert_not_null(d);
  int n = 0;
  for (struct dirent *e; (e = readdir(d));)
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
  closedir(d);
  return n;
}

static void remove_dir(const char *dir, const char *file) {
  char path[128];
  snprintf(path, sizeof path, "%s/%s", dir, file);
  unlink(path);
  rmdir(path);
  rmdir(dir);
}

Test(safetensors, write_argument_errors) {
  float x[2] = {0};
  const char *p = "/tmp/mn_st_never_written";
  mn_st_tensor ok = {"x", "F32", 1, {2}, x, 8};
  mn_assert_error(mn_safetensors_write(NULL, &ok, 1, NULL, 0), MN_ERR_INVALID_ARGUMENT,
                  "mn_safetensors_write: path is NULL");
  mn_assert_error(mn_safetensors_write(p, NULL, 1, NULL, 0), MN_ERR_INVALID_ARGUMENT,
                  "tensors is NULL");
  mn_assert_error(mn_safetensors_write(p, &ok, 1, NULL, 1), MN_ERR_INVALID_ARGUMENT,
                  "meta is NULL");
  const struct {
    mn_st_tensor t;
    const char *fragment;
  } bad[] = {
      {{NULL, "F32", 1, {2}, x, 8}, "tensor 0: name is NULL"},
      {{"x", "F33", 1, {2}, x, 8}, "tensor 'x': unsupported dtype 'F33'"},
      {{"x", NULL, 1, {2}, x, 8}, "unsupported dtype '(null)'"},
      {{"x", "F4", 1, {2}, x, 8}, "unsupported dtype 'F4'"},
      {{"x", "F32", 1, {2}, x, 4}, "tensor 'x': bytes is 4 but 2 elements of F32 need 8"},
      {{"x", "F32", 1, {-2}, x, 8}, "shape[0] is negative (-2)"},
      {{"x", "F32", 7, {1}, x, 4}, "rank 7 is outside [0, 6]"},
      {{"x", "F32", -1, {1}, x, 4}, "rank -1 is outside"},
      {{"x", "F32", 2, {INT64_MAX, 4}, x, 4}, "byte size overflows"},
      {{"x", "F32", 1, {2}, NULL, 8}, "tensor 'x': data is NULL"},
      {{"__metadata__", "F32", 1, {2}, x, 8}, "'__metadata__' is reserved"},
      {{"bad\xff", "F32", 1, {2}, x, 8}, "tensor 0: name is not valid UTF-8"},
  };
  for (size_t i = 0; i < LEN(bad); i++)
    mn_assert_error(mn_safetensors_write(p, &bad[i].t, 1, NULL, 0), MN_ERR_INVALID_ARGUMENT,
                    bad[i].fragment);
  mn_st_tensor dup[] = {ok, {"x", "I32", 1, {2}, x, 8}};
  mn_assert_error(mn_safetensors_write(p, dup, 2, NULL, 0), MN_ERR_INVALID_ARGUMENT,
                  "duplicate tensor name 'x'");
  mn_st_meta meta_dup[] = {{"k", "1"}, {"k", "2"}};
  mn_assert_error(mn_safetensors_write(p, &ok, 1, meta_dup, 2), MN_ERR_INVALID_ARGUMENT,
                  "duplicate metadata key 'k'");
  mn_st_meta meta_null[] = {{"k", NULL}};
  mn_assert_error(mn_safetensors_write(p, &ok, 1, meta_null, 1), MN_ERR_INVALID_ARGUMENT,
                  "metadata 0: value is NULL");
  mn_st_meta meta_utf8[] = {{"k", "\xc0\x80"}};
  mn_assert_error(mn_safetensors_write(p, &ok, 1, meta_utf8, 1), MN_ERR_INVALID_ARGUMENT,
                  "metadata 0: not valid UTF-8");
  cr_assert_neq(access(p, F_OK), 0, "a failed write created the file");
}

Test(safetensors, write_replaces_atomically_and_failures_keep_the_old_file) {
  char dir[64], path[96];
  make_dir(dir);
  snprintf(path, sizeof path, "%s/w.safetensors", dir);
  float a[2] = {1, 2}, b[3] = {3, 4, 5};
  mn_st_tensor ta = {"a", "F32", 1, {2}, a, sizeof a}, tb = {"b", "F32", 1, {3}, b, sizeof b};
  cr_assert_eq(mn_safetensors_write(path, &ta, 1, NULL, 0), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_safetensors_write(path, &tb, 1, NULL, 0), MN_OK, "%s", mn_last_error());
  mn_safetensors *st = NULL;
  cr_assert_eq(mn_safetensors_open(path, &st), MN_OK, "%s", mn_last_error());
  cr_assert_str_eq(mn_safetensors_name(st, 0), "b", "the second write replaced the first");
  mn_safetensors_close(st);
  mn_st_tensor bad = {"c", "F32", 1, {3}, b, 4};
  mn_assert_error(mn_safetensors_write(path, &bad, 1, NULL, 0), MN_ERR_INVALID_ARGUMENT,
                  "bytes is 4");
  cr_assert_eq(mn_safetensors_open(path, &st), MN_OK, "%s", mn_last_error());
  cr_assert_str_eq(mn_safetensors_name(st, 0), "b", "a failed write changed the file");
  mn_safetensors_close(st);
  cr_assert_eq(count_entries(dir), 1, "temp files were left behind");
  remove_dir(dir, "w.safetensors");
}

Test(safetensors, write_io_errors_leave_no_temp_file) {
  char dir[64], path[96];
  make_dir(dir);
  float a[2] = {1, 2};
  mn_st_tensor ta = {"a", "F32", 1, {2}, a, sizeof a};
  snprintf(path, sizeof path, "%s/missing/w.safetensors", dir);
  mn_assert_error(mn_safetensors_write(path, &ta, 1, NULL, 0), MN_ERR_IO, "cannot create");
  cr_assert(strstr(mn_last_error(), "No such file or directory"), "%s", mn_last_error());
  /* Renaming a file over a folder fails after the temp file was written. */
  snprintf(path, sizeof path, "%s/sub", dir);
  cr_assert_eq(mkdir(path, 0700), 0);
  mn_assert_error(mn_safetensors_write(path, &ta, 1, NULL, 0), MN_ERR_IO, "cannot rename");
  cr_assert_eq(count_entries(dir), 1, "the temp file was left behind");
  remove_dir(dir, "sub");
}

/* ---------------------------------------------------------------- malformed files */

#define A_OK "'a':{'dtype':'F32','shape':[1],'data_offsets':[0,4]}"

Test(safetensors, rejects_short_files) {
  expect_rejected_path(write_temp("", 0), "file is 0 bytes, too short for the 8-byte header");
  expect_rejected_path(write_temp("\x02\0\0", 3), "file is 3 bytes, too short");
}

Test(safetensors, rejects_header_length_too_large) {
  expect_rejected_path(write_st_raw(100000001u, "{}", 2, 0),
                       "header length 100000001 exceeds the limit of 100000000 bytes");
  expect_rejected_path(write_st_raw(UINT64_MAX, "{}", 2, 0),
                       "header length 18446744073709551615 exceeds the limit");
}

Test(safetensors, rejects_header_length_past_the_file) {
  expect_rejected_path(write_st_raw(40, "{}", 2, 10),
                       "header length 40 runs past the end of the file (12 bytes follow)");
}

Test(safetensors, rejects_invalid_utf8) {
  expect_rejected("{'a\xff':{'dtype':'F32','shape':[1],'data_offsets':[0,4]}}", 4,
                  "header is not valid UTF-8 (byte 0xff at header offset 3)");
  expect_rejected("{'\xc0\x80':1}", 0, "not valid UTF-8 (byte 0xc0");     /* overlong NUL */
  expect_rejected("{'\xed\xa0\x80':1}", 0, "not valid UTF-8 (byte 0xed"); /* surrogate */
  expect_rejected("{'\xf4\x90\x80\x80':1}", 0, "not valid UTF-8");        /* > U+10FFFF */
  expect_rejected("{'\xe2\x82':1}", 0, "not valid UTF-8");                /* truncated */
}

Test(safetensors, rejects_header_that_is_not_an_object) {
  expect_rejected("[]", 0, "header is not a JSON object (it must start with '{')");
  expect_rejected("'a'", 0, "must start with '{'");
  expect_rejected(" {}", 0, "must start with '{'");
  expect_rejected_path(write_st_raw(0, "", 0, 0), "must start with '{'");
}

Test(safetensors, rejects_invalid_json) {
  expect_rejected("{'a':", 0, "header is not valid JSON");
  expect_rejected("{'a':{'dtype':'F32','shape':[01],'data_offsets':[0,4]}}", 4,
                  "malformed number '01'");
  expect_rejected("{'a':{'dtype':'F32','shape':[1.],'data_offsets':[0,4]}}", 4,
                  "malformed number '1.'");
  expect_rejected("{} x", 0, "header has data after the JSON object at header offset 3");
  expect_rejected("{}{}", 0, "data after the JSON object");
}

Test(safetensors, rejects_control_characters_and_nul_escapes) {
  expect_rejected("{'a\x01':1}", 0, "control character 0x01 inside a string");
  expect_rejected_path(write_st_raw(3, "{}\0", 3, 0), "control character 0x00 at header offset 2");
  expect_rejected("{'a\\u0000b':{'dtype':'F32','shape':[1],'data_offsets':[0,4]}}", 4,
                  "\\u0000 escape");
}

Test(safetensors, rejects_bad_metadata) {
  expect_rejected("{'__metadata__':{'k':1}," A_OK "}", 4,
                  "__metadata__ value of 'k' is a number, not a string");
  expect_rejected("{'__metadata__':{'k':{}}," A_OK "}", 4, "value of 'k' is an object");
  expect_rejected("{'__metadata__':['k']," A_OK "}", 4, "__metadata__ is an array, not an object");
  expect_rejected("{'__metadata__':{'k':'1','k':'2'}," A_OK "}", 4,
                  "duplicate __metadata__ key 'k'");
  expect_rejected("{'__metadata__':{},'__metadata__':{}," A_OK "}", 4,
                  "duplicate __metadata__ entry");
}

Test(safetensors, rejects_malformed_entries) {
  expect_rejected("{'a':1}", 0, "tensor 'a': entry is a number, not an object");
  expect_rejected("{'a':{'shape':[1],'data_offsets':[0,4]}}", 4,
                  "tensor 'a': missing field \"dtype\"");
  expect_rejected("{'a':{'dtype':'F32','data_offsets':[0,4]}}", 4, "missing field \"shape\"");
  expect_rejected("{'a':{'dtype':'F32','shape':[1]}}", 4, "missing field \"data_offsets\"");
  expect_rejected("{'a':{'dtype':'F32','shape':[1],'shape':[1],'data_offsets':[0,4]}}", 4,
                  "tensor 'a': duplicate field \"shape\"");
  expect_rejected("{'a':{'dtype':4,'shape':[1],'data_offsets':[0,4]}}", 4,
                  "tensor 'a': dtype is a number, not a string");
  expect_rejected("{'a':{'dtype':'F32','shape':1,'data_offsets':[0,4]}}", 4,
                  "tensor 'a': shape is a number, not an array");
  expect_rejected("{'a':{'dtype':'F32','shape':[1],'data_offsets':{}}}", 4,
                  "tensor 'a': data_offsets is an object, not an array");
}

Test(safetensors, rejects_unknown_dtype) {
  expect_rejected("{'a':{'dtype':'F33','shape':[1],'data_offsets':[0,4]}}", 4,
                  "tensor 'a': unknown dtype 'F33'");
  expect_rejected("{'a':{'dtype':'f32','shape':[1],'data_offsets':[0,4]}}", 4,
                  "unknown dtype 'f32'");
  expect_rejected("{'a':{'dtype':'F4','shape':[2],'data_offsets':[0,1]}}", 1,
                  "tensor 'a': dtype 'F4' packs several elements per byte");
}

Test(safetensors, rejects_bad_shapes) {
  expect_rejected("{'a':{'dtype':'F32','shape':[-1],'data_offsets':[0,4]}}", 4,
                  "tensor 'a': shape[0] is negative (-1)");
  expect_rejected("{'a':{'dtype':'F32','shape':[1,1.5],'data_offsets':[0,4]}}", 4,
                  "tensor 'a': shape[1] is not an integer (1.5)");
  expect_rejected("{'a':{'dtype':'F32','shape':[1.0],'data_offsets':[0,4]}}", 4,
                  "shape[0] is not an integer (1.0)");
  expect_rejected("{'a':{'dtype':'F32','shape':[1e0],'data_offsets':[0,4]}}", 4,
                  "shape[0] is not an integer (1e0)");
  expect_rejected("{'a':{'dtype':'F32','shape':['1'],'data_offsets':[0,4]}}", 4,
                  "tensor 'a': shape[0] is a string, not an integer");
  expect_rejected("{'a':{'dtype':'F32','shape':[null],'data_offsets':[0,4]}}", 4,
                  "shape[0] is null, not an integer");
  expect_rejected("{'a':{'dtype':'F32','shape':[18446744073709551616],'data_offsets':[0,4]}}", 4,
                  "shape[0] does not fit in 64 bits (18446744073709551616)");
}

Test(safetensors, rejects_shape_overflow) {
  expect_rejected("{'a':{'dtype':'U8','shape':[4294967296,4294967296],'data_offsets':[0,0]}}", 0,
                  "tensor 'a': shape element count overflows 64 bits");
  /* The reference multiplies in order, so a later 0 does not save an earlier overflow. */
  expect_rejected("{'a':{'dtype':'U8','shape':[4294967296,4294967296,0],'data_offsets':[0,0]}}", 0,
                  "shape element count overflows");
  expect_rejected("{'a':{'dtype':'F32','shape':[4611686018427387904],'data_offsets':[0,0]}}", 0,
                  "tensor 'a': byte size (4611686018427387904 elements of F32) overflows 64 bits");
}

Test(safetensors, rejects_bad_offsets) {
  expect_rejected("{'a':{'dtype':'F32','shape':[1],'data_offsets':[0,4,4]}}", 4,
                  "tensor 'a': data_offsets has 3 entries, expected 2");
  expect_rejected("{'a':{'dtype':'F32','shape':[1],'data_offsets':[4]}}", 4,
                  "data_offsets has 1 entries, expected 2");
  expect_rejected("{'a':{'dtype':'F32','shape':[1],'data_offsets':[-0,4]}}", 4,
                  "tensor 'a': data_offsets[0] is negative (-0)");
  expect_rejected("{'a':{'dtype':'F32','shape':[1],'data_offsets':[0,4.0]}}", 4,
                  "data_offsets[1] is not an integer (4.0)");
  expect_rejected("{'a':{'dtype':'F32','shape':[1],'data_offsets':[0,'4']}}", 4,
                  "data_offsets[1] is a string, not an integer");
}

Test(safetensors, rejects_end_before_begin) {
  expect_rejected("{'a':{'dtype':'F32','shape':[0],'data_offsets':[20,10]}}", 20,
                  "tensor 'a': data_offsets end 10 < begin 20");
}

Test(safetensors, rejects_size_mismatch) {
  expect_rejected("{'a':{'dtype':'F32','shape':[1],'data_offsets':[0,8]}}", 8,
                  "tensor 'a': data_offsets [0, 8] span 8 bytes but 1 elements of F32 need 4");
}

Test(safetensors, rejects_gap) {
  expect_rejected("{" A_OK ",'b':{'dtype':'F32','shape':[1],'data_offsets':[8,12]}}", 12,
                  "tensor 'b': data_offsets begin 8 leaves a gap after offset 4");
  expect_rejected("{'a':{'dtype':'F32','shape':[1],'data_offsets':[4,8]}}", 8,
                  "tensor 'a': data_offsets begin 4 leaves a gap after offset 0");
}

Test(safetensors, rejects_overlap) {
  expect_rejected("{" A_OK ",'b':{'dtype':'F32','shape':[1],'data_offsets':[2,6]}}", 6,
                  "tensor 'b': data_offsets begin 2 overlaps the previous tensor, which ends at 4");
}

Test(safetensors, rejects_duplicate_names) {
  expect_rejected("{" A_OK "," A_OK "}", 4, "duplicate tensor name 'a'");
  expect_rejected("{" A_OK ",'a':{'dtype':'U8','shape':[4],'data_offsets':[4,8]}}", 8,
                  "duplicate tensor name 'a'");
}

Test(safetensors, rejects_trailing_bytes) {
  expect_rejected("{" A_OK "}", 5,
                  "1 bytes after the last tensor (data section 5 bytes, tensors end at 4)");
  expect_rejected("{}", 1, "1 bytes after the last tensor");
}

Test(safetensors, rejects_truncated_data) {
  expect_rejected("{" A_OK "}", 3, "file truncated: tensors end at 4 but the data section is 3");
}
