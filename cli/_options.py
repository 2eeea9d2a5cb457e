"""The training options shared by `gradspec collect` and `gradspec retrain`, declared once.

Each option is an ``Annotated`` alias carrying its flags and help; a command gives the
default in its own signature (``lr: Lr = 5e-4``), so commands can differ in defaults but
never in how an option is spelled or what it means. Choices come from the library's
StrEnums (the flat ``gradspec`` API): the help lists their values, and the library parses
them (``parse_choice``), so a typo fails with its one-line message naming the choices.

:func:`training_config` builds the run's ``CollectConfig`` from these options;
:func:`resume_settings` reads back the ones a user passed with ``--resume``.
"""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Annotated

import typer

from gradspec import Accounting, PerExampleBackend, Sampling


def choices(enum: type[StrEnum]) -> str:
    """The values of a choice as help text: ``pld, rdp or rdp-classic``."""
    values = [m.value for m in enum]
    return values[0] if len(values) == 1 else f"{', '.join(values[:-1])} or {values[-1]}"


# ---------------------------------------------------------------------- the shared options
#: The registered tasks, written out: the registry imports torch, and help must not
#: (tests/cli/test_collect_info.py checks this list against ``gradspec.tasks.available_tasks``).
TASKS = ("ballglm", "bow", "cnn", "geomedian", "lowrank", "sparselinear", "text")
Task = Annotated[str, typer.Option("--task", help=f"Task: {', '.join(TASKS)}.")]
TaskOption = Annotated[list[str], typer.Option(
    "--task-option", "-t", help="Task option KEY=VALUE (repeatable), e.g. -t n_train=2000.")]
Params = Annotated[list[str], typer.Option(
    "--params", help="Parameter name pattern to train (glob or re:REGEX; repeatable). Default: the task's.")]
Steps = Annotated[int, typer.Option("--steps", help="Training steps (default 200 unless --epochs).")]
Epochs = Annotated[float, typer.Option("--epochs", help="Training epochs (instead of --steps).")]
BatchSize = Annotated[int, typer.Option(
    "--batch-size", help="Expected (Poisson) or fixed (shuffle) batch size.")]
SamplingChoice = Annotated[str, typer.Option("--sampling", help=f"{choices(Sampling)}.")]
MaxGradNorm = Annotated[float, typer.Option("--max-grad-norm", "-C", help="Clipping norm C.")]
NoiseMultiplier = Annotated[float, typer.Option(
    "--noise-multiplier",
    help="Noise multiplier z: noise std z*C on the clipped sum (0 = non-private). Default 1.0 "
         "unless --epsilon. (--sigma is a deprecated alias: sigma means singular values.)")]
SigmaAlias = Annotated[float, typer.Option(
    "--sigma", hidden=True, help="Deprecated alias of --noise-multiplier.")]
Epsilon = Annotated[float, typer.Option(
    "--epsilon", help="Target epsilon: calibrate the noise multiplier to reach it at the end.")]
Delta = Annotated[float, typer.Option("--delta", help="Delta (default n^-1.1).")]
AccountingChoice = Annotated[str, typer.Option("--accounting", help=f"{choices(Accounting)}.")]
Optimizer = Annotated[str, typer.Option("--optimizer", help="sgd or adam (on the privatised gradient).")]
Lr = Annotated[float, typer.Option("--lr", help="Learning rate.")]
Backend = Annotated[str, typer.Option(
    "--backend", help=f"Per-example engine, {choices(PerExampleBackend)}: vmap (torch.func), hooks (Opacus), "
    "ghost (ghost clipping: norms and the clipped sum without per-example rows; --mode batch (or --per-example --sketch) and "
    "optimizers that use only the clipped sum; several times faster, a fraction of the memory), auto (the default: ghost "
    "where it applies and every selected layer has a ghost rule, else vmap; the engine used is printed and "
    "recorded in the store as per_example_engine).")]
#: retrain's --backend: no store, no --mode, --per-example or --sketch (was: collect's words).
RetrainBackend = Annotated[str, typer.Option(
    "--backend", help=f"Per-example engine, {choices(PerExampleBackend)}: vmap (torch.func), hooks (Opacus), "
    "ghost (ghost clipping: the clipped sum without per-example gradients, for algorithms that use only the "
    "clipped sum, not adadps; several times faster, a fraction of the memory), auto (the default: ghost where "
    "the algorithm allows it and every trained layer has a ghost rule, else vmap; the engine used is logged "
    "and recorded in the run's run.json as per_example_engine).")]
Microbatch = Annotated[int, typer.Option(
    "--microbatch", help="Examples per per-example-gradient call (bounds memory).")]
EvalEvery = Annotated[int, typer.Option("--eval-every", help="Evaluate every N steps (0: only at the end).")]
LogEvery = Annotated[int, typer.Option("--log-every", help="Log loss and epsilon every N steps.")]
Seed = Annotated[int, typer.Option("--seed", help="Random seed.")]
TaskSeed = Annotated[int, typer.Option(
    "--task-seed", help="Seed of the task alone (its data, a random head); default --seed. Fix it to vary "
    "only the batches and the noise across --seed(s).")]
Device = Annotated[str, typer.Option("--device", help="cpu, cuda or auto.")]
Sketch = Annotated[int, typer.Option(
    "--sketch", metavar="M", help="Store each row as an M-column seeded random projection (Kronecker/CountSketch "
    "factors per layer; M below p): each step's mean clipped gradient (any backend, torchrun too), or with "
    "--per-example each clipped per-example gradient (ghost backend; exact norms and clipping). --params defaults "
    "to every trainable parameter. The plan is saved in the store.")]
SketchSeed = Annotated[int, typer.Option("--sketch-seed", help="Seed of the --sketch plan's random factors.")]
SketchBlocks = Annotated[int, typer.Option(
    "--sketch-blocks", help="Independent blocks J >= 2 of the --sketch (each a full sketch with M/J columns).")]
SketchWeights = Annotated[str, typer.Option(
    "--sketch-weights", help="How the --sketch plan splits its columns among the parameters: energy (by each "
    "parameter's clipped-gradient energy in a warm-up batch, the first --batch-size examples at the starting "
    "weights) or sqrt-size (by sqrt(numel), no data seen).")]

# Options that set a CollectConfig field: option parameter -> field ("sigma" is the
# deprecated alias of --noise-multiplier). On --resume only the
# options a user actually passed are compared with (or applied to) the saved run.
SETTINGS = {
    "task": "task", "task_option": "task_options", "params": "params", "mode": "mode",
    "every": "every", "steps": "steps", "epochs": "epochs", "batch_size": "batch_size",
    "sampling": "sampling", "max_grad_norm": "max_grad_norm", "no_clip": "clip",
    "noise_multiplier": "noise_multiplier", "sigma": "noise_multiplier", "epsilon": "target_epsilon", "delta": "delta",
    "accounting": "accounting", "optimizer": "optimizer", "lr": "lr", "dtype": "dtype",
    "backend": "backend", "microbatch": "microbatch", "eval_every": "eval_every",
    "log_every": "log_every", "checkpoint_every": "checkpoint_every",
    "skip_nonfinite": "skip_nonfinite", "seed": "seed", "task_seed": "task_seed", "device": "device", "compressor": "compressor",
    "sketch": "sketch", "sketch_seed": "sketch_seed", "sketch_blocks": "sketch_blocks",
    "sketch_weights": "sketch_weights",
}


def parse_task_options(items: list[str]) -> dict:
    """``--task-option KEY=VALUE`` items as a dict (values read as JSON where they parse)."""
    options = {}
    given = {}
    for item in items:
        if "=" not in item:
            raise ValueError(f"--task-option takes KEY=VALUE, got {item!r}")
        key, value = item.split("=", 1)
        name = key.replace("-", "_")
        if name in options:  # was: the last value kept without a word
            raise ValueError(
                f"task option {name!r} is given twice (-t {given[name]}, -t {item}); give it once"
            )
        given[name] = item
        try:
            options[name] = json.loads(value)
        except json.JSONDecodeError:
            options[name] = value
    return options


def deprecated_alias(value, alias_value, *, option: str, alias: str):
    """The value of an option given by its name or by its deprecated alias (which warns).

    Giving both is an error; giving the alias prints one ``warning:`` line on stderr.
    """
    if alias_value is None:
        return value
    if value is not None:
        raise ValueError(f"give {option} only ({alias} is its deprecated alias), not both")
    typer.echo(f"warning: {alias} is deprecated, use {option} (sigma means singular values in gradspec)",
               err=True)
    return alias_value


def training_config(*, task_option: list[str], params: list[str], noise_multiplier: float | None,
                    epsilon: float | None, steps: int | None, epochs: float | None, **settings):
    """The CollectConfig of the training options shared by `collect` and `retrain`.

    CLI defaults live here once: noise multiplier 1.0 unless --epsilon, 200 steps unless
    --epochs.
    """
    from gradspec.collect import CollectConfig

    if noise_multiplier is None and epsilon is None:
        noise_multiplier = 1.0
    return CollectConfig(
        task_options=parse_task_options(task_option), params=tuple(params) or None,
        noise_multiplier=noise_multiplier, target_epsilon=epsilon,
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
            value = parse_task_options(value)
        elif name == "params":
            value = tuple(value) or None
        elif name == "no_clip":
            value = not value
        given[SETTINGS[name]] = value
    if "epochs" in given and "steps" not in given:
        given["steps"] = None  # the new length in epochs decides
    return given
