"""Ghost clipping on a GPT-2 at DistilGPT-2's shape (82M parameters): one DP step's clipped
sum vs a plain (non-private) step, vs materialised per-example gradients (vmap) and Opacus's
ghost clipping, interleaved in one process (issue 22, part 4: ghost ≤ 1.5× a plain step).

The model is ``GPT2ForSequenceClassification`` built from a config with DistilGPT-2's shape
(6 layers, width 768, 12 heads, vocabulary 50,257, 1,024 positions; its weights random —
the time of a step does not depend on them, and nothing is downloaded), every parameter
selected (81.9M: token and position embeddings, the transformers ``Conv1D`` projections,
LayerNorms, the 2-class score head). Each configuration computes the vector a DP-SGD step
needs before noise on the same batch (B random token sequences of length T):
``sum_i c_i g_i`` (the plain sum for the non-private step); the relative difference from
ours (ghost) is printed so the rows are the same computation.

Usage:
    python benchmarks/bench_ghost_gpt2.py [--batch 16] [--seq 128] [--repeats 3] [--threads N]
        [--methods nonprivate,ghost,opacus-ghost,vmap] [--out docs/bench_ghost_gpt2.txt]
"""

from __future__ import annotations

import argparse
import copy
import datetime
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's gradspec

C = 1.0


def build(batch: int, seq: int, seed: int = 0):
    import torch
    from transformers import GPT2Config, GPT2ForSequenceClassification

    torch.manual_seed(seed)
    cfg = GPT2Config(n_layer=6, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024, num_labels=2,
                     pad_token_id=50256, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2ForSequenceClassification(cfg).eval()
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 50000, (batch, seq), generator=g)
    mask = torch.ones(batch, seq, dtype=torch.long)
    labels = torch.randint(0, 2, (batch,), generator=g)
    return model, {"input_ids": ids, "attention_mask": mask, "labels": labels}


def forward(model, batch):
    return model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits


def loss(logits, batch):
    import torch

    return torch.nn.functional.cross_entropy(logits, batch["labels"], reduction="none")


def make_step(method: str, model, batch, names):
    import torch

    from gradspec.privacy import clip_factors
    from gradspec.train import GhostClipping, PerExampleGradients

    params = [model.get_parameter(n) for n in names]

    def flat_grads():
        out = torch.cat([p.grad.reshape(-1) for p in params])
        for p in params:
            p.grad = None
        return out

    if method == "nonprivate":
        def step():
            loss(forward(model, batch), batch).sum().backward()
            return flat_grads()
    elif method == "ghost":
        ghost = GhostClipping(model, forward, loss, names)  # its first call runs the batch-of-one check

        def step():
            return ghost(batch, C).total
    elif method == "vmap":
        pe = PerExampleGradients(model, forward, loss, names, backend="vmap", microbatch=2, check=False)

        def step():
            total = torch.zeros(pe.p)
            for grads, _ in pe.iter_microbatches(batch):
                total += (grads * clip_factors(grads.norm(dim=1), C)[:, None]).sum(0)
            return total
    elif method == "opacus-ghost":
        from opacus.grad_sample import GradSampleModuleFastGradientClipping
        from opacus.optimizers import DPOptimizerFastGradientClipping
        from opacus.utils.fast_gradient_clipping_utils import DPLossFastGradientClipping

        model.train()  # Opacus records activations only in train mode (every dropout here is 0)
        b, t = batch["input_ids"].shape
        pos = torch.arange(t).repeat(b, 1)  # per-example position ids (Opacus's embedding sampler)
        gsm = GradSampleModuleFastGradientClipping(model, batch_first=True, loss_reduction="sum",
                                                   max_grad_norm=C, use_ghost_clipping=True)
        opt = DPOptimizerFastGradientClipping(torch.optim.SGD(params, lr=0.0), noise_multiplier=0.0,
                                              max_grad_norm=C, expected_batch_size=b, loss_reduction="sum")
        crit = DPLossFastGradientClipping(gsm, opt, torch.nn.CrossEntropyLoss(reduction="sum"), "sum")

        def step():
            logits = gsm(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                         position_ids=pos).logits
            crit(logits, batch["labels"]).backward()
            return flat_grads()
    else:
        raise ValueError(method)
    return step


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--methods", default="nonprivate,ghost,opacus-ghost,vmap")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    model, batch = build(args.batch, args.seq)
    names = [n for n, _ in model.named_parameters()]
    p = sum(model.get_parameter(n).numel() for n in names)
    load0 = os.getloadavg()[0]
    steps, times, outs, errors = {}, {}, {}, {}
    for m in args.methods.split(","):
        mdl = copy.deepcopy(model) if m.startswith("opacus") else model
        try:
            steps[m] = make_step(m, mdl, batch, names)
            outs[m] = steps[m]().detach().double()
            times[m] = []
        except Exception as err:  # noqa: BLE001 - reported in the table
            errors[m] = f"{type(err).__name__}: {err}"[:160]
            steps.pop(m, None)
        print(f"[bench] warm {m}", file=sys.stderr, flush=True)
    for r in range(args.repeats):
        for m, step in steps.items():
            t0 = time.perf_counter()
            step()
            times[m].append(time.perf_counter() - t0)
        print(f"[bench] round {r + 1}/{args.repeats}", file=sys.stderr, flush=True)
    base = statistics.median(times["nonprivate"]) if "nonprivate" in times else float("nan")
    ref = outs.get("ghost")
    lines = [f"# bench_ghost_gpt2: one DP step's clipped sum, GPT-2 at DistilGPT-2's shape, batch {args.batch} x "
             f"T = {args.seq}",
             f"# command: python benchmarks/bench_ghost_gpt2.py --batch {args.batch} --seq {args.seq} "
             f"--repeats {args.repeats}" + (f" --threads {args.threads}" if args.threads else ""),
             f"# date: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC; machine: {platform.machine()}, "
             f"{os.cpu_count()} cores, torch threads {torch.get_num_threads()}, load average before {load0:.1f}; "
             f"torch {torch.__version__}",
             f"# p = {p:,} (every parameter); C = {C}; time: every method once per round, {args.repeats} rounds "
             "after a warm-up, median; rel.diff = ||sum - sum_ghost|| / ||sum_ghost||",
             "", f"{'method':<14}{'time s':>9}{'x nonpriv':>11}{'rel.diff':>11}"]
    for m in times:
        t = statistics.median(times[m])
        rd = float((outs[m] - ref).norm() / ref.norm()) if ref is not None else float("nan")
        lines.append(f"{m:<14}{t:>9.3f}{t / base:>11.2f}{rd:>11.1e}")
    for m, e in errors.items():
        lines.append(f"{m:<14} refused/failed: {e}")
    lines.append(f"# load average after: {os.getloadavg()[0]:.1f}")
    from _emit import emit  # benchmarks/_emit.py (this script's folder is on sys.path)

    emit(lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
