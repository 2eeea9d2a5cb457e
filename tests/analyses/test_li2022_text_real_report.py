"""The real-text claims table (``text_real_report.claims``): what each row says from the
arms' summaries, the share of DP-SGD's gain a subspace recovers, and arms not run."""

from __future__ import annotations

from analyses.li2022_restricted_lipschitz.text_real_report import claims


def _arm(*accs: float) -> dict:
    n = len(accs)
    mean = sum(accs) / n
    std = None if n < 2 else (sum((a - mean) ** 2 for a in accs) / (n - 1)) ** 0.5
    return {"accuracy": {"mean": mean, "std": std, "n": n}}


def _paired(*diffs: float) -> dict:
    return _arm(*diffs)["accuracy"]


def test_rows_say_the_gain_recovered_and_what_did_not_run() -> None:
    arms = {"dpsgd": _arm(0.76, 0.76, 0.76), "untrained": _arm(0.52), "topk-k100": _arm(0.70, 0.70, 0.70),
            "random-k100": _arm(0.52, 0.53, 0.51), "topk-k10": _arm(0.40), "complement-k100": _arm(0.64, 0.64)}
    paired = {"topk-k100": {"dpsgd": _paired(0.06, 0.06, 0.06)}, "topk-k10": {"dpsgd": _paired(0.36)}}
    rows = claims({"scale": {"ranks": [10, 100, 1000]}, "retrain": {"arms": arms, "paired": paired}})
    by = {r[2].split(" ")[0]: r for r in rows if r[0].startswith("Fig. 2b")}
    assert set(by) == {"top-10", "top-100"}  # k = 1000 not run: no row
    assert "75% of DP-SGD's gain over the untrained model" in by["top-100"][2]  # (0.70-0.52)/(0.76-0.52)
    assert by["top-100"][3] == "**no**"  # +0.06 > 2 s.e. (0 here)
    assert "-50% of DP-SGD's gain" in by["top-10"][2]  # below the untrained model: said, not hidden
    assert by["top-10"][3] == "pending (1 seed)"
    assert "random-10 not run" in by["top-10"][2]
    comp = [r for r in rows if r[0].startswith("control")]
    assert len(comp) == 1 and "50% of DP-SGD's gain" in comp[0][2]  # (0.64-0.52)/(0.76-0.52)
    base = [r for r in rows if r[0] == "baselines"][0][2]
    assert "non-private not run" in base and "full DP-SGD 0.760 ± 0.000 (n = 3)" in base


def test_no_gain_share_without_the_untrained_model_or_when_dpsgd_learned_nothing() -> None:
    paired = {"topk-k100": {"dpsgd": _paired(0.01, 0.02)}}
    for arms in ({"dpsgd": _arm(0.76, 0.75), "topk-k100": _arm(0.74, 0.74)},
                 {"dpsgd": _arm(0.50, 0.50), "untrained": _arm(0.52), "topk-k100": _arm(0.74, 0.74)}):
        rows = claims({"scale": {"ranks": [100]}, "retrain": {"arms": arms, "paired": paired}})
        assert not any("gain" in r[2] for r in rows)
