#!/usr/bin/env bash
# One command for a GPU machine: configure with the CUDA backend, build, run the
# benchmarks beside PyTorch, run the whole ctest suite (GPU suites included), and print a
# short table last.
#
# usage: scripts/gpu-test.sh [--offline DEB_DIR] [--build-dir DIR] [--log-dir DIR] [--no-bench]
#                            [--tests REGEX] [--no-ctest] [--lm] [--lora] [--quality] [--decode]
#                            [--sanitize] [--sanitizer-wheel WHL] [--attention]
#   --offline DEB_DIR  air-gapped nodes: unpack the Debian packages of cJSON and Criterion
#                      (and their dependencies) found in DEB_DIR into a private prefix
#                      instead of installing them; see README "GPU machines".
#   --tests REGEX      run only the ctest tests matching REGEX (and, with --sanitize, only
#                      the GPU suites whose names match it)
#   --no-ctest         build and benchmark only
#   --lm               also HF parity (scripts/hf_parity.py: fp32, then bf16 against
#                      transformers under torch.autocast, one PASS/FAIL line each) and the
#                      language-model steps (GPT-2 124M, SmolLM2-135M; fp32 and TF32) beside
#                      transformers' models in PyTorch eager and torch.compile (minutes)
#   --decode           also the decode benchmark (bench_decode: SmolLM2-135M shape batch 1 and 8
#                      in bf16 and f32, each --quant format at batch 1 and 8 bf16 (a format the
#                      generator refuses is reported as such), GPT-2 124M batch 1 bf16; prompt
#                      128, 256 new tokens) beside benchmarks/torch_decode.py (transformers'
#                      generate, bf16 and fp32, and a CUDA-graph static-cache decoder, bf16) in
#                      the same run, and the greedy parity with transformers' generate
#                      (scripts/hf_generate_parity.py, CPU and CUDA backends); the table of
#                      scripts/decode_summary.py comes last. MN_DECODE_REPEATS (default 3) sets
#                      the timed repeats (about 3 minutes with PyTorch)
#   --lora             also LoRA against peft (scripts/peft_parity.py: our adapter loaded by
#                      peft gives our logits, one step's adapter gradients and AdamW update,
#                      the merged export through transformers; PEFT-PARITY PASS/FAIL) and the
#                      LoRA steps: SmolLM2-135M (MN_LORA_MODELS="smollm2 gpt2" adds GPT-2),
#                      bf16, r=16 on every linear layer, beside full fine-tuning and PyTorch +
#                      peft (eager, torch.compile)
#   --quality          also the bf16 training-quality run (scripts/quality_run.py): a small
#                      GPT-2 trained 1000 steps from one initialization on the same batches by
#                      meganeura fp32, meganeura bf16 and PyTorch autocast bf16; writes
#                      docs/quality-bf16.svg and .csv and prints whether the final losses are
#                      within 1% of each other (minutes)
#   --attention        also the attention benchmark: bench_attention (causal attention forward,
#                      dQ and dK / dV ops at the GPT-2 and SmolLM2 shapes, bf16, per-op ms and
#                      TFLOP/s) beside benchmarks/torch_attention.py (PyTorch's flash
#                      attention, forward and forward + backward), then a small table
#   --sanitize         also run every GPU suite (build/tests/test_cuda_*, and the GPU tests of
#                      test_attention_qkv) under NVIDIA
#                      compute-sanitizer, memcheck then racecheck, after the other parts; a
#                      finding fails the script. Slow suites run a representative subset of
#                      small-shape tests (a Criterion --filter each, listed in sanitize_filter
#                      below); over 15 minutes on an H100 for every suite (2026-11-27), so --tests
#                      narrows it. compute-sanitizer is looked for on
#                      PATH, then in $CUDA_HOME/bin and /usr/local/cuda/bin. Logs:
#                      LOG_DIR/sanitize-SUITE-TOOL.log; a table (suite, tool, tests, errors)
#                      comes last. A racecheck run that stops with the tool's internal error
#                      runs again with no kernel instrumented and reads TOOL ERROR when that
#                      stops too (still a failure of the script, not a finding in our kernels).
#                      For the sanitizer alone: --sanitize --no-bench --no-ctest.
#                      MN_SANITIZE_TOOLS picks the tools (say racecheck alone).
#   --sanitizer-wheel WHL  use the compute-sanitizer inside PyPI's nvidia-cuda-sanitizer-api
#                      wheel WHL (unpacked into the build folder) before any other. The
#                      toolkit's 2025.3.1 stops racecheck with an internal error on sm_90;
#                      the wheel's 2026.4.0 (13.5.25) runs it (2026-11-28).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build="$root/build-gpu"
logs=""
debs=""
bench=1
lm=0
lora=0
quality=0
decode=0
attention=0
run_ctest=1
sanitize=0
wheel=""
filter=()
suites=""
while [ $# -gt 0 ]; do
  case "$1" in
    --offline) debs=$(cd "$2" && pwd); shift 2 ;;
    --build-dir) build=$2; shift 2 ;;
    --log-dir) logs=$2; shift 2 ;;
    --no-bench) bench=0; shift ;;
    --lm) lm=1; shift ;;
    --lora) lora=1; shift ;;
    --quality) quality=1; shift ;;
    --decode) decode=1; shift ;;
    --attention) attention=1; shift ;;
    --no-ctest) run_ctest=0; shift ;;
    --tests) filter=(-R "$2"); suites=$2; shift 2 ;;
    --sanitize) sanitize=1; shift ;;
    --sanitizer-wheel) wheel=$(cd "$(dirname "$2")" && pwd)/$(basename "$2"); shift 2 ;;
    -h|--help) sed -n 2,60p "$0"; exit 0 ;;
    *) echo "gpu-test.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
logs=${logs:-$build/logs}
mkdir -p "$logs"
jobs=$(nproc 2>/dev/null || echo 4)

step() { printf '\n== %s\n' "$*"; }

# Data-parallel suites load NCCL at run time: PyTorch's wheel (nvidia.nccl) has it. NVLink
# multicast (NVLS) stays off, as these machines need.
if [ -z "${MN_NCCL_LIBRARY:-}" ]; then
  nccl=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(nvidia.nccl.__path__[0], "lib/libnccl.so.2"))' 2>/dev/null || true)
  if [ -n "$nccl" ] && [ -f "$nccl" ]; then export MN_NCCL_LIBRARY=$nccl; fi
fi
export NCCL_NVLS_ENABLE=0

# compute-sanitizer: PATH first, then the toolkit's bin folders. Looked for before the build,
# so that a missing one stops the run at once.
sanitizer=""
if [ -n "$wheel" ] && [ "$sanitize" != 1 ]; then
  echo "gpu-test.sh: --sanitizer-wheel is for --sanitize runs" >&2
  exit 2
fi
if [ -n "$wheel" ]; then
  [ -f "$wheel" ] || { echo "gpu-test.sh: no wheel $wheel" >&2; exit 1; }
  mkdir -p "$build/sanitizer-wheel"
  python3 -m zipfile -e "$wheel" "$build/sanitizer-wheel"
  wheel_bin=$(dirname "$(find "$build/sanitizer-wheel" -path '*compute-sanitizer/compute-sanitizer' | head -n1)")
  [ "$wheel_bin" != . ] || { echo "gpu-test.sh: no compute-sanitizer in $wheel" >&2; exit 1; }
  # zipfile keeps no file modes.
  find "$wheel_bin" -maxdepth 1 -type f -exec chmod +x {} +
  PATH=$wheel_bin:$PATH
fi
if [ "$sanitize" = 1 ]; then
  for c in "$(command -v compute-sanitizer 2>/dev/null || true)" \
    "${CUDA_HOME:+$CUDA_HOME/bin/compute-sanitizer}" /usr/local/cuda/bin/compute-sanitizer; do
    if [ -n "$c" ] && [ -x "$c" ]; then sanitizer=$c; break; fi
  done
  if [ -z "$sanitizer" ]; then
    echo "gpu-test.sh: --sanitize needs NVIDIA compute-sanitizer, which is not on PATH nor in" \
      "${CUDA_HOME:+$CUDA_HOME/bin or }/usr/local/cuda/bin; install the CUDA toolkit's" \
      "cuda-sanitizer package or set CUDA_HOME" >&2
    exit 1
  fi
fi

have_deps() {
  [ -f /usr/include/criterion/criterion.h ] && [ -f /usr/include/cjson/cJSON.h ]
}

source "$root/scripts/lib/deps.sh"
if [ -n "$debs" ]; then
  step "unpacking $(ls "$debs"/*.deb | wc -l) Debian packages from $debs"
  mn_use_debs "$debs"
elif ! have_deps; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    step "installing cJSON and Criterion"
    apt-get update -qq && apt-get install -y -qq libcjson-dev libcriterion-dev >/dev/null
  else
    echo "gpu-test.sh: cJSON and Criterion are missing; install libcjson-dev and" \
      "libcriterion-dev, or pass --offline DEB_DIR" >&2
    exit 1
  fi
fi

step "GPU"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
command -v nvcc >/dev/null && nvcc --version | tail -n 2 || true

step "configure and build ($build)"
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
# Warnings stay warnings here: GPU hosts carry other compiler versions, whose new
# diagnostics must not stop a test run; CI builds with -Werror.
cmake -S "$root" -B "$build" "${generator[@]}" -DMN_WITH_CUDA=ON -DCMAKE_BUILD_TYPE=Release \
  -DMN_WERROR=OFF >"$logs/configure.log" 2>&1 || { cat "$logs/configure.log"; exit 1; }
cmake --build "$build" -j "$jobs" >"$logs/build.log" 2>&1 || { tail -n 60 "$logs/build.log"; exit 1; }

if [ "$bench" = 1 ]; then
  step "benchmarks"
  : >"$logs/bench.log"
  # Each step with the graph optimizer on and off: what the optimizer buys, same run.
  for cmd in "bench_mlp_step" "bench_mlp_step --tf32" "bench_block_step" "bench_block_step --tf32" \
    "bench_mlp_step --no-optimize" "bench_mlp_step --tf32 --no-optimize" \
    "bench_block_step --no-optimize" "bench_block_step --tf32 --no-optimize"; do
    "$build"/$cmd 2>&1 | tee -a "$logs/bench.log" || echo "BENCH-FAILED $cmd" | tee -a "$logs/bench.log"
  done
  "$build/bench_memplan_gpt2" 2>&1 | tee -a "$logs/bench.log" || true
  if python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
    for flag in "" "--tf32"; do
      python3 "$root/benchmarks/torch_steps.py" $flag 2>&1 | tee -a "$logs/bench.log" ||
        echo "BENCH-FAILED torch_steps.py $flag" | tee -a "$logs/bench.log"
    done
  else
    echo "PyTorch with CUDA not available: no PyTorch figures" | tee -a "$logs/bench.log"
  fi
fi

# Greedy tokens of mn_generator against transformers' generate, fp32, both backends.
generate_parity() {
  python3 "$root/scripts/hf_generate_parity.py" --driver "$build/bench_generate_parity_driver" \
    --backend both >"$logs/hf_generate_parity.log" 2>&1 || true
  grep -E "^(PASS|FAIL|GENERATE-PARITY)" "$logs/hf_generate_parity.log" | tee -a "$logs/bench.log" ||
    tail -n 20 "$logs/hf_generate_parity.log"
}

if [ "$lm" = 1 ]; then
  step "HF parity (scripts/hf_parity.py)"
  if python3 -c 'import torch, transformers' 2>/dev/null; then
    python3 "$root/scripts/hf_parity.py" --driver "$build/bench_hf_parity_driver" --backend both \
      >"$logs/hf_parity.log" 2>&1 && echo "HF-PARITY passed" | tee -a "$logs/bench.log" ||
      echo "HF-PARITY FAILED (see $logs/hf_parity.log)" | tee -a "$logs/bench.log"
    grep -E "^  (ok|FAIL) " "$logs/hf_parity.log" | tee -a "$logs/bench.log" >/dev/null || true
    # bf16 sessions against the same models under torch.autocast (tolerances from bf16's unit
    # roundoff, scripts/hf_parity.py TOL_BF16).
    if python3 "$root/scripts/hf_parity.py" --driver "$build/bench_hf_parity_driver" \
      --backend both --precision bf16 >"$logs/hf_parity_bf16.log" 2>&1; then
      echo "HF-PARITY bf16 passed" | tee -a "$logs/bench.log"
    else
      echo "HF-PARITY bf16 FAILED (see $logs/hf_parity_bf16.log)" | tee -a "$logs/bench.log"
    fi
    grep -E "^  (ok|FAIL) " "$logs/hf_parity_bf16.log" | tee -a "$logs/bench.log" >/dev/null || true
    generate_parity
  fi
  step "language-model steps"
  for model in gpt2 smollm2; do
    for flag in "" "--tf32" "--tf32 --no-optimize" "--precision bf16" \
      "--precision bf16 --with-logits"; do
      "$build/bench_lm_step" $model $flag 2>&1 | tee -a "$logs/bench.log" ||
        echo "BENCH-FAILED bench_lm_step $model $flag" | tee -a "$logs/bench.log"
    done
    if python3 -c 'import torch, transformers; assert torch.cuda.is_available()' 2>/dev/null; then
      for args in "--mode eager" "--tf32 --mode eager,compile"; do
        python3 "$root/benchmarks/torch_lm.py" $model $args 2>&1 | tee -a "$logs/bench.log" ||
          echo "BENCH-FAILED torch_lm.py $model $args" | tee -a "$logs/bench.log"
      done
      # The bar: what fast users run (nanoGPT-style GPT-2, a plain Llama), TF32 and bf16
      # autocast, eager and torch.compile.
      python3 "$root/benchmarks/torch_nanogpt.py" $model 2>&1 | tee -a "$logs/bench.log" ||
        echo "BENCH-FAILED torch_nanogpt.py $model" | tee -a "$logs/bench.log"
    fi
  done
fi

if [ "$lora" = 1 ]; then
  step "LoRA: parity with peft, and the LoRA steps"
  touch "$logs/bench.log"
  if python3 -c 'import torch, transformers, peft; assert torch.cuda.is_available()' 2>/dev/null; then
    python3 "$root/scripts/peft_parity.py" --driver "$build/bench_peft_parity_driver" \
      >"$logs/peft_parity.log" 2>&1 || true
    grep -E "^(PASS|FAIL|PEFT-PARITY|# )" "$logs/peft_parity.log" | tee -a "$logs/bench.log" ||
      tail -n 20 "$logs/peft_parity.log"
  else
    echo "PEFT-PARITY not run: PyTorch with CUDA, transformers or peft missing" | tee -a "$logs/bench.log"
  fi
  for model in ${MN_LORA_MODELS:-smollm2}; do
    for flag in "--precision bf16" "--precision bf16 --lora-rank 16" \
      "--precision bf16 --lora-rank 16 --lora-targets q_proj"; do
      "$build/bench_lm_step" $model $flag 2>&1 | tee -a "$logs/bench.log" ||
        echo "BENCH-FAILED bench_lm_step $model $flag" | tee -a "$logs/bench.log"
    done
    python3 "$root/benchmarks/torch_nanogpt.py" $model --precision bf16 --lora 16 2>&1 |
      tee -a "$logs/bench.log" || echo "BENCH-FAILED torch_nanogpt.py $model --lora 16" |
      tee -a "$logs/bench.log"
  done
fi

# The decode table (--decode); it comes again after the summary.
decode_lines=""
if [ "$decode" = 1 ]; then
  step "decode: bench_decode beside PyTorch, greedy parity with transformers"
  touch "$logs/bench.log"
  dj="$logs/decode.jsonl"
  : >"$dj"
  reps=${MN_DECODE_REPEATS:-3}
  for args in "smollm2 --batch 1,8 --precision bf16,f32" \
    "smollm2 --batch 1,8 --precision bf16 --quant q8_0,q4_0,q4_1,int8,int4" \
    "gpt2 --batch 1 --precision bf16"; do
    "$build/bench_decode" $args --repeats "$reps" --json "$dj" 2>&1 | tee -a "$logs/bench.log" ||
      echo "BENCH-FAILED bench_decode $args" | tee -a "$logs/bench.log"
  done
  if python3 -c 'import torch, transformers; assert torch.cuda.is_available()' 2>/dev/null; then
    for args in "smollm2 --batch 1,8 --precision bf16,f32" "gpt2 --batch 1 --precision bf16"; do
      python3 "$root/benchmarks/torch_decode.py" $args --repeats "$reps" --json "$dj" 2>&1 |
        tee -a "$logs/bench.log" || echo "BENCH-FAILED torch_decode.py $args" | tee -a "$logs/bench.log"
    done
    generate_parity
  else
    echo "PyTorch with CUDA or transformers not available: no PyTorch decode figures, no parity" |
      tee -a "$logs/bench.log"
  fi
  card=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n1 || true)
  decode_lines=$(python3 "$root/scripts/decode_summary.py" "$dj" --card "${card:-no GPU} $(date -u +%F)" 2>&1 || true)
  decode_lines+=$'\n'$(grep -E "^(PASS|FAIL|GENERATE-PARITY)" "$logs/hf_generate_parity.log" 2>/dev/null || true)
  echo "$decode_lines" | tee "$logs/decode-table.txt"
fi

# The attention table (--attention); it comes again after the summary.
attention_lines=""
if [ "$attention" = 1 ]; then
  step "attention: bench_attention beside PyTorch's flash attention"
  touch "$logs/bench.log"
  "$build/bench_attention" all 2>&1 | tee "$logs/attention.log" ||
    echo "BENCH-FAILED bench_attention" | tee -a "$logs/attention.log"
  if python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
    python3 "$root/benchmarks/torch_attention.py" all 2>&1 | tee -a "$logs/attention.log" ||
      echo "BENCH-FAILED torch_attention.py" | tee -a "$logs/attention.log"
  else
    echo "PyTorch with CUDA not available: no PyTorch attention figures" | tee -a "$logs/attention.log"
  fi
  cat "$logs/attention.log" >>"$logs/bench.log"
  attention_lines=$(awk '/^(ATTN|TORCH-ATTN) / {
      op = ""; ms = ""; tf = ""
      for (i = 1; i <= NF; i++) {
        if ($i ~ /^(op|pass)=/) op = substr($i, index($i, "=") + 1)
        if ($i ~ /^ms=/) ms = substr($i, 4)
        if ($i ~ /^tflops=/) tf = substr($i, 8)
      }
      printf "%-10s %-8s %-5s %-28s %9s ms %7s TFLOP/s\n", ($1 == "ATTN" ? "meganeura" : "torch"), $2, $3, op, ms, tf
    }' "$logs/attention.log")
  echo "$attention_lines"
fi

# The bf16 training-quality run (--quality); its lines come again after the summary.
quality_lines=""
if [ "$quality" = 1 ]; then
  step "bf16 training quality (scripts/quality_run.py)"
  if python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
    set +e
    python3 "$root/scripts/quality_run.py" --driver "$build/bench_quality_driver" --device cuda \
      --out "$root/docs/quality-bf16.svg" 2>&1 | tee "$logs/quality.log"
    quality_rc=${PIPESTATUS[0]}
    set -e
    case "$quality_rc" in
      0) quality_lines="QUALITY passed: final losses within 1%" ;;
      1) quality_lines="QUALITY FAILED: final losses not within 1% (see $logs/quality.log)" ;;
      *) quality_lines="QUALITY FAILED: a run failed, exit $quality_rc (see $logs/quality.log)" ;;
    esac
    quality_lines+=$'\n'$(grep -A 4 '^final loss' "$logs/quality.log" || true)
  else
    quality_lines="QUALITY not run: PyTorch with CUDA is not available"
  fi
  echo "$quality_lines" | tee -a "$logs/bench.log"
fi

test_rc=0
: >"$logs/ctest.log"
if [ "$run_ctest" = 1 ]; then
  step "ctest (all suites, GPU suites included)"
  export MN_CACHE_DIR=${MN_CACHE_DIR:-$build/kernel-cache}
  set +e
  ctest --test-dir "$build" -j "$jobs" --output-on-failure --timeout 900 "${filter[@]}" 2>&1 |
    tee "$logs/ctest.log"
  test_rc=${PIPESTATUS[0]}
  set -e
fi

# ---- compute-sanitizer over the GPU suites (--sanitize)
# Each suite runs once per tool as `compute-sanitizer --tool T ... SUITE --jobs 1 --filter F`.
# The kernels come from NVRTC with -lineinfo (cuda/jit.c), so findings name source lines.
# Options: --error-exitcode makes a finding the exit status (86, apart from a failing test);
# --check-exit-code no leaves a failing test to Criterion (reported as such, not as a
# finding); --target-processes all follows Criterion's worker processes, where the tests
# run (the parent never touches CUDA, hence --require-cuda-init no); --report-api-errors no:
# the tests provoke CUDA API errors on purpose (out of memory) and the library checks every
# call's status itself. racecheck (shared-memory hazards) looks at our kernels only (mn_kN,
# from NVRTC): cuBLASLt's are NVIDIA's, and the slowest to instrument; memcheck checks all,
# cuBLASLt's included, where a wrong leading dimension of ours would show.
# MN_SANITIZER_ARGS adds options (say --leak-check full) to every run; MN_SANITIZE_TOOLS
# picks the tools (default "memcheck racecheck").
sanitize_rc=0
: >"$logs/sanitize.log"

# The Criterion --filter of each suite under the sanitizers (memcheck slows kernels 10-50x
# and adds a few seconds per test process): the small-shape tests that reach every kernel
# family, leaving out compile-only tests (no kernel runs), the large shapes (GPT-2 vocabulary
# and projections, long caches; the same kernels as the small ones) and the tests that
# assert on device-wide free memory, which the sanitizer's own allocations move.
sanitize_filter() {
  case "$1" in
    test_cuda_attention) # causal GQA, MQA with head_dim 6, cross with odd head_dim, hd128;
      # bf16 at head dim 64 (the wgmma kernels on an H100: causal one tile and several, cross);
      # cached attention across a split, odd head_dim, and the kv_len error path
      echo 'cuda_attention/@(@(causal_gqa_9_over_3_rank3|causal_mqa_hd6|cross_hd37_rank2|causal_hd128_rank3)_@(forward|backward)_matches_cpu|@(causal_gqa_9_over_3_rank3|causal_gqa_8_over_2_t300|cross_gqa_rank3)_bf16_matches_cpu|cached_@(kv_len_129|hd37|kv_len_zero_fails_the_step))' ;;
    test_cuda_epilogue) # all but the host-only lowering test and the [2,64,1024] projections
      echo 'cuda_epilogue/!(lowering_offers_each_epilogue_with_its_fallback|matmul_bias_act_projection_shape)' ;;
    test_cuda_lifecycle) # not the 100x build (device-memory bounds; 100 instrumented loads)
      echo 'cuda_lifecycle/sessions_side_by_side_*' ;;
    test_cuda_math) # not the GPT-2 projection shapes
      echo 'cuda_math/@(mlp_training_graph|matmul_padded_row_pitch|matmul_at|matmul_bt|add_mul_div|bias_add_broadcast_add|swiglu|expand_scalar|fan_out)' ;;
    test_cuda_models) # the MLP with AdamW and clipping, two transformer blocks, resume
      echo 'cuda_models/@(mlp_adamw_with_clipping_*|transformer_blocks_adamw_*|checkpoint_resume_*)' ;;
    test_cuda_norm_grad_w) # both launch shapes (8 and 4 warps a block) on two small shapes
      echo 'cuda_norm_grad_w/rows_far_from_zero' ;;
    test_cuda_optimize) echo 'cuda_optimize/*' ;;
    test_cuda_reduce) # not the GPT-2 batch row sums; the label range error path and the
      # register-held loss gradient of bf16 logits included
      echo 'cuda_reduce/@(sum_all_mean_all|softmax|log_softmax|softmax_large_logits|cross_entropy|sparse_cross_entropy|sparse_cross_entropy_of_bf16_logits_from_a_product_*|classifier_training_graph|sum_rows_shapes|label_out_of_range_training)' ;;
    test_attention_qkv) # a CPU suite with GPU tests: the wide-row attention kernels
      echo 'attention_qkv/cuda_*' ;;
    test_cuda_runtime) # the stepping and profiling tests (the others compile only, or
      # assert on device-wide free memory)
      echo 'cuda_runtime/@(every_step_is_one_graph_launch_*|profile_step_times_*)' ;;
    test_cuda_transformer) # odd and degenerate norms, RoPE, embedding, the index error
      # paths, the KV cache and a decoder block; not the GPT-2 vocabulary or wide rows
      echo 'cuda_transformer/@(norms_odd_widths|norms_degenerate_shapes|norm_weight_shared|rope_odd_shapes|embedding_odd_widths_and_repeats|embedding_index_out_of_range|scatter_add_index_out_of_range|cache_write_steps|cache_write_chained|llama_block_training)' ;;
    test_cuda_vision) # strided and 1x1 convs, the chunked im2col, group norm (odd, vec4,
      # one large group), upsample, and the two blocks (concat, split, add_per_channel)
      echo 'cuda_vision/@(conv_3x3_s2_p1_backward|conv_1x1_s2_p1_backward|conv_chunked_over_images|group_norm_4_groups_odd_backward|group_norm_4_groups_vec4_backward|group_norm_large_group_forward|upsample_odd_backward|conv_block_training|down_block_training)_matches_cpu' ;;
    *) echo '!(*_compiles*)' ;; # a new suite: everything but compile-only tests
  esac
}

# Seconds for one suite under one tool (the run is stopped past it and counts as failed).
sanitize_limit() {
  case "$1" in
    test_cuda_models | test_cuda_attention | test_cuda_vision) echo 150 ;;
    # Under racecheck (2026.4) its twelve tests printed nothing within 90 s on an H200 and took
    # 196 s (2026-11-28).
    test_cuda_reduce) echo 300 ;;
    *) echo 90 ;;
  esac
}

sanitize_rows=()
sanitize_suite() { # EXE TOOL
  local exe=$1 tool=$2 name flt limit log rc t0 secs errors tests result
  name=$(basename "$exe")
  flt=$(sanitize_filter "$name")
  limit=$(sanitize_limit "$name")
  log="$logs/sanitize-$name-$tool.log"
  local args=(--tool "$tool" --error-exitcode 86 --check-exit-code no --require-cuda-init no
    --target-processes all --report-api-errors no --print-limit 20)
  [ "$tool" = racecheck ] && args+=(--kernel-name kns=mn_k)
  # shellcheck disable=SC2206
  args+=(${MN_SANITIZER_ARGS:-})
  printf '%s %s (filter %s, limit %ss)\n' "$name" "$tool" "$flt" "$limit" | tee -a "$logs/sanitize.log"
  t0=$(date +%s)
  set +e
  timeout -k 10 "$limit" "$sanitizer" "${args[@]}" "$exe" --jobs 1 --filter "$flt" >"$log" 2>&1
  rc=$?
  set -e
  secs=$(($(date +%s) - t0))
  # Summed over the summary lines (one per process that ran CUDA): memcheck's "ERROR
  # SUMMARY: N errors", racecheck's "RACECHECK SUMMARY: H hazards displayed (N errors, W
  # warnings)" where it prints one.
  local pat='ERROR SUMMARY: [0-9]+ error' field=3 warnings=0
  if [ "$tool" = racecheck ] && grep -q 'RACECHECK SUMMARY' "$log"; then
    pat='RACECHECK SUMMARY: .*\([0-9]+ errors?, [0-9]+ warning'
    field=0
    warnings=$({ grep -oE "$pat" "$log" || true; } | awk '{n += $(NF - 1)} END {print n + 0}')
  fi
  errors=$({ grep -oE "$pat" "$log" || true; } |
    awk -v f="$field" '{if (f == 0) {sub(/.*\(/, ""); n += $1} else n += $f} END {print n + 0}')
  tests=$({ grep -oE 'Synthesis: Tested: [0-9]+' "$log" || true; } | awk '{t = $3} END {print t}')
  # racecheck stopping with its own internal error (2025.3.1 on sm_90, in test_attention_qkv
  # and one bf16 loss test, docs/performance.md): the same run with no kernel instrumented
  # tells a failure of the tool from a finding in our kernels.
  local control=""
  if [ "$tool" = racecheck ] && grep -q 'Internal Sanitizer Error' "$log"; then
    set +e
    timeout -k 10 "$limit" "$sanitizer" "${args[@]/kns=mn_k/kne=mn_no_such_kernel}" "$exe" \
      --jobs 1 --filter "$flt" >"$log.control" 2>&1
    set -e
    grep -q 'Internal Sanitizer Error' "$log.control" && control=yes
  fi
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    result="TIMEOUT after ${limit}s"
  elif [ -n "$control" ]; then
    result="TOOL ERROR (also with no kernel instrumented: $log.control)"
  elif [ "$errors" -gt 0 ] || [ "$rc" = 86 ]; then
    result="FINDINGS"
  elif [ "$rc" != 0 ]; then
    result="FAILED (exit $rc)"
  elif ! grep -qE '(ERROR|RACECHECK) SUMMARY' "$log"; then
    result="NO SANITIZER SUMMARY" # it never ran the tests (see the log)
  elif [ "${tests:-0}" = 0 ]; then
    result="NO TEST RAN" # every test skipped: no usable device under the sanitizer?
  elif [ "$warnings" -gt 0 ]; then
    result="ok ($warnings racecheck warnings)"
  else
    result="ok"
  fi
  [ "${result%% *}" = ok ] || {
    sanitize_rc=1
    grep -E '^========= (Invalid|Error|Race|.*hazard)|Program hit|\[(FAIL|----)\]' "$log" |
      head -n 20 | tee -a "$logs/sanitize.log" || true
  }
  sanitize_rows+=("$(printf '%-22s %-10s %5s %6s %5ss  %s' "$name" "$tool" "${tests:-?}" \
    "$errors" "$secs" "$result")")
}

if [ "$sanitize" = 1 ]; then
  step "compute-sanitizer: memcheck and racecheck over the GPU suites ($("$sanitizer" --version | grep -i version | head -n1))"
  export MN_CACHE_DIR=${MN_CACHE_DIR:-$build/kernel-cache}
  exes=()
  # The GPU suites, and the CPU suites whose GPU tests reach kernels no GPU suite does.
  for exe in "$build"/tests/test_cuda_* "$build"/tests/test_attention_qkv; do
    [ -x "$exe" ] || continue
    if [ -n "$suites" ] && ! basename "$exe" | grep -qE -- "$suites"; then continue; fi
    exes+=("$exe")
  done
  [ "${#exes[@]}" -gt 0 ] || { echo "no GPU suite in $build/tests matches" >&2; sanitize_rc=1; }
  sanitize_t0=$(date +%s)
  for tool in ${MN_SANITIZE_TOOLS:-memcheck racecheck}; do
    for exe in "${exes[@]+"${exes[@]}"}"; do sanitize_suite "$exe" "$tool"; done
  done
  sanitize_secs=$(($(date +%s) - sanitize_t0))
fi

step "summary ($(date -u +%F), $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n1))"
python3 "$root/scripts/gpu_summary.py" "$logs/ctest.log" "$logs/bench.log" ||
  grep -E "tests passed|BENCH" "$logs/ctest.log" "$logs/bench.log" || true
[ -z "$quality_lines" ] || printf '%s\n' "$quality_lines"
[ -z "$decode_lines" ] || printf '\n%s\n' "$decode_lines"
[ -z "$attention_lines" ] || printf '\n%s\n' "$attention_lines"
if [ "$sanitize" = 1 ]; then
  {
    printf '\ncompute-sanitizer (%ss in all; logs %s/sanitize-*.log)\n' "$sanitize_secs" "$logs"
    printf '%-22s %-10s %5s %6s %6s  %s\n' suite tool tests errors time result
    printf '%s\n' "${sanitize_rows[@]+"${sanitize_rows[@]}"}"
  } | tee -a "$logs/sanitize.log"
fi
[ "$test_rc" != 0 ] && exit "$test_rc"
exit "$sanitize_rc"
