"""How right the start estimates a waiting user sees are: measured during a replay.

For every job that waits, the probe asks two estimators when it will start:
at its submission (after the pass that could not grant it) and then at the
first instant at least ``every_s`` after the previous sample, while it waits:

- ``predicted``: what ``Broker.queue()`` shows,
  :func:`~jupyter_gpubroker.broker.eta.predicted_starts` from the broker's
  run-time predictor: a (low, median, high) range, scaled by the broker's
  :class:`~jupyter_gpubroker.broker.eta.Calibration`. Its history is only what
  the replay has seen end or start so far: never a job's own duration. ``raw``
  is the predictor's range before that scaling, for comparison.
- ``squeue``: :func:`~jupyter_gpubroker.broker.eta.limit_starts`, Slurm's
  ``squeue --start``, every job running to its limit (``expected_duration_s``).
  Without a limit model the replay's jobs declare their true duration, so its
  limits are exact: the best case of that estimator, which real limits (padded by
  their users) are not; with one (:mod:`.limits`) it plans with the declared limits,
  as a real Slurm would.

Each estimate is scored against the job's real start: the absolute error over
the wait that really remained from the instant of the estimate (at least
``FLOOR_S``, so a wait of a second does not make an error of hours look
small), and whether the range covered the real start.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..broker.core import Broker
from ..broker.eta import Eta, limit_starts
from ..broker.models import Request

FLOOR_S = 60.0
"""The smallest remaining wait an error is divided by."""


@dataclass(frozen=True)
class Estimate:
    """What one estimator said at ``at`` about a job that really started at ``start``."""

    at: float
    start: float
    at_submit: bool
    predicted: Eta | None
    raw: Eta | None
    squeue: float | None


@dataclass
class EtaProbe:
    """Asks the estimators while jobs wait; the driver calls its hooks."""

    every_s: float
    at_submit: bool = True
    """Also ask at each submission; without, a job's first estimate waits for the next
    sample (jobs granted before it have none): far fewer passes of the estimators on a
    trace as busy as Philly."""
    estimates: list[Estimate] = field(default_factory=list)
    _open: dict[str, list[tuple[float, bool, Eta | None, Eta | None, float | None]]] = field(
        default_factory=dict
    )
    _next_sample: float = -math.inf

    def after_pass(self, broker: Broker, submitted: Sequence[str], now: float) -> None:
        """Estimate for the requests just submitted and still waiting, and for every
        waiting request when a sample is due."""
        fresh = [rid for rid in submitted if broker.request(rid).lease_id is None]
        due = now >= self._next_sample
        if not self.at_submit:
            self._open.update((rid, []) for rid in fresh)
            fresh = [rid for rid, kept in self._open.items() if not kept] if due else []
        if not fresh and not (due and self._open):
            return
        entries = broker.queue()
        queue = [e.request for e in entries]
        predicted = {e.request.id: e.eta for e in entries}
        raw = broker.calibration.raw
        squeue = limit_starts(broker, queue, lambda r: _limit(broker, r), now)
        asked = set(fresh)
        for rid in fresh:
            self._open[rid] = [(now, True, predicted[rid], raw.get(rid), squeue[rid])]
        if due:
            for rid in self._open.keys() - asked:
                self._open[rid].append((now, False, predicted[rid], raw.get(rid), squeue[rid]))
            self._next_sample = now + self.every_s

    def granted(self, request_id: str, now: float) -> None:
        for at, at_submit, predicted, raw, squeue in self._open.pop(request_id, []):
            self.estimates.append(Estimate(at, now, at_submit, predicted, raw, squeue))


def _limit(broker: Broker, r: Request) -> float:
    return r.expected_duration_s or broker.config.expected_hold_s(r.job_class.value)


def relative_error(e: Estimate, said: float) -> float:
    """``|said - start|`` over the wait that really remained (at least ``FLOOR_S``)."""
    return abs(said - e.start) / max(e.start - e.at, FLOOR_S)
