#!/usr/bin/env bash
# Builds the GPU check's programs on THIS machine and gathers what they need into one folder
# that the project's `device` tool can carry to a lent GPU machine, where
# `bench/gpu_check.sh --prebuilt FOLDER` runs them.
#
# Why: the lent machine has the CUDA toolkit, PyTorch, CMake and ninja, but none of the Debian
# -dev packages Tessera builds against (fmt, nlohmann-json, GoogleTest, Cap'n Proto, ZeroMQ,
# PCRE2, hwloc, CLI11, MPI) and no network to fetch them, so `bench/gpu_check.sh` cannot
# configure there. This machine has them and the same CUDA major version (13), so the programs
# are built here for the device's architecture and run there.
#
# The folder holds bin/ (tessera_gpu_tests, tessera-gpu-ops-bench, tessera-gpu-forward-bench),
# lib/ (libtessera_cuda.so, libtessera_fake_cuda.so for the loader test, and the third-party
# shared libraries the programs load, as `ldd` resolves them here, except glibc, libstdc++/libgcc and CUDA's own libraries, which the device
# machine has), testdata/stories260K (the gpu tests' model: the repository's reference test data,
# tests/data/, as the build unpacks it) and MANIFEST (commit, date, architectures, sizes). With the
# working tree, which the tool carries too, it must stay under the tool's 64 MiB.
#
# Usage: bench/gpu_bundle.sh [OUT_DIR]   (default .gpucheck; git ignores it)
#   CUDA_ARCHS   architectures to build for (default 90: the lent H200; "80;90" for both)
# The kernels carry -lineinfo (no cost at run time), so compute-sanitizer on the device
# machine names the source line of a bad access.
#   BUILD_DIR    build folder (default build-gpu-bundle)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-.gpucheck}
CUDA_ARCHS=${CUDA_ARCHS:-90}
BUILD_DIR=${BUILD_DIR:-build-gpu-bundle}
[ -x /usr/local/cuda/bin/nvcc ] && export PATH="/usr/local/cuda/bin:$PATH"
command -v nvcc >/dev/null || { echo "gpu_bundle: nvcc not found" >&2; exit 1; }

cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTESSERA_CUDA=ON -DTESSERA_BUILD_BENCH=ON \
  -DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCHS" -DCMAKE_CUDA_FLAGS="-lineinfo" >/dev/null
cmake --build "$BUILD_DIR" --target tessera_cuda tessera_fake_cuda tessera_gpu_tests tessera-gpu-ops-bench tessera-gpu-forward-bench \
  tessera_testdata
TESTDATA="$BUILD_DIR/testdata"

rm -rf "$OUT"
mkdir -p "$OUT/bin" "$OUT/lib" "$OUT/testdata"
for b in tessera_gpu_tests tessera-gpu-ops-bench tessera-gpu-forward-bench; do
  cp "$BUILD_DIR/bin/$b" "$OUT/bin/"
done
cp "$BUILD_DIR/lib/libtessera_cuda.so" "$BUILD_DIR/lib/libtessera_fake_cuda.so" "$OUT/lib/"
strip --strip-unneeded "$OUT"/bin/* "$OUT/lib/libtessera_cuda.so" "$OUT/lib/libtessera_fake_cuda.so"

# Third-party libraries: what ldd resolves here, minus what every Linux (glibc, the GCC runtime)
# or the device's CUDA installation provides.
SYSTEM='^(linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so|libgcc_s\.so|libstdc\+\+\.so|libcuda\.so|libcudart\.so|libcublas\.so|libcublasLt\.so|libnccl\.so)'
for f in "$OUT"/bin/* "$OUT/lib/libtessera_cuda.so" "$OUT/lib/libtessera_fake_cuda.so"; do
  ldd "$f" | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }'
done | sort -u | while read -r name path; do
  if [[ ! "$name" =~ $SYSTEM ]]; then cp -L "$path" "$OUT/lib/$name"; fi
done

[ -f "$TESTDATA/stories260K/reference.json" ] || { echo "gpu_bundle: no stories260K under $TESTDATA (target tessera_testdata)" >&2; exit 1; }
cp -r "$TESTDATA/stories260K" "$OUT/testdata/"

{
  echo "commit: $(git rev-parse HEAD)$(git diff --quiet HEAD -- . ':!bench/results' || echo ' (with uncommitted changes)')"
  echo "built: $(date -u '+%Y-%m-%d %H:%M:%S UTC') on $(hostname)"
  echo "cuda_archs: $CUDA_ARCHS"
  echo "nvcc: $(nvcc --version | tail -1)"
  echo "libraries carried: $(cd "$OUT/lib" && ls | tr '\n' ' ')"
  echo "size: $(du -sh "$OUT" | cut -f1)"
} >"$OUT/MANIFEST"
cat "$OUT/MANIFEST"
SIZE_KB=$(du -sk "$OUT" | cut -f1)
# The working tree as the tool carries it: tracked files and untracked ones git does not ignore.
# (du fails on files deleted from the tree but not from the index, hence the || true.)
TREE_KB=$(git ls-files -co --exclude-standard -z | { du -ck --files0-from=- 2>/dev/null || true; } | tail -1 | cut -f1)
if [ $((SIZE_KB + TREE_KB)) -gt $((60 * 1024)) ]; then
  echo "gpu_bundle: $OUT is $((SIZE_KB / 1024)) MiB and the working tree $((TREE_KB / 1024)) MiB; the device tool" \
    "carries at most 64 MiB of both" >&2
  exit 1
fi
echo "Carry it: device run with carry=[\"$OUT\"], command: bash bench/gpu_check.sh --prebuilt $OUT"
