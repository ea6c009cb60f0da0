"""The API's instants: UTC seconds (floats) inside, ISO 8601 text on the wire; the one
conversion each way, for the API's shapes and the event bus's envelope alike."""

from __future__ import annotations

from datetime import datetime, timezone, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from .errors import InvalidRequest


def iso(t: float | None) -> str | None:
    """UTC seconds -> ISO 8601 (``None`` stays ``None``)."""
    if t is None:
        return None
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="milliseconds")


def zone(name: str) -> tzinfo:
    """The time zone an IANA name names (``UTC`` even without the zone database); a
    sentence (``InvalidRequest``) for a name this machine does not know."""
    if name == "UTC":
        return timezone.utc
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidRequest(f"unknown time zone {name!r}") from None


def parse_iso(text: str) -> float:
    """ISO 8601 (a naive time is UTC) -> UTC seconds; ValueError if malformed."""
    dt = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.timestamp()
