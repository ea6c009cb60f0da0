"""The JSON shapes of the API, shared by every front (handlers, CLI, hub, widgets).

Times leave the core as UTC seconds and reach clients as ISO 8601 strings;
durations stay in seconds. What a viewer may see of other users' objects is
decided here, once: user names yes, request and lease ids, kernel ids and
tokens never.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ..broker.core import Broker, Event, QueueEntry, Vacating
from ..broker.eta import Eta
from ..broker.models import DeviceReading, Inventory, Lease, Request, ShareUse
from ..events import envelope
from ..wire.text import devices_held, held_back, period, queue_place, quota_allows
from ..wire.times import iso
from ..wire.times import parse_iso as parse_iso  # the API's, as its callers name it


def request_json(
    r: Request,
    entry: QueueEntry | None = None,
    length: int = 0,
    ahead: Mapping[str, int] | None = None,
    held: str | None = None,
) -> dict[str, Any]:
    """A request; while it waits (``entry``), its position, ETA and ``place``: where it
    stands in the words every front shows (``wire.text.queue_place``, with the queue's
    ``length`` and the requests ``ahead`` by class), and ``held_back``: why a quota
    keeps it waiting (``held``, ``held_back_text``), null when none does."""
    d = r.to_json()
    d["owner"] = r.holder  # the old name of "holder", answered for one release
    d["submitted_at"] = iso(r.submitted_at)
    d["ended_at"] = iso(r.ended_at)
    d["expires_at"] = iso(d["expires_at"])
    d["position"] = entry.position if entry else None
    d["place"] = queue_place(entry.position, length, ahead) if entry else None
    d["held_back"] = held if entry else None
    d.update(eta_json(entry.eta if entry else None))
    return d


def held_back_text(core: Broker, r: Request, viewer: str) -> str | None:
    """Why a quota keeps a waiting request from a grant now (``Budgets.holding_back``),
    in words for ``viewer``, in things of this machine; None where no quota does."""
    hb = core.budgets.holding_back(r, core.scheduler.gpu_eq(r.size), core.clock.now())
    if hb is None:
        return None
    profiles = {d.profile: d.gpu_equivalents for d in core.inventory.devices if d.profile}
    (kind, name), q = hb.entity, hb.quota
    mine = kind == "user" and name == viewer
    if hb.renews_at is not None:
        assert q.gpu_hours is not None and q.period_s is not None
        budget = f"{q.gpu_hours:g} GPU-hours per {period(q.period_s)}"
        return held_back(kind, name, mine, budget=budget, renews_at=hb.renews_at)
    held = [
        {"kind": "share", "memory_mib": x.share_mib}
        if x.shared
        else {"kind": "gpu" if x.profile == "gpu" else "mig", "profile": x.profile}
        for x in hb.held
        for _ in x.devices
    ]
    allows = quota_allows(q.max_gpus, profiles, core.placer.shares.largest())
    return held_back(kind, name, mine, allows=allows, holds=devices_held(held))


def eta_json(eta: Eta | None) -> dict[str, Any]:
    """A start estimate: ``eta`` the median, ``eta_range`` its low and high end (``high``
    null when unbounded), ``eta_known`` false when the broker cannot know it,
    ``eta_basis`` what it rests on, ``eta_bound`` the latest start promised."""
    if eta is None:
        return {
            "eta": None,
            "eta_range": None,
            "eta_known": False,
            "eta_basis": None,
            "eta_bound": None,
        }
    high = iso(eta.high) if math.isfinite(eta.high) else None
    return {
        "eta": iso(eta.median),
        "eta_range": {"low": iso(eta.low), "high": high},
        "eta_known": True,
        "eta_basis": eta.basis,
        "eta_bound": None if eta.bound is None else iso(eta.bound),
    }


def lease_json(lease: Lease) -> dict[str, Any]:
    d = lease.to_json()
    for k in ("granted_at", "expires_at", "ended_at", "reclaim_at", "ends_at"):
        d[k] = iso(d[k])
    return d


def queue_json(
    entries: list[QueueEntry], viewer: str, admin: bool, kernel_id: str | None = None
) -> list[dict[str, Any]]:
    """The whole queue; other users' entries without ids or holder (for a viewer with a
    kernel token, ``kernel_id``, every entry but its own kernel's)."""
    out = []
    for e in entries:
        r = e.request
        shown = admin or (r.user == viewer and kernel_id in (None, r.holder))
        out.append(
            {
                "position": e.position,
                **eta_json(e.eta),
                "user": r.user,
                "job_class": r.job_class.value,
                **r.size.to_json(),
                "submitted_at": iso(r.submitted_at),
                "mine": r.user == viewer,
                "id": r.id if shown else None,
                "holder": r.holder if shown else None,
                "owner": r.holder if shown else None,  # the old name of "holder"
            }
        )
    return out


def reading_json(r: DeviceReading | None) -> dict[str, Any]:
    if r is None:
        return {}
    return {
        "health": r.health.value,
        "utilization_gpu": r.utilization_gpu,
        "memory_used_mib": r.memory_used_mib,
        "temperature_c": r.temperature_c,
        "power_w": None if r.power_mw is None else r.power_mw / 1000,
        "unsupported": list(r.unsupported),
    }


def devices_json(
    inventory: Inventory,
    readings: dict[str, DeviceReading],
    holders: dict[str, Lease],
    viewer: str | None = None,
    admin: bool = True,
    kernel_id: str | None = None,
    kernel_of: Mapping[str, str] | None = None,
    drains: Mapping[str, tuple[str, float]] | None = None,
    vacating: Mapping[str, Vacating] | None = None,
    causes: Mapping[str, str] | None = None,
    outside: Mapping[str, list[dict[str, Any]]] | None = None,
    shared: Mapping[str, list[Lease]] | None = None,
    sharing: Mapping[str, dict[str, Any]] | None = None,
    share_use: Mapping[str, ShareUse] | None = None,
    idle_reclaim: Mapping[str, dict[str, str]] | None = None,
) -> list[dict[str, Any]]:
    """Every GPU with its grantable devices, live readings, holders and drain state; other
    users' holders without ids. A viewer with a kernel token (``kernel_id``) sees the ids of
    its own kernel's leases only: ``kernel_of`` maps the holders' request ids to their
    kernels (the requests' ``holder``).
    ``drains``: drained GPU or device UUID -> (reason, since); a GPU's covers its devices.
    ``causes``: who drained each (``health``, ``vacate``, ``admin``; default ``health``).
    ``vacating``: devices of ended leases still waiting for their processes to exit.
    ``outside``: device UUID -> the processes using it outside the broker (``user``,
    ``pid``, ``since`` in UTC seconds, ``text``). ``idle_reclaim``: device UUID -> what an
    idle reclaim does to its kernel (``action``, ``reason``). ``shared``: GPU UUID -> its
    shares; ``sharing``: GPU UUID -> how it is lent and what holds its shares
    (``GPUBroker.sharing_of``); ``share_use``: lease id -> what a share's processes use of
    its GPU (memory and utilization)."""
    drains, vacating, causes, outside = drains or {}, vacating or {}, causes or {}, outside or {}
    reclaim = idle_reclaim or {}
    shared, sharing, share_use = shared or {}, sharing or {}, share_use or {}

    def lent(uuid: str) -> dict[str, Any] | None:
        how = sharing.get(uuid)
        if how is None:
            return None
        shares = []
        for x in shared.get(uuid, []):
            use = share_use.get(x.id, ShareUse())
            shares.append(
                {
                    **(holder(x) or {}),
                    "memory_mib": x.share_mib,
                    "used_mib": use.used_mib,
                    "utilization": use.utilization,
                }
            )
        return {**how, "shares": shares}

    def left(uuid: str) -> dict[str, Any] | None:
        v = vacating.get(uuid)
        return None if v is None else {"since": iso(v.since), "pids": list(v.pids)}

    def drained(*uuids: str) -> dict[str, Any] | None:
        found = next((u for u in uuids if u in drains), None)
        if found is None:
            return None
        reason, since = drains[found]
        return {"reason": reason, "since": iso(since), "cause": causes.get(found, "health")}

    def holder(lease: Lease | None) -> dict[str, Any] | None:
        if lease is None:
            return None
        visible = admin or (
            lease.user == viewer
            and (kernel_id is None or (kernel_of or {}).get(lease.request_id) == kernel_id)
        )
        return {
            "user": lease.user,
            "lease_id": lease.id if visible else None,
            "request_id": lease.request_id if visible else None,
        }

    return [
        {
            "index": g.index,
            "uuid": g.uuid,
            "name": g.name,
            "model": g.model,
            "memory_mib": g.memory_mib,
            "mig_enabled": g.mig_enabled,
            "drained": drained(g.uuid),
            "sharing": lent(g.uuid),
            **reading_json(readings.get(g.uuid)),
            "devices": [
                {
                    "uuid": d.uuid,
                    "kind": d.kind,
                    "label": d.label,
                    "profile": d.profile,
                    "start": d.start,
                    "memory_mib": d.memory_mib,
                    "gpu_equivalents": round(d.gpu_equivalents, 4),
                    "holder": holder(holders.get(d.uuid)),
                    "lent": (sharing.get(d.uuid) or {}).get("mode", "whole"),
                    "shares": len(shared.get(d.uuid, [])),
                    "drained": drained(d.uuid, g.uuid),
                    "vacating": left(d.uuid),
                    "outside": [{**o, "since": iso(o["since"])} for o in outside.get(d.uuid, [])],
                    "idle_reclaim": reclaim.get(d.uuid),
                    **reading_json(readings.get(d.uuid)),
                }
                for d in sorted(inventory.devices, key=lambda d: d.start or 0)
                if d.gpu_uuid == g.uuid
            ],
        }
        for g in inventory.gpus
    ]


def event_json(event_id: int, e: Event, viewer: str, admin: bool) -> dict[str, Any]:
    """A broker event as a viewer may see it: their own in full (its detail nested
    under ``data``), others' with only the user it is about."""
    if admin or e.user == viewer:
        data = e.to_json()["data"]
        for k in ("deadline", "ends_at", "broken_bound", "eta_bound"):  # a warning's, ...
            if data.get(k) is not None:  # ... an extension's, a broken promise's
                data[k] = iso(data[k])
        if "alert" in data:  # an alert's
            data["alert"] = alert_json(data["alert"])
    else:
        data = {"user": e.user}
    return envelope(event_id, e.kind, e.at, data)


def samples_json(
    uuid: str,
    resolution_s: int,
    samples: list[dict[str, Any]],
    events: list[dict[str, Any]],
) -> dict[str, Any]:
    """A device's samples (``SampleStore.series``) and hardware events, times in ISO."""
    return {
        "uuid": uuid,
        "resolution_s": resolution_s,
        "samples": [{**s, "t": iso(s["t"]), "unhealthy": bool(s["unhealthy"])} for s in samples],
        "events": [{**e, "at": iso(e["at"])} for e in events],
    }


EVIDENCE_TIMES = ("kernel_last_activity", "warned_at", "deadline")
"""The evidence fields of a reclaim that are instants (UTC seconds in the store)."""


def reclaim_json(row: Mapping[str, Any]) -> dict[str, Any]:
    """A reclaim record (``Store.reclaims``): whose lease, when, why (``cause``,
    ``reason``) and what the reclaimer saw (``evidence``: idle time, utilization, the
    kernel's activity; the admin who took it)."""
    evidence = dict(row["evidence"])
    for k in EVIDENCE_TIMES:
        if isinstance(evidence.get(k), (int, float)):
            evidence[k] = iso(evidence[k])
    return {
        "lease_id": row["lease_id"],
        "request_id": row["request_id"],
        "user": row["user"],
        "group": row["grp"],
        "profile": row["profile"],
        "devices": list(row["devices"]),
        "granted_at": iso(row["granted_at"]),
        "at": iso(row["at"]),
        "cause": row["kind"],
        "reason": row["reason"],
        "evidence": evidence,
    }


def alert_json(alert: Mapping[str, Any]) -> dict[str, Any]:
    """A health alert (``Alert.to_json`` or a ``Store`` row), times in ISO; ``ended`` is
    null while it is active."""
    return {
        "id": alert["id"],
        "uuid": alert["uuid"],
        "label": alert["label"],
        "kind": alert["kind"],
        "severity": alert["severity"],
        "message": alert["message"],
        "since": iso(alert["since"]),
        "ended": iso(alert["ended"]),
    }


def audit_json(row: Mapping[str, Any]) -> dict[str, Any]:
    """An audit record (``Store.audit``)."""
    return {
        "id": row["id"],
        "at": iso(row["at"]),
        "actor": row["actor"],
        "action": row["action"],
        "target": row["target"],
        "detail": row["detail"],
    }


def drain_json(
    uuid: str, drain: tuple[str, float] | None, cause: str | None, message: str
) -> dict[str, Any]:
    """A GPU's or device's own drain after an admin's drain or undrain, and what it means."""
    drained = (
        None if drain is None else {"reason": drain[0], "since": iso(drain[1]), "cause": cause}
    )
    return {"uuid": uuid, "drained": drained, "message": message}
