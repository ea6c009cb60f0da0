"""The checks of what a caller sends, shared by the API's rules and its hosts."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..wire.errors import InvalidRequest
from ..wire.sizes import said
from .shapes import parse_iso

MAX_REASON = 500


def only(body: dict[str, Any], fields: Iterable[str]) -> None:
    """Refuse a body with a field its operation does not take (each body has a fixed
    shape, ``additionalProperties: false`` in the API document): a misspelt field is a
    400, never silently ignored."""
    unknown = set(body) - set(fields)
    if unknown:
        raise InvalidRequest(
            f"unknown field(s): {', '.join(sorted(unknown))}; this call takes "
            f"{', '.join(sorted(fields))}"
        )


def holder_of(body: dict[str, Any]) -> Any:
    """Who holds a new request: its ``holder``, or ``owner``, that field's deprecated
    name, accepted for one release; both must then name the same holder."""
    if "holder" in body and "owner" in body and body["holder"] != body["owner"]:
        raise InvalidRequest(
            "'holder' and 'owner' name two different holders: give 'holder' alone "
            "('owner' is its old name)"
        )
    return body.get("holder", body.get("owner", ""))


def reason_text(value: Any) -> str:
    """An admin's optional reason: text of at most ``MAX_REASON`` characters."""
    if value is None:
        return ""
    if not isinstance(value, str) or len(value) > MAX_REASON:
        raise InvalidRequest(f"'reason' must be text of at most {MAX_REASON} characters")
    return value.strip()


def parse_int(name: str, value: str | None, lo: int, hi: int, default: int) -> int:
    """An integer query argument in [lo, hi] (``default`` when absent)."""
    if value is None:
        return default
    try:
        n = int(value)
    except ValueError:
        n = lo - 1
    if not lo <= n <= hi:
        raise InvalidRequest(
            f"'{name}' must be an integer from {said(lo)} to {said(hi)}, not {said(value)}"
        )
    return n


def parse_time(name: str, value: str | None) -> float | None:
    """An ISO 8601 query argument as UTC seconds (None when absent)."""
    if value is None:
        return None
    try:
        return parse_iso(value)
    except ValueError:
        raise InvalidRequest(f"'{name}' must be an ISO 8601 time, not {said(value)}") from None
