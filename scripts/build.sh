#!/usr/bin/env bash
# Configures and builds Tessera into build/ (executables in build/bin/).
# BUILD_DIR, BUILD_TYPE, BUILD_TARGETS (space-separated; default all) and extra CMake arguments
# can be given. With TESSERA_FAIL_ON_WARNINGS=1 (scripts/test.sh, hence CI) a compiler warning
# fails the build: the compilers' output is kept in $BUILD_DIR/build.log and every "warning:"
# line in it is printed (ccache replays a cached object's warnings, so a warm cache hides none).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
BUILD_TYPE=${BUILD_TYPE:-Release}
# nvcc is optional: the image's CUDA toolkit lives in /usr/local/cuda when present.
[ -x /usr/local/cuda/bin/nvcc ] && export PATH="/usr/local/cuda/bin:$PATH"
# ccache, when installed, keeps compiled objects between builds, also between clones of the tree
# (paths under the tree are hashed relative to it): a rebuild of unchanged sources takes
# seconds instead of minutes on two cores. TESSERA_CCACHE=0 turns it off.
LAUNCHER=()
if [ "${TESSERA_CCACHE:-1}" != "0" ] && command -v ccache > /dev/null; then
  export CCACHE_BASEDIR="$(pwd)" CCACHE_NOHASHDIR=true CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-8G}
  LAUNCHER=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
# The grammar library's source (structured outputs), fetched once through pip.
XGRAMMAR_DIR=$(bash scripts/fetch_xgrammar.sh)
cmake -S . -B "$BUILD_DIR" -G Ninja -DTESSERA_XGRAMMAR_DIR="$XGRAMMAR_DIR" -DCMAKE_BUILD_TYPE="$BUILD_TYPE" "${LAUNCHER[@]}" "$@"
TARGET_ARGS=()
[ -n "${BUILD_TARGETS:-}" ] && TARGET_ARGS=(--target $BUILD_TARGETS)
if [ "${TESSERA_FAIL_ON_WARNINGS:-0}" != "1" ]; then
  exec cmake --build "$BUILD_DIR" -j "$(nproc)" "${TARGET_ARGS[@]}"
fi
cmake --build "$BUILD_DIR" -j "$(nproc)" "${TARGET_ARGS[@]}" 2>&1 | tee "$BUILD_DIR/build.log"
status=${PIPESTATUS[0]}
[ "$status" -eq 0 ] || exit "$status"
if grep -E "warning[: ]" "$BUILD_DIR/build.log" | grep -vE "^CMake Warning|^ninja: warning" > "$BUILD_DIR/warnings.log"; then
  echo "error: the build printed $(wc -l < "$BUILD_DIR/warnings.log") warning line(s) (the whole output: $BUILD_DIR/build.log):"
  head -50 "$BUILD_DIR/warnings.log"
  exit 1
fi
echo "build: no compiler warnings"
