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

# mn_use_debs DEB_DIR: air-gapped machines. Unpacks the Debian packages in DEB_DIR (cJSON,
# Criterion and their dependencies) into a private prefix under /tmp and points CMake and
# the dynamic linker at it (CMAKE_PREFIX_PATH, CMAKE_LIBRARY_PATH, LD_LIBRARY_PATH).
mn_use_debs() {
  local debs=$1 prefix=/tmp/meganeura-deps f libdir
  rm -rf "$prefix"
  for f in "$debs"/*.deb; do dpkg -x "$f" "$prefix"; done
  libdir=$(dirname "$(find "$prefix" -name 'libcjson.so*' | head -n1)")
  # The -dev packages' .so links point at versioned files in the same folder.
  export CMAKE_PREFIX_PATH="$prefix/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
  export CMAKE_LIBRARY_PATH="$libdir${CMAKE_LIBRARY_PATH:+:$CMAKE_LIBRARY_PATH}"
  export LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
}
