"""The live requests and active leases, in memory and in the store, kept in step.

``Book`` holds what waits (the queue, the requests' renewal deadlines) and what is held
(the leases, which device each holds), and moves each through its life: queued,
granted, ended. Each move commits to the store first and changes memory only once the
file has it, then tells everything that counts it (the fair-share ledger, the quotas,
the placer, the run-time predictor, the start estimates' calibration, the devices)
and emits its event. The broker (``core.Broker``) decides which move to make; this
module only makes it.
"""

from __future__ import annotations

import heapq
import secrets
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

from ..wire.errors import StorageFull
from .budgets import Budgets
from .clock import Clock
from .config import BrokerConfig
from .eta import Calibration
from .fairshare import FairShareLedger
from .models import Device, Event, Lease, LeaseState, Request, RequestState
from .placement import Placer
from .predictor import Predictor, held_shape
from .queue import WaitQueue
from .shares import share_mib
from .store import Store


class Held:
    """The active leases and the device each holds: the book changes them; the devices
    (``devices.Devices``) read them to tell a lease what happens to its device. Built
    before both, so neither needs the other to exist first."""

    def __init__(self) -> None:
        self.leases: dict[str, Lease] = {}
        """Active leases by id."""
        self.holder: dict[str, str] = {}
        """Device UUID -> the id of the active lease holding it whole."""
        self.shared: dict[str, set[str]] = {}
        """GPU UUID -> the ids of the active shares of it."""

    def holding(self, uuids: Iterable[str]) -> list[Lease]:
        """The active leases holding any of ``uuids`` (whole or a share), oldest grant
        first."""
        held = set()
        for u in uuids:
            if u in self.holder:
                held.add(self.holder[u])
            held |= self.shared.get(u, set())
        return sorted((self.leases[x] for x in held), key=lambda x: x.granted_at)


class Book:
    """The live requests and active leases, and each one's moves."""

    def __init__(
        self,
        store: Store,
        clock: Clock,
        config: BrokerConfig,
        *,
        held: Held,
        placer: Placer,
        ledger: FairShareLedger,
        budgets: Budgets,
        predictor: Predictor,
        calibration: Calibration,
        rank: Callable[[Request], float],
        emit: Callable[[Event], None],
        vacate: Callable[[Lease, float], None],
    ) -> None:
        """``vacate``: gives an ended lease's devices back (``Devices.vacate``)."""
        self.store, self.clock, self.config = store, clock, config
        self.placer, self.ledger, self.budgets = placer, ledger, budgets
        self.predictor, self.calibration = predictor, calibration
        self._emit, self._vacate = emit, vacate
        self.live: dict[str, Request] = {}
        """Queued and granted requests by id."""
        self.waiting = WaitQueue(rank)
        self.leases, self.holder, self.shared = held.leases, held.holder, held.shared
        """The active leases by id, the lease holding each device, the shares of each
        GPU (``Held``)."""
        self._deadlines: list[tuple[float, str]] = []
        """(expires_at, request id) of queued requests, a heap; stale entries (renewed,
        ended) are skipped as they come up."""
        self._seq = store.next_seq()

    @property
    def request_ttl_s(self) -> float:
        return self.config.request_ttl_s or self.config.lease_ttl_s

    # -- requests

    def queue(self, r: Request) -> None:
        """Commit a new request, then queue it."""
        with self.store.transaction():
            self.store.insert_request(r, self._seq)
        self._seq += 1
        self._enqueue(r)
        heapq.heappush(self._deadlines, (r.submitted_at + self.request_ttl_s, r.id))

    def renew_request(self, r: Request) -> None:
        """Keep a queued request alive for another TTL."""
        expires_at = self.clock.now() + self.request_ttl_s
        with self.store.transaction():
            self.store.renew_request(replace(r, expires_at=expires_at))
        r.expires_at = expires_at
        heapq.heappush(self._deadlines, (r.expires_at, r.id))

    def end_queued(self, r: Request, state: RequestState, reason: str, by: str = "") -> None:
        """End a request that never got a grant (cancelled, expired, refused); ``by``: the
        admin who cancelled it."""
        now = self.clock.now()
        with self.store.transaction():  # memory changes only once the file has
            self.store.end_request(replace(r, state=state, ended_at=now, reason=reason))
        r.state, r.ended_at, r.reason = state, now, reason
        self._dequeue(r)
        detail = {"reason": reason, "by": by} if by else {"reason": reason}
        self._emit(Event(state.value, now, r.user, r.id, detail=detail))

    def _enqueue(self, r: Request) -> None:
        self.live[r.id] = r
        self.waiting.add(r)

    def _dequeue(self, r: Request) -> None:
        self.waiting.remove(r)
        self.calibration.left(r.id, self.clock.now(), r.state is RequestState.GRANTED)
        if r.state is not RequestState.GRANTED:
            del self.live[r.id]

    # -- leases

    def grant(self, r: Request, devices: list[Device], now: float, expected_end: float) -> Lease:
        """Commit a lease of ``devices`` to ``r`` (a share: of its one GPU), then hold them
        for it."""
        mib = share_mib(r.size) if r.size.shared else 0
        eq = mib / devices[0].memory_mib if mib else sum(d.gpu_equivalents for d in devices)
        profile = "share" if mib else devices[0].profile or "gpu"
        lease = Lease(
            id="l-" + secrets.token_hex(6),
            request_id=r.id,
            user=r.user,
            group=r.group,
            devices=tuple(d.uuid for d in devices),
            gpu_equivalents=eq,
            granted_at=now,
            expires_at=now + self.config.lease_ttl_s,
            ttl_s=self.config.lease_ttl_s,
            profile=profile,
            limit_s=r.limit_s,
            share_mib=mib,
            compute_percent=r.size.compute_percent,
        )
        with self.store.transaction():
            self.store.insert_lease(lease, expected_end, devices[0].memory_mib)
        r.state, r.lease_id = RequestState.GRANTED, lease.id
        self._dequeue(r)
        self._hold(lease, expected_end)
        if self.ledger.charge_entry(r.user, eq, now):
            self.waiting.rerank_user(r.user)
        self._emit(
            Event(
                "granted",
                now,
                r.user,
                r.id,
                lease.id,
                {"devices": list(lease.devices), "waited_s": now - r.submitted_at},
            )
        )
        return lease

    def renew_lease(self, lease: Lease) -> None:
        """Extend a lease by its TTL."""
        expires_at = self.clock.now() + lease.ttl_s
        with self.store.transaction():
            self.store.renew_lease(replace(lease, expires_at=expires_at))
        lease.expires_at = expires_at

    def extend(self, lease: Lease, end: float) -> None:
        """Move a lease's time limit to end at ``end`` (its expected end with it)."""
        extended = replace(
            lease,
            extended_s=end - lease.granted_at - (lease.limit_s or 0.0),
            extensions=lease.extensions + 1,
        )
        with self.store.transaction():
            self.store.extend_lease(extended, end)
        lease.extended_s, lease.extensions = extended.extended_s, extended.extensions
        if lease.shared:
            self.placer.expect_share(lease.id, lease.devices[0], end)
        else:
            self.placer.expect(lease.devices, end)
        detail = {"ends_at": end, "extensions": lease.extensions}
        self._emit(Event.of_lease("extended", self.clock.now(), lease, detail))

    def move(self, lease: Lease, devices: tuple[str, ...], reason: str) -> None:
        """Hand an active lease over to ``devices``, which the broker reserved for it
        (``Devices.reserve``): its kernel moved there. Its old devices go back as an ended
        lease's do (vacating while a process stays); its charge, its time and its id stay:
        the kernel renews the same lease."""
        now, old = self.clock.now(), lease.devices
        with self.store.transaction():
            self.store.move_lease(lease.id, old, devices)
        until = self.placer.until.get(old[0]) if old else None
        lease.devices = devices
        for d in old:
            self.holder.pop(d, None)
        self.placer.release(devices)  # reserved: now held as the lease's, to its end
        self.placer.hold(devices, until=until)
        for d in devices:
            self.holder[d] = lease.id
        self.placer.ended(old)
        self._vacate(replace(lease, devices=old), now)
        detail = {"from": list(old), "to": list(devices), "reason": reason}
        self._emit(Event.of_lease("moved", now, lease, detail))

    def _hold(self, lease: Lease, expected_end: float) -> None:
        self.leases[lease.id] = lease
        self.ledger.hold(lease)
        self.budgets.hold(lease)
        if lease.shared:
            self.placer.share(lease.id, lease.devices[0], lease.share_mib, expected_end)
            self.shared.setdefault(lease.devices[0], set()).add(lease.id)
            return
        self.placer.hold(lease.devices, until=expected_end)
        for d in lease.devices:
            self.holder[d] = lease.id

    def end_lease(
        self,
        lease: Lease,
        state: LeaseState,
        reason: str,
        reclaim: tuple[str, dict[str, Any]] | None = None,
        by: str = "",
        ended: float | None = None,
    ) -> None:
        """End a lease (as of ``ended``, between its grant and now: what it is charged
        up to; default now); ``reclaim`` is the (cause, evidence) recorded with a reclaim,
        ``by`` the admin who reclaimed it."""
        now = self.clock.now()
        end = now if ended is None else min(now, max(lease.granted_at, ended))
        r = self.live[lease.request_id]
        r_state = RequestState(state.value)
        with self.store.transaction():  # memory changes only once the file has
            self.store.end_lease(
                replace(lease, state=state, ended_at=end, reason=reason), r.job_class.value
            )
            self.store.end_request(replace(r, state=r_state, ended_at=end, reason=reason))
            if reclaim is not None:
                self.store.insert_reclaim(lease.id, now, reclaim[0], reason, reclaim[1])
        lease.state, lease.ended_at, lease.reason = state, end, reason
        r.state, r.ended_at, r.reason = r_state, end, reason
        self.ledger.end(lease, end)
        self.budgets.end(lease, end)
        del self.leases[lease.id]
        del self.live[r.id]
        if lease.shared:  # its memory is free at once: the watch sees what lingers
            self.shared[lease.devices[0]].discard(lease.id)
            self.placer.unshare(lease.id, lease.devices[0])
        else:
            for d in lease.devices:
                self.holder.pop(d, None)
            self.placer.ended(lease.devices)
            self._vacate(lease, now)
        shape = held_shape(lease.profile, lease.gpu_equivalents)
        self.predictor.learn(
            lease.user, lease.group, r.job_class.value, shape, end - lease.granted_at
        )
        detail = {"reason": reason} if reclaim is None else {"reason": reason, "cause": reclaim[0]}
        if by:
            detail["by"] = by
        self._emit(Event(state.value, now, lease.user, r.id, lease.id, detail))

    # -- time

    def expire(self, now: float) -> None:
        """End the leases and queued requests whose holders stopped renewing them."""
        for lease in [x for x in self.leases.values() if x.expires_at <= now]:
            self.end_lease(lease, LeaseState.EXPIRED, "its holder stopped renewing it")
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] <= now:
            due = heapq.heappop(deadlines)
            r = self.live.get(due[1])
            if r is not None and r.state is RequestState.QUEUED and (r.expires_at or 0) <= now:
                try:
                    self.end_queued(r, RequestState.EXPIRED, "its holder stopped renewing it")
                except StorageFull:
                    heapq.heappush(deadlines, due)  # expire it once the file can be written
                    raise

    def restore(self, now: float) -> list[tuple[Lease, str]]:
        """Load the live requests and active leases after a start or a crash, each with a
        fresh TTL for its holder to find the broker again; the leases whose devices are
        gone, with why."""
        live = self.store.live_requests()
        self.live.update((r.id, r) for r in live if r.state is RequestState.GRANTED)
        lost: list[tuple[Lease, str]] = []
        for lease, expected_end in self.store.active_leases():
            lease.expires_at = max(lease.expires_at, now + lease.ttl_s)
            self._hold(lease, expected_end)  # usage accrues from granted_at, as before
            missing = [d for d in lease.devices if d not in self.placer.devices]
            if missing:
                lost.append((lease, f"device {missing[0]} is no longer in the inventory"))
        for r in live:
            # live users count in the share totals, as they did before
            self.ledger.register(r.user, r.group, now)
            if r.state is RequestState.QUEUED:
                r.expires_at = max(r.expires_at or now, now + self.request_ttl_s)
                r.ttl_s = self.request_ttl_s
                self._enqueue(r)
                heapq.heappush(self._deadlines, (r.expires_at, r.id))
        return lost
