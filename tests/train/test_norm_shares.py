"""A new run's norm shares (`gradspec.train._norm_shares`): each parameter group's share of the
warm-up batch's clipped per-example squared norms, checked against a batch-of-one loop in
float64, for every per-example engine; the warning when a small group dominates (the pooler
of issue 37 §5's whole-MiniLM runs), and none when it does not; kept across a resume."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import torch

from gradspec.collect import collect
from gradspec.store import GradientStore
from gradspec.train._norm_shares import group_of, norm_shares

from ..collect._tiny import tiny_task
from ..collect.test_collect import cfg, metrics_without_time

C = 0.5  # below the tiny model's per-example norms, so that clipping matters


def reference_shares(task, batch_size: int, max_norm: float) -> dict[str, float]:
    """Group shares from a batch-of-one loop: float64 per-parameter squared norms, clipped by
    min(1, C / ||g_i||), summed over the first ``batch_size`` training examples."""
    model = task.model.double().eval()
    params = dict(model.named_parameters())
    batch = task.train.batch(torch.arange(batch_size))
    sums: dict[str, float] = {}
    for i in range(batch_size):
        one = {k: v[i : i + 1] for k, v in batch.items()}
        loss = task.loss(task.forward(lambda *a, **k: model(*a, **k), one), one).sum()
        grads = torch.autograd.grad(loss, list(params.values()))
        sq = {n: float(g.pow(2).sum()) for n, g in zip(params, grads, strict=True)}
        factor2 = min(1.0, max_norm**2 / sum(sq.values()))
        for n, v in sq.items():
            sums[group_of(n)] = sums.get(group_of(n), 0.0) + factor2 * v
    total = sum(sums.values())
    return {g: v / total for g, v in sums.items()}


def stored_shares(run) -> dict:
    return GradientStore.open(run.store).config["norm_shares"]


@pytest.mark.parametrize("backend", ["ghost", "vmap", "hooks"])
def test_shares_equal_a_batch_of_one_reference(tmp_path, backend):
    run = collect(cfg(steps=2, backend=backend, max_grad_norm=C), out=tmp_path / "r",
                  task=tiny_task())
    got = stored_shares(run)
    want = reference_shares(tiny_task(), 16, C)
    assert got["examples"] == 16 and got["p"] == sum(p.numel() for p in tiny_task().model.parameters())
    shares = {g["group"]: g["share"] for g in got["groups"]}
    assert set(shares) == {"emb", "norm", "fc1", "fc2"} == set(want)
    for g, v in want.items():
        assert shares[g] == pytest.approx(v, rel=1e-4, abs=1e-7), g
    assert [g["share"] for g in got["groups"]] == sorted(shares.values(), reverse=True)
    assert got["median_norm"] > C  # pre-clip norms: most of the tiny model's examples are clipped


def test_the_layer_index_is_folded_so_a_layer_type_counts_once():
    assert group_of("bert.encoder.layer.3.attention.self.query.weight") == "bert.encoder.layer.*.attention.self.query"
    assert group_of("bert.encoder.layer.11.output.LayerNorm.bias") == "bert.encoder.layer.*.output.LayerNorm"
    assert group_of("blocks.0.attn.qkv.weight") == "blocks.*.attn.qkv"
    assert group_of("features.0.weight") == "features.0"  # a Sequential's layers stay apart
    assert group_of("features.3.bias") == "features.3"
    assert group_of("0.weight") == "0"
    assert group_of("bert.pooler.dense.weight") == "bert.pooler.dense"
    assert group_of("bias") == "bias"  # a parameter of the root module
    assert group_of("fc2.weight") == "fc2"


def _layout(sizes):
    from gradspec._layout import ParamLayout

    return ParamLayout.from_shapes([(n, (k,)) for n, k in sizes])


def test_a_small_group_holding_most_of_the_norm_is_named_and_a_large_one_is_not():
    # the whole-MiniLM shape: a pooler of 0.65% of the parameters holding 88% of the norm
    layout = _layout([("pooler.dense.weight", 65), ("encoder.layer.0.q.weight", 5000),
                      ("encoder.layer.1.q.weight", 4935)])
    e = torch.tensor([[0.88, 0.06, 0.06], [0.88, 0.07, 0.05]], dtype=torch.float64)
    shares = norm_shares(layout, e)
    assert shares.dominant() == ("pooler.dense", 65, pytest.approx(0.88))
    why = shares.warning()
    assert "pooler.dense (65 parameters, 0.65% of those trained) holds 88% of the clipped squared gradient norm of 2 examples" in why
    assert "--params" in why
    assert shares.groups[1][0] == "encoder.layer.*.q" and shares.groups[1][1] == 9935
    # the same energies on a group that is half the model: not flagged
    big = norm_shares(_layout([("a.w", 5000), ("b.w", 5000)]), e[:, :2])
    assert big.dominant() is None and big.warning() is None
    # small but not dominant (the few-class head of the mixed model: 49% of the energy)
    head = norm_shares(_layout([("head.w", 40), ("body.w", 9960)]),
                       torch.tensor([[0.49, 0.51]], dtype=torch.float64))
    assert head.dominant() is None
    # an all-zero batch says nothing
    assert norm_shares(layout, torch.zeros(2, 3, dtype=torch.float64)).dominant() is None


def test_shares_refuse_energies_of_other_parameters():
    with pytest.raises(ValueError, match=r"energies must be \(examples, 3\)"):
        norm_shares(_layout([("a.w", 2), ("b.w", 2), ("c.w", 2)]), torch.zeros(4, 2))


def test_a_run_warns_when_a_small_layer_dominates_and_keeps_the_table_across_a_resume(tmp_path, caplog):
    """With the head's weight scaled down 1000x, every gradient upstream of it shrinks 1000x and
    its bias (3 of the 191 trained values) holds nearly all of each example's norm."""
    task = tiny_task()
    with torch.no_grad():
        task.model.fc2.weight.mul_(1e-3)
    config = cfg(steps=6, max_grad_norm=C, params=("emb.*", "norm.*", "fc1.*", "fc2.bias"))
    with caplog.at_level(logging.INFO, logger="gradspec.train._norm_shares"):
        collect(config, out=tmp_path / "r", task=task, stop_after=3)
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and warned[0].getMessage().startswith("fc2 (3 parameters, 1.57% of those trained)")
    first = json.loads(json.dumps(GradientStore.open(tmp_path / "r" / "gradients.zarr").config["norm_shares"]))
    assert first["groups"][0]["group"] == "fc2" and first["groups"][0]["share"] > 0.99
    caplog.clear()
    task = tiny_task()
    with torch.no_grad():
        task.model.fc2.weight.mul_(1e-3)
    with caplog.at_level(logging.INFO, logger="gradspec.train._norm_shares"):
        done = collect(out=tmp_path / "r", task=task, resume=True)
    assert not caplog.records  # measured once, when the run began
    assert stored_shares(done) == first


def test_a_balanced_run_only_logs_its_table_and_an_unclipped_run_measures_none(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="gradspec.train._norm_shares"):
        run = collect(cfg(steps=2, max_grad_norm=C), out=tmp_path / "r", task=tiny_task())
    assert [r.levelno for r in caplog.records] == [logging.INFO]
    assert "clipped gradient norm by parameter group over 16 warm-up examples" in caplog.text
    table = stored_shares(run)
    assert sorted(table) == ["examples", "groups", "median_norm", "p"]
    assert sum(g["share"] for g in table["groups"]) == pytest.approx(1.0)
    plain = collect(cfg(steps=2, clip=False, noise_multiplier=0.0), out=tmp_path / "plain", task=tiny_task())
    assert "norm_shares" not in GradientStore.open(plain.store).config


@pytest.mark.parametrize(("backend", "mode"), [("ghost", "batch"), ("vmap", "per-example")])
def test_the_warm_up_changes_nothing_the_run_trains_or_stores(tmp_path, monkeypatch, backend, mode):
    """The same seeded run with the norm-share pass and without it: the same rows, norms and
    metrics, bit for bit (the pass forks the random generators and trains nothing)."""
    import gradspec.train._run

    config = cfg(steps=6, backend=backend, mode=mode, max_grad_norm=C)
    measured = collect(config, out=tmp_path / "measured", task=tiny_task())
    monkeypatch.setattr(gradspec.train._run._Run, "measure_norm_shares", lambda self, measure=True: None)
    plain = collect(config, out=tmp_path / "plain", task=tiny_task())
    a, b = GradientStore.open(measured.store), GradientStore.open(plain.store)
    assert "norm_shares" in a.config and "norm_shares" not in b.config
    np.testing.assert_array_equal(a.read(), b.read())
    for k, v in a.row_meta().items():
        np.testing.assert_array_equal(v, b.row_meta()[k], err_msg=k)
    assert metrics_without_time(measured.metrics) == metrics_without_time(plain.metrics)
