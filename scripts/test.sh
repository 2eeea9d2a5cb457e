#!/usr/bin/env bash
# Install what the tests need, then run the default (fast) test suite.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -m slow`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh test
PY="${PYTHON:-python3}"
"$PY" -m ruff check gradspec cli tests analyses benchmarks scripts examples
"$PY" -m pytest -q "$@"
