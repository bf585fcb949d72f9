#!/usr/bin/env bash
# The meganeura command end to end: usage errors (exit 2), missing and bad files (exit 1),
# outputs checked before the first step, a short byte-level training run (loss falls, metrics
# CSV, SVG curves, checkpoints), held-out evaluation, the example configs, the README's
# fine-tuning walk-through, generate and bench. Resume: test_cli_resume.sh.
# Usage: test_cli.sh PATH/TO/meganeura
set -uo pipefail
mn=${1:?usage: test_cli.sh PATH/TO/meganeura}
export MN_BACKEND=${MN_BACKEND:-cpu}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source "$(dirname "${BASH_SOURCE[0]}")/cli_expect.sh"

configs=$(cd "$(dirname "${BASH_SOURCE[0]}")/../configs" && pwd)
cfg=$configs/tiny-gpt2.json
text=$tmp/text.txt
for _ in $(seq 40); do echo "the quick brown fox jumps over the lazy dog. abc abc abc."; done >"$text"
T=(--config "$cfg" --data "$text" --seq 16 --steps 20 --lr 1e-2)
# The tensors of a safetensors file as raw bytes by name, for the checks written in Python.
cat >"$tmp/st_tensors.py" <<'PY'
import json, struct
def tensors(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    return {k: raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]
            for k, v in head.items() if k != "__metadata__"}
PY
export PYTHONPATH="$tmp${PYTHONPATH:+:$PYTHONPATH}"

# ---- help and usage errors
"$mn" --help | grep -q "usage: meganeura" || fail "meganeura --help"
"$mn" train --help | grep -q -- "--checkpoint-every" || fail "meganeura train --help"
"$mn" train --help | grep -q "default is bf16 on a" || fail "meganeura train --help: no default precision"
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
expect 1 "meganeura generate: cannot load --weights" generate --config "$cfg" --prompt hi --weights "$tmp/text.txt"
expect 1 "meganeura bench: cannot load config" bench --config "$tmp/none.json" --batch 1 --seq 4

# ---- a 20-step run: the loss falls, 20 CSV rows, an SVG, checkpoints, final weights
out=$tmp/run
if ! "$mn" train "${T[@]}" --batch 4 --warmup 2 --grad-clip 1 --checkpoint-every 10 --out "$out" \
  --metrics "$tmp/m.csv" --plot "$tmp/loss.svg" 2>"$tmp/train.log"; then
  fail "train: $(cat "$tmp/train.log")"
fi
[[ $(head -1 "$tmp/m.csv") == step,loss,lr,tokens_per_s,val_loss,val_ppl,precision ]] || fail "CSV header"
# No --precision: f32 on the CPU (bf16 is the default on CUDA devices of compute capability 8.0+).
awk -F, 'NR > 1 && $7 != "f32" {exit 1}' "$tmp/m.csv" || fail "the CSV does not record precision f32"
grep -q "cpu backend, f32 precision" "$tmp/train.log" || fail "train's start line: $(head -1 "$tmp/train.log")"
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

# ---- outputs are checked before the first step; a failing plot is only a warning
touch "$tmp/afile"
for bad in "--plot $tmp/afile/loss.svg" "--metrics $tmp/afile/m.csv" "--out $tmp/afile/out"; do
  # shellcheck disable=SC2086
  expect 1 "cannot create" train "${T[@]}" --batch 2 --out "$tmp/early" $bad
  grep -q "step 1/" "$tmp/err" && fail "$bad: trained before refusing: $(cat "$tmp/err")"
  [[ -e $tmp/early/model.safetensors ]] && fail "$bad: wrote weights before refusing"
done
expect 1 "cannot write --plot '$tmp'" train "${T[@]}" --batch 2 --out "$tmp/early" --plot "$tmp"
if [[ -w /dev/full ]]; then
  "$mn" train "${T[@]}" --batch 2 --steps 2 --out "$tmp/full" --plot /dev/full 2>"$tmp/full.log" ||
    fail "an unwritable plot lost the run: $(cat "$tmp/full.log")"
  grep -q "warning: cannot write --plot '/dev/full'" "$tmp/full.log" || fail "no plot warning: $(cat "$tmp/full.log")"
  [[ -s $tmp/full/model.safetensors ]] || fail "an unwritable plot lost the final weights"
fi
"$mn" train "${T[@]}" --batch 2 --steps 2 --out "$tmp/mk" --plot "$tmp/new/dir/loss.svg" \
  --metrics "$tmp/new/m.csv" 2>"$tmp/mk.log" || fail "output folders not created: $(cat "$tmp/mk.log")"
[[ -s $tmp/new/dir/loss.svg && -s $tmp/new/m.csv ]] || fail "plot or metrics missing in new folders"

# ---- --freeze: the matching parameters keep their initial values (the same seed initializes
# a 2-step and a 4-step run alike: frozen tensors agree byte for byte, trained ones moved on);
# a bad or unmatched pattern is a usage error
expect 2 "meganeura train: --freeze '[' is not a POSIX extended regular expression" train "${T[@]}" --batch 2 --freeze '['
expect 2 "meganeura train: --freeze 'nomatch' matches no parameter" train "${T[@]}" --batch 2 --freeze nomatch
for n in 2 4; do
  "$mn" train "${T[@]}" --batch 2 --steps $n --freeze 'h\.0\.' --out "$tmp/frz$n" 2>"$tmp/frz.log" ||
    fail "train --freeze: $(cat "$tmp/frz.log")"
done
grep -q "froze 12 of 28 parameters" "$tmp/frz.log" || fail "--freeze: $(head -1 "$tmp/frz.log")"
if command -v python3 >/dev/null 2>&1; then
  python3 - "$tmp/frz2/model.safetensors" "$tmp/frz4/model.safetensors" <<'PY' || fail "--freeze: frozen tensors moved or trained ones did not"
import json, sys
from st_tensors import tensors
a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
frozen = [k for k in a if ".h.0." in k]
assert len(frozen) == 12, frozen
assert all(a[k] == b[k] for k in frozen), [k for k in frozen if a[k] != b[k]]
assert all(a[k] != b[k] for k in a if ".h.1." in k and k.endswith("weight")), "h.1 did not train"
PY
fi

# ---- LoRA: adapters on c_attn and c_fc of the run above, saved as PEFT saves them, merged
# into a plain model that generates what the base with the adapter generates
expect 2 "meganeura train: --lora-alpha needs --lora-rank" train "${T[@]}" --batch 2 --lora-alpha 8
expect 2 "meganeura train: --freeze and --lora-rank cannot be used together" train "${T[@]}" --batch 2 --lora-rank 4 --freeze 'h\.0\.'
expect 1 "LoRA target \"q_proj\" matches no linear layer of GPT-2" train "${T[@]}" --batch 2 --lora-rank 4 --lora-targets q_proj --out "$tmp/lbad"
lora=$tmp/lora
# Other text than the base's, so that the adapter visibly changes what is generated.
for _ in $(seq 40); do echo "zebras zigzag: 123 456 789 zebras zigzag."; done >"$tmp/text2.txt"
"$mn" train "${T[@]/$text/$tmp/text2.txt}" --batch 4 --steps 30 --lr 1e-1 --init-from "$out/model.safetensors" --lora-rank 4 \
  --lora-targets c_attn,c_fc --merge-lora --out "$lora" 2>"$tmp/lora.log" || fail "train --lora-rank: $(cat "$tmp/lora.log")"
for f in adapter_config.json adapter_model.safetensors merged/model.safetensors merged/config.json; do
  [[ -s $lora/$f ]] || fail "train --lora-rank: no $f"
done
if command -v python3 >/dev/null 2>&1; then
  python3 - "$lora" "$out/model.safetensors" <<'PY' || fail "--lora-rank: the adapter is not in PEFT's layout"
import json, sys
from st_tensors import tensors
cfg = json.load(open(sys.argv[1] + "/adapter_config.json"))
assert cfg["peft_type"] == "LORA" and cfg["task_type"] == "CAUSAL_LM", cfg
assert cfg["r"] == 4 and cfg["lora_alpha"] == 8 and cfg["target_modules"] == ["c_attn", "c_fc"], cfg
assert cfg["fan_in_fan_out"] is True and cfg["bias"] == "none", cfg
ad = tensors(sys.argv[1] + "/adapter_model.safetensors")
assert len(ad) == 8, sorted(ad)
assert "base_model.model.transformer.h.1.mlp.c_fc.lora_B.weight" in ad, sorted(ad)
base, merged = tensors(sys.argv[2]), tensors(sys.argv[1] + "/merged/model.safetensors")
assert sorted(base) == sorted(merged), "the merged file holds the base's tensors"
assert merged["transformer.h.0.attn.c_attn.weight"] != base["transformer.h.0.attn.c_attn.weight"]
assert merged["transformer.h.0.ln_1.weight"] == base["transformer.h.0.ln_1.weight"]
PY
fi
G=(generate --config "$cfg" --prompt "the quick" --tokens 24 --greedy)
"$mn" "${G[@]}" --weights "$out/model.safetensors" --adapter "$lora" >"$tmp/gen_adapter.txt" 2>"$tmp/gen.log" ||
  fail "generate --adapter: $(cat "$tmp/gen.log")"
"$mn" "${G[@]}" --weights "$lora/merged/model.safetensors" >"$tmp/gen_merged.txt" 2>"$tmp/gen.log" ||
  fail "generate merged: $(cat "$tmp/gen.log")"
cmp -s "$tmp/gen_adapter.txt" "$tmp/gen_merged.txt" ||
  fail "generate --adapter and the merged weights differ: '$(cat "$tmp/gen_adapter.txt")' vs '$(cat "$tmp/gen_merged.txt")'"
"$mn" "${G[@]}" --weights "$out/model.safetensors" >"$tmp/gen_base.txt" 2>/dev/null
cmp -s "$tmp/gen_adapter.txt" "$tmp/gen_base.txt" && fail "generate --adapter gives the base model's text: '$(cat "$tmp/gen_base.txt")' ($(tail -1 "$tmp/lora.log"))"

# ---- --precision: bf16 mixed precision trains (CPU backend), the CSV records it, a resume
# keeps it, and an unknown name is a usage error
expect 2 "meganeura train: --precision must be f32, tf32, bf16 or f16, got 'fp8'" train "${T[@]}" --batch 2 --precision fp8
if ! "$mn" train "${T[@]}" --batch 4 --warmup 2 --checkpoint-every 10 --out "$tmp/bf16" \
  --metrics "$tmp/bf16.csv" --precision bf16 2>"$tmp/bf16.log"; then
  fail "train --precision bf16: $(cat "$tmp/bf16.log")"
fi
awk -F, 'NR > 1 && $7 != "bf16" {exit 1}' "$tmp/bf16.csv" || fail "the CSV does not record bf16"
awk -F, 'NR == 2 {a = $2} END {if (!($2 < a - 0.5)) exit 1}' "$tmp/bf16.csv" ||
  fail "bf16: the loss did not fall: $(sed -n '2p;$p' "$tmp/bf16.csv" | tr '\n' ' ')"
expect 2 "--precision f32 differs from the checkpoint's bf16" train --resume "$tmp/bf16/checkpoint-000010.safetensors" --precision f32

# ---- --grad-accum: K batches per update; a resume keeps K; bad values are usage errors
expect 2 "meganeura train: --grad-accum must be a positive integer, got '0'" train "${T[@]}" --batch 2 --grad-accum 0
if ! "$mn" train "${T[@]}" --batch 2 --grad-accum 2 --checkpoint-every 10 --out "$tmp/accum" \
  --metrics "$tmp/accum.csv" 2>"$tmp/accum.log"; then
  fail "train --grad-accum 2: $(cat "$tmp/accum.log")"
fi
[[ $(($(wc -l <"$tmp/accum.csv") - 1)) == 20 ]] || fail "--grad-accum 2: $(($(wc -l <"$tmp/accum.csv") - 1)) CSV rows, not 20"
awk -F, 'NR == 2 {a = $2} END {if (!($2 < a - 0.5)) exit 1}' "$tmp/accum.csv" ||
  fail "--grad-accum: the loss did not fall: $(sed -n '2p;$p' "$tmp/accum.csv" | tr '\n' ' ')"
expect 2 "--grad-accum 3 differs from the checkpoint's 2" train --resume "$tmp/accum/checkpoint-000010.safetensors" --grad-accum 3

# ---- held-out evaluation: fixed windows, val_loss and perplexity, both curves, a final eval
expect 2 "--eval-every needs --val-data or --val-fraction" train "${T[@]}" --batch 2 --eval-every 5
expect 2 "--val-fraction must be below 1" train "${T[@]}" --batch 2 --val-fraction 1.5
expect 2 "give --val-data or --val-fraction, not both" train "${T[@]}" --batch 2 --val-fraction 0.1 --val-data "$text"
expect 1 "the validation data holds 4 tokens, fewer than --seq + 1 = 17" train "${T[@]}" --batch 2 --val-data "$tmp/tiny.txt"
"$mn" train "${T[@]}" --batch 4 --steps 12 --val-fraction 0.2 --eval-every 5 --eval-batches 3 \
  --out "$tmp/ev" --metrics "$tmp/ev.csv" --plot "$tmp/ev.svg" 2>"$tmp/ev.log" || fail "eval run: $(cat "$tmp/ev.log")"
[[ $(awk -F, 'NR > 1 && $5 != "" {printf "%s ", $1}' "$tmp/ev.csv") == "5 10 12 " ]] ||
  fail "eval steps: $(awk -F, 'NR > 1 && $5 != "" {printf "%s ", $1}' "$tmp/ev.csv")"
awk -F, 'NR > 1 && $5 != "" {d = exp($5) / $6 - 1; if (d > 1e-4 || d < -1e-4) exit 1}' "$tmp/ev.csv" ||
  fail "val_ppl is not exp(val_loss)"
grep -q "step 10/12  loss [0-9.]*  val [0-9.]*  ppl [0-9.]*" "$tmp/ev.log" || fail "no val on the progress line: $(cat "$tmp/ev.log")"
if [[ $(grep -c '<polyline' "$tmp/ev.svg") != 2 ]] || ! grep -q "held-out loss" "$tmp/ev.svg"; then
  fail "the SVG lacks the held-out curve"
fi
# An lr far too small to move the weights: every eval sees the same windows, so the same loss.
"$mn" train "${T[@]}" --batch 2 --steps 4 --lr 1e-12 --val-data "$text" --eval-every 1 \
  --out "$tmp/same" --metrics "$tmp/same.csv" 2>"$tmp/same.log" || fail "fixed-window run: $(cat "$tmp/same.log")"
[[ $(awk -F, 'NR > 1 {print $5}' "$tmp/same.csv" | sort -u | wc -l) == 1 ]] ||
  fail "evals of the same weights differ: $(awk -F, 'NR > 1 {print $5}' "$tmp/same.csv" | tr '\n' ' ')"

# ---- the example configs load (the data read fails after the config is read)
for c in "$configs"/*.json; do
  expect 1 "cannot read '$tmp/none.txt'" train --config "$c" --data "$tmp/none.txt" --batch 1 --seq 4 \
    --steps 1 --lr 1e-3 --out "$tmp/cfgs"
done

# ---- the README's fine-tuning walk-through: an HF folder (config.json, model.safetensors,
# tokenizer.json) fine-tuned with --init-from, --tokenizer and --val-data
if command -v python3 >/dev/null 2>&1; then
  hf=$tmp/hf
  mkdir -p "$hf"
  cp "$configs/tiny-llama.json" "$hf/config.json"
  "$mn" train --config "$hf/config.json" --data "$text" --batch 2 --seq 16 --steps 3 --lr 1e-2 \
    --out "$hf" 2>"$tmp/hf.log" || fail "tiny Llama: $(cat "$tmp/hf.log")"
  # A byte-level BPE tokenizer.json with no merges: each byte's GPT-2 character is its token.
  python3 - "$hf/tokenizer.json" <<'PY'
import json, sys
bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
cs, n = bs[:], 0
for b in range(256):
    if b not in bs:
        bs.append(b); cs.append(256 + n); n += 1
vocab = {chr(c): b for b, c in zip(bs, cs)}
json.dump({"version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
           "normalizer": None,
           "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
           "post_processor": None,
           "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
           "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                     "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                     "vocab": vocab, "merges": []}}, open(sys.argv[1], "w"))
PY
  head -c 600 "$text" >"$tmp/val.txt"
  "$mn" train --config "$hf/config.json" --init-from "$hf/model.safetensors" --tokenizer "$hf/tokenizer.json" \
    --data "$text" --val-data "$tmp/val.txt" --eval-every 2 --batch 2 --seq 16 --steps 4 --lr 1e-3 \
    --checkpoint-every 2 --out "$tmp/ft" --metrics "$tmp/ft.csv" 2>"$tmp/ft.log" ||
    fail "fine-tuning walk-through: $(cat "$tmp/ft.log")"
  [[ $(awk -F, 'NR > 1 && $5 != "" {printf "%s ", $1}' "$tmp/ft.csv") == "2 4 " ]] ||
    fail "fine-tuning evals: $(cat "$tmp/ft.csv")"
  [[ -s $tmp/ft/model.safetensors ]] || fail "fine-tuning wrote no weights"
  # The checkpoint records the tokenizer's identity: another tokenizer file is refused.
  { cat "$hf/tokenizer.json"; echo; } >"$tmp/tokenizer2.json"
  expect 1 "--tokenizer '$tmp/tokenizer2.json' is not the tokenizer the checkpoint was trained with" \
    train --resume "$tmp/ft/checkpoint-000002.safetensors" --tokenizer "$tmp/tokenizer2.json"
fi

# ---- generate: the prompt and exactly --tokens bytes
"$mn" generate --weights "$out/model.safetensors" --config "$cfg" --prompt "the " --tokens 25 \
  --seed 2 >"$tmp/gen.txt" 2>"$tmp/gen.err" || fail "generate: $(cat "$tmp/gen.err")"
[[ $(wc -c <"$tmp/gen.txt") == 29 ]] || fail "generate printed $(wc -c <"$tmp/gen.txt") bytes, not 4 + 25"
"$mn" generate --checkpoint "$out/checkpoint-000020.safetensors" --config "$cfg" --prompt "the " \
  --tokens 10 --greedy --seq 16 >"$tmp/gen2.txt" 2>"$tmp/gen2.err" || fail "generate --checkpoint: $(cat "$tmp/gen2.err")"
[[ $(wc -c <"$tmp/gen2.txt") == 14 ]] || fail "generate --checkpoint --greedy printed $(wc -c <"$tmp/gen2.txt") bytes"

# ---- generate through the KV-cache generator: --batch prints one line per sequence, --top-p
# with a tiny p is greedy, and a GGUF needs no --config or --tokenizer (the same tokens as its
# safetensors twin)
"$mn" generate --weights "$out/model.safetensors" --config "$cfg" --prompt "the " --tokens 6 \
  --batch 3 --seed 4 >"$tmp/genb.txt" 2>"$tmp/genb.err" || fail "generate --batch: $(cat "$tmp/genb.err")"
[[ $(grep -c '^the ' "$tmp/genb.txt") == 3 ]] || fail "generate --batch 3 printed: $(cat "$tmp/genb.txt")"
grep -q "prefill 4 tokens in .* ms; 3 x 6 tokens at" "$tmp/genb.err" || fail "generate's rates: $(cat "$tmp/genb.err")"
"$mn" generate --weights "$out/model.safetensors" --config "$cfg" --prompt "the " --tokens 8 --greedy \
  >"$tmp/greedy.txt" 2>/dev/null
"$mn" generate --weights "$out/model.safetensors" --config "$cfg" --prompt "the " --tokens 8 --top-p 1e-6 \
  --seed 9 >"$tmp/topp.txt" 2>/dev/null
cmp -s "$tmp/greedy.txt" "$tmp/topp.txt" || fail "--top-p 1e-6 is not greedy"
fx=$(cd "$(dirname "${BASH_SOURCE[0]}")/fixtures/gguf" && pwd)
"$mn" generate --weights "$fx/llama_f32.gguf" --prompt "hello" --tokens 8 --greedy >"$tmp/gguf.txt" \
  2>"$tmp/gguf.err" || fail "generate from a GGUF: $(cat "$tmp/gguf.err")"
"$mn" generate --weights "$fx/llama.safetensors" --config "$fx/llama_config.json" \
  --tokenizer "$fx/llama_tokenizer.json" --prompt "hello" --tokens 8 --greedy >"$tmp/st.txt" 2>/dev/null
cmp -s "$tmp/gguf.txt" "$tmp/st.txt" || fail "a GGUF generates other text than its safetensors twin"
# quantized weights: from a Q8_0 GGUF (its blocks kept) and from safetensors (int4 groups of
# 32), and unknown formats and group sizes refused
"$mn" generate --weights "$fx/llama_q8_0.gguf" --prompt "hello" --tokens 8 --greedy --quant q8_0 \
  >/dev/null 2>"$tmp/q8.err" || fail "generate --quant q8_0 from a Q8_0 GGUF: $(cat "$tmp/q8.err")"
"$mn" generate --weights "$out/model.safetensors" --config "$cfg" --prompt "the " --tokens 8 --greedy \
  --quant int4 --group-size 32 >"$tmp/int4.txt" 2>"$tmp/int4.err" || fail "generate --quant int4: $(cat "$tmp/int4.err")"
[[ $(wc -c <"$tmp/int4.txt") == 12 ]] || fail "generate --quant int4 printed $(wc -c <"$tmp/int4.txt") bytes"
expect 2 "meganeura generate: --quant must be none, q8_0, q4_0, q4_1, int8 or int4, got 'q5'" generate --config "$cfg" --prompt hi --weights x --quant q5
expect 2 "meganeura generate: --group-size must be 32, 64 or 128, got '48'" generate --config "$cfg" --prompt hi --weights x --group-size 48
expect 2 "meganeura generate: --top-p must be in (0, 1], got '2'" generate --config "$cfg" --prompt hi --weights x --top-p 2
expect 2 "--config is required (only a GGUF --weights carries its own)" generate --prompt hi --weights "$out/model.safetensors"

# ---- bench prints a step time and a token rate
"$mn" bench --config "$cfg" --batch 2 --seq 16 --steps 3 >"$tmp/bench.txt" 2>&1 || fail "bench: $(cat "$tmp/bench.txt")"
grep -Eq 'median [0-9.]+ ms/step, [0-9]+ tokens/s' "$tmp/bench.txt" || fail "bench output: $(cat "$tmp/bench.txt")"
grep -q 'backend cpu, precision f32,' "$tmp/bench.txt" || fail "bench's CPU default is not f32: $(cat "$tmp/bench.txt")"
"$mn" bench --config "$cfg" --batch 2 --seq 16 --steps 2 --precision bf16 >"$tmp/bench16.txt" 2>&1 ||
  fail "bench --precision bf16: $(cat "$tmp/bench16.txt")"
grep -q 'precision bf16,' "$tmp/bench16.txt" || fail "bench --precision bf16 output: $(cat "$tmp/bench16.txt")"
"$mn" generate --weights "$out/model.safetensors" --config "$cfg" --prompt "the " --tokens 5 \
  --precision bf16 >"$tmp/gen16.txt" 2>"$tmp/gen16.err" || fail "generate --precision bf16: $(cat "$tmp/gen16.err")"
[[ $(wc -c <"$tmp/gen16.txt") == 9 ]] || fail "generate --precision bf16 printed $(wc -c <"$tmp/gen16.txt") bytes"
expect 2 "meganeura generate: --precision must be f32, tf32, bf16 or f16, got 'x'" generate --config "$cfg" --prompt hi --weights x --precision x
expect 2 "meganeura bench: --precision must be f32, tf32, bf16 or f16, got 'x'" bench --config "$cfg" --batch 1 --seq 4 --precision x

# ---- bad input: --data that is a folder; NaN weights refused at load naming the tensor
# (train's --allow-nonfinite loads them; generate always refuses them)
expect 1 "meganeura train: cannot read '$tmp': it is a folder, not a file" train "${T[@]/$text/$tmp}" --batch 2
nan=$tmp/nan.safetensors
cp "$out/model.safetensors" "$nan"
header_len=$(od -An -tu8 -N8 "$nan" | tr -d ' ')
printf '\x00\x00\xc0\x7f' | dd of="$nan" bs=1 seek=$((8 + header_len)) conv=notrunc status=none
expect 1 "holds a non-finite value" generate --weights "$nan" --config "$cfg" --prompt "the " --tokens 5
grep -qF "tensor \"" "$tmp/err" || fail "the NaN refusal does not name the tensor: $(cat "$tmp/err")"
expect 1 "holds a non-finite value" train "${T[@]}" --batch 2 --steps 1 --init-from "$nan" --out "$tmp/nan-run"
"$mn" train "${T[@]}" --batch 2 --steps 1 --init-from "$nan" --allow-nonfinite --out "$tmp/nan-run" \
  >/dev/null 2>"$tmp/nan-train.err"
grep -q "holds a non-finite value" "$tmp/nan-train.err" && fail "train --allow-nonfinite still refused the weights"

# ---- --ranks: 2 data-parallel ranks of batch 2 train as one of batch 4; rank 0 alone reports
expect 2 "meganeura train: --ranks must be a positive integer, got '0'" train "${T[@]}" --batch 2 --ranks 0
"$mn" train "${T[@]}" --steps 4 --batch 4 --out "$tmp/rank1" >/dev/null 2>"$tmp/rank1.err" ||
  fail "train --batch 4: $(cat "$tmp/rank1.err")"
"$mn" train "${T[@]}" --steps 4 --batch 2 --ranks 2 --checkpoint-every 2 --out "$tmp/ranks2" \
  >/dev/null 2>"$tmp/ranks2.err" || fail "train --ranks 2: $(cat "$tmp/ranks2.err")"
[[ $(grep -c "weights saved" "$tmp/ranks2.err") == 1 ]] || fail "--ranks 2: not only rank 0 reported"
grep -q "2 data-parallel ranks of batch 2" "$tmp/ranks2.err" || fail "--ranks 2: no ranks line"
[[ -f $tmp/ranks2/checkpoint-000004.safetensors ]] || fail "--ranks 2: no checkpoint"
if command -v python3 >/dev/null 2>&1; then
  python3 - "$tmp/rank1/model.safetensors" "$tmp/ranks2/model.safetensors" <<'PY' ||
import array, sys
from st_tensors import tensors
one, two = tensors(sys.argv[1]), tensors(sys.argv[2])
assert one.keys() == two.keys()
# AdamW magnifies the rounding noise of gradients that are 0 in exact arithmetic (the keys'
# bias), hence 1e-4 rather than fp32's order of the sums alone.
worst = max(abs(x - y) for k in one
            for x, y in zip(array.array("f", one[k]), array.array("f", two[k])))
sys.exit(0 if worst < 1e-4 else f"max difference {worst}")
PY
    fail "--ranks 2 --batch 2 differs from --batch 4"
fi

# ---- --gpus and launched ranks: what is refused before any device is touched (the runs
# themselves need several GPUs: scripts/gpu-dp.sh)
unset RANK WORLD_SIZE LOCAL_RANK MASTER_ADDR MASTER_PORT MN_GROUP_PORT SLURM_PROCID SLURM_NTASKS \
  OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE
expect 2 "meganeura train: give --ranks (CPU threads) or --gpus (one process per CUDA device), not both" \
  train "${T[@]}" --batch 2 --ranks 2 --gpus 2
expect 2 "meganeura train: --gpus must be a positive integer, got '0'" train "${T[@]}" --batch 2 --gpus 0
expect 2 "meganeura train: --gpus must be at most 64, got 65" train "${T[@]}" --batch 2 --gpus 65
expect 1 "meganeura train: --gpus 64 needs" train "${T[@]}" --batch 2 --gpus 64 --out "$tmp/gpus"
expect 2 "meganeura train: --launcher must be auto, env or none, got 'mpi'" train "${T[@]}" --batch 2 --launcher mpi
expect 2 "meganeura train: --launcher env: mn_launch_env_read: no launcher environment" train "${T[@]}" --batch 2 --launcher env
expect 2 "meganeura train: --group-id-file applies to a job started by a launcher" train "${T[@]}" --batch 2 --group-id-file "$tmp/id"
export RANK=1 WORLD_SIZE=2
expect 2 "meganeura train: --ranks cannot be used in a job started by torchrun (rank 1 of 2)" train "${T[@]}" --batch 2 --ranks 2
expect 2 "meganeura train: --gpus cannot be used in a job started by torchrun (rank 1 of 2)" train "${T[@]}" --batch 2 --gpus 2
expect 2 "the group id goes through MASTER_ADDR, which is not set" train "${T[@]}" --batch 2
export MASTER_ADDR=127.0.0.1
expect 2 "but MASTER_PORT is not set; set MN_GROUP_PORT or give --group-id-file PATH" train "${T[@]}" --batch 2
MN_GROUP_PORT=70000 expect 2 "meganeura train: MN_GROUP_PORT=\"70000\" is not a port" train "${T[@]}" --batch 2
# No device visible: the rank fails at once (on a machine with one, it would use that one).
export MASTER_PORT=29500 LOCAL_RANK=63
CUDA_VISIBLE_DEVICES= expect 1 "meganeura train: rank 1 " train "${T[@]}" --batch 2 --out "$tmp/launched"
"$mn" train "${T[@]}" --batch 2 --steps 2 --launcher none --out "$tmp/alone" >/dev/null 2>"$tmp/alone.err" ||
  fail "--launcher none under RANK=1 WORLD_SIZE=2: $(cat "$tmp/alone.err")"
export RANK=0 WORLD_SIZE=1
"$mn" train "${T[@]}" --batch 2 --steps 2 --out "$tmp/world1" >/dev/null 2>"$tmp/world1.err" ||
  fail "WORLD_SIZE=1 is not a plain run: $(cat "$tmp/world1.err")"
unset RANK WORLD_SIZE LOCAL_RANK MASTER_ADDR MASTER_PORT
"$mn" train --help | grep -q -- "--gpus N" || fail "meganeura train --help: no --gpus"

if ((fails)); then
  echo "$fails check(s) failed" >&2
  exit 1
fi
echo "all meganeura command checks passed"
