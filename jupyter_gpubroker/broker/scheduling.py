"""The scheduling pass: who gets devices now, in policy order, with EASY backfill.

The queue (``queue.WaitQueue``) walks each size's bucket heads best first; a pass merges
the walks of the sizes some free device could take (every size when the policy is
strict FCFS) and takes the best head of all, again and again. A head that fits is
granted (by the broker's ``grant``, which commits the lease). The first that fits
nowhere is *blocked*: the pass reserves devices for it at its shadow time, from the
leases' expected ends, and from then on a later request goes only where it leaves that
reservation alone or ends before it starts (backfill), for at most ``backfill_depth``
more requests. A strict policy stops at the first request that does not fit.

Where starts were promised from time limits (``limits.Promises``), a pass grants
nothing that would push a promised start past its promise, and then grants the
promised requests whose worst-case start has come that policy order left waiting.
(Granting those first, before policy order, kept the promises as well but served the
promised requests in promise order, which is arrival order: on Philly's first 9,000
jobs on 640 GPUs with modelled limits it raised the mean wait by 43% and the jobs
waiting over a day from 158 to 856.)

``Scheduler`` also knows what the pass rests on: a size's GPU-equivalents, a request's
expected hold time, and whether any device here could ever take a size.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Callable, Generator
from dataclasses import dataclass
from enum import Enum

from ..wire.errors import PartitionFailed, StorageFull, Unsatisfiable
from ..wire.profiles import CATALOG
from ..wire.sizes import Size
from ..wire.text import memory
from .budgets import Budgets
from .config import ASSUMED_HOLD_S, BrokerConfig
from .limits import Promises
from .migplan import MigPlan
from .models import Device, Lease, Request
from .placement import Placer
from .policy import Policy
from .predictor import Predictor, request_shape
from .queue import WaitQueue, stated
from .shares import share_fraction, share_mib

log = logging.getLogger(__name__)

Fit = list[Device] | MigPlan
"""Where a request goes: free devices, or a MIG GPU to re-cut for it."""
Grant = Callable[[Request, Fit, float], Lease]


@dataclass
class Reservation:
    """The top blocked request's claim: these devices at ``start`` (EASY backfill)."""

    devices: frozenset[str]
    start: float


class Scheduler:
    """Decides each pass's grants; the broker holds the queue, the leases and the ranking."""

    def __init__(
        self,
        waiting: WaitQueue,
        placer: Placer,
        policy: Policy,
        budgets: Budgets,
        predictor: Predictor,
        config: BrokerConfig,
        grant: Grant,
        promises: Promises,
    ) -> None:
        self.waiting, self.placer, self.policy = waiting, placer, policy
        self.budgets, self.predictor, self.config = budgets, predictor, config
        self.grant, self.promises = grant, promises
        self._gpu_eq_of_size: dict[str, float] = {}

    def run(self, now: float) -> list[Lease]:
        """One pass at ``now``: the leases granted, in grant order."""
        strict = self.policy.strict
        walks = {
            k: self.waiting.walk(k)
            for k, size in self.waiting.sizes.items()
            if strict or self.could_place(size)
        }
        try:
            granted = _Pass(self, _Heads(self.waiting, walks), now).run()
        finally:
            for w in walks.values():
                w.close()
        return granted + self._grant_due(now)

    def _grant_due(self, now: float) -> list[Lease]:
        """Grant the promised requests whose worst-case start has come."""
        grants = _Pass(self, _Heads(self.waiting, {}), now)
        for r in self.promises.due(now):
            devices = self.placer.find(r.size, self.policy.placement)
            if devices is None or self.budgets.blocks(r, self.gpu_eq(r.size), now):
                continue
            if grants.grant(r, devices) is _Step.STOP:
                break
        return grants.granted

    # -- what a pass asks

    def could_place(self, size: Size) -> bool:
        """Is a device free for ``size``, or could a re-cut make one?"""
        if self.placer.has_free_for(size):
            return True
        return bool(size.profile and self.config.dynamic_mig)

    def fit(self, r: Request, reservation: Reservation | None, now: float) -> Fit | None:
        """Where ``r`` goes now, leaving ``reservation`` alone unless ``r`` ends first."""
        strategy = self.policy.placement
        reserved = reservation.devices if reservation else frozenset()
        devices = self.placer.find(r.size, strategy, reserved)
        if devices is None and reservation and now + self.duration(r) <= reservation.start:
            devices = self.placer.find(r.size, strategy)  # backfill: done before it is needed
        if devices is not None:
            return devices
        if r.size.profile and self.config.dynamic_mig:
            return self.placer.plan_mig(r.size.profile, reserved)
        return None

    def may_backfill(self, size: Size, reservation: Reservation, now: float) -> bool:
        """Could a waiting request of ``size`` still backfill: is a device outside the
        reservation free for it, and could one of them end before the reservation
        starts? If not, the pass drops the size instead of examining each of its
        requests in turn (at cluster scale, hundreds in every pass)."""
        if self.placer.find(size, self.policy.placement) is None:
            return False
        unstated = min(self.predictor.shortest, *map(self.config.expected_hold_s, ASSUMED_HOLD_S))
        return now + self.waiting.shortest(size.key, unstated) <= reservation.start

    def reserve(self, r: Request, now: float) -> Reservation | None:
        """When and where the top blocked request will start, from leases' expected
        ends (``Placer.reserve``: its shadow time, on one node)."""
        found = self.placer.reserve(r.size, now)
        return None if found is None else Reservation(*found)

    # -- durations

    def history_duration(self, r: Request) -> float:
        """The median hold time of the request's kind (the predictor's finest history
        with enough samples: user and shape, user, group, class), else the class's
        expected hold."""
        cls = r.job_class.value
        est = self.predictor.hold(r.user, r.group, cls, request_shape(r.size))
        return est.median if est is not None else self.config.expected_hold_s(cls)

    def duration(self, r: Request) -> float:
        """Expected hold time: the request's time limit or own estimate (``stated``),
        else its kind's history."""
        return stated(r) or self.history_duration(r)

    # -- sizes on this inventory

    def gpu_eq(self, size: Size) -> float:
        """GPU-equivalents of ``size``: its GPUs, its profile's share of a GPU, else the
        smallest device that has its memory (kept until ``forget_sizes``)."""
        eq = self._gpu_eq_of_size.get(size.key)
        if eq is None:
            eq = self._gpu_eq_of_size[size.key] = self._compute_gpu_eq(size)
        return eq

    def forget_sizes(self) -> None:
        """Devices joined: the smallest device that fits a memory size may have changed."""
        self._gpu_eq_of_size.clear()

    def fit_gpu_eq(self, size: Size, devices: list[Device]) -> float:
        """What ``devices`` granted to a request of ``size`` count as: their
        GPU-equivalents, or a share's part of its GPU."""
        if size.shared:
            return share_fraction(size, devices[0])
        return sum(d.gpu_equivalents for d in devices)

    def _compute_gpu_eq(self, size: Size) -> float:
        if size.gpus is not None:
            return float(size.gpus)
        if size.shared:  # its part of the largest GPU it could go on: the least it counts
            largest = max((d.memory_mib for d in self.placer.compatible(size)), default=0)
            return share_mib(size) / largest if largest else 1.0
        if size.profile is not None:
            for model in CATALOG.values():
                p = model.profile(size.profile)
                if p:
                    return p.gpu_equivalents
        devices = self.placer.compatible(size)
        return min((d.gpu_equivalents for d in devices), default=1.0)

    def check_satisfiable(self, size: Size) -> None:
        """Raise ``Unsatisfiable``, saying why, when no device here could ever take
        ``size`` (counting what a re-cut could make, with dynamic MIG)."""
        if size.shared:
            self._check_share(size)
            return
        have = self.placer.count_compatible(size)
        if have >= self.placer.units(size):
            return
        if size.profile and self.config.dynamic_mig and self._mig_capable(size.profile):
            return
        devices = self.placer.devices.values()
        if size.gpus is not None:
            where = "this machine has" if self.placer.nodes() <= {""} else "the largest node has"
            of = f" {size.model}" if size.model else ""
            raise Unsatisfiable(
                f"asks for {size.gpus} whole{of} GPU{_s(size.gpus)} but {where} {have}{of} "
                f"GPU{_s(have)} with MIG disabled"
            )
        if size.profile is not None:
            offered = sorted({d.profile for d in devices if d.profile})
            raise Unsatisfiable(
                f"no GPU here offers MIG profile {size.profile!r}"
                + (f"; available profiles: {', '.join(offered)}" if offered else "")
            )
        biggest = max((d.memory_mib for d in devices), default=0)
        raise Unsatisfiable(
            f"no device here has {size.min_memory_gb:g} GB; the largest has {memory(biggest)}"
        )

    def _check_share(self, size: Size) -> None:
        """``Unsatisfiable``, saying why, for a share no GPU here could ever take: none is
        shared (MIG on, or lent whole only), or none has that much memory."""
        largest = self.placer.shares.largest()
        if largest >= share_mib(size):
            return
        gpus = self.placer.gpus.values()
        alternative = f"ask for a whole GPU, or for a GPU of at least {size.share_gb:g} GB, instead"
        if gpus and all(g.mig_enabled for g in gpus):
            offered = sorted({d.profile for d in self.placer.devices.values() if d.profile})
            raise Unsatisfiable(
                "no GPU here is shared: each is cut into MIG slices, and a slice is never "
                f"shared; ask for a slice ({', '.join(offered)}) instead"
            )
        if not largest:
            raise Unsatisfiable(
                f"no GPU here is shared: the admin lends them whole only; {alternative}"
            )
        raise Unsatisfiable(
            f"no GPU shared here has {size.share_gb:g} GB; the largest has {memory(largest)}"
        )

    def _mig_capable(self, profile: str) -> bool:
        return any(
            g.mig_enabled and g.model in CATALOG and CATALOG[g.model].profile(profile)
            for g in self.placer.gpus.values()
        )


class _Heads:
    """The best waiting request of each size in the pass, best of all first."""

    def __init__(
        self, waiting: WaitQueue, walks: dict[str, Generator[tuple[float, Request], None, None]]
    ) -> None:
        self._waiting, self._walks = waiting, walks
        self._front: list[tuple[float, float, int, str, Request]] = []

    def start(self) -> None:
        """Put the first head of every size in line."""
        for k in self._walks:
            self.advance(k)

    def advance(self, size_key: str) -> None:
        """Put the next head of this size in line (none: the size is done)."""
        nxt = next(self._walks[size_key], None)
        if nxt is not None:
            p, head = nxt
            order = self._waiting.order(head)
            heapq.heappush(self._front, (-p, head.submitted_at, order, size_key, head))

    def pop(self) -> tuple[str, Request] | None:
        """The best head left and its size; None when none is left."""
        if not self._front:
            return None
        _, _, _, k, r = heapq.heappop(self._front)
        return k, r


class _Step(Enum):
    NEXT = "next"
    """Go on with this size's next request."""
    DROP = "drop"
    """Drop this size from the pass."""
    STOP = "stop"
    """End the pass."""


class _Pass:
    """One pass's state: its heads, the blocked request, its reservation, the grants."""

    def __init__(self, scheduler: Scheduler, heads: _Heads, now: float) -> None:
        self.s, self.heads, self.now = scheduler, heads, now
        self.strict = scheduler.policy.strict
        self.blocked: Request | None = None
        self.reservation: Reservation | None = None
        self.examined = 0
        """Requests examined since the first blocked one (``backfill_depth`` bounds it)."""
        self.granted: list[Lease] = []

    def run(self) -> list[Lease]:
        self.heads.start()
        while (head := self.heads.pop()) is not None:
            k, r = head
            if not self.strict and not self.s.could_place(r.size):
                continue  # this size is out of free devices: drop it from the pass
            if self.s.budgets.blocks(r, self.s.gpu_eq(r.size), self.now):
                self.heads.advance(k)
                continue
            if not self._may_examine():
                break
            step = self._place(r)
            if step is _Step.STOP:
                break
            if step is _Step.NEXT:
                self.heads.advance(k)
        return self.granted

    def _may_examine(self) -> bool:
        """Behind a blocked request, count this one against the backfill depth (False:
        past it) and reserve the blocked request's devices once."""
        if self.blocked is None:
            return True
        self.examined += 1
        if self.examined > self.s.policy.backfill_depth:
            return False
        if self.reservation is None:
            self.reservation = self.s.reserve(self.blocked, self.now)
        return True

    def _place(self, r: Request) -> _Step:
        """Grant ``r`` where it fits, or say what its not fitting means for the pass."""
        fit = self.s.fit(r, self.reservation, self.now)
        if fit is None:
            return self._unplaced(r)
        if isinstance(fit, list) and self.s.budgets.blocks(
            r, self.s.fit_gpu_eq(r.size, fit), self.now
        ):
            return _Step.NEXT  # only a device larger than its quota allows is free
        if isinstance(fit, list) and not self.s.promises.keeps(r, fit, self.now):
            return _Step.NEXT  # it would delay a start promised to another request
        return self.grant(r, fit)

    def grant(self, r: Request, fit: Fit) -> _Step:
        try:
            self.granted.append(self.s.grant(r, fit, self.now))
        except PartitionFailed as e:
            log.warning("could not re-cut a GPU for request %s: %s", r.id, e.message)
        except StorageFull as e:  # the change that called this pass is committed
            log.warning("no grant until the state file can be written: %s", e.message)
            return _Step.STOP
        return _Step.NEXT

    def _unplaced(self, r: Request) -> _Step:
        if self.strict:
            return _Step.STOP
        if self.blocked is None:
            self.blocked = r  # nothing of this size fits at all: drop the size
            return _Step.DROP
        if self.reservation is not None and self.s.may_backfill(r.size, self.reservation, self.now):
            return _Step.NEXT  # a shorter request of this size may still backfill
        return _Step.DROP


def _s(n: int) -> str:
    """A plural's ending: "1 GPU", "2 GPUs"."""
    return "" if n == 1 else "s"
