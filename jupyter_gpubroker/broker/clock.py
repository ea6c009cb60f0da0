"""Clocks. The core never reads the time itself: it asks the clock it was given."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """UTC seconds since the epoch."""
        ...


class SystemClock:
    """Wall-clock time, for servers."""

    def now(self) -> float:
        return time.time()


class VirtualClock:
    """A clock that only moves when told to, for tests and trace replay."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> float:
        if seconds < 0:
            raise ValueError("a clock cannot go backwards")
        self._now += seconds
        return self._now

    def set(self, when: float) -> float:
        if when < self._now:
            raise ValueError("a clock cannot go backwards")
        self._now = float(when)
        return self._now
