#!/usr/bin/env bash
# Installs the Debian packages Tessera builds and tests with (Debian 12). Idempotent: does
# nothing when everything is present. The CUDA toolkit is optional and never installed here.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config git python3 python3-venv ccache
  libopenmpi-dev openmpi-bin
  libzmq3-dev cppzmq-dev
  libcapnp-dev capnproto
  libhwloc-dev
  nlohmann-json3-dev
  libpcre2-dev
  libutf8proc-dev
  libgtest-dev libgmock-dev
  libcli11-dev
  libfmt-dev
  libcpp-httplib-dev
  clang          # scripts/fuzz.sh: libFuzzer targets
  iproute2       # the multi-host test's network namespaces
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi
echo "install_deps: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -o DPkg::Lock::Timeout=600
$SUDO apt-get install -y -o DPkg::Lock::Timeout=600 --no-install-recommends "${missing[@]}"
