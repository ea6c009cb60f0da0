"""The broker: one class that holds every decision about GPUs.

``Broker`` queues requests, grants devices in policy order with EASY
backfill, keeps requests and leases alive while their holders renew them,
hands a device on only once its last holder's processes have left it, and
tells each lease's start and end to the fair-share ledger (``fairshare``), the
quotas (``budgets``) and the run-time predictor (``predictor``), which it asks
at each decision. Every front (server extension, hub service, CLI, trace replay,
tests) drives this class; it never reads the time (a clock is injected), never
touches hardware (an inventory, an optional MIG partitioner and an optional
process probe are), and commits every change to the store before it returns.

``Broker`` is the one API every front calls; each of its parts holds one job:
``book.Book`` the live requests and active leases, ``scheduling.Scheduler`` the
scheduling pass, ``devices.Devices`` drains, vacating devices and re-cuts,
``estimates.StartEstimates`` the queue's start estimates, ``restart.restore`` the
rebuild from the store when it starts. The broker ranks (the
policy's priorities from the fair-share ledger) and decides which move to make.

Not thread-safe: call it from one thread (the server's event loop).
"""

from __future__ import annotations

import logging
import math
import secrets
from collections.abc import Callable, Iterable
from datetime import timezone
from typing import Any

from ..wire.errors import Conflict, Forbidden, InvalidRequest, NotFound
from ..wire.sizes import Size
from . import accounting
from .book import Book, Held
from .budgets import Budgets, Quota
from .clock import Clock, SystemClock
from .config import BrokerConfig as BrokerConfig
from .devices import Devices, Partitioner, ProcessProbe
from .devices import Vacating as Vacating
from .estimates import QueueEntry as QueueEntry
from .estimates import StartEstimates
from .eta import Calibration
from .fairshare import Entity, FairShareLedger
from .limitrules import LimitRules
from .limits import Promises
from .models import (
    Device,
    Gpu,
    Inventory,
    JobClass,
    Lease,
    LeaseState,
    Request,
    RequestState,
    check_name,
    check_request_id,
    check_submission,
    parse_job_class,
)
from .models import Event as Event
from .placement import Placer
from .policy import BrokerPolicy, Policy
from .predictor import Predictor
from .restart import restore
from .scheduling import Fit, Scheduler
from .store import Store

log = logging.getLogger(__name__)


class Broker:
    def __init__(
        self,
        store: Store,
        inventory: Inventory,
        *,
        clock: Clock | None = None,
        policy: Policy | None = None,
        config: BrokerConfig | None = None,
        partitioner: Partitioner | None = None,
        processes: ProcessProbe | None = None,
    ) -> None:
        """``processes``: what runs on a device. Without one, a lease's devices are free
        the moment it ends (the replay, engines that enforce placement themselves)."""
        self.store = store
        self.clock = clock or SystemClock()
        self.policy = policy or BrokerPolicy()
        self.config = config or BrokerConfig()
        if self.config.dynamic_mig and partitioner is None:
            raise InvalidRequest("dynamic MIG needs a partitioner")
        # Its own state, which callbacks read, then each part from parts built before it.
        self._listeners: list[Callable[[Event], None]] = []
        self._changes = 0
        """Counts events: every change of leases, queue or devices emits one."""
        self._ranked_at = self.clock.now()
        """The instant priorities are evaluated at (the last fair-share recalculation)."""
        self._oldest_waiting: float | None = None
        """Submit time of the oldest waiting request at the last ranking."""
        self._recalc_due = True
        self._lent_at = self._ranked_at
        """When the GPUs were last lent as the sharing rules say."""
        self.placer = Placer(inventory, self.config.sharing, self._ranked_at)
        self.budgets = Budgets(store)
        """Quotas: shares, most GPUs held, GPU-hour budgets."""
        self.limits = LimitRules(self.config, store, self.clock, self._emit)
        """Time-limit rules; each change an admin makes sends a ``limits`` event."""
        self.ledger = FairShareLedger(
            self._share,
            half_life_s=self.policy.half_life_s,
            entry_penalty_s=self.policy.entry_penalty_s,
            now=self._ranked_at,
        )
        """Fair-share usage: what the policy orders by and preemption takes from."""
        self._ranker = self.policy.ranker(self, self._ranked_at)
        """The policy's priority as of the last ranking (``Policy.ranker``)."""
        self.predictor = Predictor()
        """Hold times of ended leases: expected durations and start estimates."""
        self.calibration = Calibration()
        """Scales the start estimates' ranges by how well the past ones covered."""
        self.promises = Promises(self, self._emit)
        """The starts promised from time limits, and the checks that keep them."""
        self.estimates = StartEstimates(self, self.predictor, self.calibration, self.promises.bound)
        held = Held()
        self.devices = Devices(
            store,
            inventory,
            self.placer,
            self.clock,
            config=self.config,
            partitioner=partitioner,
            processes=processes,
            emit=self._emit,
            holding=held.holding,
        )
        """Drains, vacating devices, re-cuts and devices that join."""
        self.book = Book(
            store,
            self.clock,
            self.config,
            held=held,
            placer=self.placer,
            ledger=self.ledger,
            budgets=self.budgets,
            predictor=self.predictor,
            calibration=self.calibration,
            rank=self._rank,
            emit=self._emit,
            vacate=self.devices.vacate,
        )
        """The live requests and active leases."""
        self._waiting = self.book.waiting
        self.scheduler = Scheduler(
            self._waiting,
            self.placer,
            self.policy,
            self.budgets,
            self.predictor,
            self.config,
            self._grant,
            self.promises,
        )
        """The scheduling pass, and the sizes and durations it rests on."""
        restore(self)
        self._recalc(self.clock.now())

    @property
    def inventory(self) -> Inventory:
        """The inventory as placement has it now (after re-cuts and devices that joined)."""
        return self.devices.inventory

    # ------------------------------------------------------------ public API

    def subscribe(self, listener: Callable[[Event], None]) -> Callable[[], None]:
        """Call ``listener`` with every event; returns a function that unsubscribes."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    def submit(
        self,
        user: str,
        size: Size,
        *,
        groups: Iterable[str] = (),
        job_class: JobClass | str = JobClass.INTERACTIVE,
        holder: str = "",
        expected_duration_s: float | None = None,
        schedule: bool = True,
        request_id: str | None = None,
        limit_s: float | None = None,
    ) -> Request:
        """Queue a request (committed before returning), then run a scheduling pass.

        ``request_id``: the client's own id for it; a submit that names one of the same
        user's requests (one that reached the broker, its answer lost) returns that
        request, changing nothing. ``limit_s``: its time limit (``LimitRules.check``).

        Raises a ``BrokerError`` subclass, having written nothing, when the input is
        malformed, no device of this inventory could ever satisfy it, or a quota
        forbids it outright.
        """
        now = self.clock.now()
        groups = tuple(groups)
        job_class = check_submission(user, groups, job_class, holder, expected_duration_s)
        limit_s = self.limits.check(job_class, size, groups, limit_s)
        self.scheduler.check_satisfiable(size)
        if request_id is not None:
            check_request_id(request_id)
            known = self.book.live.get(request_id) or self.store.request(request_id)
            if known is not None:
                if known.user != user:
                    raise InvalidRequest(f"request id {request_id!r} is taken: choose another")
                return known
        r = Request(
            id=request_id or "r-" + secrets.token_hex(6),
            user=user,
            groups=groups,
            size=size,
            job_class=job_class,
            submitted_at=now,
            holder=holder,
            expected_duration_s=expected_duration_s,
            expires_at=now + self.request_ttl_s,
            ttl_s=self.request_ttl_s,
            limit_s=limit_s,
        )
        self.budgets.admit(r, self.scheduler.gpu_eq(r.size), now)
        self.book.queue(r)
        self.promises.wants(r)
        if self.ledger.register(r.user, r.group, now):
            self._recalc_due = True
        self._emit(Event("queued", now, user, r.id, detail={"size": size.key}))
        if schedule:
            self.schedule()
        return r

    def cancel(
        self, request_id: str, user: str | None = None, *, by: str = "", reason: str = ""
    ) -> Request:
        """Withdraw a queued request; a granted one is released instead.

        ``by``: an admin cancelling another user's request, with ``reason``: a queued one
        ends ``cancelled``, a granted one is reclaimed (cause ``admin``), and the event its
        holder gets names ``by`` and the reason."""
        r = self._own_request(request_id, user)
        granted = r.state is RequestState.GRANTED
        why = f"{'reclaimed' if granted else 'cancelled'} by {by}{': ' + reason if reason else ''}"
        if granted:
            assert r.lease_id is not None
            if by:
                self.reclaim(r.lease_id, why, cause="admin", evidence={"by": by}, by=by)
            else:
                self.release(r.lease_id, user)
            return r
        self.book.end_queued(r, RequestState.CANCELLED, why if by else "cancelled by its user", by)
        self.schedule()
        return r

    def set_job_class(self, request_id: str, job_class: JobClass | str, *, by: str = "") -> Request:
        """Move a waiting request to the other class (interactive <-> batch): the queue's
        order reflects it at once, and its holder gets a ``reclassed`` event."""
        new = parse_job_class(job_class)
        r = self._own_request(request_id, None)
        if r.state is not RequestState.QUEUED:
            raise Conflict(
                f"request {request_id!r} is {r.state.value}: only a waiting one changes class"
            )
        old = r.job_class
        if new is old:
            return r
        with self.store.transaction():
            self.store.set_job_class(r.id, new.value)
        order = self._waiting.order(r)
        self._waiting.remove(r)
        r.job_class = new
        self._waiting.add(r, order)
        detail = {"job_class": new.value, "was": old.value, "by": by}
        self._emit(Event("reclassed", self.clock.now(), r.user, r.id, detail=detail))
        self.schedule()
        return r

    @property
    def request_ttl_s(self) -> float:
        return self.book.request_ttl_s

    def renew_request(self, request_id: str, user: str | None = None) -> Request:
        """Keep a queued request alive for another TTL: its holder's heartbeat while it
        waits. A granted one is returned as it is (its lease is renewed instead)."""
        r = self._own_request(request_id, user)
        if r.state is RequestState.QUEUED:
            self.book.renew_request(r)
        return r

    def request(self, request_id: str, user: str | None = None) -> Request:
        """A request by id, live or ended (only that user's when ``user`` is given)."""
        r = self.book.live.get(request_id) or self.store.request(request_id)
        if r is None:
            raise NotFound(f"no request {request_id!r}")
        if user is not None and r.user != user:
            raise Forbidden(f"request {request_id!r} belongs to another user")
        return r

    def live_requests(self, user: str | None = None) -> list[Request]:
        """Queued and granted requests, all or one user's, oldest first."""
        live = [r for r in self.book.live.values() if user is None or r.user == user]
        return sorted(live, key=lambda r: r.submitted_at)

    def lease(self, lease_id: str, user: str | None = None) -> Lease:
        lease = self.book.leases.get(lease_id) or self.store.lease(lease_id)
        if lease is None:
            raise NotFound(f"no lease {lease_id!r}")
        if user is not None and lease.user != user:
            raise Forbidden(f"lease {lease_id!r} belongs to another user")
        return lease

    def leases(self, user: str | None = None) -> list[Lease]:
        """Active leases, all or one user's."""
        return [x for x in self.book.leases.values() if user is None or x.user == user]

    def renew(self, lease_id: str, user: str | None = None) -> Lease:
        """Extend a lease by its TTL: the holder's heartbeat."""
        lease = self._active_lease(lease_id, user)
        self.book.renew_lease(lease)
        return lease

    def release(
        self,
        lease_id: str,
        user: str | None = None,
        *,
        schedule: bool = True,
        reason: str = "released by its holder",
        charged_until: float | None = None,
    ) -> Lease:
        """Give a lease's devices back; the next waiting request may get them. ``reason``:
        when it is not the holder who gives it back (its engine job ended);
        ``charged_until``: when its holder stopped using it, if that was earlier (a hub
        server stopped while the broker was down): the lease ends, and is charged, then."""
        lease = self._active_lease(lease_id, user)
        self.book.end_lease(lease, LeaseState.RELEASED, reason, ended=charged_until)
        if schedule:
            self.schedule()
        return lease

    def reclaim(
        self,
        lease_id: str,
        reason: str,
        *,
        cause: str = "admin",
        evidence: dict[str, Any] | None = None,
        by: str = "",
    ) -> Lease:
        """Take a lease back from its holder. ``cause`` (idle, stalled, preempted, admin)
        and ``evidence`` (what the decision saw) are committed with the lease's end; ``by``
        names the admin who took it, in its event."""
        lease = self._active_lease(lease_id, None)
        self.book.end_lease(lease, LeaseState.RECLAIMED, reason, (cause, evidence or {}), by)
        self.schedule()
        return lease

    def move(self, lease_id: str, devices: list[str], reason: str) -> Lease:
        """Hand a lease over to other free devices of its shape, reserved for it
        (``devices.reserve``): the host moved its kernel there; a ``moved`` event says so."""
        lease = self._active_lease(lease_id, None)
        self.book.move(lease, tuple(devices), reason)
        self.schedule()
        return lease

    def extend(self, lease_id: str, seconds: float, user: str | None = None) -> Lease:
        """Give a lease's time limit ``seconds`` more unless that breaks a start promised
        to a waiting request or its longest limit (``Conflict`` says why)."""
        lease = self._active_lease(lease_id, user)
        self.book.extend(lease, self.promises.check_extension(lease, seconds))
        return lease

    def warn(self, lease_id: str, reason: str, deadline: float, cause: str) -> Lease:
        """Tell a lease's holder it will be reclaimed at ``deadline`` and why (``cause``:
        a front offers Extend for a time limit, "keep it" for idleness): a ``warning``
        event, and the lease's ``reclaim_at``. Deciding when is ``broker.reclaim``'s job."""
        lease = self._active_lease(lease_id, None)
        lease.reclaim_at, lease.reclaim_cause = deadline, cause
        detail = {"cause": cause, "reason": reason, "deadline": deadline}
        self._emit(Event.of_lease("warning", self.clock.now(), lease, detail))
        return lease

    def unwarn(self, lease_id: str, reason: str) -> Lease:
        """Withdraw a warning (the holder is active again): a ``warning_cleared`` event."""
        lease = self._active_lease(lease_id, None)
        lease.reclaim_at = lease.reclaim_cause = None
        self._emit(Event.of_lease("warning_cleared", self.clock.now(), lease, {"reason": reason}))
        return lease

    def drain(
        self, uuid: str, reason: str, cause: str = "admin", *, take_over: bool = False
    ) -> None:
        """Grant nothing more on a GPU (and every device on it) or on one device. Holders
        keep their leases; they and the machine's watchers get a ``drained`` event.

        ``cause`` says who drained it (``health``, ``vacate``, ``admin``): a device drained
        for any other cause stays so when its health recovers. A health fault does not
        take another cause's drain over; ``take_over`` does (an admin's own drain, or an
        admin handing a drain back to a GPU's health check)."""
        self.devices.drain(uuid, reason, cause, take_over=take_over)

    def add_devices(self, gpus: Iterable[Gpu], devices: Iterable[Device]) -> list[Device]:
        """Place on devices that joined the inventory (a node added to the engine's cluster,
        more gres on a node); known UUIDs are left as they are. The devices added."""
        added = self.devices.add(gpus, devices)
        if added:
            self.scheduler.forget_sizes()  # the smallest device that fits a memory size
            self.schedule()
        return added

    def undrain(self, uuid: str, reason: str) -> None:
        """Grant on a drained GPU or device again, and run a scheduling pass."""
        self.devices.undrain(uuid, reason)
        self.schedule()

    def drained(self) -> dict[str, tuple[str, float]]:
        """Drained GPU or device UUID -> (reason, since when)."""
        return self.devices.drained()

    def drain_cause(self, uuid: str) -> str | None:
        """Who drained a GPU or device itself (``health``, ``vacate``, ``admin``), if so."""
        return self.devices.drain_cause(uuid)

    def drain_causes(self) -> dict[str, str]:
        """Drained GPU or device UUID -> who drained it."""
        return self.devices.drain_causes()

    def drained_by(self, cause: str) -> set[str]:
        """The GPUs and devices drained for ``cause``."""
        return self.devices.drained_by(cause)

    def vacating(self) -> dict[str, Vacating]:
        """Devices of ended leases that a process still runs on, by UUID."""
        return self.devices.vacating()

    def tick(self) -> list[Lease]:
        """Expire leases and queued requests whose holders stopped renewing, free or drain
        the devices that were vacating, then schedule. Call periodically."""
        now = self.clock.now()
        self.book.expire(now)
        self.devices.check_vacating(now)
        granted = self.schedule()
        self.store.checkpoint()
        return granted

    def schedule(self) -> list[Lease]:
        """One scheduling pass: grant what fits, in priority order, with EASY backfill
        (``scheduling``), keeping the starts promised from time limits (``limits``)."""
        now = self.clock.now()
        if self._recalc_due or now - self._ranked_at >= self.policy.recalc_interval_s:
            self._recalc(now)
        if now // 60 != self._lent_at // 60:  # the sharing rules' windows, to the minute
            self._lent_at = now
            self.placer.set_time(now)
        granted = self.scheduler.run(now)
        if self.promises.offer(lambda keep: [r for _, r in self._ranked(keep)], now):
            granted += self.scheduler.run(now)  # a start promised for now
        return granted

    def _ranked(self, keep: Callable[[Request], bool] | None = None) -> list[tuple[float, Request]]:
        """The waiting requests (those ``keep`` keeps) in priority order, with their ranks."""
        return sorted(
            ((self._rank(r), r) for r in self._waiting if keep is None or keep(r)),
            key=lambda pr: (-pr[0], pr[1].submitted_at, self._waiting.order(pr[1])),
        )

    def queue(self) -> list[QueueEntry]:
        """Every waiting request in priority order, with its position (1..n) and ETA."""
        now = self.clock.now()
        ranked = self._ranked()
        etas = self.estimates.of([r for _, r in ranked], now, (self._changes, self._ranked_at))
        return [QueueEntry(i + 1, r, p, etas.get(r.id)) for i, (p, r) in enumerate(ranked)]

    @property
    def ranked_at(self) -> float:
        """The instant the queue's priorities were last evaluated at: the queue's order
        changes with it (aging) even when no event happened."""
        return self._ranked_at

    def holders(self) -> dict[str, Lease]:
        """Device uuid -> the active lease holding it whole."""
        return {d: self.book.leases[lid] for d, lid in self.book.holder.items()}

    def sharers(self) -> dict[str, list[Lease]]:
        """GPU uuid -> the active shares of it, oldest grant first."""
        leases = self.book.leases
        return {
            d: sorted((leases[x] for x in ids), key=lambda x: x.granted_at)
            for d, ids in self.book.shared.items()
            if ids
        }

    def set_quota(self, kind: str, name: str, quota: Quota) -> Quota:
        """Set (replace) a user's or group's share and limits. Admin only, at the fronts."""
        if kind not in ("user", "group"):
            raise InvalidRequest(f"quota kind must be 'user' or 'group', not {kind!r}")
        check_name(name, kind)
        self.budgets.set((kind, name), quota, self.clock.now())
        self._quota_changed(kind, name, quota)
        return quota

    def delete_quota(self, kind: str, name: str) -> None:
        if not self.budgets.delete((kind, name)):
            raise NotFound(f"no quota for {kind} {name!r}")
        self._quota_changed(kind, name, Quota())

    def _quota_changed(self, kind: str, name: str, quota: Quota) -> None:
        """Re-rank with the new shares, send a ``quota`` event (the limits now in force;
        all null: the defaults), and schedule: a raised limit may let waiting requests go."""
        self.ledger.shares_changed()
        self._recalc_due = True
        user = name if kind == "user" else ""
        detail = {"kind": kind, "name": name, **quota.to_json()}
        self._emit(Event("quota", self.clock.now(), user, detail=detail))
        self.schedule()

    def quotas(self) -> dict[Entity, Quota]:
        return self.budgets.quotas()

    def budget_spent(self, kind: str, name: str) -> float | None:
        """GPU-hours a user or group used in its budget's current period (None: no budget)."""
        return self.budgets.spent((kind, name), self.clock.now())

    def usage(
        self, since: float | None = None, until: float | None = None, by: str = "user"
    ) -> dict[str, float]:
        """GPU-hours per user, group, profile, job class or UTC day over [since, until),
        live leases included up to now (``accounting.usage`` over the store)."""
        now = self.clock.now()
        lo, hi = since if since is not None else -math.inf, until if until is not None else now
        rows = self.store.holdings(lo, hi, now)
        found = accounting.usage(rows, since=lo, until=hi, by=by, tz=timezone.utc)
        return {row.key: row.gpu_hours for row in found}

    # ------------------------------------------------- policy context (policy.Context)

    def fairshare(self, user: str, group: str) -> float:
        return self.ledger.fairshare(user, group)

    def expected_gpu_hours(self, request: Request) -> float:
        """From the user's history, capped by the request's time limit (enforced: a request
        that declares less to go first ends there), never by its own estimate."""
        hold = self.scheduler.history_duration(request)
        return self.scheduler.gpu_eq(request.size) * min(hold, request.limit_s or hold) / 3600.0

    def size_fraction(self, request: Request) -> float:
        total = self.placer.total_gpu_equivalents
        return self.scheduler.gpu_eq(request.size) / total if total else 0.0

    def oldest_submitted_at(self) -> float | None:
        return self._oldest_waiting

    # ------------------------------------------------------------ internals

    def _emit(self, event: Event) -> None:
        self._changes += 1
        for listener in list(self._listeners):
            try:
                listener(event)
            except Exception:  # a broken watcher must not break the broker
                log.exception("event listener failed on %s", event.kind)

    def _rank(self, r: Request) -> float:
        return self._ranker(r)

    def _own_request(self, request_id: str, user: str | None) -> Request:
        r = self.request(request_id, user)
        if r.state.ended:
            raise Conflict(f"request {request_id!r} already ended ({r.state.value})")
        return self.book.live[r.id]

    def _active_lease(self, lease_id: str, user: str | None) -> Lease:
        lease = self.lease(lease_id, user)
        if lease.state is not LeaseState.ACTIVE:
            raise Conflict(f"lease {lease_id!r} already ended ({lease.state.value})")
        return self.book.leases[lease_id]

    # -- granting

    def _grant(self, r: Request, fit: Fit, now: float) -> Lease:
        devices = fit if isinstance(fit, list) else self.devices.repartition(fit)
        return self.book.grant(r, devices, now, now + self.scheduler.duration(r))

    # -- fair share

    def _share(self, entity: Entity) -> float:
        share = self.budgets.share(entity)
        return share if share is not None else self.config.default_share

    def _recalc(self, now: float) -> None:
        """Bring every entity's usage to ``now``, reset fair-share factors, re-rank."""
        self.ledger.recalc(now)
        self._ranked_at, self._recalc_due = now, False
        self._oldest_waiting = self._waiting.oldest_submitted_at()
        self._ranker = self.policy.ranker(self, now)
        self._waiting.rerank_all()
