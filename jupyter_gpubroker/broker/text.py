"""Words for people: the one way durations and start estimates are written, in the core's
reasons, the widgets and the CLI."""

from __future__ import annotations

from datetime import datetime


def duration(seconds: float) -> str:
    """A short human duration: "40 s", "3 min", "2 h 05 min"."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds // 60:.0f} min"
    return f"{seconds // 3600:.0f} h {seconds % 3600 // 60:02.0f} min"


def clock(t: float) -> str:
    """An instant (UTC seconds) as local wall-clock time: "10:40"."""
    return datetime.fromtimestamp(t).astimezone().strftime("%H:%M")


def start_estimate(
    estimate: tuple[float, float, float | None] | None, position: int | None, now: float
) -> str:
    """A waiting request's start as its user reads it, from (low, median, high; None: no
    bound): "10:40 (10:20-11:30)"; "any moment" only once the low end is now; "unknown;
    position 3" when the broker cannot know (never a guess that looks like one)."""
    if estimate is None:
        return "unknown" + (f"; position {position}" if position else "")
    low, median, high = estimate
    until = f"-{clock(high)}" if high is not None else " or later"
    if median <= now:
        return "any moment" + (f" (by {clock(high)})" if high is not None else "")
    start = "now" if low <= now else clock(low)
    if start == clock(median) and high is not None and clock(high) == start:
        return start
    return f"{clock(median)} ({start}{until})"
