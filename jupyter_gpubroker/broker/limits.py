"""Time limits: what a request may declare, and the start bounds the broker keeps.

A request may carry a time limit (Slurm's ``--time``): its lease is warned
``limit_warning_s`` before the limit ends and reclaimed ``limit_grace_s`` after it
(``reclaim.Reclaimer``, cause ``time_limit``), unless ``Broker.extend`` gave it more.
A declared limit is an upper bound, so the scheduler plans with it (a lease's expected
end, EASY backfill's durations) and the broker can *promise* a start:

:class:`Promises` list-schedules (``eta.list_schedule``) the requests already promised,
in the order they were promised, then the other waiting requests in priority order,
over the devices' worst-case free times: every lease ending at its limit end plus the
grace, every request holding its limit plus the grace, and anything without a limit
holding forever. A waiting request whose start is finite there is promised it, once,
``promise_stretch`` times as far off (room for the policy's order: with promises exactly
at the worst case, nobody could ever go ahead of a promised request, and the broker
would serve in promise order, about arrival order). From then on the broker keeps every
promise: a grant that would push a promised start past its promise is refused
(``keeps``), an extension that would push it past its worst case when promised is
refused (``broken``: the stretch is not for extensions), and a promised request whose
worst-case start has come is granted after the policy's own grants (``due``). Starts
only move earlier when leases end sooner than their limits, so a promise holds unless
an admin intervenes (a drain, a reclaim, a quota, a changed limit, an arbiter keeping
a lease) or a GPU fails. Then the broker says so (``check``): after a drain (a GPU
taken out of service by an admin or by a fault) it list-schedules the promised requests
again, and any promised request still waiting past its promise is looked at too; each
promise that can no longer be kept is replaced by one from the worst case now, with a
``promise_broken`` event that tells its user why.

Promised only where the list-schedule is how placement really goes: whole GPUs or MIG
profiles (not memory sizes nor shares), several GPUs only on a one-node inventory, no
dynamic MIG.
Promises live in memory: after a restart they are made afresh. Which default and
maximum a request gets (per job class, profile and group) is ``limitrules``'.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from ..wire.errors import Conflict
from ..wire.sizes import hold_seconds
from ..wire.text import clock, count, duration, promise_broken
from .config import BrokerConfig
from .eta import list_schedule
from .limitrules import rule_words
from .models import Device, Event, JobClass, Lease, Request, RequestState

if TYPE_CHECKING:
    from .core import Broker

DEFAULT_MAX_EXTENSIONS = 3
SLACK_S = 1e-6
"""Float noise allowed in comparing a start with its promise."""


def max_extensions(config: BrokerConfig, job_class: JobClass) -> int:
    return config.max_extensions.get(job_class.value, DEFAULT_MAX_EXTENSIONS)


class Promises:
    """The start bounds promised to waiting requests, and the checks that keep them."""

    def __init__(self, broker: Broker, emit: Callable[[Event], None]) -> None:
        self.broker, self._emit = broker, emit
        self._bound: dict[str, float] = {}
        """Request id -> its promised start, in the order promised."""
        self._worst: dict[str, float] = {}
        """Request id -> its worst-case start when promised (before ``promise_stretch``):
        no extension may push it later."""
        self._pending: set[str] | None = None
        """Waiting requests with a limit and no promise yet (None: not read yet, after a
        start: the waiting requests restored then)."""
        self._due: list[tuple[float, str]] = []
        """(promised start, request id) of every promise made, a heap: one whose start
        passes while its request still waits was broken."""
        self._drained: str | None = None
        """Why GPUs were taken out of service since the last check (None: none were)."""
        broker.subscribe(self._on_event)

    def wants(self, r: Request) -> None:
        """``r`` waits: promise it a start once it has a finite worst case."""
        if r.limit_s is not None and self._modelled(r) and self._pending is not None:
            self._pending.add(r.id)

    def bound(self, request_id: str) -> float | None:
        """The start promised to a waiting request (None: none)."""
        return self._bound.get(request_id)

    # -- worst cases

    def _ends(self, lease: Lease) -> Sequence[float] | None:
        end = lease.ends_at
        return None if end is None else (end + self.broker.config.limit_grace_s,)

    def _holds(self, r: Request) -> Sequence[float] | None:
        return None if r.limit_s is None else (r.limit_s + self.broker.config.limit_grace_s,)

    def _promised(self) -> list[Request]:
        """The waiting promised requests in promise order (forgetting those gone)."""
        live = self.broker.book.live
        for rid in [rid for rid in self._bound if rid not in live]:
            del self._bound[rid], self._worst[rid]
        return [live[rid] for rid in self._bound if live[rid].state is RequestState.QUEUED]

    def _starts(
        self,
        queue: Sequence[Request],
        now: float,
        held: dict[str, Lease] | None = None,
        ends: Callable[[Lease], Sequence[float] | None] | None = None,
    ) -> dict[str, float]:
        got = list_schedule(self.broker, queue, ends or self._ends, self._holds, 1, now, held=held)
        return {rid: s[0] for rid, s in got.items()}

    def _first_broken(
        self, starts: dict[str, float], bounds: dict[str, float]
    ) -> tuple[str, float] | None:
        for rid, t in starts.items():
            if t > bounds[rid] + SLACK_S:
                return rid, bounds[rid]
        return None

    # -- making and keeping promises

    def offer(
        self, ranked: Callable[[Callable[[Request], bool]], Iterable[Request]], now: float
    ) -> bool:
        """Promise a start to each waiting request that wants one and has a finite
        worst-case start (``ranked(keep)``: the waiting requests ``keep`` keeps, in
        priority order); whether one of them was promised a start now (a pass should
        grant it)."""
        live = self.broker.book.live
        if self._pending is None:
            self._pending = set()
            for r in self.broker.book.waiting:
                self.wants(r)
        self._pending = {
            rid for rid in self._pending if rid in live and live[rid].state is RequestState.QUEUED
        }
        self.check(now)
        if not self._pending:
            return False
        fresh = list(ranked(lambda r: r.id not in self._bound))
        starts = self._starts(self._promised() + fresh, now)
        now_due = False
        for r in fresh:
            if r.id in self._pending and math.isfinite(starts[r.id]):
                self._promise(r.id, starts[r.id], now)
                now_due = now_due or starts[r.id] <= now + SLACK_S
        return now_due

    def _promise(self, request_id: str, start: float, now: float) -> None:
        """Promise ``request_id`` a start ``promise_stretch`` times as far off as its
        worst case, ``start``."""
        ahead = max(start - now, 0.0)
        bound = now + self.broker.config.promise_stretch * ahead
        self._bound[request_id], self._worst[request_id] = bound, now + ahead
        heapq.heappush(self._due, (bound, request_id))
        if self._pending is not None:
            self._pending.discard(request_id)

    def _on_event(self, event: Event) -> None:
        """A drain may break promises: remember why, in words for a waiting user."""
        if event.kind == "drained":
            lingering = self.broker.drain_cause(event.detail["device"]) == "vacate"
            self._drained = (
                "a process left on a GPU after its lease ended keeps it busy"
                if lingering  # the drain's own reason tells an admin what to do
                else f"a GPU was taken out of service ({event.detail['reason']})"
            )

    def check(self, now: float) -> None:
        """Replace the promises that can no longer be kept (module docstring), saying
        why; nothing to do on most passes: no GPU drained and no promise overdue."""
        live, overdue = self.broker.book.live, False
        while self._due and self._due[0][0] + SLACK_S < now:
            bound, rid = heapq.heappop(self._due)
            r = live.get(rid)
            overdue = overdue or (
                self._bound.get(rid) == bound and r is not None and r.state is RequestState.QUEUED
            )
        drained, self._drained = self._drained, None
        if not (overdue or drained):
            return
        promised = self._promised()
        starts = self._starts(promised, now)
        for r in promised:
            was = self._bound[r.id]
            if starts[r.id] <= was + SLACK_S:
                continue
            del self._bound[r.id], self._worst[r.id]
            if now + SLACK_S < starts[r.id] < math.inf:
                self._promise(r.id, starts[r.id], now)
            elif math.isinf(starts[r.id]) and self._pending is not None:
                self._pending.add(r.id)  # promised again once it has a worst case
            # else its worst case is past (a lease held beyond its limit, a quota): a
            # promise of "now" would break at once, so it waits unpromised
            why = drained or (
                "it is still waiting, held up by an admin's action, a quota or a process "
                "still on a GPU"
            )
            now_by = self._bound.get(r.id)
            detail = {"reason": why, "broken_bound": was, "eta_bound": now_by}
            detail["message"] = promise_broken(was, why, now_by)
            self._emit(Event("promise_broken", now, r.user, r.id, None, detail))

    def _modelled(self, r: Request) -> bool:
        """Is the list-schedule how ``r`` is placed (see the module's docstring)?"""
        b = self.broker
        if b.config.dynamic_mig or r.size.min_memory_gb is not None or r.size.shared:
            return False
        return (r.size.gpus or 1) == 1 or len(b.placer.nodes()) <= 1

    def keeps(self, r: Request, devices: list[Device], now: float) -> bool:
        """Would granting ``devices`` to ``r`` now keep every other promise?"""
        promised = [x for x in self._promised() if x.id != r.id]
        if not promised:
            return True
        held = dict(self.broker.holders())
        uuids = tuple(d.uuid for d in devices)
        probe = Lease("", r.id, r.user, r.group, uuids, 0.0, now, math.inf, 0.0, limit_s=r.limit_s)
        held.update((d.uuid, probe) for d in devices)
        return self._first_broken(self._starts(promised, now, held), self._bound) is None

    def due(self, now: float) -> list[Request]:
        """The promised requests whose worst-case start has come, in promise order."""
        promised = self._promised()
        free_for = self.broker.placer.has_free_for
        if not any(free_for(r.size) for r in promised):
            return []  # none could be granted now: spare the list-schedule (most passes)
        starts = self._starts(promised, now)
        return [r for r in promised if starts[r.id] <= now + SLACK_S]

    def broken(self, lease: Lease, end: float, now: float) -> tuple[str, float] | None:
        """The first promised request (its id and worst-case start when promised) that
        ``lease`` ending at ``end`` would start later than that; None if none. Stricter
        than its promise: the stretch is room for the policy's order, not for
        extensions."""
        promised = self._promised()
        if not promised:
            return None
        longer = replace(lease, extended_s=end - lease.granted_at - (lease.limit_s or 0.0))

        def ends(x: Lease) -> Sequence[float] | None:
            return self._ends(longer if x.id == lease.id else x)

        return self._first_broken(self._starts(promised, now, ends=ends), self._worst)

    def check_extension(self, lease: Lease, seconds: float) -> float:
        """The lease's new end if it may have ``seconds`` more (within the longest limit
        of its request's class, profile and groups); ``Conflict`` saying why not."""
        b, now = self.broker, self.broker.clock.now()
        r = b.book.live[lease.request_id]
        seconds = hold_seconds(seconds, "an extension")
        end = lease.ends_at
        if end is None:
            raise Conflict("this lease has no time limit to extend")
        most = max_extensions(b.config, r.job_class)
        if lease.extensions >= most:
            raise Conflict(
                f"this lease was already extended {count(most, 'time')}, the most allowed"
            )
        total = end + seconds - lease.granted_at
        cap, whose = b.limits.longest(r.job_class, r.size, r.groups)
        if total > cap:
            raise Conflict(
                f"{duration(total)} in all would be longer than the {duration(cap)} "
                f"allowed for {rule_words(whose)}"
            )
        broken = self.broken(lease, end + seconds, now)
        if broken is not None:
            raise Conflict(
                "not extended: a waiting request needs this GPU when its time limit ends, "
                f"at {clock(end)}"
            )
        return end + seconds
