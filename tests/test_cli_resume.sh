#!/usr/bin/env bash
# meganeura train's resume and checkpoint housekeeping: a run resumed from its checkpoint alone
# is bitwise identical to the uninterrupted one (final weights, the next checkpoint, the
# metrics CSV without duplicated rows); what a resumed run must refuse (--steps at or below the
# checkpoint's step, another config naming the key, other options, other data); old
# checkpoints with a .step side file; --keep-last; stale temporary files removed at start-up.
# With MN_BACKEND=cuda the same on the GPU (exit 77, skipped, when no CUDA device is usable).
# Usage: test_cli_resume.sh PATH/TO/meganeura
set -uo pipefail
mn=$(cd "$(dirname "${1:?usage: test_cli_resume.sh PATH/TO/meganeura}")" && pwd)/$(basename "$1")
export MN_BACKEND=${MN_BACKEND:-cpu}
configs=$(cd "$(dirname "${BASH_SOURCE[0]}")/../configs" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source "$(dirname "${BASH_SOURCE[0]}")/cli_expect.sh"
cd "$tmp" || exit 1
# The CSV without its wall-clock column.
trajectory() { cut -d, -f1,2,3,5,6 "$1"; }

for _ in $(seq 40); do echo "the quick brown fox jumps over the lazy dog. abc abc abc."; done >text.txt
cp "$configs/tiny-gpt2.json" config.json
if [[ $MN_BACKEND == cuda ]] &&
  ! "$mn" bench --config config.json --batch 1 --seq 4 --steps 1 >/dev/null 2>cuda.err; then
  echo "no CUDA device: $(cat cuda.err)"
  exit 77
fi
T=(--config config.json --data text.txt --batch 4 --seq 16 --lr 1e-2 --warmup 3 --grad-clip 1
  --seed 7 --val-fraction 0.2 --eval-every 4)

# ---- 20 steps straight; then resumed from step 10 with nothing but the checkpoint
"$mn" train "${T[@]}" --steps 20 --checkpoint-every 10 --out run --metrics run/m.csv \
  --plot run/loss.svg 2>straight.log || fail "straight run: $(cat straight.log)"
cp run/model.safetensors straight.safetensors
cp run/checkpoint-000020.safetensors straight-20.safetensors
cp run/m.csv straight.csv
rm run/model.safetensors run/checkpoint-000020.safetensors
"$mn" train --resume run/checkpoint-000010.safetensors 2>resume.log || fail "resume: $(cat resume.log)"
grep -q "steps 11..20" resume.log || fail "resume did not start at step 11: $(cat resume.log)"
cmp -s straight.safetensors run/model.safetensors ||
  fail "the resumed run's final weights differ from the uninterrupted run's"
cmp -s straight-20.safetensors run/checkpoint-000020.safetensors ||
  fail "the resumed run's step-20 checkpoint differs from the uninterrupted run's"
diff <(trajectory straight.csv) <(trajectory run/m.csv) >csv.diff ||
  fail "the resumed metrics differ (or repeat rows): $(head -5 csv.diff)"

# ---- what a resume refuses, writing nothing
cp run/m.csv before.csv
expect 2 "--steps 10 is at or below the checkpoint's step 10: nothing to train" \
  train --resume run/checkpoint-000010.safetensors --steps 10 --out refused --metrics refused.csv
[[ -e refused || -e refused.csv ]] && fail "a refused --steps wrote outputs"
cmp -s before.csv run/m.csv || fail "a refused --steps changed the metrics"
sed 's/"n_head": 4/"n_head": 2/' config.json >heads.json
expect 1 "--config differs from the checkpoint's model at \"num_heads\": 2 in --config, 4 in the checkpoint" \
  train --resume run/checkpoint-000010.safetensors --config heads.json --out refused
expect 2 "--lr 0.02 differs from the checkpoint's 0.00999999978" \
  train --resume run/checkpoint-000010.safetensors --lr 0.02 --out refused
rev <text.txt >other.txt
expect 1 "--data 'other.txt' is not the data the checkpoint was trained on" \
  train --resume run/checkpoint-000010.safetensors --data other.txt --out refused
[[ -e refused/model.safetensors ]] && fail "a refused resume wrote weights"
# Given options that agree are fine, and --steps may grow.
"$mn" train "${T[@]}" --resume run/checkpoint-000020.safetensors --steps 22 --out more \
  --metrics more.csv 2>more.log || fail "resume with the same options: $(cat more.log)"

# ---- an old checkpoint: no train.* metadata, the step in a deprecated side file
if command -v python3 >/dev/null 2>&1; then
  python3 - run/checkpoint-000010.safetensors old.safetensors <<'PY'
import json, struct, sys
raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
head = json.loads(raw[8:8 + n])
head["__metadata__"] = {k: v for k, v in head["__metadata__"].items() if not k.startswith("train.")}
text = json.dumps(head, separators=(",", ":")).encode()
text += b" " * (-len(text) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(text)) + text + raw[8 + n:])
PY
  echo 10 >old.safetensors.step
  "$mn" train "${T[@]}" --steps 12 --resume old.safetensors --out old 2>old.log || fail "old checkpoint: $(cat old.log)"
  grep -q "deprecated" old.log || fail "no deprecation notice for the .step file: $(cat old.log)"
  grep -q "steps 11..12" old.log || fail "the .step file was not read: $(cat old.log)"
  grep -q " f32 precision" old.log || fail "an old checkpoint did not resume at f32: $(cat old.log)"
  # A checkpoint that records everything but the precision (written before --precision): its
  # run was f32, the default then, and its resume stays f32 whatever the device's default.
  python3 - run/checkpoint-000010.safetensors noprec.safetensors <<'PY'
import json, struct, sys
raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
head = json.loads(raw[8:8 + n])
del head["__metadata__"]["train.precision"]
text = json.dumps(head, separators=(",", ":")).encode()
text += b" " * (-len(text) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(text)) + text + raw[8 + n:])
PY
  expect 2 "--precision bf16 differs from the checkpoint's f32" train --resume noprec.safetensors --precision bf16
  "$mn" train --resume noprec.safetensors --steps 12 --out noprec --metrics noprec.csv 2>noprec.log ||
    fail "a checkpoint without precision: $(cat noprec.log)"
  grep -q " f32 precision" noprec.log || fail "a checkpoint without precision did not resume at f32: $(cat noprec.log)"
fi

# ---- --keep-last and stale temporary files
mkdir -p keep
dead=$(sh -c 'echo $$')
touch "keep/model.safetensors.tmp.$dead.0" "keep/checkpoint-000005.safetensors.tmp.$dead.3" \
  "keep/notes.tmp.$dead.0" "keep/model.safetensors.tmp.$$.0" keep/mine.txt
"$mn" train "${T[@]}" --steps 20 --checkpoint-every 5 --keep-last 2 --out keep 2>keep.log ||
  fail "keep-last run: $(cat keep.log)"
kept=(keep/checkpoint-*.safetensors)
[[ ${kept[*]} == "keep/checkpoint-000015.safetensors keep/checkpoint-000020.safetensors" ]] ||
  fail "--keep-last 2 kept: ${kept[*]}"
[[ -e keep/model.safetensors.tmp.$dead.0 || -e keep/checkpoint-000005.safetensors.tmp.$dead.3 ]] &&
  fail "stale temporary files were not removed"
for f in "notes.tmp.$dead.0" "model.safetensors.tmp.$$.0" mine.txt; do
  [[ -e keep/$f ]] || fail "start-up removed keep/$f, which is not a stale file of ours"
done
grep -q "removed the stale temporary file keep/model.safetensors.tmp.$dead.0" keep.log ||
  fail "no notice of the removed file: $(cat keep.log)"

# ---- a run without held-out data and with --freeze resumes from its checkpoint alone, bit for
# bit, still frozen; another --freeze is refused
F=(--config config.json --data text.txt --batch 2 --seq 16 --lr 1e-2 --seed 3 --freeze 'h\.0\.')
"$mn" train "${F[@]}" --steps 4 --checkpoint-every 2 --out frz 2>frz.log || fail "frozen run: $(cat frz.log)"
cp frz/model.safetensors frz-straight.safetensors
"$mn" train --resume frz/checkpoint-000002.safetensors --out frz2 2>frz2.log ||
  fail "resume without held-out data: $(cat frz2.log)"
grep -q "froze 12 of 28 parameters" frz2.log || fail "the resumed run is not frozen: $(cat frz2.log)"
cmp -s frz-straight.safetensors frz2/model.safetensors ||
  fail "the resumed frozen run's weights differ from the uninterrupted run's"
expect 2 "--freeze h\.1\. differs from the checkpoint's h\.0\." train --resume frz/checkpoint-000002.safetensors --freeze 'h\.1\.'

if ((fails)); then
  echo "$fails check(s) failed" >&2
  exit 1
fi
echo "all resume checks passed"
