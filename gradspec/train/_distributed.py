"""Training under ``torch.distributed``: which process this is, and the few collectives a
distributed DP-SGD step needs. The one owner of distributed concerns in gradspec.

Under ``torchrun --nproc_per_node N`` (or any launcher that initialises a process group),
every rank runs the same trainer (Li et al. 2022 run collection on 4 GPUs the same way):

* every rank draws the same global batch (the same seeded sampler) and computes the
  clipped per-example gradients of its own share of it, the examples ``rank::N``
  (:meth:`Ranks.shard`);
* the clipped sums are all-reduced (SUM, in float64), so every rank holds the global
  step's clipped sum (:meth:`Ranks.sum_`), and the examples' norms and losses are
  gathered in the batch's order (:meth:`Ranks.gather_examples`); per-example rows are
  gathered to rank 0 alone, which stores them as one process would;
* the Gaussian noise is drawn on every rank from the same seeded generator: the released
  sum is ``sum_i clip(g_i) + N(0, sigma^2 C^2 I)``, the noise added once, and every rank
  applies the same update and stays in step (checked at every checkpoint,
  :meth:`Ranks.check_same`);
* the sampling rate, the noise multiplier and the accountant are those of the global
  batch, exactly as in one process;
* rank 0 alone is the writer (:attr:`Ranks.is_writer`): it takes the run directory's lock
  and writes the store, metrics and checkpoints; the other ranks never open a file in the
  run directory for writing.

With one process (no process group, or a group of one) every method is the identity and
the trainer does exactly what it does without this module.

A rank that stops (killed, out of memory) makes the others' next collective fail: they
stop with :class:`RankLostError` (``torchrun`` also stops them and names the failed rank).
A rank that hangs makes the others wait for the process group's timeout (30 minutes by
default for gloo).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import pickle
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

logger = logging.getLogger(__name__)

__all__ = ["RankLostError", "Ranks", "current_ranks", "process_group"]


class RankLostError(ConnectionError):
    """A collective of a distributed run failed: another rank stopped (or never started)."""


@dataclass(frozen=True)
class Ranks:
    """This process's place in a distributed run: ``rank`` of ``world_size`` processes.

    ``Ranks()`` is one process: every method then returns its input unchanged.
    """

    rank: int = 0
    world_size: int = 1

    @property
    def active(self) -> bool:
        """More than one process takes part."""
        return self.world_size > 1

    @property
    def is_writer(self) -> bool:
        """This process writes the run's files (rank 0)."""
        return self.rank == 0

    def __str__(self) -> str:
        return f"rank {self.rank} of {self.world_size}"

    # ------------------------------------------------------------------ the step
    def shard(self, index: Tensor) -> Tensor:
        """This rank's examples of a global batch: ``index[rank::world_size]``."""
        return index[self.rank :: self.world_size] if self.active else index

    def sum_(self, total: Tensor, *, what: str = "the clipped sum") -> Tensor:
        """The sum over ranks of ``total`` (every rank gets it), accumulated in float64."""
        if not self.active:
            return total
        buf = total.to(torch.float64)
        with self._collective(what):
            torch.distributed.all_reduce(buf, op=torch.distributed.ReduceOp.SUM)
        return buf.to(total.dtype)

    def gather_examples(self, columns: Tensor, batch_size: int, *, what: str = "the examples' values",
                        to_writer: bool = False) -> Tensor | None:
        """Per-example values (b_local, k) of every rank, in the global batch's order (exact:
        gathered in their own dtype).

        Rank r holds the examples ``r::world_size`` of a batch of ``batch_size`` (its
        :meth:`shard`); every rank knows every shard's size, so the rows are padded to the
        largest shard, gathered and interleaved back. ``to_writer``: only rank 0 receives
        them (the others get None), for rows only the writer stores.
        """
        if not self.active:
            return columns
        longest = -(-batch_size // self.world_size)
        buf = torch.zeros(longest, *columns.shape[1:], dtype=columns.dtype, device=columns.device)
        buf[: columns.shape[0]] = columns
        receive = not to_writer or self.is_writer
        parts = [torch.empty_like(buf) for _ in range(self.world_size)] if receive else None
        with self._collective(what):
            if to_writer:
                torch.distributed.gather(buf, parts, dst=0)
            else:
                torch.distributed.all_gather(parts, buf)
        if not receive:
            return None
        out = torch.empty(batch_size, *columns.shape[1:], dtype=columns.dtype, device=columns.device)
        for r, part in enumerate(parts):
            out[r :: self.world_size] = part[: len(range(r, batch_size, self.world_size))]
        return out

    # ------------------------------------------------------------------ agreement
    def agree(self, error: BaseException | None, *, what: str, payload: Any = None) -> list[Any]:
        """Every rank reports how ``what`` went; all raise if any rank failed, else every rank
        gets every rank's ``payload`` (picklable), by rank.

        A rank that failed re-raises its own error; the others raise a copy of it (the
        failed rank named in a note), so every rank stops with the same one-line error and
        none waits for a collective that never comes.
        """
        if not self.active:
            if error is not None:
                raise error
            return [payload]
        reports = self.gather((None, payload) if error is None else (_portable(error), None), what=what)
        if error is not None:
            raise error
        for rank, (failed, _) in enumerate(reports):
            if failed is not None:
                failed.add_note(f"({what} failed on rank {rank} of {self.world_size})")
                raise failed
        return [p for _, p in reports]

    def gather(self, value: Any, *, what: str) -> list[Any]:
        """Every rank's ``value`` (picklable), by rank; ``[value]`` in one process."""
        if not self.active:
            return [value]
        values: list[Any] = [None] * self.world_size
        with self._collective(what):
            torch.distributed.all_gather_object(values, value)
        return values

    def broadcast_(self, tensors: Sequence[Tensor], *, what: str) -> None:
        """Overwrite ``tensors`` with rank 0's (in place)."""
        if not self.active:
            return
        with self._collective(what), torch.no_grad():
            for t in tensors:
                torch.distributed.broadcast(t.data, src=0)

    def check_same(self, values: Mapping[str, Any], *, what: str) -> None:
        """Raise ``ValueError`` unless every rank holds the same ``values`` (floats compared
        exactly: ranks that apply the same update hold the same numbers)."""
        if not self.active:
            return
        mine = dict(values)
        for rank, theirs in enumerate(self.gather(mine, what=what)):
            if theirs != mine:
                diff = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
                raise ValueError(
                    f"{what}: rank {rank} differs from rank {self.rank} in {', '.join(diff)} "
                    f"({ {k: theirs.get(k) for k in diff} } vs { {k: mine.get(k) for k in diff} }); every rank must "
                    "run the same settings, task and data"
                )

    @contextlib.contextmanager
    def _collective(self, what: str) -> Iterator[None]:
        try:
            yield
        except RuntimeError as err:  # DistBackendError and gloo's connection errors
            raise RankLostError(
                f"{self}: {what} failed, another rank has stopped ({str(err).splitlines()[0]}); the "
                "committed rows and the last checkpoint are kept: rerun the same command with --resume"
            ) from err


def _portable(error: BaseException) -> BaseException:
    """``error`` as it can travel to the other ranks (pickled): itself, or a RuntimeError saying it."""
    try:
        copy = pickle.loads(pickle.dumps(error))
        if isinstance(copy, BaseException) and str(copy) == str(error):
            return copy
    except Exception:  # noqa: BLE001 - an exception that does not pickle travels as text
        pass
    return RuntimeError(f"{type(error).__name__}: {error}")


def current_ranks() -> Ranks:
    """This process's :class:`Ranks`: those of the initialised default process group, else one process."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return Ranks(dist.get_rank(), dist.get_world_size())
    return Ranks()


def _launched_world() -> int:
    """The world size a launcher (``torchrun``) put in the environment; 1 without one."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        raise ValueError(f"WORLD_SIZE={os.environ['WORLD_SIZE']!r} is not a number of processes") from None


@contextlib.contextmanager
def process_group() -> Iterator[Ranks]:
    """The run's :class:`Ranks`, joining a launcher's process group when there is one.

    * a process group is initialised already (the user's own, or one an earlier run of this
      process joined): use it;
    * ``torchrun`` (``WORLD_SIZE`` > 1 in the environment) and none is: initialise the
      default group from the environment — gloo for CPU tensors, and NCCL for CUDA tensors
      where CUDA exists (each process on the GPU ``LOCAL_RANK``). It stays for the later
      runs of the process (a group re-made on the same port can meet a peer's old one) and
      is destroyed at exit;
    * otherwise: one process, nothing initialised.
    """
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        yield current_ranks()
        return
    world = _launched_world()
    if world <= 1:
        yield Ranks()
        return
    if not dist.is_available():
        raise ValueError(f"WORLD_SIZE={world} asks for {world} processes, but this torch has no torch.distributed")
    backend = "gloo"
    if torch.cuda.is_available() and dist.is_nccl_available():
        backend = "cpu:gloo,cuda:nccl"
        local = int(os.environ.get("LOCAL_RANK", "0"))
        if local < torch.cuda.device_count():
            torch.cuda.set_device(local)
    dist.init_process_group(backend=backend)
    atexit.register(_leave)
    ranks = current_ranks()
    logger.info("joined the process group as %s (%s)", ranks, backend)
    yield ranks


def _leave() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
