"""Recording from a Hugging Face Trainer: rows equal independently computed gradients."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from gradspec.store import GradientStore

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate", reason="transformers.Trainer needs accelerate")
from transformers import (  # noqa: E402
    BertConfig,
    BertForSequenceClassification,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

from gradspec.collect import GradientRecorder, GradientRecorderCallback  # noqa: E402
from gradspec.collect._hf import DIVISOR_HF, ROW_HF_STEP  # noqa: E402
from gradspec.collect._rows import ROW_EXAMPLE_UNCLIPPED  # noqa: E402

N, T, LABELS = 12, 8, 3


def make_model() -> BertForSequenceClassification:
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=100, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=T, num_labels=LABELS, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )
    return BertForSequenceClassification(config)


class Data(torch.utils.data.Dataset):
    """Padded token sequences of lengths 3..8 with labels."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(1)
        self.ids = torch.randint(1, 100, (N, T), generator=g)
        lengths = torch.arange(N) % (T - 2) + 3
        self.mask = (torch.arange(T)[None, :] < lengths[:, None]).long()
        self.ids = self.ids * self.mask
        self.labels = torch.randint(0, LABELS, (N,), generator=g)

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "attention_mask": self.mask[i], "labels": self.labels[i]}

    def batch(self, idx) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[idx], "attention_mask": self.mask[idx], "labels": self.labels[idx]}


class Snapshots(TrainerCallback):
    """The weights at the start of every step (before the optimizer moves them)."""

    def __init__(self) -> None:
        self.weights: list[dict[str, torch.Tensor]] = []

    def on_step_begin(self, args, state, control, model=None, **kwargs):
        self.weights.append({k: v.detach().clone() for k, v in model.state_dict().items()})


def train(tmp_path, callback, *, steps=3, batch_size=4, accumulation=1, model=None):
    logging.getLogger("transformers").setLevel(logging.ERROR)
    snapshots = Snapshots()
    args = TrainingArguments(
        output_dir=str(tmp_path / "trainer"), per_device_train_batch_size=batch_size, max_steps=steps,
        gradient_accumulation_steps=accumulation, learning_rate=5e-2, max_grad_norm=0.0, report_to=[],
        use_cpu=True, save_strategy="no", logging_strategy="no", train_sampling_strategy="sequential",
        disable_tqdm=True, seed=0,
    )
    data = Data()
    trainer = Trainer(model=model or make_model(), args=args, train_dataset=data, callbacks=[snapshots, callback])
    trainer.train()
    return data, snapshots.weights, trainer


def reference_gradient(weights, batch, names):
    model = make_model()
    model.load_state_dict(weights)
    params = dict(model.named_parameters())
    loss = model(**batch).loss
    grads = torch.autograd.grad(loss, [params[n] for n in names])
    return torch.cat([g.reshape(-1) for g in grads]), loss.item()


@pytest.mark.parametrize("accumulation", [1, 2], ids=["plain", "accumulated"])
def test_per_step_rows_equal_the_batch_gradient(tmp_path, accumulation):
    callback = GradientRecorderCallback(out=tmp_path / "run")
    batch_size = 4 // accumulation
    data, weights, trainer = train(tmp_path, callback, batch_size=batch_size, accumulation=accumulation)
    store = GradientStore.open(tmp_path / "run" / "gradients.zarr")
    names = store.layout.names
    assert store.status == "complete" and store.n_rows == 3 and len(names) == len(list(make_model().parameters()))
    meta = store.row_meta()
    # What the optimizer receives: the sum over micro-batches of each one's mean-loss gradient,
    # divided by their number unless the Trainer takes the model's loss as already normalised
    # (transformers 5 assumes so for any forward with **kwargs, BERT's included).
    scale = 1.0 if trainer.model_accepts_loss_kwargs else 1.0 / accumulation
    for step in range(3):
        parts = [reference_gradient(weights[step], data.batch(slice(a, a + batch_size)), names)
                 for a in range(4 * step, 4 * step + 4, batch_size)]
        want = scale * sum(g for g, _ in parts)
        np.testing.assert_allclose(store.read(rows=[step])[0], want.numpy(), rtol=1e-4, atol=1e-6)
        assert meta["loss"][step] == pytest.approx(np.mean([v for _, v in parts]), rel=1e-4)
    np.testing.assert_array_equal(meta["step"], [0, 1, 2])
    np.testing.assert_array_equal(meta["batch_size"], [4, 4, 4])
    assert store.config["source"] == "hf-trainer"
    assert store.config["hf"]["gradient_accumulation_steps"] == accumulation
    # not gradspec's mean clipped gradient: the store says so, and how the row is divided
    assert store.config["row"] == ROW_HF_STEP and store.config["row_divisor"] == DIVISOR_HF


@pytest.mark.filterwarnings("ignore:There is a performance drop:UserWarning")
def test_per_example_rows_and_pca(tmp_path):
    import gradspec

    names = ["bert.encoder.layer.0.attention.self.query.weight", "classifier.weight", "classifier.bias"]
    callback = GradientRecorderCallback(out=tmp_path / "run", params=names, per_example=True)
    data, weights, _ = train(tmp_path, callback, steps=2)
    store = GradientStore.open(tmp_path / "run" / "gradients.zarr")
    assert store.per_example and store.n_rows == 8 and store.layout.names == names
    rows, meta = store.read(), store.row_meta()
    for i in range(8):
        want, loss = reference_gradient(weights[i // 4], data.batch(slice(i, i + 1)), names)
        np.testing.assert_allclose(rows[i], want.numpy(), rtol=1e-4, atol=1e-6)
        assert meta["loss"][i] == pytest.approx(loss, rel=1e-4)
    np.testing.assert_array_equal(meta["step"], [0] * 4 + [1] * 4)
    # each row's own norm and factor (issue 22): unclipped rows, so factor 1 and the rows' norms
    wide = rows.astype(np.float64)
    np.testing.assert_array_equal(store.clip_factors(), np.ones(8))
    np.testing.assert_allclose(store.row_norms(), np.linalg.norm(wide, axis=1), rtol=1e-6)
    np.testing.assert_allclose(store.param_norms(), np.stack(
        [np.linalg.norm(wide[:, s.offset : s.stop], axis=1) for s in store.layout.params], axis=1), rtol=1e-6)
    assert store.config["row"] == ROW_EXAMPLE_UNCLIPPED and store.config["row_divisor"] is None
    result = gradspec.pca(source=store, k=4)
    assert result.sigma.shape == (4,) and np.all(np.diff(result.sigma) <= 0) and result.sigma[-1] > 0


def test_a_ready_recorder_stays_open_and_bad_input(tmp_path):
    model = make_model()
    with GradientRecorder(out=tmp_path / "run", model=model, params="classifier.*") as recorder:
        train(tmp_path, GradientRecorderCallback(recorder=recorder), steps=2, model=model)
        assert not recorder.closed and recorder.store.n_rows == 2  # committed, left open
        recorder.record_step(grad=torch.zeros(recorder.layout.p))  # your own rows may follow
    assert GradientStore.open(tmp_path / "run" / "gradients.zarr").status == "complete"
    with pytest.raises(ValueError, match="not both"):
        GradientRecorderCallback()
    with pytest.raises(ValueError, match="every must be a positive"):
        GradientRecorderCallback(out=tmp_path / "x", every=0)
    with (
        GradientRecorder(out=tmp_path / "other", model=make_model()) as recorder,
        pytest.raises(ValueError, match="not the Trainer model's"),
    ):
        train(tmp_path, GradientRecorderCallback(recorder=recorder), steps=1)


def test_a_refusal_comes_before_training_and_leaves_the_store_failed_and_unlocked(tmp_path):
    """Issue 25: the callback refused (e.g. a per-example backend it cannot use) only at the
    first optimizer step, and left its store "writing" with the run lock held until the process
    exited. Now what can be checked is checked in on_train_begin, and any error marks the store
    failed and releases the lock, so the run can be resumed in the same process."""
    callback = GradientRecorderCallback(out=tmp_path / "run", params="classifier.*", per_example=True,
                                        backend="ghost")
    steps_begun = Snapshots()
    args = TrainingArguments(output_dir=str(tmp_path / "trainer"), per_device_train_batch_size=4, max_steps=2,
                             report_to=[], use_cpu=True, save_strategy="no", disable_tqdm=True)
    trainer = Trainer(model=make_model(), args=args, train_dataset=Data(), callbacks=[callback, steps_begun])
    with pytest.raises(ValueError, match="ghost"):
        trainer.train()
    assert not steps_begun.weights  # refused in on_train_begin: no step began
    store = GradientStore.open(tmp_path / "run" / "gradients.zarr")
    assert store.status == "failed" and "ghost" in store.config["error"]
    with GradientRecorder(out=tmp_path / "run", model=make_model(), params="classifier.*", per_example=True,
                          resume=True) as again:  # the lock is free; the failed store resumes
        assert again.store.status == "writing"
    assert GradientStore.open(tmp_path / "run" / "gradients.zarr").status == "complete"
