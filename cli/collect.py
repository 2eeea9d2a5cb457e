"""`gradspec collect`: train (DP-SGD or not) and stream clipped gradients into a store."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from cli._common import user_errors

# Options that set a CollectConfig field: option parameter -> field. On --resume only the
# options a user actually passed are compared with (or applied to) the saved run.
SETTINGS = {
    "task": "task", "task_option": "task_options", "params": "params", "mode": "mode",
    "every": "every", "steps": "steps", "epochs": "epochs", "batch_size": "batch_size",
    "sampling": "sampling", "max_grad_norm": "max_grad_norm", "no_clip": "clip",
    "sigma": "noise_multiplier", "epsilon": "target_epsilon", "delta": "delta",
    "accounting": "accounting", "optimizer": "optimizer", "lr": "lr", "dtype": "dtype",
    "backend": "backend", "microbatch": "microbatch", "eval_every": "eval_every",
    "log_every": "log_every", "checkpoint_every": "checkpoint_every",
    "skip_nonfinite": "skip_nonfinite", "seed": "seed", "device": "device", "compressor": "compressor",
}


def _parse_options(items: list[str]) -> dict:
    options = {}
    for item in items:
        if "=" not in item:
            raise ValueError(f"--task-option takes KEY=VALUE, got {item!r}")
        key, value = item.split("=", 1)
        try:
            options[key.replace("-", "_")] = json.loads(value)
        except json.JSONDecodeError:
            options[key.replace("-", "_")] = value
    return options


def training_config(*, task_option: list[str], params: list[str], sigma: float | None,
                    epsilon: float | None, steps: int | None, epochs: float | None, **settings):
    """The CollectConfig of the training options shared by `collect` and `retrain`.

    CLI defaults live here once: sigma 1.0 unless --epsilon, 200 steps unless --epochs.
    """
    from gradspec.collect import CollectConfig

    if sigma is None and epsilon is None:
        sigma = 1.0
    return CollectConfig(
        task_options=_parse_options(task_option), params=tuple(params) or None,
        noise_multiplier=sigma, target_epsilon=epsilon,
        steps=steps if steps is not None or epochs is not None else 200, epochs=epochs, **settings,
    )


def passed_options(ctx: typer.Context, names) -> list[str]:
    """The option parameters among ``names`` that the user gave (not left at their defaults)."""
    # By name: typer may carry its own copy of click's ParameterSource enum.
    given = ("COMMANDLINE", "ENVIRONMENT", "PROMPT")
    return [n for n in names if getattr(ctx.get_parameter_source(n), "name", None) in given]


def resume_settings(ctx: typer.Context, values: dict) -> dict:
    """The CollectConfig fields the user passed on a --resume, with their values."""
    given = {}
    for name in passed_options(ctx, SETTINGS):
        value = values[name]
        if name == "task_option":
            value = _parse_options(value)
        elif name == "params":
            value = tuple(value) or None
        elif name == "no_clip":
            value = not value
        given[SETTINGS[name]] = value
    if "epochs" in given and "steps" not in given:
        given["steps"] = None  # the new length in epochs decides
    return given


@user_errors
def collect_command(
    ctx: typer.Context,
    out: Path = typer.Option(Path("runs/default"), "--out", "-o", help="Run directory (store, metrics, checkpoint)."),
    task: str = typer.Option("text", help="Task: text, cnn, geomedian, lowrank."),
    task_option: list[str] = typer.Option([], "--task-option", "-t", help="Task option KEY=VALUE (repeatable), e.g. -t n_train=2000."),
    params: list[str] = typer.Option([], "--params", help="Parameter name pattern to train and collect (glob or re:REGEX; repeatable). Default: the task's."),
    mode: str = typer.Option("batch", help="batch: each step's average clipped gradient; per-example: every clipped gradient."),
    every: int = typer.Option(1, help="Store every N-th step."),
    steps: int = typer.Option(None, help="Training steps (default 200 unless --epochs)."),
    epochs: float = typer.Option(None, help="Training epochs (instead of --steps)."),
    batch_size: int = typer.Option(64, help="Expected (Poisson) or fixed (shuffle) batch size."),
    sampling: str = typer.Option("poisson", help="poisson or shuffle."),
    max_grad_norm: float = typer.Option(1.0, "--max-grad-norm", "-C", help="Clipping norm C."),
    no_clip: bool = typer.Option(False, "--no-clip", help="Do not clip (non-private runs only)."),
    sigma: float = typer.Option(None, "--sigma", "--noise-multiplier", help="Noise multiplier (0 = non-private). Default 1.0 unless --epsilon."),
    epsilon: float = typer.Option(None, "--epsilon", help="Target epsilon: calibrate sigma to reach it at the end."),
    delta: float = typer.Option(None, help="Delta (default n^-1.1)."),
    accounting: str = typer.Option("pld", help="pld, rdp or rdp-classic."),
    optimizer: str = typer.Option("adam", help="sgd or adam (on the privatised gradient)."),
    lr: float = typer.Option(5e-4, help="Learning rate."),
    dtype: str = typer.Option("float32", help="On-disk dtype: float32, float16, bfloat16."),
    backend: str = typer.Option("vmap", help="Per-example gradients: vmap (torch.func) or hooks (Opacus)."),
    microbatch: int = typer.Option(32, help="Examples per per-example-gradient call (bounds memory)."),
    eval_every: int = typer.Option(50, help="Evaluate every N steps (0: only at the end)."),
    log_every: int = typer.Option(10, help="Log loss and epsilon every N steps."),
    checkpoint_every: int = typer.Option(50, help="Commit rows and checkpoint every N steps."),
    skip_nonfinite: bool = typer.Option(False, "--skip-nonfinite", help="Skip steps with NaN/Inf gradients instead of stopping."),
    seed: int = typer.Option(0, help="Random seed."),
    device: str = typer.Option("cpu", help="cpu, cuda or auto."),
    compressor: str = typer.Option(None, help="Store compression: zstd or blosc (default none)."),
    resume: bool = typer.Option(False, "--resume", help="Continue the run in --out from its last checkpoint. Options given with it must match the run, except the run's length (--steps/--epochs), --eval-every, --log-every, --checkpoint-every, --skip-nonfinite, --microbatch."),
    allow_larger_epsilon: bool = typer.Option(False, "--allow-larger-epsilon", help="With --resume: run more steps than the sigma of an --epsilon run was calibrated for (its epsilon then exceeds the target)."),
    stop_after: int = typer.Option(None, "--stop-after", help="Stop (checkpointed) after N steps of this call; continue later with --resume."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing run in --out."),
    no_progress: bool = typer.Option(False, "--no-progress", help="No progress bar."),
) -> None:
    """Train a model and stream clipped gradients into OUT/gradients.zarr."""
    from gradspec.collect import collect, merge_resume, read_run_config

    if resume:
        # (with --overwrite too, collect() refuses the pair before reading anything)
        config = None if overwrite else merge_resume(read_run_config(out), resume_settings(ctx, ctx.params))
    else:
        if allow_larger_epsilon:
            raise ValueError("--allow-larger-epsilon applies to --resume (extending a run); drop it")
        config = training_config(
            task=task, task_option=task_option, params=params, mode=mode, every=every, steps=steps,
            epochs=epochs, batch_size=batch_size, sampling=sampling, max_grad_norm=max_grad_norm,
            clip=not no_clip, sigma=sigma, epsilon=epsilon, delta=delta, accounting=accounting,
            optimizer=optimizer, lr=lr, dtype=dtype, backend=backend, microbatch=microbatch,
            eval_every=eval_every, log_every=log_every, checkpoint_every=checkpoint_every,
            skip_nonfinite=skip_nonfinite, seed=seed, device=device, compressor=compressor,
        )
    result = collect(config, out=out, resume=resume, overwrite=overwrite, progress=not no_progress,
                     stop_after=stop_after, allow_larger_epsilon=allow_larger_epsilon)
    eps = "inf (non-private)" if result.epsilon == float("inf") else f"{result.epsilon:.3f}"
    typer.echo(f"store    {result.store}  ({result.rows} rows)")
    typer.echo(f"steps    {result.steps}   q = {result.sample_rate:.4g}   sigma = {result.noise_multiplier:.4g}")
    typer.echo(f"privacy  epsilon = {eps} at delta = {result.delta:.3g}")
    if result.final_metrics:
        typer.echo("eval     " + "  ".join(f"{k} = {v:.4f}" for k, v in result.final_metrics.items()))
    typer.echo(f"metrics  {result.metrics}")
