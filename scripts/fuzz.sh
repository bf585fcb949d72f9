#!/usr/bin/env bash
# Builds a libFuzzer target (fuzz/TARGET.c) with AddressSanitizer + UndefinedBehaviorSanitizer
# into build-fuzz/ and runs it for SECONDS, starting from a copy of its seed corpus
# (fuzz/corpus/<TARGET without "fuzz_">/), so the checked-in corpus is never written to.
# Exits non-zero when the build fails or the fuzzer finds a crash (the reproducer is left in
# build-fuzz/artifacts-TARGET/).
#
#   scripts/fuzz.sh fuzz_safetensors 600
#
# A target whose source has a seed writer (a main under MN_FUZZ_WRITE_SEEDS) has its seeds
# written afresh into the working corpus before the run, so that they follow the format.
# The last line is "== TARGET: cov N ft M corpus K": libFuzzer's final coverage (edges and
# features), which scripts/test.sh prints so that a drop shows.
#
# Environment: FUZZ_CC (default clang), FUZZ_FLAGS (extra libFuzzer flags, e.g. -jobs=2).
set -euo pipefail

usage() {
  echo "usage: $0 TARGET SECONDS   (TARGET: fuzz_safetensors, fuzz_plan_cache," \
    "fuzz_model_config, fuzz_tokenizer, fuzz_gguf)" >&2
  exit 2
}
[[ $# -eq 2 ]] || usage
target=$1
seconds=$2
[[ $seconds =~ ^[0-9]+$ ]] || usage

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

# The library sources each target links; cuda/ never (the fuzzers run without a GPU).
shopt -s nullglob
case "$target" in
fuzz_safetensors) sources=(io/safetensors_*.c host/half.c host/error.c) ;;
fuzz_plan_cache) sources=(io/*.c host/*.c host/reference/*.c autodiff/*.c optimizer/*.c session/*.c) ;;
fuzz_model_config)
  sources=(models/*.c io/*.c host/*.c host/reference/*.c autodiff/*.c optimizer/*.c session/*.c)
  ;;
fuzz_tokenizer) sources=(io/tokenizer*.c io/unicode_tables.c io/gguf_*.c io/safetensors_dtype.c host/half.c host/quant.c host/error.c) ;;
fuzz_gguf) sources=(io/gguf_*.c io/safetensors_dtype.c host/half.c host/quant.c host/error.c) ;;
*) usage ;;
esac
[[ -f fuzz/$target.c ]] || { echo "fuzz/$target.c does not exist" >&2; exit 2; }

cc=${FUZZ_CC:-clang}
out=build-fuzz
mkdir -p "$out"
flags=(-std=c11 -D_POSIX_C_SOURCE=200809L -g -O1 -fno-omit-frame-pointer
  -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes -Werror -Iinclude -I.)
echo "== build $out/$target"
"$cc" "${flags[@]}" -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  "fuzz/$target.c" "${sources[@]}" -lcjson -lm -lpthread -o "$out/$target"

work=$out/corpus-$target
artifacts=$out/artifacts-$target
rm -rf "$work"
mkdir -p "$work" "$artifacts"
seeds=(fuzz/corpus/"${target#fuzz_}"/*)
((${#seeds[@]})) && cp "${seeds[@]}" "$work"/
if grep -q MN_FUZZ_WRITE_SEEDS "fuzz/$target.c"; then
  echo "== write fresh seeds of $target into $work"
  "$cc" "${flags[@]}" -DMN_FUZZ_WRITE_SEEDS -fsanitize=address,undefined \
    "fuzz/$target.c" "${sources[@]}" -lcjson -lm -lpthread -o "$out/$target-seeds"
  "$out/$target-seeds" "$work"
  seeds=("$work"/*)
fi
dict=()
[[ -f fuzz/$target.dict ]] && dict=(-dict="fuzz/$target.dict")

echo "== run $target for ${seconds}s (corpus $work, ${#seeds[@]} seeds)"
status=0
log=$out/run-$target.log
# shellcheck disable=SC2086 # FUZZ_FLAGS is a list of flags
"$out/$target" -max_total_time="$seconds" -print_final_stats=1 \
  -artifact_prefix="$artifacts/" "${dict[@]}" ${FUZZ_FLAGS:-} "$work" 2>&1 | tee "$log" ||
  status=${PIPESTATUS[0]}
if ((status != 0)); then
  echo "scripts/fuzz.sh: $target failed (status $status); reproducers in $artifacts/:" >&2
  ls -l "$artifacts" >&2 || true
  exit 1
fi
echo "== $target: no crash in ${seconds}s"
# The last status line libFuzzer printed ("#N  DONE  cov: 1234 ft: 5678 corp: 90/12Kb ...").
last=$(grep -E '^#[0-9]+[[:space:]].*cov: [0-9]+' "$log" | tail -n 1 || true)
cov=$(sed -nE 's/.*cov: ([0-9]+).*/\1/p' <<<"$last")
ft=$(sed -nE 's/.*ft: ([0-9]+).*/\1/p' <<<"$last")
corp=$(sed -nE 's/.*corp: ([0-9]+).*/\1/p' <<<"$last")
echo "== $target: cov ${cov:-?} ft ${ft:-?} corpus ${corp:-?}"
