"""What a state file recorded of demand and of the machine, read back for learning from it:
the forecast (``broker.forecast``) reads each request's waiting and holding, the what-if
replay (``replay.whatif``) its requests, when their kernels were busy and the machine they
ran on."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from .models import Inventory
from .store import Store

MERGE_S = 60.0
"""Busy spans less than this apart are recorded as one: an idle timeout is minutes long,
and a GPU in use while its kernel sits idle moves the idle start at every look."""
MAX_SPANS = 500
"""The most busy spans a lease records (past them its last span grows): a lease's record
stays under about 15 kB however long it is held."""


def machine(inventory: Inventory) -> list[dict[str, Any]]:
    """Per GPU, in index order: ``model`` (the catalog's, else NVML's name) and ``mig``
    (profile -> slices; null with MIG off)."""
    slices: dict[str, Counter[str]] = {g.uuid: Counter() for g in inventory.gpus}
    for d in inventory.devices:
        if d.kind == "mig" and d.profile:
            slices[d.gpu_uuid][d.profile] += 1
    return [
        {
            "model": g.model or g.name,
            "mig": dict(sorted(slices[g.uuid].items())) if g.mig_enabled else None,
        }
        for g in sorted(inventory.gpus, key=lambda g: (g.node, g.index))
    ]


def record_machine(
    store: Store, at: float, gpus: list[dict[str, Any]], settings: dict[str, Any]
) -> None:
    """The machine served from ``at`` on (``machine``) and the settings it ordered by,
    where either differs from the last recorded; call inside ``store.transaction()``."""
    now = (json.dumps(gpus, sort_keys=True), json.dumps(settings, sort_keys=True))
    row = store.conn.execute(
        "SELECT gpus, settings FROM machines ORDER BY since DESC LIMIT 1"
    ).fetchone()
    if row is None or tuple(row) != now:
        store.conn.execute("INSERT OR REPLACE INTO machines VALUES (?, ?, ?)", (at, *now))


class Activity:
    """Each lease's busy spans, as the reclaimer sees them, written to its ``busy`` column.

    At each look (``look``) a lease whose kernel is seen is busy (idle for 0 s: running a
    cell, or its GPU in use) or idle since ``now - idle_s``. A span opens at the first busy
    look and closes at the idle start; activity between two looks (a short cell) is a span
    that ends where the idle time starts again. A lease seen but never busy records ``[]``;
    one never seen keeps null. Kept across restarts: a lease's spans are read back the first
    time it is seen."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._spans: dict[str, list[list[float | None]]] = {}

    def look(self, now: float, leases: dict[str, tuple[float, float]]) -> None:
        """``leases``: lease id -> (granted at, idle seconds at this look), for the leases
        whose kernel is seen; the changed spans in one transaction."""
        for gone in self._spans.keys() - leases.keys():
            del self._spans[gone]
        changed = {}
        for lease_id, (granted_at, idle_s) in leases.items():
            spans = self._spans.get(lease_id)
            if spans is None:
                spans = self._spans[lease_id] = self._read(lease_id)
                changed[lease_id] = spans
            if _moved_on(spans, granted_at, now, idle_s):
                changed[lease_id] = spans
        if changed:
            with self.store.transaction() as c:
                c.executemany(
                    "UPDATE leases SET busy=? WHERE id=?",
                    [(json.dumps(spans), lease_id) for lease_id, spans in changed.items()],
                )

    def _read(self, lease_id: str) -> list[list[float | None]]:
        row = self.store.conn.execute("SELECT busy FROM leases WHERE id=?", (lease_id,)).fetchone()
        return [] if row is None or row[0] is None else json.loads(row[0])


def _moved_on(
    spans: list[list[float | None]], granted_at: float, now: float, idle_s: float
) -> bool:
    """Update ``spans`` by one look; whether they changed."""
    is_open = bool(spans) and spans[-1][1] is None
    last = spans[-1][1] if spans and not is_open else granted_at
    assert last is not None
    if idle_s <= 0:
        if is_open:
            return False
        if spans and (now - last < MERGE_S or len(spans) >= MAX_SPANS):
            spans[-1][1] = None  # the last span goes on
        else:
            spans.append([round(now, 1), None])
        return True
    since = round(now - idle_s, 1)
    if is_open:
        spans[-1][1] = max(since, spans[-1][0] or since)
        return True
    if since <= last + 1.0:  # idle since the last span (or the grant): nothing new
        return False
    if spans and (since - last < MERGE_S or len(spans) >= MAX_SPANS):
        spans[-1][1] = since
    else:
        spans.append([since, since])  # it ran something between two looks
    return True


def machines(store: Store) -> list[tuple[float, list[dict[str, Any]], dict[str, Any]]]:
    """Each machine recorded, oldest first: (since, its GPUs, the settings)."""
    rows = store.conn.execute("SELECT since, gpus, settings FROM machines ORDER BY since")
    return [(float(t), json.loads(gpus), json.loads(settings)) for t, gpus, settings in rows]


def requests(store: Store) -> list[dict[str, Any]]:
    """Every request with its lease, if it had one, in submission order: what a replay
    of the file's history submits; ``busy`` the lease's spans (``Activity``, as JSON) and
    ``reclaim_cause`` why it was reclaimed (null: its holder ended it, or it goes on)."""
    return list(
        store.db.query(
            "SELECT r.id, r.user, r.size, r.job_class, r.submitted_at, r.expected_duration_s,"
            " r.state, l.grp, l.profile, l.gpu_equivalents, l.granted_at, l.ended_at,"
            " l.state AS lease_state, l.busy, (SELECT kind FROM reclaims WHERE lease_id = l.id)"
            " AS reclaim_cause FROM requests r LEFT JOIN leases l ON l.request_id = r.id"
            " ORDER BY r.seq"
        )
    )


def demand(store: Store, since: float, now: float) -> list[dict[str, Any]]:
    """Every request still waiting or held after ``since``, for the forecast: its
    ``submitted_at``, ``size``, ``job_class``, its lease's ``gpu_equivalents`` and
    ``granted_at`` (null: never granted) and ``ended_at`` (``now`` while it goes on)."""
    return list(
        store.db.query(
            "SELECT r.submitted_at, r.size, r.job_class, l.gpu_equivalents, l.granted_at,"
            " COALESCE(l.ended_at, CASE WHEN l.id IS NULL THEN r.ended_at END, :now)"
            " AS ended_at FROM requests r LEFT JOIN leases l ON l.request_id = r.id"
            " WHERE COALESCE(l.ended_at, r.ended_at, :now) > :since ORDER BY r.seq",
            {"since": since, "now": now},
        )
    )
