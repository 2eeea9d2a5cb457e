"""Per-step overhead of the private optimizers on the text task, as ratios to a DP-SGD step.

All optimizers train the same model in one process; their steps are interleaved
(round robin, order rotated each round) so machine noise hits all alike, and the
median step time of each is divided by DP-SGD's. The projection costs O(pk) per step
(two p x k products); PDP-SGD with a public projector also computes m public
per-example gradients and an m x m Gram eigendecomposition every s steps.

Usage:
    python benchmarks/bench_retrain.py            # MiniLM q/v weights (p ~ 1.8M)
    python benchmarks/bench_retrain.py --quick    # tiny-bert, a smoke run
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny-bert and few steps")
    parser.add_argument("--rank", type=int, default=20, help="subspace rank k")
    parser.add_argument("--public-size", type=int, default=16, help="public examples m (PDP-SGD)")
    parser.add_argument("--period", type=int, default=1, help="PDP-SGD recompute period s")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=5, help="timed steps per optimizer")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()

    import torch

    from gradspec.optim import make_algorithm
    from gradspec.tasks import make_task
    from gradspec.train import CollectConfig
    from gradspec.train._loop import _Run

    model = "tiny-bert" if args.quick else "minilm"
    options = {"model": model, "n_train": 256, "n_eval": 64}
    config = CollectConfig(task="text", task_options=options, steps=10**6, batch_size=args.batch_size,
                           noise_multiplier=1.0, optimizer="sgd", lr=0.05, microbatch=args.batch_size,
                           device=args.device)
    task = make_task("text", seed=0, **options)
    k = args.rank
    algorithms = {
        "dp-sgd": ("dp-sgd", {}),
        "subspace (random V)": ("subspace", {"projector": "random", "rank": k}),
        "rpdp-sgd": ("rpdp-sgd", {"rank": k}),
        f"pdp-sgd (m={args.public_size}, s={args.period})":
            ("pdp-sgd", {"rank": k, "public_size": args.public_size, "period": args.period}),
        "noisy-adagrad (random V)":
            ("noisy-adagrad", {"projector": "random", "rank": k, "precond_noise_multiplier": 5.0}),
        "dp-adam": ("dp-adam", {}),
    }
    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label, (name, opts) in algorithms.items():
            runs[label] = _Run(config, task, Path(tmp), False, make_algorithm(name, **opts))
        p = runs["dp-sgd"].layout.p
        print(f"text task ({model}), p = {p:,}, k = {k}, batch {args.batch_size}, "
              f"{args.rounds} interleaved rounds, device {args.device}, "
              f"{torch.get_num_threads()} threads")
        for run in runs.values():  # warm-up (vmap tracing, allocator)
            run.train_step(store_row=False)
        times: dict[str, list[float]] = {label: [] for label in runs}
        labels = list(runs)
        for r in range(args.rounds):
            for label in labels[r % len(labels):] + labels[: r % len(labels)]:
                start = time.perf_counter()
                runs[label].train_step(store_row=False)
                times[label].append(time.perf_counter() - start)
    base = statistics.median(times["dp-sgd"])
    print(f"{'optimizer':<32} {'median step (s)':>16} {'ratio to DP-SGD':>16}")
    for label, ts in times.items():
        med = statistics.median(ts)
        print(f"{label:<32} {med:>16.3f} {med / base:>16.3f}")


if __name__ == "__main__":
    main()
