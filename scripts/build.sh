#!/usr/bin/env bash
# Configures and builds Tessera into build/ (executables in build/bin/).
# BUILD_DIR, BUILD_TYPE and extra CMake arguments (after --) can be given.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
BUILD_TYPE=${BUILD_TYPE:-Release}
# nvcc is optional: the image's CUDA toolkit lives in /usr/local/cuda when present.
[ -x /usr/local/cuda/bin/nvcc ] && export PATH="/usr/local/cuda/bin:$PATH"
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE="$BUILD_TYPE" "$@"
cmake --build "$BUILD_DIR" -j "$(nproc)"
