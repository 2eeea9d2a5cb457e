"""`gradspec retrain`: train with a private optimizer (one run, or a sweep) and report epsilon."""

from __future__ import annotations

from pathlib import Path

import typer

from cli import _options as opt
from cli._common import user_errors
from gradspec import Accounting, Sampling


def _csv(text: str | None, cast) -> list:
    if not text:
        return []
    try:
        return [cast(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"expected a comma-separated list of numbers, got {text!r}") from None


def _check_applicable(names: list[str], given: dict[str, object]) -> None:
    """Refuse an option that none of the chosen algorithms uses (it would be ignored)."""
    from gradspec.optim import PROJECTED, Algorithm

    projected = set(PROJECTED)
    users = {
        "--projector": projected, "--no-layout-check": projected, "--period": projected,
        "--public-size": projected | {Algorithm.ADADPS}, "--noise-in": {Algorithm.SUBSPACE},
        "--start-epoch": {Algorithm.PDP_SGD, Algorithm.RPDP_SGD},
        "--precond-noise-multiplier": {Algorithm.NOISY_ADAGRAD}, "--diagonal": {Algorithm.NOISY_ADAGRAD},
        "--rule": {Algorithm.ADADPS}, "--side-information": {Algorithm.ADADPS},
        "--rank": projected, "--ranks": projected,
    }
    chosen = {Algorithm(n) for n in names}
    for option, value in given.items():
        if value is not None and value is not False and not chosen & users[option]:
            valid = ", ".join(sorted(str(a) for a in users[option]))
            raise ValueError(f"{option} applies to {valid}, not to {', '.join(names)}: it would be ignored")


@user_errors
def retrain_command(
    ctx: typer.Context,
    out: Path = typer.Option(Path("runs/retrain"), "--out", "-o", help="Run (or sweep) directory."),
    algorithm: list[str] = typer.Option(["subspace"], "--algorithm", "-a", help="dp-sgd, subspace, complement, pdp-sgd, rpdp-sgd, noisy-adagrad, adadps, dp-adam (repeatable with --sweep). subspace projects the clipped gradient sum onto the top-k subspace of --projector, before noise; complement projects that subspace out, g - V(V^T g), at the same place, noise in all p dims (Song, Ahn & Yun 2025's control)."),
    projector: str = typer.Option(None, "--projector", metavar="SPECTRUM|public|random", help="A spectrum store (gradspec pca output), or 'public' / 'random'. Default per algorithm."),
    no_layout_check: bool = typer.Option(False, "--no-layout-check", help="Use a spectrum store that does not record its parameters, comparing p only."),
    rank: int = typer.Option(None, "--rank", "-k", help="Subspace rank k (one run; a sweep takes --ranks)."),
    sweep: bool = typer.Option(False, "--sweep", help="Run a grid over --ranks, --seeds and --noise-multipliers or --epsilons."),
    ranks: str = typer.Option(None, help="Ranks of a sweep (comma-separated; default 10,20,100)."),
    seeds: str = typer.Option(None, help="Seeds of a sweep (comma-separated; default --seed)."),
    noise_multipliers: str = typer.Option(None, "--noise-multipliers", help="Noise multipliers of a sweep (comma-separated; --sigmas is a deprecated alias)."),
    sigmas: str = typer.Option(None, "--sigmas", hidden=True, help="Deprecated alias of --noise-multipliers."),
    epsilons: str = typer.Option(None, help="Target epsilons of a sweep (comma-separated)."),
    noise_in: str = typer.Option(None, help="subspace retraining: noise in all p dims (full, default) or the subspace."),
    public_size: int = typer.Option(None, help="Public examples m (public projector, AdaDPS; default 100), drawn from the task's public split (-t n_public=M)."),
    period: int = typer.Option(None, help="Recompute the public subspace every s steps (default 1)."),
    start_epoch: float = typer.Option(None, help="PDP-SGD: epochs of plain DP-SGD before projecting (default 0)."),
    precond_noise_multiplier: float = typer.Option(None, "--precond-noise-multiplier", help="noisy-adagrad: noise multiplier of the preconditioner (default 1; --precond-sigma is a deprecated alias)."),
    precond_sigma: float = typer.Option(None, "--precond-sigma", hidden=True, help="Deprecated alias of --precond-noise-multiplier."),
    diagonal: bool = typer.Option(False, "--diagonal", help="noisy-adagrad: diagonal preconditioner."),
    rule: str = typer.Option(None, help="AdaDPS preconditioner: rmsprop (default), adam, adagrad (public data), or fixed (side information)."),
    side_information: str = typer.Option(None, "--side-information", metavar="FILE|frequency", help="AdaDPS without public data (Option 2): a file of p positive values (.npy, .pt, .txt), or 'frequency' (feature/token frequencies of the public examples)."),
    task: opt.Task = "text",
    task_option: opt.TaskOption = [],  # noqa: B006 (typer copies it)
    params: opt.Params = [],  # noqa: B006
    steps: opt.Steps = None,
    epochs: opt.Epochs = None,
    batch_size: opt.BatchSize = 64,
    sampling: opt.SamplingChoice = Sampling.POISSON.value,
    max_grad_norm: opt.MaxGradNorm = 1.0,
    noise_multiplier: opt.NoiseMultiplier = None,
    sigma: opt.SigmaAlias = None,
    epsilon: opt.Epsilon = None,
    delta: opt.Delta = None,
    accounting: opt.AccountingChoice = Accounting.PLD.value,
    optimizer: opt.Optimizer = "sgd",  # retraining's default (collect's is adam); noisy-adagrad and dp-adam use sgd
    lr: opt.Lr = 0.05,
    microbatch: opt.Microbatch = 32,
    backend: opt.RetrainBackend = "auto",
    eval_every: opt.EvalEvery = 20,
    log_every: opt.LogEvery = 10,
    seed: opt.Seed = 0,  # also seeds the random projector and the public examples drawn
    task_seed: opt.TaskSeed = None,
    device: opt.Device = "cpu",
    train_metrics: bool = typer.Option(True, "--train-metrics/--no-train-metrics", help="Also report loss and accuracy on the training set at the end."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace existing runs."),
    resume: bool = typer.Option(False, "--resume", help="Continue the interrupted run in --out from its last checkpoint (give the settings it was started with; other ones are refused). A sweep continues its interrupted runs by itself."),
    plot: bool = typer.Option(True, "--plot/--no-plot", help="Write figures of a sweep."),
    no_progress: bool = typer.Option(False, "--no-progress", help="No progress bar."),
) -> None:
    """Retrain in a subspace or its complement, or run PDP-SGD, noisy AdaGrad, AdaDPS, DP-Adam, DP-SGD."""
    from gradspec import parse_choice
    from gradspec.optim import PROJECTED, Algorithm, ProjectorKind
    from gradspec.optim import retrain as run_retrain
    from gradspec.optim import sweep as run_sweep

    noise_multiplier = opt.deprecated_alias(noise_multiplier, sigma, option="--noise-multiplier", alias="--sigma")
    noise_multipliers = opt.deprecated_alias(noise_multipliers, sigmas, option="--noise-multipliers", alias="--sigmas")
    precond_noise_multiplier = opt.deprecated_alias(precond_noise_multiplier, precond_sigma,
                                                option="--precond-noise-multiplier", alias="--precond-sigma")
    if noise_multiplier is not None and epsilon is not None:
        raise ValueError("give --noise-multiplier or --epsilon, not both")
    if steps is not None and epochs is not None:
        raise ValueError("give --steps or --epochs, not both")
    names = [str(parse_choice(Algorithm, a, "algorithm")) for a in algorithm]
    if resume and sweep:
        raise ValueError("--resume is for one run: a --sweep reuses its finished runs and continues its interrupted "
                         "ones by itself")
    if not sweep:
        if len(names) != 1:
            raise ValueError("give one --algorithm, or --sweep to run several")
        for option, value in (("--ranks", ranks), ("--seeds", seeds),
                              ("--noise-multipliers", noise_multipliers), ("--epsilons", epsilons)):
            if value is not None:
                raise ValueError(f"{option} is for --sweep; one run takes --rank, --seed, --noise-multiplier, "
                                 "--epsilon")
    elif rank is not None:
        raise ValueError("a sweep takes its ranks from --ranks, not --rank")
    _check_applicable(names, {
        "--projector": projector, "--no-layout-check": no_layout_check, "--period": period,
        "--public-size": public_size, "--noise-in": noise_in, "--start-epoch": start_epoch,
        "--precond-noise-multiplier": precond_noise_multiplier, "--diagonal": diagonal, "--rule": rule,
        "--side-information": side_information, "--rank": rank, "--ranks": ranks,
    })
    if projector is not None and projector != "public":  # a spectrum or random: no public subspace
        from gradspec.optim import Algorithm

        used = {"--period": period, "--public-size": None if Algorithm.ADADPS.value in names else public_size}
        for option, value in used.items():
            if value is not None:
                raise ValueError(f"{option} describes the public projector (recomputed from public examples), "
                                 f"not --projector {projector}: it would be ignored")

    if projector is not None and projector not in set(ProjectorKind) and "task" not in opt.passed_options(ctx, ["task"]):
        _same_task_as_spectrum(projector, task)

    config = opt.training_config(
        task=task, task_option=task_option, params=params, steps=steps, epochs=epochs,
        batch_size=batch_size, sampling=sampling, max_grad_norm=max_grad_norm,
        noise_multiplier=noise_multiplier, epsilon=epsilon, delta=delta, accounting=accounting, optimizer=optimizer, lr=lr,
        microbatch=microbatch, eval_every=eval_every, log_every=log_every,
        checkpoint_every=max(eval_every, 50), seed=seed, task_seed=task_seed, device=device, backend=backend,
    )

    def options(name: str) -> dict:
        # No "seed" here: retrain/sweep take it from each run's seed, so the random
        # projector and the public examples differ across the seeds of a sweep.
        alg = Algorithm(name)
        opts: dict = {}
        if alg in PROJECTED:
            if projector is not None and projector not in set(ProjectorKind):
                opts.update(projector="spectrum", spectrum=projector)
            elif projector is not None:
                opts["projector"] = projector
            opts.update(public_size=100 if public_size is None else public_size,
                        period=1 if period is None else period)
            if no_layout_check:
                opts["check_layout"] = False
            if rank is not None:
                opts["rank"] = rank
        if alg == Algorithm.SUBSPACE:
            opts["noise"] = noise_in or "full"
        elif alg in (Algorithm.PDP_SGD, Algorithm.RPDP_SGD):
            opts["start_epoch"] = 0.0 if start_epoch is None else start_epoch
        elif alg == Algorithm.NOISY_ADAGRAD:
            opts.update(precond_noise_multiplier=1.0 if precond_noise_multiplier is None else precond_noise_multiplier,
                        diagonal=diagonal)
        elif alg == Algorithm.ADADPS:
            opts.update(public_size=100 if public_size is None else public_size)
            if rule is not None:
                opts["rule"] = rule
            if side_information is not None:
                opts["side_information"] = side_information
        return opts

    if not sweep:
        res = run_retrain(config=config, algorithm=names[0], options=options(names[0]), out=out, resume=resume,
                          overwrite=overwrite, progress=not no_progress, train_metrics=train_metrics)
        eps = "inf (non-private)" if res.epsilon == float("inf") else f"{res.epsilon:.3f}"
        if not res.dp_guarantee and res.epsilon != float("inf"):
            eps += (" (gradient noise only; NOT a DP guarantee: the subspace comes from noise-free "
                    "gradients of the private training data)")
        typer.echo(f"run      {res.out}  ({res.algorithm}, k = {res.rank}, {res.steps} steps)")
        typer.echo(f"privacy  epsilon = {eps} at delta = {res.delta:.3g}   noise multiplier = {res.noise_multiplier:.4g}")
        if "without subsampling amplification" in res.accounting:
            typer.echo(f"         accounting: {res.accounting}")
        if not res.dp_guarantee:
            typer.echo(f"         {res.dp_caveat}")
        final = res.final_metrics
        held = {k: v for k, v in final.items() if k.startswith("eval_") and k not in
                ("eval_examples", "eval_accuracy_se")}
        if held:
            note = f"   (n = {int(final['eval_examples'])}"
            note += f", accuracy se {final['eval_accuracy_se']:.4f})" if "eval_accuracy_se" in final else ")"
            typer.echo("eval     " + "  ".join(f"{k} = {v:.4f}" for k, v in held.items()) + note)
        train = {k: v for k, v in final.items() if k.startswith("train_")}
        if train:
            typer.echo("train    " + "  ".join(f"{k} = {v:.4f}" for k, v in train.items()))
        public = res.hooks.get("projector", res.hooks) if isinstance(res.hooks, dict) else {}
        if public.get("public_size"):
            typer.echo(f"public   {public['public_size']} examples of the task's public split; "
                       f"their ids in {res.out / 'retrain.json'}")
        return
    rows = run_sweep(
        config=config, algorithms=[(n, options(n)) for n in names], out=out,
        ranks=_csv(ranks or "10,20,100", int), seeds=_csv(seeds, int) or [seed],
        noise_multipliers=_csv(noise_multipliers, float), epsilons=_csv(epsilons, float),
        overwrite=overwrite, progress=not no_progress, train_metrics=train_metrics,
    )
    typer.echo(f"sweep    {len(rows)} runs in {out}; summary: {out / 'summary.csv'}")
    if plot:
        from gradspec.plot import save_sweep_figures

        for path in save_sweep_figures(rows, out):
            typer.echo(f"figure   {path}")


def _same_task_as_spectrum(projector: str, task: str) -> None:
    """Without --task, retrain trains the text task; a spectrum of another task's rows would be
    refused only after that model was built (MiniLM: seconds), by a layout mismatch that does
    not say why. Say it first, naming the spectrum's task."""
    from gradspec.store import SpectrumStore

    try:
        source = SpectrumStore.open(projector).source or {}
    except (OSError, ValueError, KeyError, TypeError):
        return  # not a readable spectrum: the projector's own checks say why
    run = source.get("run") if isinstance(source.get("run"), dict) else {}
    theirs = run.get("task")
    if isinstance(theirs, str) and theirs != task:
        how = ("it was built in Python: retrain it from Python (gradspec.retrain) with the same task"
               if theirs.startswith("custom:") else f"pass --task {theirs} with the run's -t options")
        raise ValueError(f"--projector {projector!r} is a spectrum of task {theirs!r} (the run its rows came from), "
                         f"but retrain trains --task {task} when --task is not given: {how}")
