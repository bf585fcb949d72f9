#!/usr/bin/env bash
# Profiles one phase of a training step with Nsight Compute (ncu; the GPU machine has no nsys).
#
# The benchmark's --profile pass runs every command of one step outside the step graph,
# inside NVTX ranges named "meganeura: forward", "meganeura: backward" and
# "meganeura: optimizer" (cuda/profile.c), so ncu can select a phase; the same pass prints
# the per-op table and the floor table (each op's ms against its FLOPs at the measured bf16
# GEMM rate or its bytes at the measured copy bandwidth; cuda/profile_floor.c).
#
# usage: scripts/profile.sh [--phase forward|backward|optimizer] [--count N] [--set NAME]
#                           [--out DIR] [-- BENCH ARGS...]
#   --phase  the NVTX range to profile (default backward)
#   --count  how many kernels of it (default 200: ncu replays each kernel several times)
#   --set    ncu section set (default basic; "full" for memory and warp-state detail)
#   --out    where the report goes (default build-gpu/profile)
#   BENCH ARGS  a benchmark of build-gpu/ and its arguments
#               (default: bench_lm_step gpt2 --precision bf16 --steps 1 --profile)
# Set BUILD_DIR to profile another build. The card's clocks are left as they are
# (--clock-control none), so kernel times match the benchmark's.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build-gpu}
phase=backward count=200 set=basic out=$build/profile
while [ $# -gt 0 ]; do
  case $1 in
  --phase) phase=$2; shift 2 ;;
  --count) count=$2; shift 2 ;;
  --set) set=$2; shift 2 ;;
  --out) out=$2; shift 2 ;;
  --) shift; break ;;
  *) echo "profile.sh: unknown argument $1 (see the usage in the script)" >&2; exit 2 ;;
  esac
done
case $phase in forward | backward | optimizer) ;; *)
  echo "profile.sh: --phase must be forward, backward or optimizer" >&2; exit 2 ;;
esac
[ $# -gt 0 ] || set -- bench_lm_step gpt2 --precision bf16 --steps 1 --profile
bench=$1
shift
mkdir -p "$out"
[ -x "$build/$bench" ] || { echo "profile.sh: $build/$bench not built (run scripts/gpu-test.sh)" >&2; exit 1; }
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n1 || true)
[ -n "$ncu" ] || { echo "profile.sh: ncu (Nsight Compute) not found" >&2; exit 1; }

report=$out/$bench-$phase
"$ncu" --nvtx --nvtx-include "meganeura: $phase/" --clock-control none --launch-count "$count" \
  --set "$set" -f -o "$report" "$build/$bench" "$@" | tee "$report-run.txt"
"$ncu" -i "$report.ncu-rep" --print-summary per-kernel >"$report-summary.txt"
grep '^FLOOR' "$report-run.txt" || true
echo "report: $report.ncu-rep (summary: $report-summary.txt)"
