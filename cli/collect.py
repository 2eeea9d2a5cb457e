"""`gradspec collect`: train (DP-SGD or not) and stream clipped gradients into a store."""

from __future__ import annotations

from pathlib import Path

import typer

from cli import _options as opt
from cli._common import user_errors
from gradspec import Accounting, CollectMode, GradDtype, PerExampleBackend, Sampling


@user_errors
def collect_command(
    ctx: typer.Context,
    out: Path = typer.Option(Path("runs/default"), "--out", "-o", help="Run directory (store, metrics, checkpoint)."),
    task: opt.Task = "text",
    task_option: opt.TaskOption = [],  # noqa: B006 (typer copies it)
    params: opt.Params = [],  # noqa: B006
    mode: str = typer.Option(CollectMode.BATCH.value, help=f"{opt.choices(CollectMode)}: batch stores each step's average clipped gradient, per-example every clipped gradient."),
    per_example: bool = typer.Option(False, "--per-example", help="Store every clipped per-example gradient (--mode per-example)."),
    every: int = typer.Option(1, help="Store every N-th step."),
    steps: opt.Steps = None,
    epochs: opt.Epochs = None,
    batch_size: opt.BatchSize = 64,
    sampling: opt.SamplingChoice = Sampling.POISSON.value,
    max_grad_norm: opt.MaxGradNorm = 1.0,
    no_clip: bool = typer.Option(False, "--no-clip", help="Do not clip (non-private runs only)."),
    noise_multiplier: opt.NoiseMultiplier = None,
    sigma: opt.SigmaAlias = None,
    epsilon: opt.Epsilon = None,
    delta: opt.Delta = None,
    accounting: opt.AccountingChoice = Accounting.PLD.value,
    optimizer: opt.Optimizer = "adam",
    lr: opt.Lr = 5e-4,
    dtype: str = typer.Option(GradDtype.FLOAT32.value, help=f"On-disk dtype: {opt.choices(GradDtype)}."),
    backend: opt.Backend = PerExampleBackend.AUTO.value,
    microbatch: opt.Microbatch = 32,
    eval_every: opt.EvalEvery = 50,
    log_every: opt.LogEvery = 10,
    checkpoint_every: int = typer.Option(50, help="Commit rows and checkpoint every N steps."),
    skip_nonfinite: bool = typer.Option(False, "--skip-nonfinite", help="Skip steps with NaN/Inf gradients instead of stopping (non-private runs only: a skip is a decision on the private data no epsilon covers)."),
    seed: opt.Seed = 0,
    task_seed: opt.TaskSeed = None,
    device: opt.Device = "cpu",
    compressor: str = typer.Option(None, help="Store compression: zstd or blosc (default none)."),
    sketch: opt.Sketch = None,
    sketch_seed: opt.SketchSeed = 0,
    sketch_blocks: opt.SketchBlocks = 8,
    sketch_weights: opt.SketchWeights = "energy",
    resume: bool = typer.Option(False, "--resume", help="Continue the run in --out from its last checkpoint. Options given with it must match the run, except the run's length (--steps/--epochs), --eval-every, --log-every, --checkpoint-every, --skip-nonfinite, --microbatch."),
    allow_larger_epsilon: bool = typer.Option(False, "--allow-larger-epsilon", help="With --resume: run more steps than the noise multiplier of an --epsilon run was calibrated for (its epsilon then exceeds the target)."),
    stop_after: int = typer.Option(None, "--stop-after", help="Stop (checkpointed) after N steps of this call; continue later with --resume."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing run in --out."),
    no_progress: bool = typer.Option(False, "--no-progress", help="No progress bar."),
) -> None:
    """Train a model and stream clipped gradients into OUT/gradients.zarr.

    On N processes or GPUs: torchrun --nproc_per_node N --no-python gradspec collect ...
    (rank 0 writes the one store).
    """
    from gradspec.collect import collect, merge_resume, read_run_config
    from gradspec.privacy import rate_text

    noise_multiplier = opt.deprecated_alias(noise_multiplier, sigma, option="--noise-multiplier", alias="--sigma")
    if per_example:
        if opt.passed_options(ctx, ["mode"]) and mode != CollectMode.PER_EXAMPLE.value:
            raise ValueError(f"--per-example and --mode {mode} contradict each other: give one of them")
        mode = CollectMode.PER_EXAMPLE.value
    if sketch is None and opt.passed_options(ctx, ["sketch_seed", "sketch_blocks", "sketch_weights"]):
        raise ValueError("--sketch-seed, --sketch-blocks and --sketch-weights set up a --sketch M: add --sketch, "
                         "or drop them")
    if resume:
        # (with --overwrite too, collect() refuses the pair before reading anything)
        given = opt.resume_settings(ctx, ctx.params)
        if per_example:
            given.setdefault("mode", CollectMode.PER_EXAMPLE.value)
        config = None if overwrite else merge_resume(read_run_config(out), given)
    else:
        if allow_larger_epsilon:
            raise ValueError("--allow-larger-epsilon applies to --resume (extending a run); drop it")
        config = opt.training_config(
            task=task, task_option=task_option, params=params, mode=mode, every=every, steps=steps,
            epochs=epochs, batch_size=batch_size, sampling=sampling, max_grad_norm=max_grad_norm,
            clip=not no_clip, noise_multiplier=noise_multiplier, epsilon=epsilon, delta=delta, accounting=accounting,
            optimizer=optimizer, lr=lr, dtype=dtype, backend=backend, microbatch=microbatch,
            eval_every=eval_every, log_every=log_every, checkpoint_every=checkpoint_every,
            skip_nonfinite=skip_nonfinite, seed=seed, task_seed=task_seed, device=device, compressor=compressor,
            sketch=sketch, sketch_seed=sketch_seed, sketch_blocks=sketch_blocks, sketch_weights=sketch_weights,
        )
    result = collect(config, out=out, resume=resume, overwrite=overwrite, progress=not no_progress,
                     stop_after=stop_after, allow_larger_epsilon=allow_larger_epsilon)
    if result.rank != 0:  # another rank of a torchrun run: rank 0 wrote the store and reports it
        return
    eps = "inf (non-private)" if result.epsilon == float("inf") else f"{result.epsilon:.3f}"
    typer.echo(f"store    {result.store}  ({result.rows} rows)")
    typer.echo(f"steps    {result.steps}   {rate_text(result.sample_rate, result.accounted_sample_rate)}   noise multiplier = {result.noise_multiplier:.4g}")
    typer.echo(f"privacy  epsilon = {eps} at delta = {result.delta:.3g}")
    if result.final_metrics:
        typer.echo("eval     " + "  ".join(f"{k} = {v:.4f}" for k, v in result.final_metrics.items()))
    typer.echo(f"metrics  {result.metrics}")
