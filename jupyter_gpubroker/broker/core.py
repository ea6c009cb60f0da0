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

The queue is kept in *buckets*: one FIFO per (user, group, class, size).
Priorities only ever grow with age, so within a bucket the oldest request is
always first, and a scheduling pass only ranks bucket heads. A pass skips the
sizes for which no device is free (unless the policy is strict FCFS), which
keeps a decision cheap with tens of thousands of requests waiting.

Not thread-safe: call it from one thread (the server's event loop).
"""

from __future__ import annotations

import heapq
import logging
import math
import re
import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import timezone
from typing import Any, Protocol

from ..wire.errors import (
    Conflict,
    Forbidden,
    InvalidRequest,
    NotFound,
    PartitionFailed,
    StorageFull,
    Unsatisfiable,
)
from ..wire.profiles import CATALOG
from ..wire.sizes import DURATIONS, MAX_DURATION_S, Size, expected_duration
from ..wire.text import memory
from . import accounting
from .budgets import Budgets, Quota
from .clock import Clock, SystemClock
from .eta import Calibration, Eta, predicted_starts
from .fairshare import Entity, FairShareLedger
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
)
from .placement import MigPlan, Placer
from .policy import BrokerPolicy, Policy
from .predictor import Predictor, held_shape, request_shape
from .queue import WaitQueue
from .store import Store

log = logging.getLogger(__name__)

ETA_MAX_AGE_S = 30.0
"""How long the queue's start estimates stand without a change: the leases' elapsed
times, which they rest on, move on."""
MAX_GROUPS = 32
MAX_OWNER = 256
REQUEST_ID = re.compile(r"r-[0-9a-f]{12,32}")
"""A request's id: the broker's own (``r-`` and 12 hex digits), or one its client chose
at random, so that a submit retried after a lost answer is not queued twice."""


class Partitioner(Protocol):
    """Creates and destroys MIG slices (``jupyter_gpubroker.nvml.partitioner``)."""

    def create(self, gpu_uuid: str, profile: str, start: int) -> Device: ...

    def destroy(self, device_uuid: str) -> None: ...


class ProcessProbe(Protocol):
    """What runs on a device (``jupyter_gpubroker.nvml.NvmlBackend``): the pids of its
    compute processes, ``()`` when none or when the device cannot be asked."""

    def compute_pids(self, device_uuid: str) -> tuple[int, ...]: ...


@dataclass(frozen=True)
class Vacating:
    """A device whose lease ended while a process still ran on it: granted to nobody
    until that process is gone, drained once ``vacate_timeout_s`` has passed."""

    since: float
    lease_id: str
    """The lease that ended ("" when the device was found busy at the broker's start)."""
    pids: tuple[int, ...]


@dataclass
class BrokerConfig:
    """Knobs of the broker itself (the policy has its own)."""

    lease_ttl_s: float = 120.0
    """A lease whose holder stops renewing for this long expires."""
    request_ttl_s: float | None = None
    """A queued request whose holder stops renewing for this long expires (None: the
    lease TTL)."""
    vacate_timeout_s: float = 60.0
    """How long an ended lease's devices wait for its processes to exit before they are
    drained (only with a process probe)."""
    dynamic_mig: bool = False
    """Re-cut idle MIG GPUs to fit waiting profiles (needs a partitioner)."""
    default_share: float = 1.0
    default_duration_s: dict[str, float] = field(
        default_factory=lambda: {"interactive": 2 * 3600.0, "batch": 4 * 3600.0}
    )
    """Expected hold time before any history exists, per job class."""

    def __post_init__(self) -> None:
        if not 1 <= self.lease_ttl_s <= MAX_DURATION_S:
            raise InvalidRequest("lease_ttl_s must be between 1 s and a year")
        if self.request_ttl_s is not None and not 1 <= self.request_ttl_s <= MAX_DURATION_S:
            raise InvalidRequest("request_ttl_s must be between 1 s and a year")
        if not 0 <= self.vacate_timeout_s <= MAX_DURATION_S:
            raise InvalidRequest("vacate_timeout_s must be between 0 and a year")
        if not self.default_share > 0:
            raise InvalidRequest("default_share must be positive")
        for k, v in self.default_duration_s.items():
            if k not in {c.value for c in JobClass} or not 0 < v <= MAX_DURATION_S:
                raise InvalidRequest(f"bad default duration {k!r}: {v!r}")


@dataclass(frozen=True)
class Event:
    """Something a holder or watcher may want to see: queued, granted, released, ..."""

    kind: str
    at: float
    user: str
    request_id: str | None = None
    lease_id: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The event's type, time and data: who and what it is about, with the detail
        nested under ``data`` (never over the envelope: a quota's ``kind`` is its own)."""
        return {
            "type": self.kind,
            "at": self.at,
            "data": {
                "user": self.user,
                "request_id": self.request_id,
                "lease_id": self.lease_id,
                **self.detail,
            },
        }


@dataclass(frozen=True)
class QueueEntry:
    position: int
    request: Request
    priority: float
    eta: Eta | None
    """Expected start (epoch seconds) as a (low, median, high) range from the run-time
    predictor (``eta.predicted_starts``); None when the broker cannot know it."""


@dataclass
class _Reservation:
    """The top blocked request's claim: these devices at ``start`` (EASY backfill)."""

    devices: frozenset[str]
    start: float


def _job_class(value: JobClass | str) -> JobClass:
    try:
        return JobClass(value)
    except ValueError:
        raise InvalidRequest(f"job class must be 'interactive' or 'batch', not {value!r}") from None


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
        self.inventory = inventory
        self.clock = clock or SystemClock()
        self.policy = policy or BrokerPolicy()
        self.config = config or BrokerConfig()
        self.partitioner = partitioner
        self.processes = processes
        if self.config.dynamic_mig and partitioner is None:
            raise InvalidRequest("dynamic MIG needs a partitioner")
        self.placer = Placer(inventory)
        self._listeners: list[Callable[[Event], None]] = []

        self._live: dict[str, Request] = {}
        self._waiting = WaitQueue(self._rank)
        self._leases: dict[str, Lease] = {}
        self._expected_end: dict[str, float] = {}
        self._holder: dict[str, str] = {}
        self.budgets = Budgets(store)
        """Quotas: shares, most GPUs held, GPU-hour budgets."""
        self.ledger = FairShareLedger(
            self._share,
            half_life_s=self.policy.half_life_s,
            entry_penalty_s=self.policy.entry_penalty_s,
            now=self.clock.now(),
        )
        """Fair-share usage: what the policy orders by and preemption takes from."""
        self._ranked_at = self.clock.now()
        self._oldest_waiting: float | None = None
        """Submit time of the oldest waiting request at the last ranking."""
        """The instant priorities are evaluated at (the last fair-share recalculation)."""
        self._recalc_due = True
        self._ranker = self.policy.ranker(self, self._ranked_at)
        """The policy's priority as of the last ranking (``Policy.ranker``)."""
        self._gpu_eq_of_size: dict[str, float] = {}
        self.predictor = Predictor()
        """Hold times of ended leases: expected durations and start estimates."""
        self.calibration = Calibration()
        """Scales the start estimates' ranges by how well the past ones covered."""
        self._changes = 0
        """Counts events: every change of leases, queue or devices emits one."""
        self._etas: tuple[tuple[int, float], float, dict[str, Eta | None]] | None = None
        """(changes and ranking instant, when, estimates) of the last ``queue()``."""
        self._drains: dict[str, tuple[str, float]] = {}
        self._drain_cause: dict[str, str] = {}
        """Who drained each drained device: ``health`` lifts only its own drains."""
        self._vacating: dict[str, Vacating] = {}
        self._request_deadlines: list[tuple[float, str]] = []
        """(expires_at, request id) of queued requests, a heap; stale entries (renewed,
        ended) are skipped as they come up."""
        self._seq = store.next_seq()
        self._restore()
        self._recalc(self.clock.now())

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
        owner: str = "",
        expected_duration_s: float | None = None,
        schedule: bool = True,
        request_id: str | None = None,
    ) -> Request:
        """Queue a request (committed before returning), then run a scheduling pass.

        ``request_id``: the client's own id for it; a submit that names one of the same
        user's requests (one that reached the broker, its answer lost) returns that
        request, changing nothing.

        Raises a ``BrokerError`` subclass, having written nothing, when the input is
        malformed, no device of this inventory could ever satisfy it, or a quota
        forbids it outright.
        """
        now = self.clock.now()
        check_name(user, "user")
        groups = tuple(groups)
        if len(groups) > MAX_GROUPS:
            raise InvalidRequest(f"at most {MAX_GROUPS} groups per request")
        for g in groups:
            check_name(g, "group")
        job_class = _job_class(job_class)
        if not isinstance(owner, str) or len(owner) > MAX_OWNER:
            raise InvalidRequest(f"owner must be text of at most {MAX_OWNER} characters")
        if expected_duration_s is not None and not expected_duration(expected_duration_s):
            raise InvalidRequest(
                f"expected_duration_s must be {DURATIONS}, not {expected_duration_s!r}"
            )
        self._check_satisfiable(size)
        if request_id is not None:
            if not isinstance(request_id, str) or not REQUEST_ID.fullmatch(request_id):
                raise InvalidRequest(
                    "'id' must be 'r-' and 12 to 32 lowercase hex digits, chosen at random"
                )
            known = self._live.get(request_id) or self.store.request(request_id)
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
            owner=owner,
            expected_duration_s=expected_duration_s,
            expires_at=now + self.request_ttl_s,
            ttl_s=self.request_ttl_s,
        )
        self.budgets.admit(r, self._size_gpu_eq(r.size), now)
        with self.store.transaction():
            self.store.insert_request(r, self._seq)
        self._seq += 1
        self._enqueue(r)
        heapq.heappush(self._request_deadlines, (now + self.request_ttl_s, r.id))
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
        why = f"{'reclaimed' if granted else 'cancelled'} by {by}" + (
            f": {reason}" if reason else ""
        )
        if granted:
            assert r.lease_id is not None
            if by:
                self.reclaim(r.lease_id, why, cause="admin", evidence={"by": by}, by=by)
            else:
                self.release(r.lease_id, user)
            return r
        self._end_queued(r, RequestState.CANCELLED, why if by else "cancelled by its owner", by)
        self.schedule()
        return r

    def set_job_class(self, request_id: str, job_class: JobClass | str, *, by: str = "") -> Request:
        """Move a waiting request to the other class (interactive <-> batch): the queue's
        order reflects it at once, and its holder gets a ``reclassed`` event."""
        new = _job_class(job_class)
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
        return self.config.request_ttl_s or self.config.lease_ttl_s

    def renew_request(self, request_id: str, user: str | None = None) -> Request:
        """Keep a queued request alive for another TTL: its holder's heartbeat while it
        waits. A granted one is returned as it is (its lease is renewed instead)."""
        r = self._own_request(request_id, user)
        if r.state is RequestState.QUEUED:
            expires_at = self.clock.now() + self.request_ttl_s
            with self.store.transaction():
                self.store.renew_request(replace(r, expires_at=expires_at))
            r.expires_at = expires_at
            heapq.heappush(self._request_deadlines, (r.expires_at, r.id))
        return r

    def request(self, request_id: str, user: str | None = None) -> Request:
        """A request by id, live or ended (only the owner's when ``user`` is given)."""
        r = self._live.get(request_id) or self.store.request(request_id)
        if r is None:
            raise NotFound(f"no request {request_id!r}")
        if user is not None and r.user != user:
            raise Forbidden(f"request {request_id!r} belongs to another user")
        return r

    def live_requests(self, user: str | None = None) -> list[Request]:
        """Queued and granted requests, all or one user's, oldest first."""
        live = [r for r in self._live.values() if user is None or r.user == user]
        return sorted(live, key=lambda r: r.submitted_at)

    def lease(self, lease_id: str, user: str | None = None) -> Lease:
        lease = self._leases.get(lease_id) or self.store.lease(lease_id)
        if lease is None:
            raise NotFound(f"no lease {lease_id!r}")
        if user is not None and lease.user != user:
            raise Forbidden(f"lease {lease_id!r} belongs to another user")
        return lease

    def leases(self, user: str | None = None) -> list[Lease]:
        """Active leases, all or one user's."""
        return [x for x in self._leases.values() if user is None or x.user == user]

    def renew(self, lease_id: str, user: str | None = None) -> Lease:
        """Extend a lease by its TTL: the holder's heartbeat."""
        lease = self._active_lease(lease_id, user)
        expires_at = self.clock.now() + lease.ttl_s
        with self.store.transaction():
            self.store.renew_lease(replace(lease, expires_at=expires_at))
        lease.expires_at = expires_at
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
        self._end_lease(lease, LeaseState.RELEASED, reason, ended=charged_until)
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
        self._end_lease(lease, LeaseState.RECLAIMED, reason, (cause, evidence or {}), by)
        self.schedule()
        return lease

    def warn(self, lease_id: str, reason: str, deadline: float) -> Lease:
        """Tell a lease's holder it will be reclaimed at ``deadline``: a ``warning`` event,
        and the lease's ``reclaim_at``. Deciding when is ``broker.reclaim``'s job."""
        lease = self._active_lease(lease_id, None)
        lease.reclaim_at = deadline
        self._lease_event("warning", lease, {"reason": reason, "deadline": deadline})
        return lease

    def unwarn(self, lease_id: str, reason: str) -> Lease:
        """Withdraw a warning (the holder is active again): a ``warning_cleared`` event."""
        lease = self._active_lease(lease_id, None)
        lease.reclaim_at = None
        self._lease_event("warning_cleared", lease, {"reason": reason})
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
        if uuid not in self.placer.gpus and uuid not in self.placer.devices:
            raise NotFound(f"no GPU or device {uuid!r}")
        if not take_over and self._drain_cause.get(uuid, "health") != "health":
            cause = self._drain_cause[uuid]  # a health fault does not take an admin's drain over
        drained = self._drains.get(uuid)
        if drained is not None and (drained[0], self._drain_cause[uuid]) == (reason, cause):
            return
        now = self.clock.now()
        since = self._drains.get(uuid, (reason, now))[1]
        with self.store.transaction():
            self.store.set_drain(uuid, reason, since, cause)
        self._drains[uuid] = (reason, since)
        self._drain_cause[uuid] = cause
        self.placer.drain(uuid)
        self._device_event("drained", uuid, now, reason)

    def add_devices(self, gpus: Iterable[Gpu], devices: Iterable[Device]) -> list[Device]:
        """Place on devices that joined the inventory (a node added to the engine's
        cluster, more gres on a node) from this pass on; known UUIDs are left as they
        are. The devices added."""
        added = [d for d in devices if d.uuid not in self.placer.devices]
        if not added:
            return []
        for g in gpus:
            self.placer.gpus.setdefault(g.uuid, g)
        for d in added:
            self.placer.add(d)
        self._sync_inventory()
        self._gpu_eq_of_size.clear()  # the smallest device that fits a memory size
        self.schedule()
        return added

    def undrain(self, uuid: str, reason: str) -> None:
        """Grant on a drained GPU or device again, and run a scheduling pass."""
        if uuid not in self._drains:
            raise NotFound(f"{uuid!r} is not drained")
        with self.store.transaction():
            self.store.clear_drain(uuid)
        del self._drains[uuid], self._drain_cause[uuid]
        self.placer.undrain(uuid)
        self._device_event("undrained", uuid, self.clock.now(), reason)
        self.schedule()

    def drained(self) -> dict[str, tuple[str, float]]:
        """Drained GPU or device UUID -> (reason, since when)."""
        return dict(self._drains)

    def drain_cause(self, uuid: str) -> str | None:
        """Who drained a GPU or device itself (``health``, ``vacate``, ``admin``); None
        when it is not drained itself."""
        return self._drain_cause.get(uuid)

    def drain_causes(self) -> dict[str, str]:
        """Drained GPU or device UUID -> who drained it."""
        return dict(self._drain_cause)

    def drained_by(self, cause: str) -> set[str]:
        """The GPUs and devices drained for ``cause``."""
        return {uuid for uuid, c in self._drain_cause.items() if c == cause}

    def vacating(self) -> dict[str, Vacating]:
        """Devices of ended leases that a process still runs on, by UUID."""
        return dict(self._vacating)

    def tick(self) -> list[Lease]:
        """Expire leases and queued requests whose holders stopped renewing, free or drain
        the devices that were vacating, then schedule. Call periodically."""
        now = self.clock.now()
        for lease in [x for x in self._leases.values() if x.expires_at <= now]:
            self._end_lease(lease, LeaseState.EXPIRED, "its holder stopped renewing it")
        deadlines = self._request_deadlines
        while deadlines and deadlines[0][0] <= now:
            due = heapq.heappop(deadlines)
            r = self._live.get(due[1])
            if r is not None and r.state is RequestState.QUEUED and (r.expires_at or 0) <= now:
                try:
                    self._end_queued(r, RequestState.EXPIRED, "its holder stopped renewing it")
                except StorageFull:
                    heapq.heappush(deadlines, due)  # expire it once the file can be written
                    raise
        self._check_vacating(now)
        granted = self.schedule()
        self.store.checkpoint()
        return granted

    def schedule(self) -> list[Lease]:
        """One scheduling pass: grant what fits, in priority order, with EASY backfill.

        Sizes with no free device are skipped (their reservation could only name
        busy devices, so it would not constrain anyone), unless the policy is strict.
        """
        now = self.clock.now()
        if self._recalc_due or now - self._ranked_at >= self.policy.recalc_interval_s:
            self._recalc(now)
        strict = self.policy.strict
        walks = {
            k: self._waiting.walk(k)
            for k, size in self._waiting.sizes.items()
            if strict or self._could_place(size)
        }
        front: list[tuple[float, float, int, str, Request]] = []

        def advance(size_key: str) -> None:
            nxt = next(walks[size_key], None)
            if nxt is not None:
                p, head = nxt
                order = self._waiting.order(head)
                heapq.heappush(front, (-p, head.submitted_at, order, size_key, head))

        granted: list[Lease] = []
        blocked: Request | None = None
        reservation: _Reservation | None = None
        examined = 0
        try:
            for k in walks:
                advance(k)
            while front:
                _, _, _, k, r = heapq.heappop(front)
                if not strict and not self._could_place(r.size):
                    continue  # this size is out of free devices: drop it from the pass
                if self.budgets.blocks(r, self._size_gpu_eq(r.size), now):
                    advance(k)
                    continue
                if blocked is not None:
                    examined += 1
                    if examined > self.policy.backfill_depth:
                        break
                    if reservation is None:
                        reservation = self._reserve(blocked, now)
                fit = self._fit(r, reservation, now)
                if isinstance(fit, list) and self.budgets.blocks(
                    r, sum(d.gpu_equivalents for d in fit), now
                ):
                    advance(k)  # only a device larger than its quota allows is free
                    continue
                if fit is None:
                    if strict:
                        break
                    if blocked is None:
                        blocked = r  # nothing of this size fits at all: drop the size
                    elif reservation is not None and self._may_backfill(r.size, reservation, now):
                        advance(k)  # a shorter request of this size may still backfill
                    continue
                try:
                    granted.append(self._grant(r, fit, now))
                except PartitionFailed as e:
                    log.warning("could not re-cut a GPU for request %s: %s", r.id, e.message)
                except StorageFull as e:  # the change that called this pass is committed
                    log.warning("no grant until the state file can be written: %s", e.message)
                    break
                advance(k)
        finally:
            for w in walks.values():
                w.close()
        return granted

    def queue(self) -> list[QueueEntry]:
        """Every waiting request in priority order, with its position (1..n) and ETA."""
        now = self.clock.now()
        ranked = sorted(
            ((self._rank(r), r) for r in self._waiting),
            key=lambda pr: (-pr[0], pr[1].submitted_at, self._waiting.order(pr[1])),
        )
        etas = self._start_estimates([r for _, r in ranked], now)
        return [QueueEntry(i + 1, r, p, etas.get(r.id)) for i, (p, r) in enumerate(ranked)]

    @property
    def ranked_at(self) -> float:
        """The instant the queue's priorities were last evaluated at: the queue's order
        changes with it (aging) even when no event happened."""
        return self._ranked_at

    def holders(self) -> dict[str, Lease]:
        """Device uuid -> the active lease holding it."""
        return {d: self._leases[lid] for d, lid in self._holder.items()}

    def set_quota(self, kind: str, name: str, quota: Quota) -> Quota:
        """Set (replace) a user's or group's share and limits. Admin only, at the fronts."""
        if kind not in ("user", "group"):
            raise InvalidRequest(f"quota kind must be 'user' or 'group', not {kind!r}")
        check_name(name, kind)
        self.budgets.set((kind, name), quota, self.clock.now())
        self.ledger.shares_changed()
        self._recalc_due = True
        self._quota_event(kind, name, quota)
        self.schedule()  # a raised limit may let waiting requests go
        return quota

    def delete_quota(self, kind: str, name: str) -> None:
        if not self.budgets.delete((kind, name)):
            raise NotFound(f"no quota for {kind} {name!r}")
        self.ledger.shares_changed()
        self._recalc_due = True
        self._quota_event(kind, name, Quota())
        self.schedule()

    def _quota_event(self, kind: str, name: str, quota: Quota) -> None:
        """A ``quota`` event: the limits now in force (all null: the defaults)."""
        user = name if kind == "user" else ""
        detail = {"kind": kind, "name": name, **quota.to_json()}
        self._emit(Event("quota", self.clock.now(), user, detail=detail))

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
        """From the user's history only, never the request's own claim."""
        return self._size_gpu_eq(request.size) * self._history_duration(request) / 3600.0

    def size_fraction(self, request: Request) -> float:
        total = self.placer.total_gpu_equivalents
        return self._size_gpu_eq(request.size) / total if total else 0.0

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

    def _enqueue(self, r: Request) -> None:
        self._live[r.id] = r
        self._waiting.add(r)

    def _dequeue(self, r: Request) -> None:
        self._waiting.remove(r)
        self.calibration.left(r.id, self.clock.now(), r.state is RequestState.GRANTED)
        if r.state is not RequestState.GRANTED:
            del self._live[r.id]

    def _end_queued(self, r: Request, state: RequestState, reason: str, by: str = "") -> None:
        """End a request that never got a grant (cancelled, expired, refused); ``by``: the
        admin who cancelled it."""
        now = self.clock.now()
        with self.store.transaction():  # memory changes only once the file has
            self.store.end_request(replace(r, state=state, ended_at=now, reason=reason))
        r.state, r.ended_at, r.reason = state, now, reason
        self._dequeue(r)
        detail = {"reason": reason, "by": by} if by else {"reason": reason}
        self._emit(Event(state.value, now, r.user, r.id, detail=detail))

    def _own_request(self, request_id: str, user: str | None) -> Request:
        r = self.request(request_id, user)
        if r.state.ended:
            raise Conflict(f"request {request_id!r} already ended ({r.state.value})")
        return self._live[r.id]

    def _active_lease(self, lease_id: str, user: str | None) -> Lease:
        lease = self.lease(lease_id, user)
        if lease.state is not LeaseState.ACTIVE:
            raise Conflict(f"lease {lease_id!r} already ended ({lease.state.value})")
        return self._leases[lease_id]

    def _check_satisfiable(self, size: Size) -> None:
        have = self.placer.count_compatible(size)
        if have >= self.placer.units(size):
            return
        if size.profile and self.config.dynamic_mig and self._mig_capable(size.profile):
            return
        if size.gpus is not None:
            where = "this machine has" if self.placer.nodes() <= {""} else "the largest node has"
            raise Unsatisfiable(
                f"asks for {size.gpus} whole GPU(s) but {where} {have} GPU(s) with MIG disabled"
            )
        if size.profile is not None:
            offered = sorted({d.profile for d in self.placer.devices.values() if d.profile})
            raise Unsatisfiable(
                f"no GPU here offers MIG profile {size.profile!r}"
                + (f"; available profiles: {', '.join(offered)}" if offered else "")
            )
        biggest = max((d.memory_gb for d in self.placer.devices.values()), default=0.0)
        raise Unsatisfiable(
            f"no device here has {size.min_memory_gb:g} GiB; the largest has "
            f"{memory(biggest * 1024)}"
        )

    def _mig_capable(self, profile: str) -> bool:
        return any(
            g.mig_enabled and g.model in CATALOG and CATALOG[g.model].profile(profile)
            for g in self.placer.gpus.values()
        )

    def _size_gpu_eq(self, size: Size) -> float:
        eq = self._gpu_eq_of_size.get(size.key)
        if eq is None:
            eq = self._gpu_eq_of_size[size.key] = self._compute_gpu_eq(size)
        return eq

    def _compute_gpu_eq(self, size: Size) -> float:
        if size.gpus is not None:
            return float(size.gpus)
        if size.profile is not None:
            for model in CATALOG.values():
                p = model.profile(size.profile)
                if p:
                    return p.gpu_equivalents
        devices = self.placer.compatible(size)
        return min((d.gpu_equivalents for d in devices), default=1.0)

    def _could_place(self, size: Size) -> bool:
        if self.placer.has_free_for(size):
            return True
        return bool(size.profile and self.config.dynamic_mig)

    # -- fitting and granting

    def _fit(
        self, r: Request, reservation: _Reservation | None, now: float
    ) -> list[Device] | MigPlan | None:
        strategy = self.policy.placement
        reserved = reservation.devices if reservation else frozenset()
        devices = self.placer.find(r.size, strategy, reserved)
        if devices is None and reservation and now + self._duration(r) <= reservation.start:
            devices = self.placer.find(r.size, strategy)  # backfill: done before it is needed
        if devices is not None:
            return devices
        if r.size.profile and self.config.dynamic_mig:
            return self.placer.plan_mig(r.size.profile, reserved)
        return None

    def _may_backfill(self, size: Size, reservation: _Reservation, now: float) -> bool:
        """Could a waiting request of ``size`` still backfill: is a device outside the
        reservation free for it, and could one of them end before the reservation
        starts? If not, the pass drops the size instead of examining each of its
        requests in turn (at cluster scale, hundreds in every pass)."""
        if self.placer.find(size, self.policy.placement) is None:
            return False
        unstated = min(self.predictor.shortest, *self.config.default_duration_s.values())
        return now + self._waiting.shortest(size.key, unstated) <= reservation.start

    def _reserve(self, r: Request, now: float) -> _Reservation | None:
        """When and where the top blocked request will start, from leases' expected
        ends (``Placer.reserve``: its shadow time, on one node)."""
        found = self.placer.reserve(r.size, now)
        return None if found is None else _Reservation(*found)

    def _grant(self, r: Request, fit: list[Device] | MigPlan, now: float) -> Lease:
        devices = self._repartition(fit) if isinstance(fit, MigPlan) else fit
        eq = sum(d.gpu_equivalents for d in devices)
        profile = devices[0].profile or "gpu"
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
        )
        expected_end = now + self._duration(r)
        with self.store.transaction():
            self.store.insert_lease(lease, expected_end)
        r.state, r.lease_id = RequestState.GRANTED, lease.id
        self._dequeue(r)
        self._hold(lease, expected_end)
        if self.ledger.charge_entry(r.user, eq, now):
            self._waiting.rerank_user(r.user)
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

    def _repartition(self, plan: MigPlan) -> list[Device]:
        assert self.partitioner is not None
        for d in plan.destroy:
            self.partitioner.destroy(d.uuid)
            self.placer.remove(d.uuid)
        created = self.partitioner.create(plan.gpu.uuid, plan.profile.name, plan.start)
        self.placer.add(created)
        self._sync_inventory()
        self._emit(
            Event(
                "repartitioned",
                self.clock.now(),
                "",
                detail={
                    "gpu": plan.gpu.uuid,
                    "destroyed": [d.uuid for d in plan.destroy],
                    "created": created.uuid,
                },
            )
        )
        return [created]

    def _sync_inventory(self) -> None:
        """``inventory`` as the placer now has it (after a re-cut or devices that joined)."""
        self.inventory = Inventory(
            tuple(self.placer.gpus.values()), tuple(self.placer.devices.values())
        )

    def _hold(self, lease: Lease, expected_end: float) -> None:
        self._leases[lease.id] = lease
        self._expected_end[lease.id] = expected_end
        self.ledger.hold(lease)
        self.budgets.hold(lease)
        self.placer.hold(lease.devices, until=expected_end)
        for d in lease.devices:
            self._holder[d] = lease.id

    def _end_lease(
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
        r = self._live[lease.request_id]
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
        del self._leases[lease.id], self._expected_end[lease.id]
        del self._live[r.id]
        for d in lease.devices:
            self._holder.pop(d, None)
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

    def _vacate(self, lease: Lease, now: float) -> None:
        """Give an ended lease's devices back, each once no process runs on it.

        The rule: a device that the probe shows a compute process on when its lease ends
        (the previous holder's: nobody else was allowed on it) stays out of placement as
        *vacating*; ``tick`` frees it once the probe shows it empty, or drains it, naming
        the process, after ``vacate_timeout_s``. A device showing nothing is free at once,
        so an ordinary release is granted again in the same pass.
        """
        busy = {d: self._pids(d) for d in lease.devices}
        self.placer.release(d for d, pids in busy.items() if not pids)
        for d, pids in busy.items():
            if pids:
                self._vacating[d] = Vacating(now, lease.id, pids)
                detail = {"device": d, "pids": list(pids)}
                self._emit(Event("vacating", now, lease.user, lease.request_id, lease.id, detail))

    def _pids(self, uuid: str) -> tuple[int, ...]:
        if self.processes is None or uuid not in self.placer.devices:
            return ()
        return self.processes.compute_pids(uuid)

    def _check_vacating(self, now: float) -> None:
        for uuid, v in list(self._vacating.items()):
            pids = self._pids(uuid)
            if pids and now - v.since < self.config.vacate_timeout_s:
                continue
            del self._vacating[uuid]
            if pids:
                after = f"lease {v.lease_id} ended" if v.lease_id else "the broker started"
                self.drain(
                    uuid,
                    f"process {pids[0]} still ran on it {now - v.since:.0f} s after {after}; "
                    "undrain it once that process is gone",
                    cause="vacate",
                )
            self.placer.release([uuid])
            if not pids:
                self._emit(Event("vacated", now, "", lease_id=v.lease_id, detail={"device": uuid}))

    def _device_event(self, kind: str, uuid: str, now: float, reason: str) -> None:
        """A machine-wide event about a GPU or device, then one to each lease holding it."""
        detail = {"device": uuid, "reason": reason}
        self._emit(Event(kind, now, "", detail=detail))
        held = {self._holder[d.uuid] for d in self.placer.under(uuid) if d.uuid in self._holder}
        for lease in sorted((self._leases[x] for x in held), key=lambda x: x.granted_at):
            self._lease_event(kind, lease, detail)

    def _lease_event(self, kind: str, lease: Lease, detail: dict[str, Any]) -> None:
        self._emit(Event(kind, self.clock.now(), lease.user, lease.request_id, lease.id, detail))

    # -- durations

    def _history_duration(self, r: Request) -> float:
        """The median hold time of the request's kind (the predictor's finest history
        with enough samples: user and shape, user, group, class), else the class default."""
        cls = r.job_class.value
        est = self.predictor.hold(r.user, r.group, cls, request_shape(r.size))
        return est.median if est is not None else self.config.default_duration_s[cls]

    def _duration(self, r: Request) -> float:
        """Expected hold time: the request's own estimate, else its kind's history."""
        return r.expected_duration_s or self._history_duration(r)

    def _start_estimates(self, ranked: list[Request], now: float) -> dict[str, Eta | None]:
        """``predicted_starts`` of the queue in priority order, computed again only after
        a change (an event, a new ranking) or ``ETA_MAX_AGE_S``: polling the queue stays
        cheap and its estimates stable between changes. An empty queue has none to
        compute (what the leases' ends would be is not needed)."""
        key = (self._changes, self._ranked_at)
        if self._etas is None or self._etas[0] != key or now - self._etas[1] > ETA_MAX_AGE_S:
            raw = predicted_starts(self, ranked, self.predictor, now) if ranked else {}
            self._etas = (key, now, self.calibration.apply(raw, now))
        return self._etas[2]

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

    # -- restart

    def _restore(self) -> None:
        """Rebuild memory from the store after a start or a crash."""
        now = self.clock.now()
        self.budgets.restore(now)
        horizon = now - 10 * self.policy.half_life_s
        for row in self.store.ledger(since=horizon):
            self.ledger.charge_past(
                row["user"], row["grp"], row["gpu_equivalents"], row["start"], row["end"], now
            )
            shape = held_shape(row["profile"], row["gpu_equivalents"])
            held_s = row["end"] - row["start"]
            self.predictor.learn(row["user"], row["grp"], row["job_class"], shape, held_s)
        live = self.store.live_requests()
        self._live.update((r.id, r) for r in live if r.state is RequestState.GRANTED)
        lost: list[tuple[Lease, str]] = []
        for lease, expected_end in self.store.active_leases():
            # A restart gives every live holder a fresh TTL to find the broker again.
            lease.expires_at = max(lease.expires_at, now + lease.ttl_s)
            self._hold(lease, expected_end)  # usage accrues from granted_at, as before
            missing = [d for d in lease.devices if d not in self.placer.devices]
            if missing:
                lost.append((lease, f"device {missing[0]} is no longer in the inventory"))
        for r in live:
            # live users count in the share totals, as they did before
            self.ledger.register(r.user, r.group, now)
            if r.state is RequestState.QUEUED:
                # Like a lease: a fresh TTL for its holder to find the broker again.
                r.expires_at = max(r.expires_at or now, now + self.request_ttl_s)
                r.ttl_s = self.request_ttl_s
                self._enqueue(r)
                heapq.heappush(self._request_deadlines, (r.expires_at, r.id))
        self._drains = self.store.drains()
        self._drain_cause = self.store.drain_causes()
        for uuid in self._drains:
            self.placer.drain(uuid)
        for uuid in [u for u in self.placer.devices if u not in self._holder]:
            pids = self._pids(uuid)  # a lease ended before the restart, its process lingers
            if pids:
                self.placer.hold([uuid])
                self._vacating[uuid] = Vacating(now, "", pids)
        for lease, reason in lost:
            self._end_lease(lease, LeaseState.RECLAIMED, reason, ("lost", {"reason": reason}))
        for r in [r for r in self._live.values() if r.state is RequestState.QUEUED]:
            try:
                self._check_satisfiable(r.size)
            except Unsatisfiable as e:
                self._end_queued(r, RequestState.REFUSED, e.message)
