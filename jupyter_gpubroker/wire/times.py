"""The API's instants: UTC seconds (floats) inside, ISO 8601 text on the wire; the one
conversion each way, for the API's shapes and the event bus's envelope alike."""

from __future__ import annotations

from datetime import datetime, timezone


def iso(t: float | None) -> str | None:
    """UTC seconds -> ISO 8601 (``None`` stays ``None``)."""
    if t is None:
        return None
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="milliseconds")


def parse_iso(text: str) -> float:
    """ISO 8601 (a naive time is UTC) -> UTC seconds; ValueError if malformed."""
    dt = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.timestamp()
