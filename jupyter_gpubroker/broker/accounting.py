"""Accounting: GPU-hours per user, group, profile or day from the ledger, optionally priced.

A GPU-hour is one GPU-equivalent held for an hour (a MIG slice counts its compute slices
out of 7), as quotas count it. Prices are per GPU-hour and per profile (``gpu`` for whole
GPUs, ``*`` for any other), times the factor of the time-of-day band in force: peak and
off-peak, read in the deployment's time zone like the policy's windows. A lease that
crosses midnight (by day) or a band's edge is split there, so each part is counted in its
own day and priced at its own band.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, tzinfo
from typing import Any

from ..wire.errors import InvalidRequest
from .policy import Window

GROUPINGS = ("user", "group", "profile", "job_class", "day")


@dataclass(frozen=True)
class PriceBand:
    """A time-of-day band and the factor its GPU-hours are priced at."""

    window: Window
    factor: float


@dataclass(frozen=True)
class Prices:
    per_gpu_hour: Mapping[str, float]
    """Profile (``gpu`` for whole GPUs, ``*`` for the rest) -> price of a GPU-hour."""
    bands: tuple[PriceBand, ...] = ()
    """Checked in order; the first that contains an instant applies (none: factor 1)."""
    currency: str = ""

    def __post_init__(self) -> None:
        for k, v in [*self.per_gpu_hour.items(), *((b.window.name, b.factor) for b in self.bands)]:
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
                raise InvalidRequest(f"price or factor of {k!r} must be zero or more, not {v!r}")
            if not math.isfinite(v):
                raise InvalidRequest(f"price or factor of {k!r} must be finite")

    def of(self, profile: str, local: datetime) -> float:
        """The price of a GPU-hour of ``profile`` at the local time ``local``."""
        price = self.per_gpu_hour.get(profile, self.per_gpu_hour.get("*"))
        if price is None:
            raise InvalidRequest(f"no price for profile {profile!r} (and no '*' price)")
        band = next((b for b in self.bands if b.window.contains(local)), None)
        return price * (band.factor if band else 1.0)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Prices:
        """From a prices file: ``{currency: EUR, per_gpu_hour: {gpu: 4, "*": 3}, bands:
        [{name: peak, start: "08:00", end: "20:00", days: mon-fri, factor: 1.5}]}``."""
        unknown = set(d) - {"currency", "per_gpu_hour", "bands"}
        if unknown or not isinstance(d.get("per_gpu_hour"), Mapping):
            raise InvalidRequest(
                "prices need 'per_gpu_hour' (a mapping of profiles to prices), optionally "
                "'bands' and 'currency'"
                + (f"; unknown: {', '.join(sorted(unknown))}" if unknown else "")
            )
        bands = []
        if not isinstance(d.get("bands") or (), (list, tuple)):
            raise InvalidRequest("price 'bands' must be a list of bands")
        for b in d.get("bands") or ():
            if not isinstance(b, Mapping) or "factor" not in b:
                raise InvalidRequest(f"a price band needs name, start, end and factor: {b!r}")
            window = Window.from_dict({k: v for k, v in b.items() if k != "factor"})
            bands.append(PriceBand(window, b["factor"]))
        return cls(dict(d["per_gpu_hour"]), tuple(bands), str(d.get("currency", "")))


@dataclass(frozen=True)
class UsageRow:
    key: str
    gpu_hours: float
    cost: float | None = None


def usage(
    rows: Iterable[Mapping[str, Any]],
    *,
    since: float,
    until: float,
    by: str,
    tz: tzinfo,
    prices: Prices | None = None,
) -> list[UsageRow]:
    """GPU-hours (and their cost, with ``prices``) of ``rows`` inside [since, until),
    grouped by user, group (``""``: none), profile, job class or local day; largest first
    (days in order)."""
    if by not in GROUPINGS:
        raise InvalidRequest(f"usage is grouped by {', '.join(GROUPINGS)}, not {by!r}")
    if since > until:
        raise InvalidRequest("'since' is after 'until'")
    edges = sorted({0.0, *(h for b in (prices.bands if prices else ()) for h in _hours(b))})
    hours: dict[str, float] = defaultdict(float)
    cost: dict[str, float] = defaultdict(float)
    whole = by != "day" and prices is None  # nothing to cut at midnights or band edges
    for row in rows:
        start, end = max(row["start"], since), min(row["end"], until)
        if whole and start < end:
            hours[str(row[_COLUMN[by]])] += row["gpu_equivalents"] * (end - start) / 3600.0
            continue
        for a, b, local in _pieces(start, end, tz, edges):
            key = local.date().isoformat() if by == "day" else str(row[_COLUMN[by]])
            gpu_hours = row["gpu_equivalents"] * (b - a) / 3600.0
            hours[key] += gpu_hours
            if prices is not None:
                cost[key] += gpu_hours * prices.of(row["profile"], local)
    keys = sorted(hours) if by == "day" else sorted(hours, key=lambda k: (-hours[k], k))
    return [UsageRow(k, hours[k], cost[k] if prices else None) for k in keys]


_COLUMN = {"user": "user", "group": "grp", "profile": "profile", "job_class": "job_class"}


def _hours(band: PriceBand) -> tuple[float, float]:
    return band.window.start_hour, band.window.end_hour


def _pieces(
    start: float, end: float, tz: tzinfo, edges: list[float]
) -> Iterator[tuple[float, float, datetime]]:
    """[start, end) cut at every local midnight and band edge (hours of the day in
    ``edges``): (piece start, piece end, local time at its start)."""
    t = start
    while t < end:
        local = datetime.fromtimestamp(t, tz)
        midnight = local.replace(hour=0, minute=0, second=0, microsecond=0)
        cuts = [(midnight + timedelta(hours=h)).timestamp() for h in [*edges, 24.0]]
        nxt = min((c for c in cuts if c > t), default=end)
        yield t, min(end, nxt), local
        t = min(end, nxt)
