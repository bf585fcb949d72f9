#!/usr/bin/env bash
# Times variants of one training step (environment switches) against each other in one build
# (scripts/ab-steps.sh compares two revisions instead), interleaved
# (A B C A B C ...) so that a card warming up or a neighbour's load falls on every variant
# alike, and prints each variant's median step time and its ratio to the first.
#
# usage: scripts/ab-env.sh [--build-dir DIR] [--rounds R] -- BENCH_ARGS -- VARIANT...
#   BENCH_ARGS  passed to bench_lm_step (e.g. gpt2 --precision bf16)
#   VARIANT     environment assignments for one variant, space-separated, or "base" for none
#               (e.g. base MN_CUDA_EPILOGUES_OFF=bgrad "MN_CUDA_STREAMS=4")
#   --rounds R  runs of each variant (default 3); each run is bench_lm_step's median of 10
#               steps after 3
# example: scripts/ab-env.sh -- gpt2 --precision bf16 -- base MN_CUDA_EPILOGUES_OFF=bgrad
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build="$root/build-gpu"
rounds=3
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  case "$1" in
    --build-dir) build=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    *) echo "ab-env.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
[ $# -gt 0 ] && shift
bench_args=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do bench_args+=("$1"); shift; done
[ $# -gt 0 ] && shift
variants=("$@")
if [ ${#bench_args[@]} -eq 0 ] || [ ${#variants[@]} -eq 0 ]; then
  sed -n '6,13p' "$0" >&2
  exit 2
fi
[ -x "$build/bench_lm_step" ] || { echo "ab-env.sh: $build/bench_lm_step not built" >&2; exit 1; }

declare -A times
for ((r = 0; r < rounds; r++)); do
  for v in "${variants[@]}"; do
    envs=()
    [ "$v" != base ] && read -r -a envs <<<"$v"
    line=$(env "${envs[@]}" "$build/bench_lm_step" "${bench_args[@]}" 2>&1 | grep '^BENCH ' || true)
    ms=$(echo "$line" | grep -oE 'step_ms=[0-9.]+' | cut -d= -f2)
    echo "round $((r + 1)) [$v] ${ms:-failed}"
    times[$v]="${times[$v]:-} ${ms:-nan}"
  done
done

printf '\n%-50s %12s %10s  %s\n' "variant (bench_lm_step ${bench_args[*]})" "median ms" "x first" "runs"
first=""
for v in "${variants[@]}"; do
  med=$(echo "${times[$v]}" | tr ' ' '\n' | grep -E '^[0-9.]+$' | sort -g |
    awk '{a[NR]=$1} END {if (NR == 0) print "nan"; else if (NR % 2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}')
  [ -z "$first" ] && first=$med
  ratio=$(awk -v m="$med" -v f="$first" 'BEGIN {if (m == "nan" || f == "nan" || f == 0) print "-"; else printf "%.3f", m / f}')
  printf '%-50s %12s %10s %s\n' "$v" "$med" "$ratio" "${times[$v]}"
done
