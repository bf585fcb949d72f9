#!/usr/bin/env bash
# Data-parallel training on a machine of 2 or more GPUs, in one command: builds (through
# scripts/gpu-test.sh), then checks
#   (a) one rank through NCCL (RANK=0 WORLD_SIZE=1 --launcher env) against the plain run:
#       the same weights, bit for bit, in f32 and in f16 (the loss scaler's overflow flag
#       all-reduced in the step graph);
#   (b) `meganeura train --gpus N` (N = 2, and 4 when there are 4 devices) with --batch B
#       against one process with --batch N*B: final weights within --tol (relative to the
#       model's largest weight, at least 1), rank 0 alone reporting, the collective
#       checkpoint written;
#   (c) the same 2-rank run as two processes started by hand with RANK, WORLD_SIZE,
#       LOCAL_RANK, MASTER_ADDR and MASTER_PORT (the id over TCP at MASTER_PORT + 1), and
#       started by torchrun (--no-python) when torchrun or torch.distributed.run is there;
#   (d) a rank killed mid-run (SIGKILL): --gpus names it and stops the other, within a minute;
#   (e) bench_dp_step (GPT-2 124M bf16 AdamW, per-GPU batch 16 x 1024) at 1, 2 (and 4) GPUs;
# and prints a table last. Every step's output is kept under the log folder. Exits 1 when
# any check fails.
#
# usage: scripts/gpu-dp.sh [--offline DEB_DIR] [--build-dir DIR] [--log-dir DIR] [--no-build]
#                          [--steps K] [--tol T] [--tests REGEX] [--no-bench]
#   --offline DEB_DIR  as gpu-test.sh: unpack cJSON and Criterion from DEB_DIR
#   --no-build         use the meganeura and bench_dp_step already in the build folder
#   --steps K          steps of the tiny runs (default 4)
#   --tol T            largest weight difference of (b) and (c), relative to the largest
#                      weight (at least 1) (default 1e-4)
#   --tests REGEX      also run the ctest tests matching REGEX after the build
#   --no-bench         skip (e)
# NCCL_NVLS_ENABLE=0 is always set (NVLink multicast is not available on every machine), and
# MN_NCCL_LIBRARY, when unset, is pointed at the NCCL of PyTorch's nvidia-nccl wheel.
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build="$root/build-gpu"
logs=""
debs=""
do_build=1
steps=4
tol=1e-4
tests=""
bench=1
while [ $# -gt 0 ]; do
  case "$1" in
    --offline) debs=$(cd "$2" && pwd); shift 2 ;;
    --build-dir) build=$2; shift 2 ;;
    --log-dir) logs=$2; shift 2 ;;
    --no-build) do_build=0; shift ;;
    --steps) steps=$2; shift 2 ;;
    --tol) tol=$2; shift 2 ;;
    --tests) tests=$2; shift 2 ;;
    --no-bench) bench=0; shift ;;
    -h|--help) sed -n 2,29p "$0"; exit 0 ;;
    *) echo "gpu-dp.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
logs=${logs:-$build/logs-dp}
mkdir -p "$logs"
logs=$(cd "$logs" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

step() { printf '\n== %s\n' "$*"; }
rows=()
failed=0
# row CHECK RESULT DETAIL: one line of the final table; a FAIL makes the script exit 1.
row() {
  rows+=("$(printf '%-40s %-5s %s' "$1" "$2" "$3")")
  [ "$2" = FAIL ] && failed=1
  printf '%s: %s %s\n' "$1" "$2" "$3"
}

export NCCL_NVLS_ENABLE=0
if [ -z "${MN_NCCL_LIBRARY:-}" ]; then
  nccl=$(python3 -c 'import nvidia.nccl,os;print(os.path.join(nvidia.nccl.__path__[0],"lib/libnccl.so.2"))' 2>/dev/null || true)
  [ -n "$nccl" ] && [ -f "$nccl" ] && export MN_NCCL_LIBRARY=$nccl
fi
echo "NCCL: ${MN_NCCL_LIBRARY:-libnccl.so.2 on the loader path}, NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE"

source "$root/scripts/lib/deps.sh"
[ -n "$debs" ] && mn_use_debs "$debs"

if [ "$do_build" = 1 ]; then
  step "build (scripts/gpu-test.sh)"
  args=(--build-dir "$build" --log-dir "$logs/build" --no-bench)
  [ -n "$debs" ] && args+=(--offline "$debs")
  if [ -n "$tests" ]; then args+=(--tests "$tests"); else args+=(--no-ctest); fi
  "$root/scripts/gpu-test.sh" "${args[@]}" >"$logs/gpu-test.log" 2>&1
  rc=$?
  tail -n 30 "$logs/gpu-test.log"
  if [ ! -x "$build/meganeura" ]; then
    row "build" FAIL "see $logs/gpu-test.log"
    printf '\n%s\n' "${rows[@]}"
    exit 1
  fi
  [ -n "$tests" ] && row "ctest -R '$tests'" "$([ $rc = 0 ] && echo PASS || echo FAIL)" \
    "$(grep -E 'tests passed|tests failed' "$logs/gpu-test.log" | tail -n 1)"
fi
mn=$build/meganeura

devices=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
step "$devices GPU(s)"
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader 2>/dev/null || true
worlds=(2)
[ "$devices" -ge 4 ] && worlds+=(4)

# The tiny run of tests/test_cli.sh: byte-level text, a 2-layer GPT-2, f32 (no TF32) so that
# the ranks' sums differ from one process's only in their order.
text=$work/text.txt
for _ in $(seq 200); do echo "the quick brown fox jumps over the lazy dog. abc abc abc."; done >"$text"
T=(--config "$root/configs/tiny-gpt2.json" --data "$text" --seq 16 --steps "$steps" --lr 1e-2
  --precision f32)
unset RANK WORLD_SIZE LOCAL_RANK MASTER_ADDR MASTER_PORT MN_GROUP_PORT

# compare REF OUT TOL: the largest difference between two weight files; exit 1 when above TOL
# times the largest weight (at least 1), or for TOL 0 when not bit for bit.
cat >"$work/compare.py" <<'PY'
import json, struct, sys, array
def tensors(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    out = {}
    for k, v in head.items():
        if k == "__metadata__":
            continue
        if v["dtype"] != "F32":
            sys.exit(f"{path}: {k} is {v['dtype']}, the comparator reads F32")
        out[k] = array.array("f", raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
    return out
ref, got, tol = tensors(sys.argv[1]), tensors(sys.argv[2]), float(sys.argv[3])
if ref.keys() != got.keys():
    sys.exit(f"different tensors: {sorted(ref.keys() ^ got.keys())[:5]}")
# AdamW magnifies the rounding noise of gradients that are 0 in exact arithmetic (the keys'
# bias, near 0 itself), so the bound is on the difference relative to the model's largest
# weight (at least 1), as tests/test_cli.sh's absolute 1e-4; the worst tensor-relative
# difference is printed for information.
worst_abs = worst_rel = big = 0.0
worst_name = ""
for k in ref:
    scale = max((abs(x) for x in ref[k]), default=0.0)
    big = max(big, scale)
    d = max((abs(x - y) for x, y in zip(ref[k], got[k])), default=0.0)
    worst_abs = max(worst_abs, d)
    if d / (scale or 1.0) > worst_rel:
        worst_rel, worst_name = d / (scale or 1.0), k
ok = worst_abs == 0 if tol == 0 else worst_abs <= tol * max(big, 1.0)
print(f"max abs {worst_abs:.3g} (largest weight {big:.3g}); per tensor {worst_rel:.3g}"
      f"{' in ' + worst_name if worst_name else ''}")
sys.exit(0 if ok else 1)
PY

# train NAME ARGS...: a run whose output goes to $logs/NAME.log and weights to $work/NAME.
train() {
  local name=$1
  shift
  timeout 900 "$mn" train "${T[@]}" --out "$work/$name" "$@" >"$logs/$name.log" 2>&1
}

# check NAME REF OUT TOL EXTRA: compares two runs' final weights into a table row.
check() {
  local name=$1 ref=$2 out=$3 t=$4 detail
  if [ ! -f "$work/$ref/model.safetensors" ] || [ ! -f "$work/$out/model.safetensors" ]; then
    row "$name" FAIL "no weights: see $logs/$ref.log, $logs/$out.log"
    return
  fi
  detail=$(python3 "$work/compare.py" "$work/$ref/model.safetensors" "$work/$out/model.safetensors" "$t" 2>&1)
  if [ $? = 0 ]; then row "$name" PASS "$detail"; else row "$name" FAIL "$detail"; fi
}

step "(a) one rank through NCCL against the plain run"
train plain2 --batch 2 || row "plain run --batch 2" FAIL "see $logs/plain2.log"
RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 train nccl1 --batch 2 --launcher env --group-id-file "$work/id1" ||
  row "one rank through NCCL" FAIL "$(tail -n 3 "$logs/nccl1.log" | tr '\n' ' ')"
[ -f "$work/nccl1/model.safetensors" ] && check "one rank through NCCL = plain" plain2 nccl1 0
train plain2f16 --batch 2 --precision f16 || row "plain run --precision f16" FAIL "see $logs/plain2f16.log"
RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 train nccl1f16 --batch 2 --precision f16 --launcher env \
  --group-id-file "$work/id1f16" ||
  row "f16: one rank through NCCL" FAIL "$(tail -n 3 "$logs/nccl1f16.log" | tr '\n' ' ')"
[ -f "$work/nccl1f16/model.safetensors" ] && check "f16: one rank through NCCL = plain" plain2f16 nccl1f16 0

for n in "${worlds[@]}"; do
  step "(b) --gpus $n --batch 2 against --batch $((2 * n))"
  ref=plain$((2 * n))
  [ -f "$work/$ref/model.safetensors" ] || train "$ref" --batch $((2 * n)) ||
    row "plain run --batch $((2 * n))" FAIL "see $logs/$ref.log"
  if train "gpus$n" --batch 2 --gpus "$n" --checkpoint-every "$steps"; then
    check "--gpus $n = one process" "$ref" "gpus$n" "$tol"
    saved=$(grep -c "weights saved" "$logs/gpus$n.log")
    ck=$(printf '%s/gpus%s/checkpoint-%06d.safetensors' "$work" "$n" "$steps")
    if [ "$saved" = 1 ] && grep -q "$n data-parallel ranks of batch 2" "$logs/gpus$n.log" && [ -f "$ck" ]; then
      row "--gpus $n reporting, checkpoint" PASS "rank 0 alone saved; $(basename "$ck")"
    else
      row "--gpus $n reporting, checkpoint" FAIL "weights saved $saved times; checkpoint $([ -f "$ck" ] && echo written || echo missing)"
    fi
  else
    row "--gpus $n = one process" FAIL "$(grep -v '^step' "$logs/gpus$n.log" | tail -n 4 | tr '\n' ' ')"
  fi
done

step "(c) two ranks started by hand, as srun would, the id over TCP"
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])')
pids=()
for r in 0 1; do
  RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    timeout 900 "$mn" train "${T[@]}" --batch 2 --out "$work/tcp2" >"$logs/tcp2-rank$r.log" 2>&1 &
  pids+=($!)
done
wait "${pids[0]}"
rc0=$?
wait "${pids[1]}"
rc1=$?
if [ "$rc0" = 0 ] && [ "$rc1" = 0 ]; then
  check "2 launched ranks (TCP id) = one process" plain4 tcp2 "$tol"
else
  row "2 launched ranks (TCP id) = one process" FAIL "exits $rc0, $rc1: $(grep -h 'meganeura' "$logs"/tcp2-rank*.log | grep -v '^step' | tail -n 3 | tr '\n' ' ')"
fi

step "(c) torchrun --nproc_per_node 2"
launcher=()
if command -v torchrun >/dev/null 2>&1; then
  launcher=(torchrun)
elif python3 -c 'import torch.distributed.run' 2>/dev/null; then
  launcher=(python3 -m torch.distributed.run)
fi
if [ ${#launcher[@]} = 0 ]; then
  row "torchrun 2 ranks" SKIP "no torchrun"
else
  timeout 900 "${launcher[@]}" --standalone --nnodes 1 --nproc_per_node 2 --no-python \
    "$mn" train "${T[@]}" --batch 2 --out "$work/torchrun2" >"$logs/torchrun2.log" 2>&1
  if [ $? = 0 ]; then
    check "torchrun 2 ranks = one process" plain4 torchrun2 "$tol"
  else
    row "torchrun 2 ranks = one process" FAIL "$(grep -i 'meganeura\|error' "$logs/torchrun2.log" | tail -n 4 | tr '\n' ' ')"
  fi
fi

# children_of PID: its child processes (from /proc, without procps).
children_of() {
  local want=$1 stat fields
  for stat in /proc/[0-9]*/stat; do
    # After "pid (comm)" come the state and the parent's pid.
    fields=$(cut -d')' -f2- "$stat" 2>/dev/null) || continue
    read -r _ ppid _ <<<"$fields"
    [ "$ppid" = "$want" ] && basename "$(dirname "$stat")"
  done
}

step "(d) a rank killed mid-run stops the job"
long=(--config "$root/configs/tiny-gpt2.json" --data "$text" --seq 16 --steps 100000 --lr 1e-3
  --precision f32 --batch 2 --gpus 2 --out "$work/killed")
"$mn" train "${long[@]}" >"$logs/killed.log" 2>&1 &
parent=$!
victim=""
for _ in $(seq 600); do
  sleep 0.5
  kill -0 "$parent" 2>/dev/null || break
  grep -q '^step' "$logs/killed.log" 2>/dev/null || continue
  for c in $(children_of "$parent"); do
    tr '\0' '\n' <"/proc/$c/environ" 2>/dev/null | grep -qx 'RANK=1' && victim=$c
  done
  break
done
if [ -z "$victim" ]; then
  kill "$parent" 2>/dev/null
  wait "$parent" 2>/dev/null
  row "killed rank stops --gpus 2" FAIL "the run did not start: $(tail -n 3 "$logs/killed.log" | tr '\n' ' ')"
else
  t0=$(date +%s)
  kill -9 "$victim"
  ( sleep 120; kill -9 "$parent" 2>/dev/null ) &
  guard=$!
  wait "$parent"
  rc=$?
  kill "$guard" 2>/dev/null
  took=$(($(date +%s) - t0))
  if [ "$rc" != 0 ] && [ "$took" -lt 100 ] && grep -q "rank 1 (pid $victim) was killed by signal 9" "$logs/killed.log"; then
    row "killed rank stops --gpus 2" PASS "exit $rc after ${took} s, rank 1 named"
  else
    row "killed rank stops --gpus 2" FAIL "exit $rc after ${took} s: $(grep -v '^step' "$logs/killed.log" | tail -n 2 | tr '\n' ' ')"
  fi
fi

if [ "$bench" = 1 ]; then
  step "(e) bench_dp_step"
  list=1,2
  [ "$devices" -ge 4 ] && list=1,2,4
  timeout 1200 "$build/bench_dp_step" gpt2 --gpus "$list" 2>&1 | tee "$logs/bench_dp_step.log"
  for n in ${list//,/ }; do
    line=$(grep "^BENCH dp_gpt2_bf16 ranks=$n " "$logs/bench_dp_step.log")
    if [ -n "$line" ]; then
      row "bench_dp_step $n GPU(s)" PASS "$(echo "$line" | grep -oE '(step_ms|tokens_per_s|scaling|exposed_comm_ms|allreduce_alone_ms|serial_step_ms|hidden_ms)=[^ ]+' | tr '\n' ' ')"
    else
      row "bench_dp_step $n GPU(s)" FAIL "see $logs/bench_dp_step.log"
    fi
  done
fi

step "summary (logs: $logs)"
printf '%-40s %-5s %s\n' check result detail
printf '%s\n' "${rows[@]}" | tee "$logs/summary.txt"
exit "$failed"
