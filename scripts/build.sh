#!/usr/bin/env bash
# Configures and builds Tessera into build/ (executables in build/bin/).
# BUILD_DIR, BUILD_TYPE, BUILD_TARGETS (space-separated; default all) and extra CMake arguments
# can be given.
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
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE="$BUILD_TYPE" "${LAUNCHER[@]}" "$@"
TARGET_ARGS=()
[ -n "${BUILD_TARGETS:-}" ] && TARGET_ARGS=(--target $BUILD_TARGETS)
cmake --build "$BUILD_DIR" -j "$(nproc)" "${TARGET_ARGS[@]}"
