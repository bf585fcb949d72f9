#!/usr/bin/env bash
# meganeura train on instruction data: JSON Lines of prompt/completion and messages records
# rendered by the chatml and plain templates, the loss counting exactly the completion tokens
# (checked against a count made here), a LoRA fine-tune whose loss falls, held-out loss on
# instruction data, the usage and file errors, and a resume that keeps the template.
# Usage: test_cli_instruct.sh PATH/TO/meganeura
set -uo pipefail
mn=${1:?usage: test_cli_instruct.sh PATH/TO/meganeura}
export MN_BACKEND=${MN_BACKEND:-cpu}
tmp=$(mktemp -d)
[[ -n ${MN_KEEP_TMP:-} ]] || trap 'rm -rf "$tmp"' EXIT
source "$(dirname "${BASH_SOURCE[0]}")/cli_expect.sh"
command -v python3 >/dev/null 2>&1 || { echo "python3 is needed to write the fixtures"; exit 77; }
configs=$(cd "$(dirname "${BASH_SOURCE[0]}")/../configs" && pwd)

# A tiny Llama over bytes plus three special tokens (256-258), and its byte-level tokenizer;
# the base is trained on text first, so that LoRA (which freezes the head) has a head to use.
hf=$tmp/hf
mkdir -p "$hf"
python3 - "$configs/tiny-llama.json" "$hf" <<'PY'
import json, sys
cfg = json.load(open(sys.argv[1]))
cfg["vocab_size"] = 259
json.dump(cfg, open(sys.argv[2] + "/config.json", "w"))
bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
cs, n = bs[:], 0
for b in range(256):
    if b not in bs:
        bs.append(b); cs.append(256 + n); n += 1
vocab = {chr(c): b for b, c in zip(bs, cs)}
added = [{"id": 256 + i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
          "normalized": False, "special": True}
         for i, t in enumerate(["<|im_start|>", "<|im_end|>", "<|endoftext|>"])]
tok = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
       "normalizer": None,
       "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
       "post_processor": None,
       "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
       "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                 "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                 "vocab": vocab, "merges": []}}
json.dump(tok, open(sys.argv[2] + "/tokenizer.json", "w"))
tok["added_tokens"] = []
json.dump(tok, open(sys.argv[2] + "/bytes-tokenizer.json", "w"))
# 40 records: "add N and M" -> the sum, half prompt/completion and half messages.
with open(sys.argv[2] + "/train.jsonl", "w") as f, open(sys.argv[2] + "/counts", "w") as c:
    counted = 0
    for i in range(40):
        a, b = i % 7, (3 * i) % 5
        q, ans = f"add {a} and {b}", f"{a + b}!"
        if i % 2:
            rec = {"prompt": q, "completion": ans}
        else:
            rec = {"messages": [{"role": "system", "content": "math"}, {"role": "user", "content": q},
                                {"role": "assistant", "content": ans}]}
        f.write(json.dumps(rec) + "\n")
        if i % 9 == 0:
            f.write("\n")
        counted += len(ans.encode()) + 1  # the completion and its end token
    c.write(str(counted))
PY
cfg=$hf/config.json
text=$tmp/text.txt
for _ in $(seq 20); do echo "add 3 and 4 is 7. add 1 and 1 is 2."; done >"$text"
"$mn" train --config "$cfg" --data "$text" --batch 4 --seq 32 --steps 60 --lr 1e-2 --out "$hf" \
  2>"$tmp/base.log" || fail "base model: $(cat "$tmp/base.log")"
I=(--config "$cfg" --tokenizer "$hf/tokenizer.json" --data "$hf/train.jsonl" --batch 4 --seq 48)
counted=$(cat "$hf/counts")

# ---- usage and file errors
expect 2 "instruction data '$hf/train.jsonl' needs --tokenizer" train --config "$cfg" --data "$hf/train.jsonl" --batch 2 --seq 48 --steps 1 --lr 1e-3 --out "$tmp/e"
expect 2 "--chat-template must be chatml or plain, got 'alpaca'" train "${I[@]}" --steps 1 --lr 1e-3 --chat-template alpaca
expect 2 "--pack applies to instruction data (--data FILE.jsonl) only" train --config "$cfg" --data "$text" --batch 2 --seq 16 --steps 1 --lr 1e-3 --pack
expect 2 "--data-format does not apply to instruction data" train --config "$cfg" --data "$hf/train.jsonl" --batch 2 --seq 48 --steps 1 --lr 1e-3 --data-format u16
printf '{"prompt": "a", "completion": "b"}\n{"prompt": \n' >"$tmp/bad.jsonl"
expect 1 "'$tmp/bad.jsonl' line 2: not JSON" train "${I[@]/$hf\/train.jsonl/$tmp/bad.jsonl}" --steps 1 --lr 1e-3 --out "$tmp/e"
printf '{"question": "a"}\n' >"$tmp/odd.jsonl"
expect 1 "line 1: neither \"messages\" nor string \"prompt\" and \"completion\"" train "${I[@]/$hf\/train.jsonl/$tmp/odd.jsonl}" --steps 1 --lr 1e-3 --out "$tmp/e"
expect 1 "the tokenizer has no <|im_start|> and <|im_end|> tokens" train "${I[@]/$hf\/tokenizer.json/$hf/bytes-tokenizer.json}" --steps 1 --lr 1e-3 --out "$tmp/e"

# ---- chatml: the loss counts exactly the completions and their <|im_end|>; LoRA learns
"$mn" train "${I[@]}" --steps 40 --lr 3e-2 --init-from "$hf/model.safetensors" --lora-rank 8 \
  --val-fraction 0.2 --eval-every 20 --checkpoint-every 20 --out "$tmp/chat" --metrics "$tmp/chat.csv" \
  2>"$tmp/chat.log" || fail "chatml LoRA run: $(cat "$tmp/chat.log")"
grep -q "40 examples (0 cut to --seq, 0 without a counted token dropped) in 40 rows, $counted of 1920 tokens counted" \
  "$tmp/chat.log" || fail "chatml counts (want $counted): $(grep examples "$tmp/chat.log")"
awk -F, 'NR == 2 {a = $2} END {if (!($2 < a / 2)) exit 1}' "$tmp/chat.csv" ||
  fail "chatml LoRA: the loss did not halve: $(cut -d, -f1,2 "$tmp/chat.csv" | tr '\n' ' ')"
[[ $(awk -F, 'NR > 1 && $5 != "" {printf "%s ", $1}' "$tmp/chat.csv") == "20 40 " ]] ||
  fail "held-out loss on instruction data: $(cat "$tmp/chat.csv")"
[[ -s $tmp/chat/adapter_model.safetensors ]] || fail "chatml LoRA run wrote no adapter"

# ---- plain: the completion and <|endoftext|>
"$mn" train "${I[@]}" --steps 2 --lr 1e-3 --chat-template plain --out "$tmp/plain" 2>"$tmp/plain.log" ||
  fail "plain run: $(cat "$tmp/plain.log")"
grep -q "in 40 rows, $counted of 1920 tokens counted" "$tmp/plain.log" ||
  fail "plain counts (want $counted): $(grep examples "$tmp/plain.log")"

# ---- --pack: the same examples and counted tokens in fewer rows, position ids restarting per
# example (the library's test_packed_model checks that a packed row equals its examples); a
# resume keeps --pack
"$mn" train "${I[@]/48/96}" --steps 4 --lr 1e-2 --pack --init-from "$hf/model.safetensors" --lora-rank 4 \
  --checkpoint-every 2 --out "$tmp/pack" 2>"$tmp/pack.log" || fail "packed run: $(cat "$tmp/pack.log")"
rows=$(sed -n 's/.* in \([0-9]*\) rows (packed), \([0-9]*\) of .*/\1 \2/p' "$tmp/pack.log")
[[ -n $rows && ${rows% *} -lt 40 && ${rows#* } == "$counted" ]] ||
  fail "--pack: want fewer than 40 rows and $counted counted tokens: $(grep examples "$tmp/pack.log")"
"$mn" train --resume "$tmp/pack/checkpoint-000002.safetensors" 2>"$tmp/pack2.log" ||
  fail "resume of a packed run: $(cat "$tmp/pack2.log")"
grep -q "rows (packed)" "$tmp/pack2.log" || fail "the resumed run is not packed: $(grep examples "$tmp/pack2.log")"

# ---- a seq too short for any completion: every example dropped, a clear error
expect 1 "holds no example with a counted token (40 records, 40 dropped)" train "${I[@]/48/6}" --steps 1 --lr 1e-3 --out "$tmp/e"

# ---- resume keeps the template
expect 2 "--chat-template plain differs from the checkpoint's chatml" \
  train --resume "$tmp/chat/checkpoint-000020.safetensors" --chat-template plain
"$mn" train --resume "$tmp/chat/checkpoint-000020.safetensors" --steps 22 2>"$tmp/resume.log" ||
  fail "resume of an instruction run: $(cat "$tmp/resume.log")"

[[ $fails == 0 ]] || { echo "$fails check(s) failed" >&2; exit 1; }
echo "test_cli_instruct: all checks passed"
