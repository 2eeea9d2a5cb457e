"""`gradspec account`: epsilon of a DP-SGD run, or the noise multiplier for a target epsilon."""

from __future__ import annotations

import math

import typer

from cli._common import echo_json, fail, user_errors
from cli._options import SigmaAlias, deprecated_alias


@user_errors
def account_command(
    noise_multiplier: float = typer.Option(
        None, "--noise-multiplier", help="Noise multiplier: print the epsilon it gives (--sigma is a deprecated alias)."
    ),
    sigma: SigmaAlias = None,
    epsilon: float = typer.Option(
        None, "--epsilon", help="Target epsilon: print the noise multiplier that meets it."
    ),
    q: float = typer.Option(
        None,
        "--q",
        "--sample-rate",
        help="Sample rate q = batch size / n (or give --batch-size and --n).",
    ),
    batch_size: int = typer.Option(
        None, "--batch-size", help="Expected (Poisson) or fixed (shuffle) batch size, with --n."
    ),
    n: int = typer.Option(
        None, "--n", help="Training-set size (gives q with --batch-size, and the default delta)."
    ),
    steps: int = typer.Option(None, "--steps", help="Training steps (or give --epochs)."),
    epochs: float = typer.Option(
        None, "--epochs", help="Training epochs: steps = epochs / q (shuffle with --batch-size/--n: epochs x (n // B), as the trainer)."
    ),
    delta: float = typer.Option(None, "--delta", help="Delta (default n^-1.1, which needs --n)."),
    method: str = typer.Option("pld", "--method", help="Accounting: pld, rdp or rdp-classic."),
    sampling: str = typer.Option(
        "poisson", "--sampling", help="poisson, or shuffle (one Gaussian mechanism per epoch)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Privacy of DP-SGD: epsilon for a --noise-multiplier, or the noise multiplier for a target --epsilon."""
    from gradspec import Accounting, Sampling, parse_choice
    from gradspec.privacy import (
        accountant_rate,
        calibrate_noise_multiplier,
        compute_epsilon,
        default_delta,
        epochs_for_steps,
        steps_for_epochs,
        steps_per_epoch,
    )

    noise_multiplier = deprecated_alias(noise_multiplier, sigma, option="--noise-multiplier", alias="--sigma")
    if (noise_multiplier is None) == (epsilon is None):
        fail("give exactly one of --noise-multiplier (to get epsilon) or --epsilon (to get the noise multiplier)")
    method_ = parse_choice(Accounting, method, "accounting method")
    sampling_ = parse_choice(Sampling, sampling, "sampling")
    if q is not None:
        if batch_size is not None:
            fail("give either --q or --batch-size with --n, not both")
        if sampling_ == Sampling.SHUFFLE and 0 < q <= 1 and abs(1 / q - round(1 / q)) > 1e-9 * (1 / q):
            # B/n (what collect prints as q) is not the shuffled accountant's rate 1/(n // B): taking
            # round(1/q) batches an epoch under-reported epsilon (12% on n = 200, B = 30)
            fail(f"with --sampling shuffle, --q {q:g} is not 1 / (batches per epoch): a shuffled run is "
                 "accounted per epoch of n // B batches; give --batch-size and --n instead")
    elif batch_size is not None and n is not None:
        if not 0 < batch_size <= n:
            fail(f"--batch-size must be in 1..n={n}, got {batch_size}")
        q = accountant_rate(n, batch_size, sampling_)  # as the trainer counts it
    else:
        fail("give the sample rate: --q, or --batch-size and --n")
    if not 0 < q <= 1:
        fail(f"--q must be in (0, 1], got {q}")
    if (steps is None) == (epochs is None):
        fail("give exactly one of --steps or --epochs")
    if steps is None:
        if not (math.isfinite(epochs) and epochs > 0):
            fail(f"--epochs must be > 0, got {epochs}")
        steps = max(1, steps_for_epochs(epochs, steps_per_epoch(q, sampling=sampling_)))
    if delta is None:
        if n is None:
            fail("give --delta, or --n for the default delta n^-1.1")
        delta = default_delta(n)
    elif n is not None and delta >= 1 / n and (noise_multiplier is None or noise_multiplier > 0):
        # as `gradspec collect` refuses: such a guarantee allows publishing an example outright
        fail(f"--delta {delta:g} is not below 1/n = {1 / n:.4g} (n = {n}): a guarantee with "
             f"delta >= 1/n allows publishing a training example outright; give a smaller --delta "
             f"(the default is n^-1.1 = {default_delta(n):.4g})")
    run = {
        "sample_rate": q,
        "steps": steps,
        "delta": delta,
        "method": method_,
        "sampling": sampling_,
    }
    if noise_multiplier is not None:
        eps = compute_epsilon(noise_multiplier=noise_multiplier, **run)
        result = {"noise_multiplier": noise_multiplier, "epsilon": eps}
    else:
        noise_multiplier = calibrate_noise_multiplier(target_epsilon=epsilon, **run)
        result = {
            "target_epsilon": epsilon,
            "noise_multiplier": noise_multiplier,
            "epsilon": compute_epsilon(noise_multiplier=noise_multiplier, **run),
        }
    epochs_done = epochs_for_steps(steps, q, sampling=sampling_)
    out = {
        "method": method_.value,
        "sampling": sampling_.value,
        "sample_rate": q,
        "steps": steps,
        "epochs": epochs_done,
        "delta": delta,
        **result,
    }
    if as_json:
        echo_json(out)
        return
    typer.echo(f"method            {out['method']}  ({out['sampling']} sampling)")
    typer.echo(f"q                 {q:.6g}")
    typer.echo(f"steps             {steps}  ({epochs_done:.4g} epochs)")
    typer.echo(f"delta             {delta:.4g}")
    if "target_epsilon" in out:
        typer.echo(f"target            epsilon <= {out['target_epsilon']:g}")
    typer.echo(f"noise multiplier  {out['noise_multiplier']:.6g}")
    typer.echo(f"epsilon           {out['epsilon']:.6g}")
