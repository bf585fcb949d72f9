/* The language-model training steps of issue 7: GPT-2 124M (batch 16, seq 1024) and the
 * SmolLM2-135M shape (576 hidden, 30 layers, 9/3 heads, 1536 MLP, 49152 vocab; batch 8,
 * seq 1024), AdamW, built by models/ from the same config fields transformers reads.
 * Prints one BENCH line with the median step time, tokens/s and the device memory the
 * session holds; benchmarks/torch_lm.py times the same steps with transformers' models.
 *
 * usage: bench_lm_step gpt2|smollm2 [--tf32] [--precision f32|tf32|bf16|f16] [--no-optimize]
 *        [--batch B] [--seq T] [--steps N]
 *        [--profile]
 * --no-optimize turns the graph optimizer off (the row is named with "_noopt");
 * --siblings-always concatenates sibling products whatever the cost model says ("_sib");
 * --profile also prints the time of every op (mn_cuda_profile_step) after the timing.
 * The loss is the graph's only output, as in a training loop and in the PyTorch bar
 * (benchmarks/torch_nanogpt.py returns the loss alone), so the logits are an activation that
 * their gradient overwrites; --with-logits keeps mn_model_build's second output, the logits,
 * readable after each step in memory of their own ("_logits").
 * --lora-rank R fine-tunes with LoRA adapters of rank R (alpha 2R) on every linear layer, the
 * base frozen ("_loraR"), as PEFT's LoraConfig(target_modules="all-linear") does;
 * benchmarks/torch_nanogpt.py --lora R is its PyTorch + peft bar. --lora-targets LIST adapts
 * only those layers ("_loraR_LIST"): with q_proj alone the step is nearly the frozen base's
 * (the backward still runs down to layer 0), which prices the adapters. */
#include "benchmarks/bench_util.h"
#include "benchmarks/lm_configs.h"

static size_t device_used_bytes(void) {
#ifdef MN_WITH_CUDA
  size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) return total_b - free_b;
#endif
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 2 || (strcmp(argv[1], "gpt2") && strcmp(argv[1], "smollm2"))) {
    fprintf(
        stderr,
        "usage: bench_lm_step gpt2|smollm2 [--tf32] [--precision P] [--no-optimize] [--batch B] "
        "[--seq T] [--steps N] [--profile] [--siblings-always] [--with-logits] "
        "[--lora-rank R [--lora-targets LIST]]\n");
    return 2;
  }
  bool gpt2 = strcmp(argv[1], "gpt2") == 0;
  long batch = gpt2 ? 16 : 8, seq = 1024, steps = 10;
  mn_session_options o = mn_session_options_default();
  bool profile = false, with_logits = false;
  long lora_rank = 0;
  const char *lora_targets = "all-linear";
  for (int i = 2; i < argc; i++) {
    if (strcmp(argv[i], "--tf32") == 0)
      o.allow_tf32 = true;
    else if (i + 1 < argc && strcmp(argv[i], "--precision") == 0) {
      const char *p = argv[++i];
      o.allow_tf32 = strcmp(p, "tf32") == 0;
      o.precision = strcmp(p, "bf16") == 0  ? MN_PRECISION_BF16
                    : strcmp(p, "f16") == 0 ? MN_PRECISION_F16
                                            : MN_PRECISION_F32;
      if (strcmp(p, "f32") && strcmp(p, "tf32") && strcmp(p, "bf16") && strcmp(p, "f16")) {
        fprintf(stderr, "bench_lm_step: --precision must be f32, tf32, bf16 or f16\n");
        return 2;
      }
    } else if (strcmp(argv[i], "--no-optimize") == 0)
      o.optimize = false;
    else if (strcmp(argv[i], "--siblings-always") == 0)
      o.siblings = MN_SIBLINGS_ALWAYS;
    else if (strcmp(argv[i], "--profile") == 0)
      profile = true;
    else if (strcmp(argv[i], "--with-logits") == 0)
      with_logits = true;
    else if (i + 1 < argc && strcmp(argv[i], "--batch") == 0)
      batch = atol(argv[++i]);
    else if (i + 1 < argc && strcmp(argv[i], "--seq") == 0)
      seq = atol(argv[++i]);
    else if (i + 1 < argc && strcmp(argv[i], "--steps") == 0)
      steps = atol(argv[++i]);
    else if (i + 1 < argc && strcmp(argv[i], "--lora-rank") == 0)
      lora_rank = atol(argv[++i]);
    else if (i + 1 < argc && strcmp(argv[i], "--lora-targets") == 0)
      lora_targets = argv[++i];
    else {
      fprintf(stderr, "bench_lm_step: unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  if (batch < 1 || seq < 1 || steps < 1 || lora_rank < 0) {
    fprintf(stderr, "bench_lm_step: --batch, --seq and --steps must be positive\n");
    return 2;
  }
  mn_model_config cfg;
  bench_check(mn_model_config_parse(gpt2 ? MN_BENCH_GPT2 : MN_BENCH_SMOLLM2, &cfg), "config");
  mn_graph *g = NULL;
  mn_lora_config lora = mn_lora_config_default();
  lora.rank = lora_rank;
  lora.alpha = 2.0f * (float)lora_rank;
  snprintf(lora.target_modules, sizeof lora.target_modules, "%s", lora_targets);
  mn_model_options mo = {.lora = lora_rank ? &lora : NULL, .loss_only = !with_logits};
  bench_check(mn_model_build_with(&cfg, batch, seq, &mo, &g), "model");

  size_t used0 = device_used_bytes();
  double t0 = bench_now_ms();
  mn_session *s = NULL;
  bench_check(mn_build_session(g, &o, &s), "build");
  double build_ms = bench_now_ms() - t0;
  bench_check(mn_model_init_parameters(&cfg, g, s, 1), "init");
  bench_check(mn_session_set_adamw(s, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f), "adamw");

  size_t bt = (size_t)(batch * seq);
  uint32_t *ids = malloc(2 * bt * sizeof *ids);
  uint64_t rng = 42;
  for (size_t i = 0; i < 2 * bt; i++) {
    rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
    ids[i] = (uint32_t)((rng >> 33) % (uint64_t)cfg.vocab_size);
  }
  bench_check(mn_session_set_input_u32(s, "input_ids", ids, bt), "input_ids");
  bench_check(mn_session_set_input_u32(s, "labels", ids + bt, bt), "labels");
  free(ids);

  double step_ms = bench_steps_ms(s, 3, (int)steps, 1);
  size_t used = device_used_bytes() - used0;
  mn_session_stats st;
  mn_session_get_stats(s, &st);
  mn_memory_summary mem = mn_session_memory_summary(s);
  char lora_tag[64] = "";
  if (lora_rank)
    snprintf(lora_tag, sizeof lora_tag, "_lora%ld%s%.16s", lora_rank,
             strcmp(lora_targets, "all-linear") ? "_" : "",
             strcmp(lora_targets, "all-linear") ? lora_targets : "");
  printf("BENCH lm_%s%s%s%s%s%s backend=%s batch=%ld seq=%ld step_ms=%.3f tokens_per_s=%.0f "
         "dispatches=%zu launches_per_step=%.2f device_mib=%.0f planned_mib=%.0f build_ms=%.0f "
         "kernels=%zu graph_nodes=%zu loss=%.4f\n",
         argv[1],
         o.precision == MN_PRECISION_BF16  ? "_bf16"
         : o.precision == MN_PRECISION_F16 ? "_f16"
         : o.allow_tf32                    ? "_tf32"
                                           : "",
         o.optimize ? "" : "_noopt", o.siblings == MN_SIBLINGS_ALWAYS ? "_sib" : "",
         with_logits ? "_logits" : "", lora_tag, st.backend, batch, seq, step_ms,
         (double)bt / (step_ms * 1e-3), mn_plan_num_dispatches(mn_session_plan(s)),
         st.steps ? (double)st.submissions / (double)st.steps : 0.0, (double)used / 1048576.0,
         (double)mem.total_buffer_bytes / 1048576.0, build_ms, st.kernels, st.graph_nodes,
         mn_session_read_loss(s));
#ifdef MN_WITH_CUDA
  if (profile && mn_cuda_session_stream(s))
    bench_check(mn_cuda_profile_step(s, 5, stdout), "profile");
#else
  if (profile) printf("--profile needs a CUDA build\n");
#endif
  mn_session_free(s);
  mn_graph_free(g);
  return 0;
}
