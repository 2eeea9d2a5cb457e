#!/usr/bin/env bash
# Install what the tests need, then run the default (fast) test suite.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -m slow` (or `-n 0` for one process).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh test
PY="${PYTHON:-python3}"
"$PY" -m ruff check gradspec cli tests analyses benchmarks scripts examples
# One pytest-xdist worker per core, each on one thread (tests/conftest.py); a test module's
# tests, and all of tests/report, stay on one worker (--dist loadscope: tests/conftest.py's units).
"$PY" -m pytest -q -n auto --dist loadscope "$@"
