"""Idle reclaim as arithmetic on a kernel's busy spans, where nothing else moves them.

A kernel holds its GPUs from its start. An idle gap (from the end of its busy spans so far
to the start of the next, or to its stop) longer than ``limit_s`` (the idle timeout and
its grace) ends the hold ``limit_s`` after the gap began: the reclaimer warns a kernel idle
for the timeout and reclaims it at the grace's end. A kernel shut down holds again from its
next span that needs the GPU (one that does not goes on without it); it is *lost* where any
span follows the gap (its user came back to it; a shutdown after the last span costs nobody
anything).

Two readers: the notebook benchmark checks the real reclaimer's replay (``.notebooks``)
against this count where no cell waits, and the what-if (``.whatif``) cuts a state file's
leases with it before replaying them through the core.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Holds:
    spans: tuple[tuple[float, float], ...]
    """When the GPUs are held, in order."""
    shutdowns: int
    lost: int


def holds(
    start: float, stop: float, busy: Iterable[tuple[float, float, bool]], limit_s: float
) -> Holds:
    """The holds of a kernel started at ``start`` whose user leaves at ``stop``, busy
    during each (start, end, needs the GPU) of ``busy`` (in order), reclaimed after
    ``limit_s`` idle."""
    held: list[tuple[float, float]] = []
    since: float | None = start
    last = start
    shutdowns = lost = 0
    for a, b, gpu in busy:
        if since is not None and a - last > limit_s:
            held.append((since, last + limit_s))
            since, shutdowns, lost = None, shutdowns + 1, lost + 1
        if since is None and gpu:
            since = a
        last = max(last, b)
    if since is not None:
        gone = stop - last > limit_s
        held.append((since, last + limit_s if gone else stop))
        shutdowns += gone
    return Holds(tuple(held), shutdowns, lost)
