#!/usr/bin/env bash
# Li et al. 2022, §4.2 and Figure 2 on the offline default (MiniLM, generated sentiment data):
#   (a) the singular values of the average clipped gradients along private fine-tuning decay
#       like a power law (the paper: k^-0.6 for DistilRoBERTa on SST-2);
#   (b) retraining with the clipped gradient projected onto the top-k subspace (k = 10, 20, 100;
#       isotropic noise in all p dimensions, as in the paper) against full DP-SGD at the same epsilon.
# Usage: bash analyses/li2022_fig2_text.sh [OUT]  (STEPS, RETRAIN_STEPS, SEEDS to change sizes)
# For the paper's setting with a GPU: -t model=distilroberta-base -t dataset=glue/sst2, STEPS=2000.
set -euo pipefail
OUT="${1:-runs/li2022-fig2}"
STEPS="${STEPS:-400}"
RETRAIN_STEPS="${RETRAIN_STEPS:-200}"
SEEDS="${SEEDS:-0}"

gradspec collect --out "$OUT/collect" --overwrite --steps "$STEPS" --batch-size 32 --epsilon 8 \
    --lr 1e-3 --eval-every 50 --checkpoint-every 50
gradspec pca "$OUT/collect/gradients.zarr" --k 200 --out "$OUT/spectrum.zarr" --overwrite
gradspec decay "$OUT/spectrum.zarr" --out "$OUT/decay"            # Figure 2a: spectrum.png, density.png
gradspec retrain --sweep -a subspace -a dp-sgd --projector "$OUT/spectrum.zarr" \
    --ranks 10,20,100 --seeds "$SEEDS" --epsilons 8 --steps "$RETRAIN_STEPS" --batch-size 32 \
    --optimizer adam --lr 1e-3 --out "$OUT/retrain"                  # Figure 2b: summary.csv + figures
