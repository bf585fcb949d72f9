/* Whole-model gradient checks: an MLP and a pre-norm transformer block (rms_norm,
 * RoPE, causal GQA attention, SwiGLU, residuals). The conv block is checked with the
 * vision gradients. */
#include "tests/support/gradcheck.h"
#include "tests/support/models.h"

static mn_node mlp(mn_graph *g, const mn_node *x, void *u) {
  (void)u;
  mn_node h = mn_relu(g, mn_bias_add(g, mn_matmul(g, x[0], x[1]), x[2]));
  mn_node logits = mn_bias_add(g, mn_matmul(g, h, x[3]), x[4]);
  return mn_log_softmax(g, logits);
}

Test(grad_models, mlp) {
  mn_gc_leaf l[] = {MN_GC_LEAF("x", -1, 1, 5, 6), MN_GC_LEAF("w1", -0.5f, 0.5f, 6, 7),
                    MN_GC_LEAF("b1", -0.1f, 0.1f, 7), MN_GC_LEAF("w2", -0.5f, 0.5f, 7, 3),
                    MN_GC_LEAF("b2", -0.1f, 0.1f, 3)};
  mn_gradcheck("mlp", l, 5, mlp, NULL, NULL);
}

static const mn_test_block_config block_cfg = {.d_model = 8,
                                               .num_heads = 3,
                                               .num_kv_heads = 1,
                                               .head_dim = 4,
                                               .d_ff = 10,
                                               .rope_theta = 10000.0f,
                                               .eps = 1e-5f};

/* Leaves: x, then the nine block weights in mn_test_block_weights order. */
static mn_node block(mn_graph *g, const mn_node *x, void *u) {
  (void)u;
  mn_test_block_weights w = {x[1], x[2], x[3], x[4], x[5], x[6], x[7], x[8], x[9]};
  return mn_test_block(g, &block_cfg, &w, x[0]);
}

static void check_block(const char *what, int64_t batch, int64_t t) {
  int64_t d = block_cfg.d_model, q = block_cfg.num_heads * block_cfg.head_dim,
          kv = block_cfg.num_kv_heads * block_cfg.head_dim, ff = block_cfg.d_ff;
  mn_gc_leaf x = batch ? (mn_gc_leaf)MN_GC_LEAF("x", -1, 1, batch, t, d)
                       : (mn_gc_leaf)MN_GC_LEAF("x", -1, 1, t, d);
  mn_gc_leaf l[] = {x,
                    MN_GC_LEAF("ln1", 0.5f, 1.5f, d),
                    MN_GC_LEAF("wq", -0.4f, 0.4f, q, d),
                    MN_GC_LEAF("wk", -0.4f, 0.4f, kv, d),
                    MN_GC_LEAF("wv", -0.4f, 0.4f, kv, d),
                    MN_GC_LEAF("wo", -0.4f, 0.4f, d, q),
                    MN_GC_LEAF("ln2", 0.5f, 1.5f, d),
                    MN_GC_LEAF("wgate", -0.4f, 0.4f, ff, d),
                    MN_GC_LEAF("wup", -0.4f, 0.4f, ff, d),
                    MN_GC_LEAF("wdown", -0.4f, 0.4f, d, ff)};
  mn_gc_options o = {.max_probes = 24};
  mn_gradcheck(what, l, 10, block, NULL, &o);
}

Test(grad_models, transformer_block) { check_block("block [T,D]", 0, 5); }
Test(grad_models, transformer_block_batched) { check_block("block [B,T,D]", 2, 3); }
