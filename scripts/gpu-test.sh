#!/usr/bin/env bash
# One command for a GPU machine: configure with the CUDA backend, build, run the
# benchmarks beside PyTorch, run the whole ctest suite (GPU suites included), and print a
# short table last.
#
# usage: scripts/gpu-test.sh [--offline DEB_DIR] [--build-dir DIR] [--log-dir DIR] [--no-bench]
#                            [--tests REGEX] [--no-ctest] [--lm]
#   --offline DEB_DIR  air-gapped nodes: unpack the Debian packages of cJSON and Criterion
#                      (and their dependencies) found in DEB_DIR into a private prefix
#                      instead of installing them; see README "GPU machines".
#   --tests REGEX      run only the ctest tests matching REGEX
#   --no-ctest         build and benchmark only
#   --lm               also HF parity (scripts/hf_parity.py) and the language-model steps
#                      (GPT-2 124M, SmolLM2-135M; fp32 and TF32) beside transformers' models in
#                      PyTorch eager and torch.compile (minutes)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build="$root/build-gpu"
logs=""
debs=""
bench=1
lm=0
run_ctest=1
filter=()
while [ $# -gt 0 ]; do
  case "$1" in
    --offline) debs=$(cd "$2" && pwd); shift 2 ;;
    --build-dir) build=$2; shift 2 ;;
    --log-dir) logs=$2; shift 2 ;;
    --no-bench) bench=0; shift ;;
    --lm) lm=1; shift ;;
    --no-ctest) run_ctest=0; shift ;;
    --tests) filter=(-R "$2"); shift 2 ;;
    -h|--help) sed -n 2,16p "$0"; exit 0 ;;
    *) echo "gpu-test.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
logs=${logs:-$build/logs}
mkdir -p "$logs"
jobs=$(nproc 2>/dev/null || echo 4)

step() { printf '\n== %s\n' "$*"; }

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

if [ "$lm" = 1 ]; then
  step "HF parity (scripts/hf_parity.py)"
  if python3 -c 'import torch, transformers' 2>/dev/null; then
    python3 "$root/scripts/hf_parity.py" --driver "$build/bench_hf_parity_driver" --backend both \
      >"$logs/hf_parity.log" 2>&1 && echo "HF-PARITY passed" | tee -a "$logs/bench.log" ||
      echo "HF-PARITY FAILED (see $logs/hf_parity.log)" | tee -a "$logs/bench.log"
    grep -E "^  (ok|FAIL) " "$logs/hf_parity.log" | tee -a "$logs/bench.log" >/dev/null || true
  fi
  step "language-model steps"
  for model in gpt2 smollm2; do
    for flag in "" "--tf32" "--tf32 --no-optimize"; do
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

step "summary ($(date -u +%F), $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n1))"
python3 "$root/scripts/gpu_summary.py" "$logs/ctest.log" "$logs/bench.log" ||
  grep -E "tests passed|BENCH" "$logs/ctest.log" "$logs/bench.log" || true
exit "$test_rc"
