#!/usr/bin/env bash
# Same-run A/B timing of the language-model steps: builds bench_lm_step from another revision
# of the tree (BASE: a folder, or a .tar from `git archive REV -o base.tar`) and from this
# tree, then times GPT-2 124M and SmolLM2-135M with each build in turn, ROUNDS times, so a
# change that should not move the step time (a refactor) is checked on one card, one run.
#
# usage: scripts/ab-steps.sh [--offline DEB_DIR] [--rounds N] [--flags "--tf32"] BASE
#   --offline DEB_DIR  unpack cJSON's Debian packages from DEB_DIR (air-gapped GPU nodes)
#   --rounds N         alternations per model (default 2); each prints one BENCH line
#   --flags F          bench_lm_step flags (default --tf32)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
debs=""
rounds=2
flags="--tf32"
while [ $# -gt 1 ]; do
  case "$1" in
    --offline) debs=$(cd "$2" && pwd); shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --flags) flags=$2; shift 2 ;;
    *) echo "ab-steps.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ $# -eq 1 ] || { sed -n 2,11p "$0"; exit 2; }
base=$1
source "$root/scripts/lib/deps.sh"
[ -z "$debs" ] || mn_use_debs "$debs"

work=${MN_AB_DIR:-/tmp/meganeura-ab}
mkdir -p "$work"
if [ -d "$base" ]; then
  base_src=$(cd "$base" && pwd)
else
  base_src=$work/base-src
  rm -rf "$base_src" && mkdir -p "$base_src" && tar -xf "$base" -C "$base_src"
fi

generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
build_tree() { # SRC DIR
  cmake -S "$1" -B "$2" "${generator[@]}" -DMN_WITH_CUDA=ON -DCMAKE_BUILD_TYPE=Release \
    -DMN_WERROR=OFF -DMN_BUILD_TESTS=OFF -DMN_BUILD_EXAMPLES=OFF >"$2.configure.log" 2>&1 ||
    { cat "$2.configure.log"; exit 1; }
  cmake --build "$2" -j "$(nproc)" --target bench_lm_step >"$2.build.log" 2>&1 ||
    { tail -n 40 "$2.build.log"; exit 1; }
}
printf '== building base (%s) and head (%s)\n' "$base_src" "$root"
build_tree "$base_src" "$work/base"
build_tree "$root" "$work/head"

log=$work/ab.log
: >"$log"
for model in gpt2 smollm2; do
  for ((r = 1; r <= rounds; r++)); do
    for side in base head; do
      line=$(MN_CACHE_DIR="$work/$side-kernels" "$work/$side/bench_lm_step" $model $flags | grep '^BENCH')
      echo "$side $line" | tee -a "$log"
    done
  done
done

printf '\n== step_ms, median of %s rounds (%s; %s)\n' "$rounds" "$flags" \
  "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n1)"
python3 - "$log" <<'PY'
import re, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    side, name = line.split()[0], line.split()[2]
    ms = float(re.search(r"step_ms=([0-9.]+)", line).group(1))
    rows.setdefault(name, {}).setdefault(side, []).append(ms)
print(f"{'step':<24}{'base':>10}{'head':>10}{'change':>9}")
for name, sides in rows.items():
    b, h = statistics.median(sides["base"]), statistics.median(sides["head"])
    print(f"{name:<24}{b:>10.2f}{h:>10.2f}{(h / b - 1) * 100:>8.1f}%")
PY
