#!/usr/bin/env bash
# The one test command, for users and CI: installs missing Debian packages (as root),
# configures, builds and runs every test; then builds the CPU code again with
# AddressSanitizer + UndefinedBehaviorSanitizer and runs the tests once more.
#
# Last, each libFuzzer target runs briefly (MN_FUZZ_SECONDS, default 30; 0 skips), and its
# final coverage (edges, features, corpus size) is printed in the summary.
#
# Environment: MN_BUILD_DIR (default build), MN_ASAN_BUILD_DIR (default build-asan),
# MN_SKIP_ASAN=1 to stop after the first pass, MN_JOBS (default: nproc).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
build=${MN_BUILD_DIR:-build}
asan_build=${MN_ASAN_BUILD_DIR:-build-asan}
jobs=${MN_JOBS:-$(nproc 2>/dev/null || echo 2)}
start=$(date +%s)

say() { printf '\n== %s\n' "$*"; }
trap 'echo "scripts/test.sh: FAILED at line $LINENO: $BASH_COMMAND" >&2' ERR

# ---------------------------------------------------------------- dependencies
# Commands are checked by name, libraries by their Debian package (there is no command).
declare -A need_cmd=([cmake]=cmake [ninja]=ninja-build [gcc]=gcc [pkg-config]=pkg-config)
missing=()
for c in "${!need_cmd[@]}"; do
  command -v "$c" >/dev/null 2>&1 || missing+=("${need_cmd[$c]}")
done
fuzz_seconds=${MN_FUZZ_SECONDS:-30}
fuzz_packages=()
[[ $fuzz_seconds == 0 ]] || fuzz_packages=(clang libclang-rt-dev)
if command -v dpkg >/dev/null 2>&1; then
  for p in libcjson-dev libcriterion-dev "${fuzz_packages[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
  done
fi
if ((${#missing[@]})); then
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
    say "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update </dev/null
    apt-get install -y --no-install-recommends "${missing[@]}" </dev/null
  else
    echo "missing: ${missing[*]}" >&2
    echo "install them (Debian/Ubuntu: sudo apt-get install ${missing[*]}) or run as root" >&2
    exit 1
  fi
fi

# The safetensors interop and tokenizer conformance tests compare with the official Python
# packages; they skip with a message when those cannot be installed.
if command -v python3 >/dev/null 2>&1 &&
  ! python3 -c 'import safetensors, numpy, tokenizers' >/dev/null 2>&1; then
  python3 -m pip install --quiet numpy safetensors tokenizers </dev/null ||
    echo "numpy/safetensors/tokenizers not installed: the safetensors interop and tokenizer" \
      "conformance tests will skip" >&2
fi

# ---------------------------------------------------------------- pass 1: the normal build
# MN_WITH_CUDA is left to CMake: on when the CUDA toolkit is found.
say "configure $build"
cmake -S . -B "$build" -G Ninja -DMN_WERROR=ON
say "build $build (-j$jobs)"
cmake --build "$build" -j "$jobs"
say "test $build"
main_status=0
ctest --test-dir "$build" --output-on-failure -j "$jobs" </dev/null 2>&1 |
  tee "$build/ctest.log" || main_status=$?

# ---------------------------------------------------------------- pass 2: sanitizers
asan_status=skipped
if [[ ${MN_SKIP_ASAN:-0} != 1 ]]; then
  say "configure $asan_build (ASan + UBSan, CPU only)"
  cmake -S . -B "$asan_build" -G Ninja -DMN_WERROR=ON -DMN_SANITIZE=ON -DMN_WITH_CUDA=OFF
  say "build $asan_build (-j$jobs)"
  cmake --build "$asan_build" -j "$jobs"
  say "test $asan_build"
  # Leak checking stays on: Criterion runs each test in a forked worker, and
  # LeakSanitizer checks that worker's allocations when it exits. Criterion reports such
  # a report only as a warning ("crashed during its setup or teardown") and the test
  # still passes, so the full log is searched for sanitizer reports afterwards.
  # halt_on_error makes a UBSan report fail the test rather than scroll by.
  asan_status=0
  ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1} \
    UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} \
    ctest --test-dir "$asan_build" --output-on-failure -j "$jobs" </dev/null 2>&1 |
    tee "$asan_build/ctest.log" || asan_status=$?
  full_log=$asan_build/Testing/Temporary/LastTest.log
  if grep -qE 'ERROR: (LeakSanitizer|AddressSanitizer)|runtime error:' "$full_log"; then
    say "sanitizer reports in tests that passed (from $full_log)"
    grep -nE -A12 'ERROR: (LeakSanitizer|AddressSanitizer)|runtime error:' "$full_log" | head -200
    awk '/^[0-9]+\/[0-9]+ Testing: /{t=$3} /ERROR: (LeakSanitizer|AddressSanitizer)|runtime error:/{
      if (t && !seen[t]++) print "      sanitizer report in " t}' "$full_log" >"$asan_build/sanitizer.log"
    cat "$asan_build/sanitizer.log"
    [[ $asan_status != 0 ]] || asan_status=sanitizer
  fi
fi

# ---------------------------------------------------------------- pass 3: fuzzing, briefly
fuzz_status=skipped
fuzz_cov=()
if [[ $fuzz_seconds != 0 ]]; then
  fuzz_status=0
  mkdir -p build-fuzz
  for t in fuzz/fuzz_*.c; do
    t=$(basename "$t" .c)
    say "fuzz $t for ${fuzz_seconds} s"
    scripts/fuzz.sh "$t" "$fuzz_seconds" </dev/null >"build-fuzz/$t.log" 2>&1 ||
      { fuzz_status=1; tail -n 40 "build-fuzz/$t.log"; }
    # libFuzzer's final coverage, so that a drop (seeds gone stale, a reader refusing
    # everything) shows next to the previous run's.
    cov=$(sed -n "s/^== $t: \(cov .*\)/\1/p" "build-fuzz/$t.log" | tail -n 1)
    echo "$t: ${cov:-no coverage line}"
    fuzz_cov+=("$(printf '%-20s %s' "$t" "${cov:-no coverage line}")")
  done
fi

# ---------------------------------------------------------------- summary
summary() { # dir status
  local line
  line=$(grep -E '^[0-9]+% tests passed' "$1/ctest.log" 2>/dev/null | tail -1 || true)
  if [[ $2 == 0 ]]; then
    printf '  %-12s ok      %s\n' "$1" "$line"
  elif [[ $2 == sanitizer ]]; then
    printf '  %-12s FAILED  %s, but sanitizers reported errors:\n' "$1" "$line"
    cat "$1/sanitizer.log"
  else
    printf '  %-12s FAILED  %s\n' "$1" "${line:-ctest exited with status $2}"
    grep -E '^\s+[0-9]+ - ' "$1/ctest.log" 2>/dev/null | sed 's/^\s*/      /' || true
  fi
}
say "summary ($(($(date +%s) - start)) s)"
summary "$build" "$main_status"
if [[ $asan_status == skipped ]]; then
  printf '  %-12s skipped (MN_SKIP_ASAN=1)\n' "$asan_build"
else
  summary "$asan_build" "$asan_status"
fi
case $fuzz_status in
0) printf '  %-12s ok      every target ran %s s without a crash\n' fuzz "$fuzz_seconds" ;;
skipped) printf '  %-12s skipped (MN_FUZZ_SECONDS=0)\n' fuzz ;;
*) printf '  %-12s FAILED  (logs: build-fuzz/*.log)\n' fuzz ;;
esac
for line in ${fuzz_cov[@]+"${fuzz_cov[@]}"}; do printf '      %s\n' "$line"; done
if [[ $main_status == 0 && ($asan_status == 0 || $asan_status == skipped) &&
      ($fuzz_status == 0 || $fuzz_status == skipped) ]]; then
  exit 0
fi
exit 1
