"""Quotas: each user's and group's share, most GPUs held at once, and GPU-hour budget.

:class:`Budgets` keeps the quotas (committed to the store before memory changes), the
GPU-equivalents each entity holds and the GPU-hours its leases used in the current
budget period. The broker asks it at submit (:meth:`Budgets.admit`: refuse what a
quota forbids outright) and before each grant (:meth:`Budgets.blocks`: hold back what
would break one now), and tells it of every lease that starts or ends.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass

from ..wire.errors import InvalidRequest, QuotaExceeded
from ..wire.sizes import QUOTA_BOUNDS, number, seconds_between
from .fairshare import Entity, entities
from .models import Lease, Request
from .store import Store

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Quota:
    """Limits of one user or group; ``None`` means unlimited / default."""

    share: float | None = None
    max_gpus: float | None = None
    """Most GPU-equivalents held at once."""
    gpu_hours: float | None = None
    """GPU-hour budget per period."""
    period_s: float | None = None

    def __post_init__(self) -> None:
        """Refuse any value a later step (fair share, budget periods) could not use."""
        problems = quota_problems(self.to_json())
        if problems:
            raise InvalidRequest("; ".join(problems.values()), fields=problems)

    def to_json(self) -> dict[str, float | None]:
        return {
            "share": self.share,
            "max_gpus": self.max_gpus,
            "gpu_hours": self.gpu_hours,
            "period_s": self.period_s,
        }


def quota_problems(values: Mapping[str, object]) -> dict[str, str]:
    """What is wrong with each field of a quota (``QUOTA_BOUNDS``; a budget needs both
    ``gpu_hours`` and ``period_s``); empty when it is a quota the broker can use."""
    problems = {}
    for name, (lo, hi) in QUOTA_BOUNDS.items():
        v = values.get(name)
        words = seconds_between(lo, hi) if name == "period_s" else ""
        try:
            if v is not None:
                number(v, f"quota {name}", lo, hi, words=words)
        except InvalidRequest as e:
            problems[name] = e.message
    budget = [values.get(k) is None for k in ("gpu_hours", "period_s")]
    if budget[0] != budget[1] and not problems:
        missing = "period_s" if budget[1] else "gpu_hours"
        problems[missing] = "a GPU-hour budget needs both gpu_hours and period_s"
    return problems


@dataclass(frozen=True)
class HeldBack:
    """Why a quota keeps a request waiting: whose quota (``entity``), and either the
    leases that fill its most at once, or when its spent GPU-hour budget renews."""

    entity: Entity
    quota: Quota
    held: tuple[Lease, ...]
    renews_at: float | None = None


class Budgets:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._quotas: dict[Entity, Quota] = {}
        self._held_eq: dict[Entity, float] = defaultdict(float)
        self._leases: dict[Entity, dict[str, Lease]] = defaultdict(dict)
        """Each entity's active leases, in grant order: their running GPU-hours count in
        its budget (per entity, so a budget check costs its own leases, not the cluster's)."""
        # (period index, closed GPU-hours) per entity
        self._budget_used: dict[Entity, tuple[int, float]] = {}

    def quotas(self) -> dict[Entity, Quota]:
        return dict(self._quotas)

    def share(self, entity: Entity) -> float | None:
        """The entity's configured fair share, None for the default."""
        q = self._quotas.get(entity)
        return q.share if q else None

    def restore(self, now: float) -> None:
        """Read the quotas and this period's closed budgets back from the store."""
        for row in self.store.quotas():
            entity = (row["kind"], row["name"])
            try:
                q = Quota(row["share"], row["max_gpus"], row["gpu_hours"], row["period_s"])
            except InvalidRequest as e:  # written by an older version that let it through
                log.warning("ignoring the stored quota of %s %r: %s", *entity, e.message)
                continue
            self._quotas[entity] = q
            self._set_budget(entity, self._closed_budget(entity, q, now))

    def set(self, entity: Entity, quota: Quota, now: float) -> None:
        """Set (replace) an entity's quota: committed, then in force."""
        budget = self._closed_budget(entity, quota, now)  # before the commit
        with self.store.transaction():
            self.store.upsert_quota(entity[0], entity[1], quota.to_json())
        self._quotas[entity] = quota
        self._set_budget(entity, budget)

    def delete(self, entity: Entity) -> bool:
        """Remove an entity's quota; False if it had none."""
        if entity not in self._quotas:
            return False
        with self.store.transaction():
            self.store.delete_quota(*entity)
        del self._quotas[entity]
        return True

    def hold(self, lease: Lease) -> None:
        """A lease starts: its GPU-equivalents and running hours count from now on."""
        for entity in entities(lease.user, lease.group):
            self._leases[entity][lease.id] = lease
            self._held_eq[entity] += lease.gpu_equivalents

    def end(self, lease: Lease, now: float) -> None:
        """A lease ends: its hours close into the current period's budget."""
        hours = lease.gpu_equivalents * (now - lease.granted_at) / 3600.0
        for entity in entities(lease.user, lease.group):
            held = self._leases[entity]
            del held[lease.id]
            if not held:
                del self._leases[entity]
            self._held_eq[entity] -= lease.gpu_equivalents
            self._add_budget(entity, hours, now)

    def admit(self, r: Request, eq: float, now: float) -> None:
        """Refuse (``QuotaExceeded``) a request of ``eq`` GPU-equivalents that a quota
        forbids outright: larger than its most GPUs, or its budget spent."""
        for entity in entities(r.user, r.group):
            q = self._quotas.get(entity)
            if q is None:
                continue
            who = f"{entity[0]} {entity[1]!r}"
            if q.max_gpus is not None and eq > q.max_gpus:
                raise QuotaExceeded(
                    f"asks for {eq:g} GPU-equivalents but {who} may hold at most {q.max_gpus:g}"
                )
            if q.gpu_hours is not None and self._budget_spent(entity, q, now) >= q.gpu_hours:
                raise QuotaExceeded(
                    f"{who} has used its {q.gpu_hours:g} GPU-hour budget for this period"
                )

    def blocks(self, r: Request, eq: float, now: float) -> bool:
        """Would granting ``r`` ``eq`` GPU-equivalents now break its user's or group's
        quota?"""
        return bool(self._quotas) and self.holding_back(r, eq, now) is not None

    def holding_back(self, r: Request, eq: float, now: float) -> HeldBack | None:
        """The quota that a grant of ``r`` (``eq`` GPU-equivalents) now would break, with
        what its user or group holds, or when its spent budget renews; None if none."""
        for entity in entities(r.user, r.group):
            q = self._quotas.get(entity)
            if q is None:
                continue
            if q.max_gpus is not None and self._held_eq[entity] + eq > q.max_gpus + 1e-9:
                return HeldBack(entity, q, tuple(self._leases.get(entity, {}).values()))
            if q.gpu_hours is not None and self._budget_spent(entity, q, now) >= q.gpu_hours:
                assert q.period_s is not None
                renews_at = (now // q.period_s + 1) * q.period_s
                return HeldBack(entity, q, (), renews_at)
        return None

    def held(self, kind: str, name: str) -> float:
        """The GPU-equivalents ``(kind, name)`` holds now."""
        return max(0.0, self._held_eq.get((kind, name), 0.0))

    def spent(self, entity: Entity, now: float) -> float | None:
        """The GPU-hours ``entity`` used in its budget's current period, running leases
        included (None without a budget)."""
        q = self._quotas.get(entity)
        return None if q is None or q.period_s is None else self._budget_spent(entity, q, now)

    def _budget_spent(self, entity: Entity, q: Quota, now: float) -> float:
        assert q.period_s is not None
        period = int(now // q.period_s)
        start = period * q.period_s
        idx, closed = self._budget_used.get(entity, (period, 0.0))
        spent = closed if idx == period else 0.0
        for lease in self._leases.get(entity, {}).values():
            spent += lease.gpu_equivalents * (now - max(lease.granted_at, start)) / 3600.0
        return spent

    def _closed_budget(self, entity: Entity, q: Quota, now: float) -> tuple[int, float] | None:
        """The current period of ``entity``'s budget and the GPU-hours of its leases that
        ended in it, from the ledger (None without a budget). Reads only."""
        if q.period_s is None:
            return None
        period = int(now // q.period_s)
        rows = self.store.ledger(since=period * q.period_s)
        return period, sum(r["gpu_hours"] for r in rows if entity in entities(r["user"], r["grp"]))

    def _set_budget(self, entity: Entity, budget: tuple[int, float] | None) -> None:
        if budget is None:
            self._budget_used.pop(entity, None)
        else:
            self._budget_used[entity] = budget

    def _add_budget(self, entity: Entity, hours: float, now: float) -> None:
        q = self._quotas.get(entity)
        if q is None or q.period_s is None:
            return
        period = int(now // q.period_s)
        idx, closed = self._budget_used.get(entity, (period, 0.0))
        self._budget_used[entity] = (period, (closed if idx == period else 0.0) + hours)
