"""The fair-share ledger: who has used the machine lately, against their share of it.

Each user and group (an *entity*) has a usage: the GPU-seconds of its leases, decayed
with the policy's half-life, plus, for a user, an entry penalty charged at each grant
(as Kueue's admission fair sharing does, so a burst of one user's requests cannot take
every free device in one pass; not to the group, whose other members made no burst).
Its fair-share factor is Slurm's classic ``F = 2^(-U/S)``, with ``U`` its usage over
all entities' of its kind and ``S`` its share over theirs. The policy orders by
``F_user * F_group`` and preemption takes from the lowest: one definition for both.

Usage accrues continuously; factors are computed as of the last :meth:`recalc` (the
broker's ranking instant), so priorities stay fixed between recalculations.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from .models import Lease

Entity = tuple[str, str]
"""("user", name) or ("group", name)."""


def entities(user: str, group: str) -> list[Entity]:
    """Who a lease of ``user`` charged to ``group`` ("" for none) is counted against."""
    return [("user", user), ("group", group)] if group else [("user", user)]


def decayed_integral(rate: float, seconds: float, half_life: float) -> float:
    """Usage accrued at ``rate`` over the last ``seconds``, decayed to now."""
    return float(rate * half_life / math.log(2) * (1.0 - 2.0 ** (-seconds / half_life)))


class FairShareLedger:
    def __init__(
        self,
        share: Callable[[Entity], float],
        *,
        half_life_s: float,
        entry_penalty_s: float,
        now: float,
    ) -> None:
        """``share``: an entity's configured share (its quota's, else the default)."""
        self.share = share
        self.half_life_s = half_life_s
        self.entry_penalty_s = entry_penalty_s
        # decayed GPU-seconds per entity, each as of its own time
        self._usage: dict[Entity, list[float]] = {}
        self._accrued_at = -math.inf
        """When every active lease's usage was last charged (a recalculation)."""
        self._accrual_ref = now
        self._accruing: dict[Entity, list[float]] = {}
        """Per entity holding leases: [leases, GPU-equivalents, sum of each lease's
        GPU-equivalents * 2^((its accrued-until - ref) / half-life)]; with these a
        recalculation charges all of an entity's leases at once, not lease by lease."""
        self._totals: dict[str, float] = {"user": 0.0, "group": 0.0}
        self._share_totals: dict[str, float] = {"user": 0.0, "group": 0.0}
        self._shares_of = -1
        """How many entities ``_share_totals`` counts (-1: sum them again at the next
        recalculation): the sum changes only when one joins or a quota changes."""
        self._fs_cache: dict[Entity, float] = {}
        self._pairs: dict[tuple[str, str], float] = {}
        """``fairshare`` per (user, group), kept while both factors are: the policy asks
        it of every queued bucket at each recalculation."""
        self._pairs_of: dict[Entity, set[tuple[str, str]]] = {}

    # -- what the policy and preemption read

    def fairshare(self, user: str, group: str) -> float:
        """``F_user * F_group`` in (0, 1]: what the policy orders by."""
        pair = (user, group)
        f = self._pairs.get(pair)
        if f is None:
            f = self.factor(("user", user))
            f = self._pairs[pair] = f * self.factor(("group", group)) if group else f
            for entity in entities(user, group):
                self._pairs_of.setdefault(entity, set()).add(pair)
        return f

    def factor(self, entity: Entity) -> float:
        """Slurm's classic fair-share factor ``2^(-U/S)`` for one entity."""
        f = self._fs_cache.get(entity)
        if f is None:
            u, s = self.usage_share(entity), self.norm_share(entity)
            f = self._fs_cache[entity] = 2.0 ** (-u / s)
        return f

    def usage_share(self, entity: Entity) -> float:
        """``U``: the entity's part of its kind's decayed usage, as of the last recalc."""
        kind = entity[0]
        cell = self._usage.get(entity)
        used = cell[0] if cell else 0.0
        return used / self._totals[kind] if self._totals[kind] > 0 else 0.0

    def norm_share(self, entity: Entity) -> float:
        """``S``: the entity's share over the shares of every entity of its kind."""
        return self.share(entity) / (self._share_totals[entity[0]] or self.share(entity))

    def over_share(self, entity: Entity) -> bool:
        """Has it used more than its share (``U > S``, ``F < 1/2``)?"""
        return self.usage_share(entity) > self.norm_share(entity)

    # -- what the broker tells it

    def register(self, user: str, group: str, now: float) -> bool:
        """Count the user and group in the share totals; True if one is new (the
        factors then need a recalculation)."""
        new = [e for e in entities(user, group) if e not in self._usage]
        for e in new:
            self._decayed(e, now)
        return bool(new)

    def charge_entry(self, user: str, gpu_equivalents: float, now: float) -> bool:
        """Charge a grant's entry penalty to its user; True if it changed their usage."""
        if not self.entry_penalty_s:
            return False
        self._charge(("user", user), gpu_equivalents * self.entry_penalty_s, now)
        return True

    def charge_past(
        self, user: str, group: str, gpu_equivalents: float, start: float, end: float, now: float
    ) -> None:
        """Charge a lease that ended before this broker started (from the store)."""
        age = max(now - end, 0.0)
        amount = decayed_integral(gpu_equivalents, end - start, self.half_life_s) * 2.0 ** (
            -age / self.half_life_s
        )
        for entity in entities(user, group):
            self._charge(entity, amount, now)

    def hold(self, lease: Lease) -> None:
        """A lease starts accruing usage (from its grant)."""
        self._add_accruing(lease, 1.0)

    def end(self, lease: Lease, now: float) -> None:
        """A lease ends: charge its usage since it was last charged, stop accruing it."""
        since = max(lease.granted_at, self._accrued_at)
        if now > since:
            amount = decayed_integral(lease.gpu_equivalents, now - since, self.half_life_s)
            for entity in entities(lease.user, lease.group):
                self._charge(entity, amount, now)
        self._add_accruing(lease, -1.0)

    def recalc(self, now: float) -> None:
        """Bring every entity's usage to ``now`` and reset the factors."""
        self._accrue_all(now)
        totals = {"user": 0.0, "group": 0.0}
        for entity in self._usage:
            totals[entity[0]] += self._decayed(entity, now)[0]
        self._totals = totals
        if self._shares_of != len(self._usage):
            shares = {"user": 0.0, "group": 0.0}
            for entity in self._usage:
                shares[entity[0]] += self.share(entity)
            self._share_totals, self._shares_of = shares, len(self._usage)
        self._fs_cache.clear()
        self._pairs.clear()
        self._pairs_of.clear()

    def shares_changed(self) -> None:
        """A quota's share changed: sum the shares again at the next recalculation."""
        self._shares_of = -1

    # -- internals

    def _decayed(self, entity: Entity, now: float) -> list[float]:
        cell = self._usage.setdefault(entity, [0.0, now])
        if cell[1] != now:
            cell[0] *= 2.0 ** (-(now - cell[1]) / self.half_life_s)
            cell[1] = now
        return cell

    def _charge(self, entity: Entity, gpu_seconds: float, now: float) -> None:
        if gpu_seconds:
            self._decayed(entity, now)[0] += gpu_seconds
            self._totals[entity[0]] += gpu_seconds
            self._fs_cache.pop(entity, None)
            for pair in self._pairs_of.pop(entity, ()):
                self._pairs.pop(pair, None)

    def _add_accruing(self, lease: Lease, sign: float) -> None:
        """Count a lease in (``sign`` 1) or out of (-1) its entities' accrual sums."""
        since = max(lease.granted_at, self._accrued_at)
        eq = lease.gpu_equivalents
        weight = eq * 2.0 ** ((since - self._accrual_ref) / self.half_life_s)
        for entity in entities(lease.user, lease.group):
            cell = self._accruing.setdefault(entity, [0.0, 0.0, 0.0])
            cell[0] += sign
            cell[1] += sign * eq
            cell[2] += sign * weight
            if not cell[0]:
                del self._accruing[entity]

    def _accrue_all(self, now: float) -> None:
        """Charge every active lease's usage up to ``now``: per entity, the sum over its
        leases of ``decayed_integral(eq, now - since)``, in closed form. Only ``recalc``
        calls it, which sums the totals again and empties the caches next, so the usage
        is added without ``_charge``'s upkeep of them."""
        h = self.half_life_s
        per_unit = h / math.log(2)
        decay = 2.0 ** (-(now - self._accrual_ref) / h)
        for entity, cell in self._accruing.items():
            amount = per_unit * (cell[1] - decay * cell[2])
            if amount > 0:
                self._decayed(entity, now)[0] += amount
            cell[2] = cell[1]
        self._accrued_at = self._accrual_ref = now
