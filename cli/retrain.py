"""`gradspec retrain`: train with a private optimizer (one run, or a sweep) and report epsilon."""

from __future__ import annotations

from pathlib import Path

import typer

from cli._common import user_errors


def _csv(text: str | None, cast) -> list:
    if not text:
        return []
    try:
        return [cast(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"expected a comma-separated list of numbers, got {text!r}") from None


@user_errors
def retrain_command(
    out: Path = typer.Option(Path("runs/retrain"), "--out", "-o", help="Run (or sweep) directory."),
    algorithm: list[str] = typer.Option(["subspace"], "--algorithm", "-a", help="dp-sgd, subspace, pdp-sgd, rpdp-sgd, noisy-adagrad, adadps, dp-adam (repeatable with --sweep)."),
    projector: str = typer.Option(None, "--projector", metavar="SPECTRUM|public|random", help="A spectrum store (gradspec pca output), or 'public' / 'random'. Default per algorithm."),
    rank: int = typer.Option(None, "--rank", "-k", help="Subspace rank k."),
    sweep: bool = typer.Option(False, "--sweep", help="Run a grid over --ranks, --seeds and --sigmas or --epsilons."),
    ranks: str = typer.Option("10,20,100", help="Ranks of a sweep (comma-separated)."),
    seeds: str = typer.Option(None, help="Seeds of a sweep (comma-separated; default --seed)."),
    sigmas: str = typer.Option(None, help="Noise multipliers of a sweep (comma-separated)."),
    epsilons: str = typer.Option(None, help="Target epsilons of a sweep (comma-separated)."),
    noise_in: str = typer.Option("full", help="subspace retraining: noise in all p dims (full) or the subspace."),
    public_size: int = typer.Option(100, help="Public examples m (public projector, AdaDPS)."),
    period: int = typer.Option(1, help="Recompute the public subspace every s steps."),
    start_epoch: float = typer.Option(0.0, help="PDP-SGD: epochs of plain DP-SGD before projecting."),
    precond_sigma: float = typer.Option(1.0, help="noisy-adagrad: noise multiplier of the preconditioner."),
    diagonal: bool = typer.Option(False, "--diagonal", help="noisy-adagrad: diagonal preconditioner."),
    rule: str = typer.Option("rmsprop", help="AdaDPS preconditioner: rmsprop, adam, adagrad."),
    task: str = typer.Option("text", help="Task: text, cnn, geomedian, lowrank."),
    task_option: list[str] = typer.Option([], "--task-option", "-t", help="Task option KEY=VALUE (repeatable)."),
    params: list[str] = typer.Option([], "--params", help="Parameter name patterns to train (as for collect)."),
    steps: int = typer.Option(None, help="Training steps (default 200 unless --epochs)."),
    epochs: float = typer.Option(None, help="Training epochs (instead of --steps)."),
    batch_size: int = typer.Option(64, help="Expected (Poisson) or fixed batch size."),
    sampling: str = typer.Option("poisson", help="poisson or shuffle."),
    max_grad_norm: float = typer.Option(1.0, "--max-grad-norm", "-C", help="Clipping norm C."),
    sigma: float = typer.Option(None, "--sigma", "--noise-multiplier", help="Noise multiplier (default 1.0 unless --epsilon)."),
    epsilon: float = typer.Option(None, "--epsilon", help="Target epsilon (sigma calibrated)."),
    delta: float = typer.Option(None, help="Delta (default n^-1.1)."),
    accounting: str = typer.Option("pld", help="pld, rdp or rdp-classic."),
    optimizer: str = typer.Option("sgd", help="Outer optimizer: sgd or adam (noisy-adagrad and dp-adam use sgd)."),
    lr: float = typer.Option(0.05, help="Learning rate."),
    microbatch: int = typer.Option(32, help="Examples per per-example-gradient call."),
    eval_every: int = typer.Option(20, help="Evaluate every N steps."),
    log_every: int = typer.Option(10, help="Log every N steps."),
    seed: int = typer.Option(0, help="Random seed."),
    device: str = typer.Option("cpu", help="cpu, cuda or auto."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace existing runs."),
    plot: bool = typer.Option(True, "--plot/--no-plot", help="Write figures of a sweep."),
    no_progress: bool = typer.Option(False, "--no-progress", help="No progress bar."),
) -> None:
    """Retrain in a subspace, or run PDP-SGD, noisy AdaGrad, AdaDPS, DP-Adam, DP-SGD."""
    from cli.collect import training_config
    from gradspec.optim import Algorithm
    from gradspec.optim import retrain as run_retrain
    from gradspec.optim import sweep as run_sweep
    from gradspec.optim._registry import PROJECTED, ProjectorKind

    config = training_config(
        task=task, task_option=task_option, params=params, steps=steps, epochs=epochs,
        batch_size=batch_size, sampling=sampling, max_grad_norm=max_grad_norm,
        sigma=sigma if epsilon is None else None, epsilon=epsilon, delta=delta, accounting=accounting, optimizer=optimizer, lr=lr,
        microbatch=microbatch, eval_every=eval_every, log_every=log_every,
        checkpoint_every=max(eval_every, 50), seed=seed, device=device,
    )

    def options(name: str) -> dict:
        alg = Algorithm(name)
        opts: dict = {}
        if alg in PROJECTED:
            if projector is not None and projector not in set(ProjectorKind):
                opts.update(projector="spectrum", spectrum=projector)
            elif projector is not None:
                opts["projector"] = projector
            opts.update(public_size=public_size, period=period, seed=seed)
            if rank is not None and not sweep:
                opts["rank"] = rank
        if alg == Algorithm.SUBSPACE:
            opts["noise"] = noise_in
        elif alg in (Algorithm.PDP_SGD, Algorithm.RPDP_SGD):
            opts["start_epoch"] = start_epoch
        elif alg == Algorithm.NOISY_ADAGRAD:
            opts.update(precond_noise_multiplier=precond_sigma, diagonal=diagonal)
        elif alg == Algorithm.ADADPS:
            opts.update(rule=rule, public_size=public_size, seed=seed)
        return opts

    from gradspec._enums import parse_choice

    names = [str(parse_choice(Algorithm, a, "algorithm")) for a in algorithm]
    if not sweep:
        if len(names) != 1:
            raise ValueError("give one --algorithm, or --sweep to run several")
        res = run_retrain(config=config, algorithm=names[0], options=options(names[0]), out=out,
                          overwrite=overwrite, progress=not no_progress)
        eps = "inf (non-private)" if res.epsilon == float("inf") else f"{res.epsilon:.3f}"
        typer.echo(f"run      {res.out}  ({res.algorithm}, k = {res.rank}, {res.steps} steps)")
        typer.echo(f"privacy  epsilon = {eps} at delta = {res.delta:.3g}   sigma = {res.noise_multiplier:.4g}")
        if res.final_metrics:
            typer.echo("eval     " + "  ".join(f"{k} = {v:.4f}" for k, v in res.final_metrics.items()))
        return
    rows = run_sweep(
        config=config, algorithms=[(n, options(n)) for n in names], out=out,
        ranks=_csv(ranks, int), seeds=_csv(seeds, int) or [seed],
        noise_multipliers=_csv(sigmas, float), epsilons=_csv(epsilons, float),
        overwrite=overwrite, progress=not no_progress,
    )
    typer.echo(f"sweep    {len(rows)} runs in {out}; summary: {out / 'summary.csv'}")
    if plot:
        from gradspec.plot._retrain import save_sweep_figures

        for path in save_sweep_figures(rows, out):
            typer.echo(f"figure   {path}")
