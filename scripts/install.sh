#!/usr/bin/env bash
# Install gradspec (editable) into the current Python environment. Idempotent.
#
# torch: an existing torch is kept as it is (users bring their CUDA build).
# With no torch, we install the CPU build torch==2.13.0 first, so that pip does
# not resolve an unpinned `torch` to several GB of CUDA packages.
#
# Usage: bash scripts/install.sh [extra]   (extra: test, data; default: test)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
extra="${1:-test}"

if "$PY" -c "import torch" >/dev/null 2>&1; then
    echo "install: keeping torch $("$PY" -c 'import torch; print(torch.__version__)')"
else
    echo "install: no torch found; installing the CPU build torch==2.13.0"
    "$PY" -m pip install --quiet "torch==2.13.0"
fi

# Skip the resolver when everything is already in place (fast re-runs).
if PYTHONPATH= "$PY" -P - "$extra" <<'PYEOF' >/dev/null 2>&1
import importlib.metadata as md, os, sys
from packaging.requirements import Requirement
import gradspec  # must be this checkout's, not another clone's editable install
here = os.path.realpath(os.getcwd())
if os.path.dirname(os.path.realpath(gradspec.__path__[0])) != here:
    raise SystemExit(1)
dist = md.distribution("gradspec")
extra = sys.argv[1]
for spec in dist.requires or []:
    req = Requirement(spec)
    if req.marker and not req.marker.evaluate({"extra": extra}):
        continue
    if md.version(req.name) not in req.specifier:
        raise SystemExit(1)
PYEOF
then
    echo "install: gradspec[$extra] already installed"
else
    "$PY" -m pip install --quiet -e ".[$extra]"
fi
