"""The queue as the fronts see it: each waiting request's position and start estimate.

The estimates are ``eta.predicted_starts`` in priority order, ranged by the broker's
own past errors (``eta.Calibration``), and computed again only after a change (an
event, a new ranking) or ``ETA_MAX_AGE_S``: polling the queue stays cheap and its
estimates stable between changes.
"""

from __future__ import annotations

from dataclasses import dataclass

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
    predictor (``eta.predicted_starts``); None when the broker cannot know it."""


class StartEstimates:
    """The queue's calibrated start estimates, kept until the next change."""

    def __init__(self, view: View, predictor: Predictor, calibration: Calibration) -> None:
        self.view, self.predictor, self.calibration = view, predictor, calibration
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
        return last[2]
