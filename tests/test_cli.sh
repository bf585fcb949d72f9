#!/usr/bin/env bash
# The meganeura command end to end: usage errors (exit 2), missing and bad files (exit 1),
# a short byte-level training run (loss falls, metrics CSV, SVG curve, checkpoints),
# resume, generate and bench. Usage: test_cli.sh PATH/TO/meganeura
set -uo pipefail
mn=${1:?usage: test_cli.sh PATH/TO/meganeura}
export MN_BACKEND=${MN_BACKEND:-cpu}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() {
  echo "FAIL: $*" >&2
  fails=$((fails + 1))
}

# expect CODE MESSAGE-FRAGMENT ARGS...: exit code and a stderr line containing the fragment.
expect() {
  local code=$1 msg=$2
  shift 2
  "$mn" "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  [[ $rc == "$code" ]] || fail "meganeura $* exited $rc, not $code: $(cat "$tmp/err")"
  grep -qF -- "$msg" "$tmp/err" || fail "meganeura $*: stderr lacks '$msg': $(cat "$tmp/err")"
}

cfg=$tmp/config.json
cat >"$cfg" <<'JSON'
{"model_type": "gpt2", "vocab_size": 256, "n_embd": 32, "n_layer": 1, "n_head": 2, "n_positions": 32}
JSON
text=$tmp/text.txt
for _ in $(seq 40); do echo "the quick brown fox jumps over the lazy dog. abc abc abc."; done >"$text"
T=(--config "$cfg" --data "$text" --seq 16 --steps 20 --lr 1e-2)

# ---- help and usage errors
"$mn" --help | grep -q "usage: meganeura" || fail "meganeura --help"
"$mn" train --help | grep -q -- "--checkpoint-every" || fail "meganeura train --help"
"$mn" generate --help | grep -q -- "--top-k" || fail "meganeura generate --help"
expect 2 "usage: meganeura"
expect 2 "meganeura: unknown command 'frobnicate'" frobnicate
expect 2 "meganeura train: --batch must be a positive integer, got 'x'" train "${T[@]}" --batch x
expect 2 "meganeura train: --batch must be a positive integer, got '0'" train "${T[@]}" --batch 0
expect 2 "meganeura train: --lr must be a positive number, got 'fast'" train "${T[@]}" --batch 2 --lr fast
expect 2 "meganeura train: --steps needs a value" train --config "$cfg" --steps
expect 2 "meganeura train: unknown option '--bogus'" train "${T[@]}" --batch 2 --bogus 1
expect 2 "meganeura train: --data is required" train --config "$cfg" --batch 2 --seq 4 --steps 1 --lr 1e-3
expect 2 "meganeura train: --data-format must be text, u16 or u32, got 'u8'" train "${T[@]}" --batch 2 --data-format u8
expect 2 "meganeura generate: give exactly one of --checkpoint and --weights" generate --config "$cfg" --prompt hi
expect 2 "meganeura generate: --temperature must be a non-negative number, got '-1'" generate --config "$cfg" --prompt hi --weights x --temperature -1
expect 2 "meganeura bench: --seq must be a positive integer, got '1.5'" bench --config "$cfg" --batch 1 --seq 1.5

# ---- missing and bad files
expect 1 "meganeura train: cannot load config '$tmp/none.json'" train "${T[@]/$cfg/$tmp/none.json}" --batch 2
expect 1 "meganeura train: cannot read '$tmp/none.txt'" train "${T[@]/$text/$tmp/none.txt}" --batch 2
echo '{"model_type": "gpt2"' >"$tmp/bad.json"
expect 1 "meganeura train: cannot load config '$tmp/bad.json'" train "${T[@]/$cfg/$tmp/bad.json}" --batch 2
printf 'abc' >"$tmp/odd.bin"
expect 1 "is not a u16 token file" train "${T[@]/$text/$tmp/odd.bin}" --batch 2 --data-format u16
printf 'tiny' >"$tmp/tiny.txt"
expect 1 "fewer than --seq + 1" train "${T[@]/$text/$tmp/tiny.txt}" --batch 2
expect 1 "meganeura train: cannot load --resume checkpoint" train "${T[@]}" --batch 2 --out "$tmp/o0" --resume "$tmp/none.ckpt"
expect 1 "meganeura generate: cannot read --weights" generate --config "$cfg" --prompt hi --weights "$tmp/text.txt"
expect 1 "meganeura bench: cannot load config" bench --config "$tmp/none.json" --batch 1 --seq 4

# ---- a 20-step run: the loss falls, 20 CSV rows, an SVG, checkpoints, final weights
out=$tmp/run
if ! "$mn" train "${T[@]}" --batch 4 --warmup 2 --grad-clip 1 --checkpoint-every 10 --out "$out" \
  --metrics "$tmp/m.csv" --plot "$tmp/loss.svg" 2>"$tmp/train.log"; then
  fail "train: $(cat "$tmp/train.log")"
fi
[[ $(head -1 "$tmp/m.csv") == step,loss,lr,tokens_per_s ]] || fail "CSV header"
[[ $(($(wc -l <"$tmp/m.csv") - 1)) == 20 ]] || fail "CSV has $(($(wc -l <"$tmp/m.csv") - 1)) rows, not 20"
awk -F, 'NR == 2 {a = $2} END {if (!($2 < a - 0.5)) exit 1}' "$tmp/m.csv" ||
  fail "the loss did not fall: $(sed -n '2p;$p' "$tmp/m.csv" | tr '\n' ' ')"
if ! grep -q '^<svg ' "$tmp/loss.svg" || ! grep -q '<polyline' "$tmp/loss.svg" ||
  [[ $(tail -1 "$tmp/loss.svg") != "</svg>" ]]; then
  fail "loss.svg is not an SVG"
fi
if command -v python3 >/dev/null 2>&1; then
  python3 -c 'import sys, xml.dom.minidom as m; m.parse(sys.argv[1])' "$tmp/loss.svg" ||
    fail "loss.svg is not well-formed XML"
fi
for f in checkpoint-000010.safetensors checkpoint-000020.safetensors model.safetensors; do
  [[ -s $out/$f ]] || fail "missing $out/$f"
done

# ---- resume from step 10 continues the count: steps 11..20 only
"$mn" train "${T[@]}" --batch 4 --out "$tmp/run2" --metrics "$tmp/m2.csv" \
  --resume "$out/checkpoint-000010.safetensors" 2>"$tmp/resume.log" || fail "resume: $(cat "$tmp/resume.log")"
[[ $(sed -n 2p "$tmp/m2.csv" | cut -d, -f1) == 11 && $(tail -1 "$tmp/m2.csv" | cut -d, -f1) == 20 ]] ||
  fail "resume did not continue at step 11: $(cut -d, -f1 "$tmp/m2.csv" | tr '\n' ' ')"
grep -q "steps 11..20" "$tmp/resume.log" || fail "resume log: $(cat "$tmp/resume.log")"

# ---- generate: the prompt and exactly --tokens bytes
"$mn" generate --weights "$out/model.safetensors" --config "$cfg" --prompt "the " --tokens 25 \
  --seed 2 >"$tmp/gen.txt" 2>"$tmp/gen.err" || fail "generate: $(cat "$tmp/gen.err")"
[[ $(wc -c <"$tmp/gen.txt") == 29 ]] || fail "generate printed $(wc -c <"$tmp/gen.txt") bytes, not 4 + 25"
"$mn" generate --checkpoint "$out/checkpoint-000020.safetensors" --config "$cfg" --prompt "the " \
  --tokens 10 --greedy --seq 16 >"$tmp/gen2.txt" 2>"$tmp/gen2.err" || fail "generate --checkpoint: $(cat "$tmp/gen2.err")"
[[ $(wc -c <"$tmp/gen2.txt") == 14 ]] || fail "generate --checkpoint --greedy printed $(wc -c <"$tmp/gen2.txt") bytes"

# ---- bench prints a step time and a token rate
"$mn" bench --config "$cfg" --batch 2 --seq 16 --steps 3 >"$tmp/bench.txt" 2>&1 || fail "bench: $(cat "$tmp/bench.txt")"
grep -Eq 'median [0-9.]+ ms/step, [0-9]+ tokens/s' "$tmp/bench.txt" || fail "bench output: $(cat "$tmp/bench.txt")"

# ---- bad input: --data that is a folder; NaN weights refused at load naming the tensor
# (--allow-nonfinite loads them), and non-finite logits then stop generate with an error
# instead of printing NUL bytes
expect 1 "meganeura train: cannot read '$tmp': it is a folder, not a file" train "${T[@]/$text/$tmp}" --batch 2
nan=$tmp/nan.safetensors
cp "$out/model.safetensors" "$nan"
header_len=$(od -An -tu8 -N8 "$nan" | tr -d ' ')
printf '\x00\x00\xc0\x7f' | dd of="$nan" bs=1 seek=$((8 + header_len)) conv=notrunc status=none
expect 1 "holds a non-finite value" generate --weights "$nan" --config "$cfg" --prompt "the " --tokens 5
grep -qF "tensor \"" "$tmp/err" || fail "the NaN refusal does not name the tensor: $(cat "$tmp/err")"
expect 1 "meganeura generate: the logits of token 1 are not finite" \
  generate --weights "$nan" --config "$cfg" --prompt "the " --tokens 5 --allow-nonfinite
[[ $(tr -d '\000' <"$tmp/out" | wc -c) == $(wc -c <"$tmp/out") ]] || fail "generate printed NUL bytes"

if ((fails)); then
  echo "$fails check(s) failed" >&2
  exit 1
fi
echo "all meganeura command checks passed"
