"""Device samples in the broker's SQLite file, downsampled in tiers of bounded size.

Every sampling pass writes one raw row per GPU and MIG device. Closed minutes are
rolled up into one row each, closed hours from those minutes, and each tier keeps
only its window: raw samples for an hour, minutes for a week, hours for
``hours_kept_s`` (a year by default). The file therefore stays bounded however long
the broker runs: 64 devices sampled every 5 s hold about 46,000 raw, 645,000 minute
and 560,000 hour rows at most. The tables come from the store's schema migrations.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..broker.models import DeviceEvent, DeviceReading, Health
from ..broker.store import Store

RAW = 0
"""The resolution recorded for raw samples (one per sampling pass)."""
FIELDS = (
    "utilization_gpu",
    "utilization_memory",
    "memory_used_mib",
    "temperature_c",
    "power_w",
    "clock_event_reasons",
    "unhealthy",
)
_AGGREGATE = {"clock_event_reasons": "BIT_OR", "unhealthy": "MAX"}
"""How a roll-up combines each field (the rest are averaged)."""
_ROLLUP = ", ".join(f"{_AGGREGATE.get(f, 'AVG')}({f})" for f in FIELDS)


class _BitOr:
    """SQLite aggregate: the bitwise OR of clock-event reasons over a bucket."""

    def __init__(self) -> None:
        self.value: int | None = None

    def step(self, v: int | None) -> None:
        if v is not None:
            self.value = (self.value or 0) | v

    def finalize(self) -> int | None:
        return self.value


@dataclass(frozen=True)
class Tier:
    resolution_s: int
    kept_s: float


class SampleStore:
    """Writes samples and device events, rolls them up, and reads them back."""

    def __init__(
        self,
        store: Store,
        interval_s: float,
        *,
        raw_kept_s: float = 3600.0,
        minutes_kept_s: float = 7 * 86400.0,
        hours_kept_s: float = 365 * 86400.0,
    ) -> None:
        self.store = store
        self.interval_s = interval_s
        self.tiers = (Tier(RAW, raw_kept_s), Tier(60, minutes_kept_s), Tier(3600, hours_kept_s))
        # typeshed wants finalize() -> int; SQLite takes None (NULL: no device reported it)
        store.conn.create_aggregate("BIT_OR", 1, _BitOr)  # type: ignore[arg-type]
        self._rolled = {t.resolution_s: self._last(t.resolution_s) for t in self.tiers[1:]}
        """Per rolled-up tier: the end of the last bucket it holds."""

    def _last(self, res: int) -> float | None:
        row = self.store.conn.execute("SELECT MAX(t) FROM samples WHERE res=?", (res,)).fetchone()
        return None if row[0] is None else float(row[0]) + res

    def record(
        self, now: float, readings: Mapping[str, DeviceReading], events: Iterable[DeviceEvent]
    ) -> None:
        """One pass's readings and events, in one transaction with the roll-ups due."""
        rows = [(uuid, RAW, now, 1, *_values(r)) for uuid, r in readings.items()]
        with self.store.transaction() as c:
            c.executemany(
                f"INSERT OR REPLACE INTO samples (uuid, res, t, n, {', '.join(FIELDS)})"
                f" VALUES (?, ?, ?, ?{', ?' * len(FIELDS)})",
                rows,
            )
            c.executemany(
                "INSERT INTO device_events (uuid, at, kind, code) VALUES (?, ?, ?, ?)",
                [(e.uuid, now, e.kind, e.code) for e in events],
            )
            self._roll_up(now)
            c.executemany(
                "DELETE FROM samples WHERE res=? AND t < ?",
                [(t.resolution_s, now - t.kept_s) for t in self.tiers],
            )
            c.execute("DELETE FROM device_events WHERE at < ?", (now - self.tiers[-1].kept_s,))

    def _roll_up(self, now: float) -> None:
        """Fold every closed bucket of each tier not rolled up yet into the next tier."""
        for source, tier in zip(self.tiers, self.tiers[1:], strict=False):
            res = tier.resolution_s
            end = math.floor(now / res) * res
            start = self._rolled[res]
            if start is None:
                first = self.store.conn.execute(
                    "SELECT MIN(t) FROM samples WHERE res=?", (source.resolution_s,)
                ).fetchone()[0]
                start = end if first is None else math.floor(first / res) * res
            if start < end:
                self.store.conn.execute(
                    f"INSERT OR REPLACE INTO samples (uuid, res, t, n, {', '.join(FIELDS)})"
                    f" SELECT uuid, {res}, CAST(t / {res} AS INTEGER) * {res} AS bucket, SUM(n),"
                    f" {_ROLLUP} FROM samples WHERE res=? AND t >= ? AND t < ?"
                    " GROUP BY uuid, bucket",
                    (source.resolution_s, start, end),
                )
            self._rolled[res] = max(start, end)

    def series(self, uuid: str, since: float, now: float) -> tuple[int, list[dict[str, Any]]]:
        """Samples of ``uuid`` from ``since`` on, from the finest tier that still covers
        ``since``: (resolution in seconds, rows oldest first)."""
        tier = next((t for t in self.tiers if since >= now - t.kept_s), self.tiers[-1])
        rows = self.store.db.query(
            f"SELECT t, n, {', '.join(FIELDS)} FROM samples WHERE uuid=? AND res=? AND t >= ?"
            " ORDER BY t",
            [uuid, tier.resolution_s, since],
        )
        resolution = tier.resolution_s or math.ceil(self.interval_s)
        return resolution, list(rows)

    def events(self, uuid: str, since: float) -> list[dict[str, Any]]:
        """Xid and ECC events of ``uuid`` from ``since`` on, oldest first."""
        return list(
            self.store.db.query(
                "SELECT at, kind, code FROM device_events WHERE uuid=? AND at >= ? ORDER BY at",
                [uuid, since],
            )
        )


def _values(r: DeviceReading) -> tuple[Any, ...]:
    return (
        r.utilization_gpu,
        r.utilization_memory,
        r.memory_used_mib,
        r.temperature_c,
        None if r.power_mw is None else r.power_mw / 1000,
        r.clock_event_reasons,
        int(r.health is not Health.OK),
    )
