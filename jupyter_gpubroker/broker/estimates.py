"""The queue as the fronts see it: each waiting request's position and start estimate.

The estimates are ``eta.predicted_starts`` in priority order, ranged by the broker's
own past errors (``eta.Calibration``), and computed again only after a change (an
event, a new ranking) or ``ETA_MAX_AGE_S``: polling the queue stays cheap and its
estimates stable between changes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from .eta import Calibration, Eta, View, predicted_starts
from .models import Request
from .predictor import Predictor

ETA_MAX_AGE_S = 30.0
"""How long the queue's start estimates stand without a change: the leases' elapsed
times, which they rest on, move on."""


@dataclass(frozen=True)
class QueueEntry:
    position: int
    request: Request
    priority: float
    eta: Eta | None
    """Expected start (epoch seconds) as a (low, median, high) range from the run-time
    predictor (``eta.predicted_starts``), with the start promised from time limits
    (``bound``, which the range never passes); None when the broker cannot know it."""


class StartEstimates:
    """The queue's calibrated start estimates, kept until the next change."""

    def __init__(
        self,
        view: View,
        predictor: Predictor,
        calibration: Calibration,
        bound: Callable[[str], float | None] = lambda request_id: None,
    ) -> None:
        """``bound``: a waiting request's promised start (``limits.Promises.bound``)."""
        self.view, self.predictor, self.calibration = view, predictor, calibration
        self.bound = bound
        self._last: tuple[object, float, dict[str, Eta | None]] | None = None
        """(the change it was made after, when, estimates) of the last ones."""

    def of(self, ranked: list[Request], now: float, change: object) -> dict[str, Eta | None]:
        """The estimates of ``ranked`` (the queue in priority order) after ``change``
        (anything that differs after a change). An empty queue has none to compute (what
        the leases' ends would be is not needed)."""
        last = self._last
        if last is None or last[0] != change or now - last[1] > ETA_MAX_AGE_S:
            raw = predicted_starts(self.view, ranked, self.predictor, now) if ranked else {}
            last = self._last = (change, now, self.calibration.apply(raw, now))
        return {rid: self._bounded(rid, eta, now) for rid, eta in last[2].items()}

    def _bounded(self, request_id: str, eta: Eta | None, now: float) -> Eta | None:
        """``eta`` with the request's promised start, if any (and cut to it)."""
        bound = self.bound(request_id)
        if bound is None:
            return eta
        if eta is None:
            return Eta(min(now, bound), bound, bound, bound, "time limits")
        low, median = min(eta.low, bound), min(eta.median, bound)
        return replace(eta, low=low, median=median, high=min(eta.high, bound), bound=bound)
