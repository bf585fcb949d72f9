#!/usr/bin/env bash
# Profiles a benchmark's kernels with Nsight Compute. Kernels run inside the captured
# step graph, so graph nodes are profiled one by one; the session build and each step
# carry NVTX ranges ("meganeura: ...") to find one's way in the report.
#
# usage: scripts/profile.sh [BENCH] [OUT_DIR] [extra ncu arguments...]
#   BENCH    a benchmark of build-gpu/ (default bench_mlp_step)
#   OUT_DIR  where the report goes (default build-gpu/profile)
# Set BUILD_DIR to profile another build. The card's clocks are left as they are.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build-gpu}
bench=${1:-bench_mlp_step}
out=${2:-$build/profile}
shift $(($# < 2 ? $# : 2))
mkdir -p "$out"
[ -x "$build/$bench" ] || { echo "profile.sh: $build/$bench not built (run scripts/gpu-test.sh)" >&2; exit 1; }
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n1 || true)
[ -n "$ncu" ] || { echo "profile.sh: ncu (Nsight Compute) not found" >&2; exit 1; }

# Skip the warm-up and build launches, then profile one step's worth of kernels.
"$ncu" --graph-profiling node --clock-control none --nvtx --launch-skip 400 --launch-count 60 \
  --set basic -f -o "$out/$bench" "$@" "$build/$bench"
"$ncu" -i "$out/$bench.ncu-rep" --print-summary per-kernel | tee "$out/$bench-summary.txt"
echo "report: $out/$bench.ncu-rep"
