"""What a state file recorded of demand and of the machine, read back for learning from it:
the forecast (``broker.forecast``) reads each request's waiting and holding, the what-if
replay (``replay.whatif``) its requests and the machine they ran on."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from .models import Inventory
from .store import Store


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


def machines(store: Store) -> list[tuple[float, list[dict[str, Any]], dict[str, Any]]]:
    """Each machine recorded, oldest first: (since, its GPUs, the settings)."""
    rows = store.conn.execute("SELECT since, gpus, settings FROM machines ORDER BY since")
    return [(float(t), json.loads(gpus), json.loads(settings)) for t, gpus, settings in rows]


def requests(store: Store) -> list[dict[str, Any]]:
    """Every request with its lease, if it had one, in submission order: what a replay
    of the file's history submits."""
    return list(
        store.db.query(
            "SELECT r.id, r.user, r.size, r.job_class, r.submitted_at, r.expected_duration_s,"
            " r.state, l.grp, l.profile, l.gpu_equivalents, l.granted_at, l.ended_at,"
            " l.state AS lease_state FROM requests r"
            " LEFT JOIN leases l ON l.request_id = r.id ORDER BY r.seq"
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
