"""`PrivacyAccountant`: the stateful record of the mechanisms a DP-SGD run applies.

It keeps the events (consecutive equal mechanisms merged), validates what it loads,
and answers ``epsilon(delta)`` through the pure composition math of
`gradspec.privacy._compose` (whose docstring says what each method computes and why
shuffled batches are accounted without amplification). Input checks live in
`gradspec.privacy._validate`.
"""

from __future__ import annotations

from typing import Any

from gradspec._enums import Accounting, parse_choice
from gradspec.privacy._compose import RDP_ORDERS, _epsilon, _Event  # noqa: F401 - RDP_ORDERS re-exported
from gradspec.privacy._validate import (  # noqa: F401 - default_delta, check_delta re-exported
    _check_int,
    check_delta,
    check_noise_multiplier,
    check_sample_rate,
    default_delta,
)

_STATE_VERSION = 1
_KINDS = ("poisson", "shuffle", "gaussian")


class PrivacyAccountant:
    """Records the mechanisms a DP-SGD run applies and answers ``epsilon(delta)``.

    Events are kept as a compact list (consecutive identical mechanisms merge
    into a count), so `state_dict` is a small JSON-able dict and a resumed run
    continues its accounting exactly. ``epsilon`` recomputes from the events,
    cached by (events, delta). With ``pld`` the single step's distribution is built
    once per (q, noise multiplier) and each query is one FFT power of the composed
    distribution (tens of milliseconds for 10^3 to 10^4 Poisson steps), the same
    computation whatever was asked before, so epsilon can be logged at every step; a run
    whose distribution would exceed ``gradspec.privacy._pld.MAX_PLD_POINTS`` points
    (millions of steps) is refused with a ValueError that names ``rdp``.

    Args:
        method: ``pld`` (default), ``rdp`` or ``rdp-classic``; see the module docstring.

    Example:
        >>> acc = PrivacyAccountant(method="rdp")
        >>> acc.record_poisson(1.1, 256 / 60000, steps=1000)
        >>> round(acc.epsilon(1e-5), 3)
        0.889
    """

    def __init__(self, *, method: Accounting | str = Accounting.PLD) -> None:
        self.method: Accounting = parse_choice(Accounting, method, "accounting method")
        self._events: list[_Event] = []
        self._steps = 0
        # The shuffled epoch in progress: (steps done in it, its noise multiplier, steps per epoch).
        self._epoch: tuple[int, float, int] | None = None

    # ------------------------------------------------------------------ recording
    def _append(self, kind: str, sigma: float, q: float, count: int) -> None:
        if count == 0:
            return
        last = self._events[-1] if self._events else None
        if last is not None and (last.kind, last.noise_multiplier, last.sample_rate) == (
            kind,
            sigma,
            q,
        ):
            self._events[-1] = last._replace(count=last.count + count)
        else:
            self._events.append(_Event(kind, sigma, q, count))

    def record_poisson(self, noise_multiplier: float, sample_rate: float, steps: int = 1) -> None:
        """Record ``steps`` DP-SGD steps on Poisson-sampled batches (each example joins w.p. q).

        Args:
            noise_multiplier: sigma; the noise std is sigma times the clipping norm.
            sample_rate: q in (0, 1]; q = 1 is full-batch (a plain Gaussian mechanism).
            steps: how many such steps (>= 1).
        """
        sigma = check_noise_multiplier(noise_multiplier)
        q = check_sample_rate(sample_rate)
        steps = _check_int(steps, "steps", minimum=1)
        self._append("poisson", sigma, q, steps)
        self._steps += steps

    def record_shuffled(
        self, noise_multiplier: float, steps_per_epoch: int, steps: int = 1
    ) -> None:
        """Record ``steps`` DP-SGD steps on shuffled fixed-size batches.

        Every started epoch is one Gaussian mechanism (no amplification by
        subsampling) of sensitivity 2C, i.e. at noise multiplier sigma / 2: a fixed-size
        batch's sum moves by up to 2C when one example takes another's place
        (``gradspec.privacy._compose``, "Sampling"); a partial epoch is carried across calls, so 10 calls of
        one step with 10 steps per epoch record one mechanism, not ten. If the
        noise multiplier changes inside an epoch, the rest of that epoch is
        recorded as a further Gaussian mechanism (an upper bound).

        Args:
            noise_multiplier: sigma of these steps.
            steps_per_epoch: batches per epoch (>= 1); may change only at an epoch boundary.
            steps: how many steps (>= 1).

        Raises:
            ValueError: on bad inputs, or a change of ``steps_per_epoch`` inside an epoch.
        """
        sigma = check_noise_multiplier(noise_multiplier)
        per_epoch = _check_int(steps_per_epoch, "steps_per_epoch", minimum=1)
        steps = _check_int(steps, "steps", minimum=1)
        new = 0
        rest = steps
        position = 0
        if self._epoch is not None:
            position, open_sigma, open_per_epoch = self._epoch
            if per_epoch != open_per_epoch:
                raise ValueError(
                    f"steps_per_epoch changed from {open_per_epoch} to {per_epoch} inside an epoch "
                    f"({position} of {open_per_epoch} steps done); change it only at an epoch boundary"
                )
            inside = min(rest, per_epoch - position)  # steps that finish the open epoch
            if sigma != open_sigma:
                new += 1
            rest -= inside
        new += -(-rest // per_epoch)  # ceil
        self._append("shuffle", sigma, 1.0, new)
        position = (position + steps) % per_epoch
        self._epoch = (position, sigma, per_epoch) if position else None
        self._steps += steps

    def record_gaussian(self, noise_multiplier: float, count: int = 1) -> None:
        """Record ``count`` non-subsampled Gaussian mechanisms (sensitivity 1, std sigma).

        For privacy spent outside the gradient steps, e.g. a noisy
        preconditioner computed on the private data. Does not advance `steps`.
        """
        sigma = check_noise_multiplier(noise_multiplier)
        count = _check_int(count, "count", minimum=1)
        self._append("gaussian", sigma, 1.0, count)

    # ------------------------------------------------------------------ queries
    @property
    def steps(self) -> int:
        """DP-SGD steps recorded (Poisson and shuffled; not `record_gaussian`)."""
        return self._steps

    @property
    def events(self) -> list[dict[str, Any]]:
        """The compact event list, as dicts (a copy)."""
        return [e._asdict() for e in self._events]

    def epsilon(self, delta: float) -> float:
        """epsilon at ``delta`` of everything recorded (0 if nothing; inf if any sigma is 0)."""
        return _epsilon(self.method, tuple(self._events), check_delta(delta))

    def to_dict(self, delta: float | None = None) -> dict[str, Any]:
        """A readable summary: method, steps, events; and epsilon when ``delta`` is given."""
        out: dict[str, Any] = {
            "method": self.method.value,
            "steps": self._steps,
            "events": self.events,
        }
        if delta is not None:
            out["delta"] = float(delta)
            out["epsilon"] = self.epsilon(delta)
        return out

    def __repr__(self) -> str:
        return f"PrivacyAccountant(method={self.method.value!r}, steps={self._steps}, events={len(self._events)})"

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """A small JSON-able dict from which `load_state_dict` restores this accountant."""
        epoch = None
        if self._epoch is not None:
            position, sigma, per_epoch = self._epoch
            epoch = {"position": position, "noise_multiplier": sigma, "steps_per_epoch": per_epoch}
        return {
            "version": _STATE_VERSION,
            "method": self.method.value,
            "steps": self._steps,
            "events": self.events,
            "epoch": epoch,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from `state_dict` output, after checking it; nothing changes on error.

        Raises:
            ValueError: naming what is wrong (method mismatch, missing or bad fields).
        """
        if not isinstance(state, dict):
            raise ValueError(f"accountant state must be a dict, got {type(state).__name__}")
        missing = [k for k in ("method", "steps", "events") if k not in state]
        if missing:
            raise ValueError(f"accountant state lacks {', '.join(missing)}")
        if state.get("version", _STATE_VERSION) != _STATE_VERSION:
            raise ValueError(
                f"accountant state version {state['version']!r}; this gradspec reads {_STATE_VERSION}"
            )
        if state["method"] != self.method.value:
            raise ValueError(
                f"accountant state was recorded with method {state['method']!r}, "
                f"but this accountant uses {self.method.value!r}; create it with method={state['method']!r}"
            )
        try:
            steps = _check_int(state["steps"], "steps", minimum=0)
            if not isinstance(state["events"], list):
                raise ValueError(f"events must be a list, got {type(state['events']).__name__}")
            events = [_load_event(i, raw) for i, raw in enumerate(state["events"])]
            epoch = _load_epoch(state.get("epoch"))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"bad accountant state: {exc}") from None
        self._events, self._steps, self._epoch = events, steps, epoch


def _load_event(i: int, raw: Any) -> _Event:
    if not isinstance(raw, dict):
        raise ValueError(f"event {i} must be a dict, got {type(raw).__name__}")
    missing = [f for f in _Event._fields if f not in raw]
    if missing:
        raise ValueError(f"event {i} lacks {', '.join(missing)}")
    if raw["kind"] not in _KINDS:
        raise ValueError(f"event {i} has kind {raw['kind']!r}; expected one of {', '.join(_KINDS)}")
    sigma = check_noise_multiplier(raw["noise_multiplier"])
    q = check_sample_rate(raw["sample_rate"])
    if raw["kind"] != "poisson" and q != 1:
        raise ValueError(f"event {i} ({raw['kind']}) must have sample_rate 1, got {q}")
    return _Event(raw["kind"], sigma, q, _check_int(raw["count"], f"event {i} count", minimum=1))


def _load_epoch(raw: Any) -> tuple[int, float, int] | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or {"position", "noise_multiplier", "steps_per_epoch"} - set(raw):
        raise ValueError(
            "epoch must be null or a dict with position, noise_multiplier, steps_per_epoch"
        )
    per_epoch = _check_int(raw["steps_per_epoch"], "epoch steps_per_epoch", minimum=1)
    position = _check_int(raw["position"], "epoch position", minimum=1)
    if position >= per_epoch:
        raise ValueError(f"epoch position {position} must be below steps_per_epoch {per_epoch}")
    return position, check_noise_multiplier(raw["noise_multiplier"]), per_epoch
