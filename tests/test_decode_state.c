/* The decode-state ops on the CPU (mn_store_row_u32, mn_increment_u32): their values persist
 * across steps of a session built with the default optimizer, in the order their inputs give;
 * the builders' refusals; and the generator that uses them, whose tokens come back through
 * the device's ring: a call of 70 tokens (past the ring's 64 rows) equals 5 + 60 + 5, with one
 * launch per token and one read per 64 tokens and at the end. */
#include <stdio.h>
#include <string.h>

#include "tests/support/generator_check.h"
#include "tests/support/mn_test.h"
#include "tests/support/tmp_dir.h"

static void set_u32(mn_session *s, const char *name, const uint32_t *v, size_t n) {
  cr_assert_eq(mn_session_set_input_u32(s, name, v, n), MN_OK, "%s", mn_last_error());
}

Test(decode_state, writes_persist_across_steps_in_order) {
  mn_graph *g = mn_graph_new();
  mn_node src = mn_input_u32(g, "src", MN_SHAPE(3)), row = mn_input_u32(g, "row", MN_SHAPE(1));
  mn_node ring = mn_input_u32(g, "ring", MN_SHAPE(4, 3)), key = mn_input_u32(g, "key", MN_SHAPE(3));
  mn_node last = mn_input_u32(g, "last", MN_SHAPE(3, 1));
  mn_node next = mn_store_row_u32(g, src, last, row);
  mn_node r = mn_store_row_u32(g, next, ring, row);
  mn_node t = mn_increment_u32(g, r, row, 0);
  t = mn_increment_u32(g, t, key, 2);
  mn_node outs[3] = {r, t, next};
  cr_assert_eq(mn_graph_status(g), MN_OK, "%s", mn_graph_error(g));
  mn_set_outputs(g, outs, 3);
  mn_session_options o = mn_session_options_default();
  o.backend = MN_BACKEND_CPU;
  mn_session *s = NULL;
  cr_assert_eq(mn_build_inference_session(g, &o, &s), MN_OK, "%s", mn_last_error());
  const uint32_t zeros[12] = {0}, key0[3] = {7, 8, 2}, row0[1] = {3};
  set_u32(s, "ring", zeros, 12);
  set_u32(s, "key", key0, 3);
  set_u32(s, "row", row0, 1);
  for (uint32_t step = 0; step < 6; step++) {
    uint32_t v[3] = {10 * step, 10 * step + 1, 10 * step + 2};
    set_u32(s, "src", v, 3);
    cr_assert_eq(mn_session_step(s), MN_OK, "%s", mn_last_error());
  }
  cr_assert_eq(mn_session_wait(s), MN_OK);
  float got[12], k[3], last_ids[3];
  cr_assert_eq(mn_session_read_output_by_index(s, 0, got, 12), MN_OK, "%s", mn_last_error());
  /* Steps 0..5 wrote rows 3, 0, 1, 2, 3, 0: row 0 holds step 5, 1 step 2, 2 step 3, 3 step 4. */
  const uint32_t step_of_row[4] = {5, 2, 3, 4};
  for (int i = 0; i < 12; i++)
    cr_expect_float_eq(got[i], (float)(10 * step_of_row[i / 3] + (uint32_t)i % 3), 0, "ring %d", i);
  cr_assert_eq(mn_session_read_output_by_index(s, 1, k, 3), MN_OK);
  cr_expect(k[0] == 7 && k[1] == 8 && k[2] == 8, "key (%g, %g, %g)", k[0], k[1], k[2]);
  cr_assert_eq(mn_session_read_output_by_index(s, 2, last_ids, 3), MN_OK);
  cr_expect(last_ids[0] == 50 && last_ids[2] == 52);
  mn_session_free(s);
  mn_graph_free(g);
}

/* Case i on a fresh graph (errors are sticky): the node, MN_NO_NODE when refused. */
static mn_node refusal_case(mn_graph *g, int i) {
  mn_node src = mn_input_u32(g, "src", MN_SHAPE(3)), row = mn_input_u32(g, "row", MN_SHAPE(1));
  mn_node f = mn_input(g, "f", MN_SHAPE(3)), five = mn_input_u32(g, "five", MN_SHAPE(5));
  mn_node ids = mn_sample(g, mn_input(g, "logits", MN_SHAPE(3, 7)), mn_input(g, "p", MN_SHAPE(3)),
                          mn_input_u32(g, "k", MN_SHAPE(3)));
  cr_assert_eq(mn_graph_status(g), MN_OK, "%s", mn_graph_error(g));
  switch (i) {
  case 0: return mn_store_row_u32(g, src, f, row);
  case 1: return mn_store_row_u32(g, src, five, row);
  case 2: return mn_store_row_u32(g, src, ids, row);
  case 3: return mn_store_row_u32(g, src, src, src);
  case 4: return mn_increment_u32(g, src, src, 3);
  default: return mn_increment_u32(g, src, ids, 0);
  }
}

Test(decode_state, refusals) {
  const char *says[6] = {"dst",
                         "not a whole number of rows",
                         "mn_input or the result of an in-place write",
                         "row is",
                         "first 3 must be below the 3 elements",
                         "op sample"};
  for (int i = 0; i < 6; i++) {
    mn_graph *g = mn_graph_new();
    cr_expect_eq(refusal_case(g, i), MN_NO_NODE, "case %d", i);
    cr_expect_neq(mn_graph_status(g), MN_OK, "case %d", i);
    cr_expect(strstr(mn_graph_error(g), says[i]), "case %d: %s", i, mn_graph_error(g));
    mn_graph_free(g);
  }
}

/* The generator's tokens come back through the ring: a call longer than its 64 rows equals
 * calls that cross its end elsewhere, with one launch per token and a read per 64. */
Test(decode_state, generator_reads_tokens_in_chunks) {
  mn_tmp_dir dir = mn_tmp_dir_make("mn_decode_state");
  mn_model_config c = mn_test_gen_config(MN_MODEL_LLAMA);
  char path[512];
  snprintf(path, sizeof path, "%s", mn_tmp_path(&dir, "w.st"));
  mn_test_gen_write_weights(&c, path, 3);
  mn_generator_options o = mn_generator_options_default();
  o.session.backend = MN_BACKEND_CPU;
  o.batch = 3;
  o.max_seq = 80;
  const uint32_t prompt[3][3] = {{3, 17, 5}, {30, 1, 22}, {8, 8, 9}};
  const mn_sampling seeded = {.temperature = 1.1f, .top_k = 30, .top_p = 0.9f, .seed = 5};
  const mn_sampling *modes[2] = {NULL, &seeded};
  for (int m = 0; m < 2; m++) {
    mn_generator *one = NULL, *split = NULL;
    cr_assert_eq(mn_generator_new(&c, path, &o, &one), MN_OK, "%s", mn_last_error());
    cr_assert_eq(mn_generator_new(&c, path, &o, &split), MN_OK, "%s", mn_last_error());
    uint32_t a[3][70], b[3][70], part[3][60];
    mn_generator_stats st;
    cr_assert_eq(mn_generator_generate(one, &prompt[0][0], 3, modes[m], &a[0][0], 70), MN_OK);
    mn_generator_get_stats(one, &st);
    cr_expect_eq(st.launches, 2 + 70u);
    cr_expect_eq(st.host_reads, 2u);
    const size_t parts[3] = {5, 60, 5};
    for (size_t p = 0, t0 = 0; p < 3; t0 += parts[p++]) {
      cr_assert_eq(mn_generator_generate(split, p ? NULL : &prompt[0][0], p ? 0 : 3, modes[m],
                                         &part[0][0], parts[p]),
                   MN_OK, "%s", mn_last_error());
      mn_generator_get_stats(split, &st);
      cr_expect_eq(st.launches, parts[p] + (p ? 0 : 2), "part %zu", p);
      cr_expect_eq(st.host_reads, 1u, "part %zu", p);
      for (int i = 0; i < 3; i++)
        memcpy(&b[i][t0], &part[0][0] + (size_t)i * parts[p], parts[p] * sizeof(uint32_t));
    }
    cr_assert_arr_eq(a, b, sizeof a, "mode %d: 70 tokens differ from 5 + 60 + 5", m);
    mn_generator_free(one);
    mn_generator_free(split);
  }
  mn_tmp_dir_remove(&dir);
}
