#!/usr/bin/env bash
# Installs what is missing, builds Tessera, makes the default model (a deterministic synthetic
# Llama-shaped model, quantized to Q8_0 in GGUF) and generates text with it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
BUILD_DIR=build BUILD_TYPE=Release bash scripts/build.sh
MODEL=models/tiny-q8_0.gguf
mkdir -p models
[ -f "$MODEL" ] || build/bin/tessera-make-model --preset tiny --format gguf --type q8_0 --out "$MODEL"
build/bin/tessera generate --model "$MODEL" --prompt "Once upon a time" --max-tokens 48 \
  --temperature 0.8 --seed 7 "$@"
