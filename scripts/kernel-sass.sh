#!/usr/bin/env bash
# Reads a benchmark plan's kernels offline, with no GPU: bench_plan_kernels lowers the plan and
# compiles it with NVRTC, then cuobjdump disassembles each kernel and this prints a table of
# registers, spills (local bytes), SASS instructions, tensor-core products (HMMA / HGMMA),
# special-function ops (MUFU) and barriers beside each kernel's template instance. Static counts
# (a loop body counts once); the SASS of each kernel is kept in OUT/mn_kN.sass for reading.
#
# usage: scripts/kernel-sass.sh MODEL [--precision bf16|f32] [--arch sm_90] [--grep REGEX]
#                               [--build-dir DIR] [--out DIR]
#   MODEL        gpt2, smollm2, attention-gpt2 or attention-smollm2 (bench_plan_kernels)
#   --grep       only kernels whose template matches REGEX (e.g. attn_pipe)
#   --build-dir  a CUDA build holding bench_plan_kernels (default build)
#   --out        where the cubin, the kernel list and the SASS go (default /tmp/kernel-sass)
# cuobjdump comes from PATH, $CUDA_HOME/bin, /usr/local/cuda/bin, or a pip install of
# nvidia-cuda-cuobjdump (pip install --target DIR nvidia-cuda-cuobjdump; set CUOBJDUMP to it).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
model="" prec=bf16 arch=sm_90 pattern="" build=$root/build out=/tmp/kernel-sass
while [ $# -gt 0 ]; do
  case $1 in
  --precision) prec=$2; shift 2 ;;
  --arch) arch=$2; shift 2 ;;
  --grep) pattern=$2; shift 2 ;;
  --build-dir) build=$2; shift 2 ;;
  --out) out=$2; shift 2 ;;
  -*) echo "kernel-sass.sh: unknown argument $1 (see the usage in the script)" >&2; exit 2 ;;
  *) model=$1; shift ;;
  esac
done
[ -n "$model" ] || { echo "kernel-sass.sh: name a model (see the usage in the script)" >&2; exit 2; }
[ -x "$build/bench_plan_kernels" ] || {
  echo "kernel-sass.sh: $build/bench_plan_kernels not built (a build with -DMN_WITH_CUDA=ON)" >&2
  exit 1
}
cuobjdump=${CUOBJDUMP:-}
if [ -z "$cuobjdump" ]; then
  for c in "$(command -v cuobjdump 2>/dev/null || true)" "${CUDA_HOME:+$CUDA_HOME/bin/cuobjdump}" \
    /usr/local/cuda/bin/cuobjdump; do
    if [ -n "$c" ] && [ -x "$c" ]; then cuobjdump=$c; break; fi
  done
fi
[ -n "$cuobjdump" ] || {
  echo "kernel-sass.sh: cuobjdump not found (set CUOBJDUMP; see the usage in the script)" >&2
  exit 1
}

mkdir -p "$out"
"$build/bench_plan_kernels" "$model" --precision "$prec" --arch "$arch" --out "$out"
"$cuobjdump" -res-usage "$out/plan.cubin" >"$out/res-usage.txt" 2>&1

printf '%-7s %4s %6s %6s %6s %5s %5s %6s  %s\n' kernel regs local instrs mma mufu bar mask template
while read -r name block mask call; do
  if [ -n "$pattern" ] && ! [[ $call =~ $pattern ]]; then continue; fi
  "$cuobjdump" -sass -fun "$name" "$out/plan.cubin" >"$out/$name.sass" 2>/dev/null || continue
  usage=$(awk -v f="Function $name:" '$0 ~ f {getline; print; exit}' "$out/res-usage.txt")
  regs=$(sed -nE 's/.*REG:([0-9]+).*/\1/p' <<<"$usage")
  local_bytes=$(sed -nE 's/.*LOCAL:([0-9]+).*/\1/p' <<<"$usage")
  instrs=$(grep -cE '^\s+/\*[0-9a-f]+\*/' "$out/$name.sass" || true)
  mma=$(grep -cE 'HMMA|HGMMA' "$out/$name.sass" || true)
  mufu=$(grep -c 'MUFU' "$out/$name.sass" || true)
  bar=$(grep -c 'BAR.SYNC' "$out/$name.sass" || true)
  printf '%-7s %4s %6s %6s %6s %5s %5s %6s  %s (%s threads)\n' "$name" "${regs:-?}" \
    "${local_bytes:-?}" "$instrs" "$mma" "$mufu" "$bar" "$mask" "$call" "$block"
done <"$out/plan-kernels.txt"
echo "SASS of each kernel: $out/mn_kN.sass"
