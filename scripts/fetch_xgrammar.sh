#!/usr/bin/env bash
# Fetches the grammar library's source (xgrammar, Apache-2.0: its C++ core ships in the PyPI
# source distribution) through pip into .cache/xgrammar/ (ignored; nothing of it is committed),
# version and sha256 pinned, and prints the unpacked source folder. Idempotent: does nothing
# when that folder is there. CMake builds the C++ core from it (cmake/Xgrammar.cmake).
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=0.2.8
SHA256=8305646fd2b319d6c3003f51a1665e54cbbe9cba1fb636bc41d0b46434ccbb80
CACHE=.cache/xgrammar
SRC="$CACHE/xgrammar-$VERSION"
if [ ! -f "$SRC/.tessera-unpacked" ]; then
  mkdir -p "$CACHE"
  [ -x .venv/bin/python ] || python3 -m venv .venv >&2
  printf 'xgrammar==%s --hash=sha256:%s\n' "$VERSION" "$SHA256" > "$CACHE/requirements.txt"
  if [ ! -f "$CACHE/xgrammar-$VERSION.tar.gz" ]; then
    echo "fetch_xgrammar: pip download xgrammar==$VERSION (source distribution)" >&2
    .venv/bin/pip download --quiet --disable-pip-version-check --no-deps --no-binary xgrammar \
      --require-hashes -r "$CACHE/requirements.txt" -d "$CACHE" >&2
  fi
  echo "$SHA256  $CACHE/xgrammar-$VERSION.tar.gz" | sha256sum --check --quiet >&2
  rm -rf "$SRC"
  tar -xzf "$CACHE/xgrammar-$VERSION.tar.gz" -C "$CACHE"
  touch "$SRC/.tessera-unpacked"
fi
echo "$PWD/$SRC"
