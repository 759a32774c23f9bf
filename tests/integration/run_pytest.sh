#!/usr/bin/env bash
# Runs a pytest file with the project's virtual environment (.venv, made by scripts/test.sh).
# Exits 77 (CTest: skipped) with a message when the environment is missing.
set -u
root="$(cd "$(dirname "$0")/../.." && pwd)"
py="${TESSERA_VENV:-$root/.venv}/bin/python"
if [ ! -x "$py" ] || ! "$py" -c "import openai, pytest" 2>/dev/null; then
  echo "SKIP: no virtual environment with openai and pytest at ${TESSERA_VENV:-$root/.venv} (scripts/test.sh makes it)"
  exit 77
fi
exec "$py" -m pytest -q -p no:cacheprovider "$@"
