#!/usr/bin/env bash
# The documentation site (mkdocs.yml, pages in docs/): build it and serve it at
# http://127.0.0.1:8000, rebuilt on every change; with --build, only build it into site/.
# Either way the build is strict: a broken link or anchor, a docstring the API reference cannot
# read, or a public name without a docstring fails it.
# Extra arguments go to mkdocs, e.g. `bash scripts/docs.sh --build --site-dir /tmp/site` or
# `bash scripts/docs.sh --dev-addr 127.0.0.1:8001`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh test  # the docs toolchain is part of the test extra
PY="${PYTHON:-python3}"
export NO_MKDOCS_2_WARNING=1  # Material's banner about its successor, printed on every build
if [ "${1:-}" = "--build" ]; then
    shift
    exec "$PY" -m mkdocs build --strict "$@"
fi
exec "$PY" -m mkdocs serve --strict "$@"
