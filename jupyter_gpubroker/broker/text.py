"""Words for people: the one way durations are written, in the core's reasons and the widgets."""

from __future__ import annotations


def duration(seconds: float) -> str:
    """A short human duration: "40 s", "3 min", "2 h 05 min"."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds // 60:.0f} min"
    return f"{seconds // 3600:.0f} h {seconds % 3600 // 60:02.0f} min"
