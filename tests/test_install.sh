#!/usr/bin/env bash
# Installs a built tree into a temporary prefix, then builds and runs a small consumer
# the two ways users link meganeura: CMake's find_package (shared and static targets) and
# pkg-config. Exit 77 (ctest: skipped) only when cmake or pkg-config is missing.
#
# usage: tests/test_install.sh BUILD_DIR [EXTRA_FLAGS]
#   EXTRA_FLAGS: compile and link flags for the consumer; a sanitized library needs the
#   consumer linked with the same sanitizers so that their runtime loads first.
set -euo pipefail

build_dir=$(cd "${1:?usage: test_install.sh BUILD_DIR [EXTRA_FLAGS]}" && pwd)
extra_flags=${2:-}

for tool in cmake pkg-config; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "SKIP: $tool is not installed"
    exit 77
  fi
done
cc=${CC:-cc}
generator=()
if command -v ninja >/dev/null 2>&1; then generator=(-G Ninja); fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/mn-install.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix

step() { printf '== %s\n' "$*"; }

step "cmake --install $build_dir --prefix $prefix"
cmake --install "$build_dir" --prefix "$prefix" >"$tmp/install.log" ||
  { cat "$tmp/install.log"; exit 1; }
test -f "$prefix/include/meganeura.h"

# Builds a graph, runs it on the CPU and checks the numbers, so that a consumer that
# links but cannot run (a missing symbol in the shared library, a wrong rpath) fails.
mkdir -p "$tmp/consumer"
cat >"$tmp/consumer/consumer.c" <<'EOF'
#include <stdio.h>
#include <string.h>

#include <meganeura.h>

int main(void) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(1, 3));
  mn_node w = mn_parameter(g, "w", MN_SHAPE(3, 2));
  mn_node y = mn_relu(g, mn_matmul(g, x, w));
  mn_set_outputs(g, &y, 1);
  mn_session_options o = mn_session_options_default();
  o.backend = MN_BACKEND_CPU;
  mn_session *s = NULL;
  float xd[3] = {1, 2, 3}, wd[6] = {1, -1, 1, -1, 1, -1}, out[2] = {0, 0};
  if (mn_build_inference_session(g, &o, &s) != MN_OK ||
      mn_session_set_input(s, "x", xd, 3) != MN_OK ||
      mn_session_set_parameter(s, "w", wd, 6) != MN_OK || mn_session_step(s) != MN_OK ||
      mn_session_wait(s) != MN_OK || mn_session_read_output_by_index(s, 0, out, 2) != MN_OK) {
    fprintf(stderr, "consumer: %s\n", mn_last_error());
    return 1;
  }
  mn_session_free(s);
  mn_graph_free(g);
  if (out[0] != 6.0f || out[1] != 0.0f || strcmp(mn_version(), MN_VERSION_STRING) != 0) {
    fprintf(stderr, "consumer: got (%g, %g), version %s\n", out[0], out[1], mn_version());
    return 1;
  }
  printf("consumer: meganeura %s ok\n", mn_version());
  return 0;
}
EOF
cat >"$tmp/consumer/CMakeLists.txt" <<'EOF'
cmake_minimum_required(VERSION 3.24)
project(meganeura_consumer LANGUAGES C)
find_package(meganeura 0.1 REQUIRED)
add_executable(consumer consumer.c)
target_link_libraries(consumer PRIVATE meganeura::meganeura)
add_executable(consumer_static consumer.c)
target_link_libraries(consumer_static PRIVATE meganeura::meganeura_static)
EOF

step "find_package(meganeura) consumer"
cmake -S "$tmp/consumer" -B "$tmp/consumer/build" "${generator[@]}" \
  -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_C_COMPILER="$cc" \
  -DCMAKE_C_FLAGS="$extra_flags" -DCMAKE_EXE_LINKER_FLAGS="$extra_flags" \
  >"$tmp/consumer.log" 2>&1 || { cat "$tmp/consumer.log"; exit 1; }
cmake --build "$tmp/consumer/build" >>"$tmp/consumer.log" 2>&1 ||
  { cat "$tmp/consumer.log"; exit 1; }
"$tmp/consumer/build/consumer"
"$tmp/consumer/build/consumer_static"

step "pkg-config consumer"
pc=$(find "$prefix" -name meganeura.pc -print -quit)
test -n "$pc" || { echo "no meganeura.pc under $prefix"; exit 1; }
PKG_CONFIG_PATH=$(dirname "$pc")
export PKG_CONFIG_PATH
cflags=$(pkg-config --cflags meganeura)
libs=$(pkg-config --libs meganeura)
libdir=$(pkg-config --variable=libdir meganeura)
echo "pkg-config: $cflags $libs"
# The file must describe the prefix it was installed to, not the configure-time one.
case "$(cd "$libdir" 2>/dev/null && pwd)" in
  "$prefix"/*) ;;
  *) echo "meganeura.pc: libdir $libdir is outside the install prefix $prefix"; exit 1 ;;
esac
# shellcheck disable=SC2086 # word splitting of the flag lists is intended
"$cc" $extra_flags $cflags "$tmp/consumer/consumer.c" -o "$tmp/consumer_pc" $libs
LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$tmp/consumer_pc"

step "install test passed"
