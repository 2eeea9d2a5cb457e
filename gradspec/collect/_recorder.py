"""`GradientRecorder`: gradient rows from any training loop into a gradient store.

The public recorder: :class:`~gradspec.collect._recorder_base.RecorderBase` (the store,
rows, commits, lifecycle) plus :meth:`GradientRecorder.attach_opacus`. The adapters build
on the core (``_opacus`` on ``RecorderBase``), and this class on both, so no two modules
import each other.
"""

from __future__ import annotations

from typing import Any

from gradspec.collect._opacus import record_opacus
from gradspec.collect._recorder_base import RecorderBase
from gradspec.collect._recorder_setup import STORE_NAME, unwrap_model

__all__ = ["STORE_NAME", "GradientRecorder", "unwrap_model"]


class GradientRecorder(RecorderBase):
    """A gradient store that takes rows from any training loop.

    Writes ``out/gradients.zarr``, the store ``collect`` writes, so ``gradspec
    info``, ``pca``, ``decay`` and ``retrain --projector`` read it unchanged. Rows
    are written on a background thread and committed every ``commit_every``
    steps (at most once every ``commit_seconds``), at :meth:`commit` and at
    :meth:`close`; a crash leaves the committed rows readable. :meth:`close` (or leaving a ``with`` block normally) marks the
    store complete; an exception in the block leaves it ``writing``.

    Args:
        out: the run directory; the store is ``out/gradients.zarr``.
        model: the module whose parameters are recorded (Opacus wrappers are seen
            through, so names are those of your module).
        params: with ``model``, name patterns (globs or ``re:...``) of the recorded
            parameters (default: all with ``requires_grad``); without it, a mapping
            name -> parameter.
        layout: the layout of rows given as arrays only (no ``model``/``params``).
        per_example: rows are per-example gradients (``record_examples``), not
            per-step averages (``record_step``).
        max_grad_norm: the clipping norm C the rows were clipped to, for
            ``frac_clipped`` and the run config; None for unclipped gradients.
        config: your run config (hyper-parameters, ...), saved in the store.
        dtype: on-disk dtype, ``float32`` | ``float16`` | ``bfloat16`` (default
            float32; on resume, the store's).
        compressor: ``None`` | ``"zstd"`` | ``"blosc"``.
        resume: continue the store in ``out`` after its committed rows; its layout
            (names and shapes) and row kind must match.
        overwrite: replace a store in ``out``.
        commit_every: commit rows every this many recorded steps.
        commit_seconds: but at most once every this many seconds (0: every ``commit_every``
            steps exactly). A commit writes each row's metadata arrays (about a dozen small
            zarr writes) on the writer thread; in a 5 ms Opacus step, recording with a commit
            every 32 steps took 1.43x a plain step, with commits a second apart 1.29x (2-core
            Xeon, 2026-11-28).
        skip_nonfinite: drop a row with NaN/inf values (with a warning) instead of
            raising.
        background: write on a background thread (``False``: synchronously).
        max_queue: rows that may wait for the writer before recording blocks.
        store: a store already open for writing whose run lock the caller holds
            (gradspec's trainer; see :meth:`for_trainer`): the recorder writes into it,
            takes no lock and creates nothing; its layout is the store's.
        distributed: under torch.distributed (DDP, Opacus ``DPDDP``, a Hugging Face
            ``Trainer`` under ``torchrun``): None (default) records into one store when a
            process group of several processes is initialised: build the recorder and call
            it on every rank alike; rank 0 writes, the other ranks open nothing and take part
            in each step's collectives, which make the row's ``batch_size`` the global batch's
            (the ranks' sum), its ``loss`` the ranks' (weighted by batch size) and its norm
            statistics every rank's examples'. The row is rank 0's gradient, which DDP has
            averaged over the ranks (``attach_opacus``: the clipped sums of every rank over
            the global batch). Per-step rows only. ``False``: each process records on its own
            (give each its own ``out``). ``True``: as None, but refuse to run without a group.
        sketch: store each per-step row (p values) as its M-column seeded random projection
            (``gradspec.sketch``, the plan ``gradspec collect --sketch M`` makes for the same
            parameters; M below p): O(p M) once a step, computed by rank 0 under
            torch.distributed (the map is linear: the sketch of DDP's averaged gradient is the
            average of the ranks' sketches). The plan is saved in the store
            (``GradientStore.sketch``). Per-step rows only.
        sketch_seed: the plan's seed (every random factor derives from it).
        sketch_blocks: J >= 2 independent blocks of the sketch (its error statement).
        sketch_weights: how the plan splits its columns between parameters: ``"energy"``
            (default) by each parameter's share of the first recorded row's squared norm,
            hedged half by ``sqrt(numel)``, as ``collect --sketch`` does from its warm-up
            batch (the store is then created at the first row; a recorder closed before
            one keeps the ``sqrt(numel)`` split); ``"sqrt-size"`` by ``sqrt(numel)`` alone.
            A resume keeps the store's plan.

    Raises:
        ValueError: no or several layout sources, no parameter selected, a resume
            whose layout, row kind or sketch differs; ``sketch`` with per-example rows, or at
            or above p.
        FileExistsError: ``out`` holds a store and neither resume nor overwrite was asked.
        FileNotFoundError: ``resume`` with no store in ``out``.
        DirectoryBusyError: another process writes in ``out`` (the run lock, an ``OSError``).
        RankLostError: under torch.distributed, another rank stopped during a step's collective.

    Example:
        A plain PyTorch loop (``recorder.record_step`` reads the ``.grad`` of the
        recorded parameters after ``backward``):

        >>> import tempfile, torch
        >>> from gradspec import GradientRecorder
        >>> model, out = torch.nn.Linear(4, 2), tempfile.mkdtemp()
        >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> with GradientRecorder(out=out, model=model) as recorder:
        ...     for step in range(3):
        ...         x, y = torch.randn(8, 4), torch.randint(0, 2, (8,))
        ...         loss = torch.nn.functional.cross_entropy(model(x), y)
        ...         opt.zero_grad(); loss.backward()
        ...         recorder.record_step(loss=loss.item(), batch_size=len(x))
        ...         opt.step()
        >>> recorder.store.shape, recorder.store.status
        ((3, 10), 'complete')
    """

    def attach_opacus(self, optimizer: Any, *, accountant: Any = None, delta: float | None = None) -> Any:
        """Record from an Opacus ``DPOptimizer``; see :func:`gradspec.collect.record_opacus`."""
        return record_opacus(optimizer, recorder=self, accountant=accountant, delta=delta)

    def __repr__(self) -> str:
        kind = "per-example" if self.per_example else "per-step"
        return f"GradientRecorder({str(self.path)!r}, {kind}, p={self.layout.p}, rows={self.rows_recorded})"
