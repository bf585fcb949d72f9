# shellcheck shell=bash
# Shared by the command's test scripts (test_cli.sh, test_cli_resume.sh), which set mn (the
# meganeura binary) and tmp (a scratch folder) before sourcing it.
# fail MESSAGE: counts and prints a failed check. expect CODE FRAGMENT ARGS...: runs the
# command with ARGS, its output in $tmp/out and $tmp/err, and checks the exit code and a stderr
# line containing FRAGMENT.
fails=0
fail() {
  echo "FAIL: $*" >&2
  fails=$((fails + 1))
}

expect() {
  local code=$1 msg=$2
  shift 2
  "$mn" "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  [[ $rc == "$code" ]] || fail "meganeura $* exited $rc, not $code: $(cat "$tmp/err")"
  grep -qF -- "$msg" "$tmp/err" || fail "meganeura $*: stderr lacks '$msg': $(cat "$tmp/err")"
}
