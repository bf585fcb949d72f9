# shellcheck shell=bash
# Shared by the scripts: mn_install_missing CMD=PACKAGE... -- PACKAGE...
# Installs (as root, with apt-get) the Debian packages of missing commands (CMD=PACKAGE
# pairs before --) and missing packages (after --); otherwise says what to install and
# returns 1.
mn_install_missing() {
  local missing=() pair p
  while (($#)) && [[ $1 != -- ]]; do
    pair=$1
    shift
    command -v "${pair%%=*}" >/dev/null 2>&1 || missing+=("${pair#*=}")
  done
  [[ ${1:-} == -- ]] && shift
  if command -v dpkg >/dev/null 2>&1; then
    for p in "$@"; do
      dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
    done
  fi
  ((${#missing[@]})) || return 0
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
    printf '\n== installing %s\n' "${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get update </dev/null &&
      DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" </dev/null
  else
    echo "missing: ${missing[*]}" >&2
    echo "install them (Debian/Ubuntu: sudo apt-get install ${missing[*]}) or run as root" >&2
    return 1
  fi
}
