#!/usr/bin/env bash
# Trains a tiny byte-level GPT-2 on this repository's own text (README, docs, C sources),
# on the GPU when one is usable and otherwise on the CPU (about two minutes on two cores),
# then prints a generated sample and where the loss curve and metrics are.
#
# usage: scripts/demo.sh [--offline DEB_DIR]   (DEB_DIR: cJSON's Debian packages, for
#                                              machines without a package registry)
#
# Environment: MN_DEMO_BUILD_DIR (default build-demo), MN_DEMO_STEPS (default: 3000 on a
# GPU, 500 on the CPU), MN_DEMO_CONFIG (default configs/tiny-gpt2.json), MN_BACKEND
# (auto|cpu|cuda), MN_JOBS (default: nproc), MN_DEMO_CLI (a meganeura command already built:
# no configure or build; the test suite's smoke run uses it).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
build=${MN_DEMO_BUILD_DIR:-build-demo}
jobs=${MN_JOBS:-$(nproc 2>/dev/null || echo 2)}
out=$build/demo
start=$(date +%s)
say() { printf '\n== %s\n' "$*"; }
trap 'echo "scripts/demo.sh: FAILED at line $LINENO: $BASH_COMMAND" >&2' ERR

if [[ -n ${MN_DEMO_CLI:-} ]]; then
  mn=$MN_DEMO_CLI
else
  # shellcheck source=scripts/lib/deps.sh
  source "$root/scripts/lib/deps.sh"
  if [[ ${1:-} == --offline ]]; then
    # An air-gapped machine: cJSON from the Debian packages in $2 (see README, GPU machines).
    mn_use_debs "$(cd "$2" && pwd)"
    mn_install_missing cmake=cmake ninja=ninja-build gcc=gcc
  else
    mn_install_missing cmake=cmake ninja=ninja-build gcc=gcc -- libcjson-dev
  fi

  # Warnings stay warnings here: GCC -O3 flags a false stringop-overflow in io/graph_hash.c.
  say "configure and build $build (Release)"
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMN_BUILD_TESTS=OFF \
    -DMN_BUILD_EXAMPLES=OFF -DMN_BUILD_BENCHMARKS=OFF >/dev/null
  cmake --build "$build" -j "$jobs" --target meganeura_cli
  mn=$build/meganeura
fi

mkdir -p "$out"
corpus=$out/corpus.txt
cat README.md docs/*.md include/*.h host/*.c autodiff/*.c optimizer/*.c io/*.c models/*.c \
  tools/*.c >"$corpus" 2>/dev/null
say "corpus: $(wc -c <"$corpus") bytes of this repository's text (each byte is a token)"

# The tiny byte-level GPT-2 of configs/ (MN_DEMO_CONFIG=configs/tiny-llama.json: a Llama).
config=${MN_DEMO_CONFIG:-configs/tiny-gpt2.json}
cp "$config" "$out/config.json"

# The backend the library picks (MN_BACKEND overrides); the CPU gets fewer steps.
backend=$("$mn" bench --config "$out/config.json" --batch 1 --seq 8 --steps 1 | awk '{print $2}')
backend=${backend%,}
if [[ $backend == cuda ]]; then
  steps=${MN_DEMO_STEPS:-3000} batch=32 lr=2e-3
else
  steps=${MN_DEMO_STEPS:-500} batch=8 lr=3e-3
fi
say "train on $backend: $steps steps of batch $batch x 64 bytes"
"$mn" train --config "$out/config.json" --data "$corpus" --batch "$batch" --seq 64 \
  --steps "$steps" --lr "$lr" --warmup 30 --weight-decay 0.01 --grad-clip 1.0 --seed 1 \
  --val-fraction 0.05 --eval-every $((steps >= 10 ? steps / 10 : 1)) --checkpoint-every "$steps" --keep-last 1 \
  --out "$out" --metrics "$out/metrics.csv" --plot "$out/loss.svg"

# A GPT-2 has n_positions learned positions (64 here): without --tokens, generate fills what
# the prompt leaves of them. A Llama's RoPE has no such table: 300 bytes.
tokens=(--tokens 300)
grep -q '"model_type": *"gpt2"' "$out/config.json" && tokens=()
say "sample (temperature 0.8, top-k 40)"
"$mn" generate --weights "$out/model.safetensors" --config "$out/config.json" \
  --prompt "/* The session " "${tokens[@]}" --temperature 0.8 --top-k 40 --seed 3
echo

say "done in $(($(date +%s) - start)) s"
echo "  loss curve  $out/loss.svg"
echo "  metrics     $out/metrics.csv (step,loss,lr,tokens_per_s,val_loss,val_ppl)"
echo "  weights     $out/model.safetensors (transformers GPT2LMHeadModel names)"
echo "  checkpoint  $out/checkpoint-$(printf %06d "$steps").safetensors"
