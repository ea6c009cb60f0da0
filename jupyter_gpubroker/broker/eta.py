"""When waiting requests will start: estimates with a range, or "unknown".

The queue is list-scheduled in priority order over the devices' expected free
times: each request starts where its devices free earliest and holds them for
its expected duration. With dynamic MIG a MIG GPU is seen as its compute
slices (a ``3g`` request needs three slices of one GPU free, whatever they are
cut as now), since idle slices are re-cut; without it, as its slices.

Two estimators share the list-schedule:

- :func:`predicted_starts`, from the run-time predictor: a lease's end from the
  holds of its kind that lasted longer than it has so far, a waiting request's
  hold from its kind's history; the schedule is run once with every duration
  at the predictor's low quantile, once at the median and once at the high
  one, which gives each start a (low, median, high) range. The median's pass
  then also schedules the tier ahead (:func:`continued`): a request that will
  reach the policy's oldest-first tier before it starts is scheduled where it
  will then rank. A request behind a lease whose end nobody can know (it ran
  longer than any before) has no estimate: ``None``, shown as "unknown", never
  "any moment".
- :func:`limit_starts`, Slurm's ``squeue --start``: every running job runs to its
  limit and every waiting job holds its limit. One point per request.

The predictor's range is not a calibrated 80% range: the passes move every
duration to its low or high quantile at once, as if all of them erred the same
way, and the schedule knows nothing of later arrivals that jump the queue or of
backfill. :class:`Calibration` therefore replaces it with one learnt from the
broker's own past: how far the real starts of requests that have started since
fell from the medians they were given (conformal prediction, with Gibbs and
Candes' adaptive level so that the share covered holds while the load shifts).
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections import defaultdict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from ..wire.profiles import CATALOG, COMPUTE_SLICES
from ..wire.sizes import Size, gb_to_mib
from .models import Lease, Request
from .placement import Groups, Placer
from .policy import Context, Policy
from .predictor import Predictor, held_shape, request_shape
from .shapes import WHOLE_GPU
from .shares import ShareTimes, share_mib


@dataclass(frozen=True)
class Eta:
    """A start estimate (epoch seconds); ``high`` is infinite when only a bound is known."""

    low: float
    median: float
    high: float
    bound: float | None = None
    """The start the broker promised, from time limits (``limits.Promises``); None: none."""
    basis: str = "history"
    """What it rests on, its least firm part (``BASES``)."""


BASES = ("idle reclaim", "time limits", "history", "typical hold")
"""What an estimate may rest on, firmest first: a warned idle lease's reclaim time, time
limits (both enforced by the broker), past holds, the admin's stated typical hold."""
TYPICAL_SPREAD = (0.25, 0.5, 1.0, 2.0, 4.0)
"""Holds around a stated typical hold, as one history of its class: a hold is as likely
a quarter of it as four times it, and a lease held past four times it has no estimate."""


Ends = Callable[[Lease], Sequence[float] | None]
"""A lease's expected end, one per pass; None when unknown."""
Holds = Callable[[Request], Sequence[float] | None]
"""A waiting request's expected hold, one per pass; None when unknown."""


class Config(Protocol):
    @property
    def dynamic_mig(self) -> bool: ...

    @property
    def typical_hold_s(self) -> dict[str, float]: ...


class View(Context, Protocol):
    """What the estimators read of a broker (``Broker`` has all of it)."""

    @property
    def placer(self) -> Placer: ...

    @property
    def config(self) -> Config: ...

    @property
    def policy(self) -> Policy: ...

    @property
    def ranked_at(self) -> float: ...

    def holders(self) -> dict[str, Lease]: ...

    def sharers(self) -> dict[str, list[Lease]]: ...

    def request(self, request_id: str, user: str | None = None) -> Request: ...


def predicted(
    view: View, predictor: Predictor, now: float, bases: set[str] | None = None
) -> tuple[Ends, Holds]:
    """A lease's end and a waiting request's hold, (low, median, high) each, each looked
    up once (the list-schedule asks again and again); what each rests on is added to
    ``bases``. Where the predictor has no history: a warned idle lease ends at its
    reclaim time; a time limit bounds a lease's end and is a request's hold; else the
    stated typical hold (``TYPICAL_SPREAD``); else unknown."""
    used = set() if bases is None else bases
    typical = view.config.typical_hold_s
    ended: dict[str, Sequence[float] | None] = {}
    known: dict[tuple[str, str, str, str], Sequence[float] | None] = {}

    def ends(lease: Lease) -> Sequence[float] | None:
        if lease.id not in ended:
            r = view.request(lease.request_id)
            shape = held_shape(lease.profile, lease.gpu_equivalents)
            elapsed = now - lease.granted_at
            est = predictor.remaining(lease.user, lease.group, r.job_class.value, shape, elapsed)
            end: Sequence[float] | None = None
            if est is not None:
                used.add("history")
                end = (now + est.low, now + est.median, now + est.high)
            elif lease.reclaim_at is not None:
                used.add("idle reclaim")
                end = (lease.reclaim_at,) * 3
            elif lease.ends_at is not None:
                used.add("time limits")
                end = (now, lease.ends_at, lease.ends_at)
            elif (left := _typical(typical.get(r.job_class.value), elapsed)) is not None:
                used.add("typical hold")
                end = tuple(now + t for t in left)
            ended[lease.id] = end
        return ended[lease.id]

    def holds(r: Request) -> Sequence[float] | None:
        key = (r.user, r.group, r.job_class.value, request_shape(r.size))
        if key not in known:
            est = predictor.hold(*key)
            hold: Sequence[float] | None = None
            if est is not None:
                used.add("history")
                hold = (est.low, est.median, est.high)
            elif r.limit_s is not None:
                used.add("time limits")
                hold = (r.limit_s,) * 3
            elif (hold := _typical(typical.get(r.job_class.value), 0.0)) is not None:
                used.add("typical hold")
            known[key] = hold
        return known[key]

    return ends, holds


def _typical(hold_s: float | None, elapsed: float) -> tuple[float, float, float] | None:
    """What remains of a lease held ``elapsed`` seconds, from the holds around a stated
    typical hold that lasted longer (None: none stated, or none lasted that long)."""
    if hold_s is None:
        return None
    left = [hold_s * f - elapsed for f in TYPICAL_SPREAD if hold_s * f > elapsed]
    return (left[0], left[len(left) // 2], left[-1]) if left else None


def least_firm(bases: set[str]) -> str:
    """The basis of an estimate resting on all of ``bases``."""
    return max(bases, key=BASES.index, default="history")


def predicted_starts(
    view: View, queue: Sequence[Request], predictor: Predictor, now: float
) -> dict[str, Eta | None]:
    """Every waiting request's start range from the predictor (``queue`` in priority
    order); its median with the queue's expected future (:func:`continued`)."""
    bases: set[str] = set()
    ends, holds = predicted(view, predictor, now, bases)
    starts = list_schedule(view, queue, ends, holds, 3, now)
    medians = continued(
        view,
        queue,
        {r.id: starts[r.id][1] for r in queue},
        (),
        lambda lease: median(ends(lease)),
        lambda r: median(holds(r)),
        now,
    )
    out: dict[str, Eta | None] = {}
    for r in queue:
        low, mid, high = starts[r.id][0], medians[r.id], starts[r.id][2]
        basis = least_firm(bases)
        out[r.id] = (
            None if math.isinf(mid) else Eta(min(low, mid), mid, max(high, mid), None, basis)
        )
    return out


def median(values: Sequence[float] | None) -> Sequence[float] | None:
    """The median pass alone of (low, median, high)."""
    return None if values is None else (values[1],)


def continued(
    view: View,
    queue: Sequence[Request],
    first: dict[str, float],
    arrivals: Sequence[Request],
    ends: Ends,
    holds: Holds,
    now: float,
) -> dict[str, float]:
    """The starts ``first`` (of ``queue`` list-scheduled in priority order now) once the
    queue's own future is scheduled too: requests that will enter a higher tier before
    they start (``Policy.promotion``) move ahead of those they will then outrank, and
    each of ``arrivals`` (requests not submitted yet, none starting before its
    ``submitted_at``) goes before the waiting requests it would outrank that are still
    waiting when it comes; the positions come from ``first``, then once more from the
    starts with them.

    The broker passes no arrivals: only the oracle bound of ``benchmarks/eta_oracle.py``
    knows them. On openb at x4 the tier is most of the error (the real start order
    among the waiting alone makes it 0 with exact durations); on openb at x3 later
    arrivals are, but expecting the last hour's submissions again in each hour ahead
    (chosen there: 0.55 -> 0.42 with the tier) made Philly's error worse (0.323 ->
    0.331), so it is not in."""
    policy, at = view.policy, view.ranked_at
    rank = policy.ranker(view, at)
    ranked = [rank(r) for r in queue]
    known: dict[tuple[str, tuple[str, ...], str, Size], float] = {}
    moving: list[tuple[float, float, Request]] = []
    for r in arrivals:  # as new: no age, today's usage
        key = (r.user, r.groups, r.job_class.value, r.size)
        if key not in known:
            known[key] = rank(r)
        moving.append((known[key], r.submitted_at, r))
    promoted = {
        r.id: (pro[0], p + pro[1])
        for p, r in zip(ranked, queue, strict=True)
        if (pro := policy.promotion(r, view, at)) is not None
    }
    if not moving and not promoted:
        return first
    starts = first
    for _ in range(2):  # positions from the starts without them, then with them once
        merged = _merged(queue, ranked, starts, moving, promoted)
        got = list_schedule(view, merged, ends, holds, 1, now, lambda r: r.submitted_at)
        starts = {r.id: got[r.id][0] for r in queue}
    return starts


def _merged(
    queue: Sequence[Request],
    ranked: list[float],
    starts: dict[str, float],
    moving: list[tuple[float, float, Request]],
    promoted: dict[str, tuple[float, float]],
) -> list[Request]:
    """The queue in the order it will start in: each arrival and each request that enters
    the tier (``promoted``: id -> (when, its priority then)) before it starts, by
    ``starts``, goes before the requests it will outrank that still wait by then."""
    entering = {rid for rid, (when, _) in promoted.items() if when < starts[rid] < math.inf}
    base = [(p, r) for p, r in zip(ranked, queue, strict=True) if r.id not in entering]
    neg = [-p for p, _ in base]
    later = [starts[r.id] for _, r in base]
    for i in range(len(later) - 2, -1, -1):  # the earliest start from each place on
        later[i] = min(later[i], later[i + 1])
    tier = [(promoted[r.id][1], promoted[r.id][0], r) for r in queue if r.id in entering]
    ahead: dict[int, list[tuple[float, Request]]] = defaultdict(list)
    for p, when, r in moving + tier:
        i = max(bisect.bisect_right(neg, -p), bisect.bisect_right(later, when))
        if i < len(base) or r.id in entering:
            ahead[i].append((-p, r))
    merged: list[Request] = []
    for i in range(len(base) + 1):
        merged += [r for _, r in sorted(ahead.get(i, ()), key=lambda pr: pr[0])]
        if i < len(base):
            merged.append(base[i][1])
    return merged


def limit_starts(
    view: View, queue: Sequence[Request], limit: Callable[[Request], float], now: float
) -> dict[str, float | None]:
    """Slurm's ``squeue --start``: every job runs to ``limit`` of its request."""

    def ends(lease: Lease) -> Sequence[float]:
        return (lease.granted_at + limit(view.request(lease.request_id)),)

    starts = list_schedule(view, queue, ends, lambda r: (limit(r),), 1, now)
    return {r.id: None if math.isinf(starts[r.id][0]) else starts[r.id][0] for r in queue}


def list_schedule(
    view: View,
    queue: Sequence[Request],
    ends: Ends,
    holds: Holds,
    passes: int,
    now: float,
    release: Callable[[Request], float] | None = None,
    held: dict[str, Lease] | None = None,
) -> dict[str, list[float]]:
    """Each request's start in each pass (infinite where unknown or never); with
    ``release``, none starts before its release (a request not yet submitted); ``held``:
    device -> lease, in place of the view's holders (a grant being weighed)."""
    groups = view.placer.groups(by_slices=view.config.dynamic_mig)
    never = [math.inf] * passes
    shared = view.sharers()
    lease_ends = _lease_ends(
        [
            *(view.holders() if held is None else held).values(),
            *(x for s in shared.values() for x in s),
        ],
        ends,
        never,
        now,
    )
    free = _freed_at(groups, view.holders() if held is None else held, shared, lease_ends, now)
    starts = {r.id: [math.inf] * passes for r in queue}
    lengths = [holds(r) or never for r in queue]
    for p in range(passes):
        times = FreeTimes(groups, free, p, now)
        shares = ShareTimes(view.placer.shares, {x: e[p] for x, e in lease_ends.items()}, now)
        for r, hold in zip(queue, lengths, strict=True):
            after = release(r) if release else now
            if r.size.shared:
                start = shares.take(share_mib(r.size), hold[p], after)
            else:
                start = times.take(r.size, hold[p], after)
            if start is not None:
                starts[r.id][p] = start
    return starts


def _lease_ends(
    leases: Sequence[Lease], ends: Ends, never: list[float], now: float
) -> dict[str, Sequence[float]]:
    """Each lease's end in each pass (never when unknown), each asked once."""
    found: dict[str, Sequence[float]] = {}
    for lease in leases:
        if lease.id not in found:
            found[lease.id] = [max(now, t) for t in ends(lease) or never]
    return found


def _freed_at(
    groups: Groups,
    held: dict[str, Lease],
    shared: dict[str, list[Lease]],
    lease_ends: dict[str, Sequence[float]],
    now: float,
) -> Callable[[str, int], float]:
    """When a device frees in a pass: now when nobody holds it, at its lease's end in
    that pass (never when unknown), at its last share's end when shared, never when
    drained."""
    drained = groups.drained

    def free(u: str, p: int) -> float:
        if u in drained:
            return math.inf
        if u in shared:
            return max(lease_ends[x.id][p] for x in shared[u])
        lease = held.get(u)
        return now if lease is None else lease_ends[lease.id][p]

    return free


class FreeTimes:
    """The devices' free times in one pass of the list-schedule, as the three kinds of
    placement see them: a MIG profile on the compute slices of one GPU (dynamic MIG: any
    cut will do), whole GPUs or slices of one profile (devices of one class), a memory
    size (one device of any class large enough). Each placement starts once what it
    takes is free and holds it for its length."""

    def __init__(
        self, groups: Groups, free: Callable[[str, int], float], p: int, now: float
    ) -> None:
        self.largest = groups.largest
        self.heaps = {c: [(free(u, p), u) for u in uuids] for c, uuids in groups.by_class.items()}
        """Device class -> (free at, device), a heap."""
        for heap in self.heaps.values():
            heapq.heapify(heap)
        self.slots: dict[str, list[float]] = {}
        """MIG GPU -> when each of its compute slices frees, sorted; slices not cut into
        any device are free to cut now."""
        for g, cut in groups.by_gpu.items():
            s = [t for u, n in cut for t in [free(u, p)] * n]
            s += [math.inf if g in groups.drained else now] * (COMPUTE_SLICES - len(s))
            s.sort()
            self.slots[g] = s

    def take(self, size: Size, length: float, after: float) -> float | None:
        """Where ``size`` starts first, not before ``after``, held for ``length`` from
        there (None: nothing here fits it)."""
        if size.profile is not None and self.slots:
            return self._on_slices(_compute_slices(size.profile), length, after)
        if size.gpus is not None or size.profile is not None:
            return self._on_devices(size.profile or WHOLE_GPU, size.gpus or 1, length, after)
        return self._by_memory(gb_to_mib(size.min_memory_gb or 0.0), length, after)

    def _on_slices(self, need: int, length: float, after: float) -> float:
        """``need`` compute slices of the GPU whose ``need``-th slice frees first."""
        slots = self.slots
        s = slots[min(slots, key=lambda g: slots[g][need - 1])]
        start = max(s[need - 1], after)
        s[:need] = [start + length] * need
        s.sort()
        return start

    def _on_devices(self, cls: str, k: int, length: float, after: float) -> float | None:
        """The ``k`` devices of class ``cls`` that free first."""
        heap = self.heaps.get(cls, [])
        if len(heap) < k:
            return None
        taken = [heapq.heappop(heap) for _ in range(k)]
        start = max(taken[-1][0], after)
        for _, u in taken:
            heapq.heappush(heap, (start + length, u))
        return start

    def _by_memory(self, mib: float, length: float, after: float) -> float | None:
        """The earliest-free device of a class large enough; None when only slices a
        re-cut would make are (that is the grant's choice)."""
        heaps = self.heaps
        fits = [c for c, heap in heaps.items() if heap and self.largest[c] >= mib]
        if not fits:
            return None
        heap = heaps[min(fits, key=lambda c: heaps[c][0][0])]
        start, u = heapq.heappop(heap)
        start = max(start, after)
        heapq.heappush(heap, (start + length, u))
        return start


@dataclass
class Calibration:
    """Gives the predicted starts a range from how the broker's own past estimates erred.

    Each waiting request's estimate is kept as the broker gives it (at most one
    per ``every_s``: a request that waits long counts once per interval, however
    often the queue is polled). When the request starts, each kept estimate gets a
    score: how many times longer the real remaining wait ``w`` was than the
    predicted median ``m``, in log time, ``log((w + F) / (m + F))`` (``F`` =
    ``floor_s`` so that waits of seconds do not dominate). A new estimate keeps the
    predictor's median; its range is ``(m + F) e^q - F`` for ``q`` the
    ``alpha / 2`` and ``1 - alpha / 2`` quantiles of the newest ``window`` scores
    (split conformal prediction on the median's error), so it sits where past
    starts fell: later than predicted, as in a deep queue whose wait is the sum of
    heavy-tailed holds and which later arrivals jump. ``alpha`` starts at
    ``1 - coverage`` and moves by ``gamma`` after each scored estimate (up when it
    was covered, down when it missed: Gibbs and Candes' adaptive conformal
    inference), so the share covered holds while the load shifts. A miss is known
    before the start once the request still waits past the range's high end: the
    level moves then, not a day later (in a deep queue the start is the last to
    know; waiting for it, openb x4 covered 72.8% once the median had the tier).

    Chosen on openb at x3 (openb at x4 and Philly are reported with it unchanged):
    the median is left as predicted (moving it by the median score cut openb x3's
    error 0.55 -> 0.48 but raised Philly's 0.32 -> 0.46 and openb x4's 0.48 ->
    0.56), one set of scores for all estimates (scores kept per bucket of the
    predicted wait or of the queue position covered 67-75%: too few recent scores
    each), ``window``, ``gamma`` and ``every_s``, and learning a miss when it is
    known (80.9% -> 81.0% covered on openb x3, its later half 87.6% -> 81.4%). The
    range this replaced widened the predictor's own (low, high) instead, and covered
    70-72% on openb.
    """

    coverage: float = 0.8
    window: int = 1000
    gamma: float = 0.005
    every_s: float = 600.0
    min_scores: int = 20
    """Fewer scores than this: the raw range is shown (nothing to learn from yet)."""
    floor_s: float = 60.0

    def __post_init__(self) -> None:
        if not 0 < self.coverage < 1:
            raise ValueError(f"coverage must be in (0, 1), not {self.coverage!r}")
        self.alpha = 1.0 - self.coverage
        self._scores: deque[float] = deque(maxlen=self.window)
        self._sorted: list[float] = []
        self._given: dict[str, list[tuple[float, Eta, Eta]]] = {}
        self._overdue: list[tuple[float, str, float]] = []
        """(shown high, request, instant) of kept estimates, a heap: one whose request
        still waits past its high has missed, which the level learns then."""
        self._missed: set[tuple[str, float]] = set()
        """Per waiting request, its kept estimates: (instant, raw, as shown)."""
        self.raw: dict[str, Eta | None] = {}
        """The predictor's own ranges of the last ``apply`` (the replay compares them)."""

    def apply(self, raw: dict[str, Eta | None], now: float) -> dict[str, Eta | None]:
        """The calibrated ranges of ``raw`` (estimates made at ``now``); kept for scoring."""
        self.raw = raw
        while self._overdue and self._overdue[0][0] < now:
            _, rid, at = heapq.heappop(self._overdue)
            if rid in self._given:
                self._missed.add((rid, at))
                self.alpha -= self.gamma * self.coverage  # a miss, known now
        out: dict[str, Eta | None] = {}
        for rid, eta in raw.items():
            if eta is None:
                out[rid] = None
                continue
            shown = out[rid] = self._scaled(eta, now)
            kept = self._given.setdefault(rid, [])
            if not kept or now - kept[-1][0] >= self.every_s:
                kept.append((now, eta, shown))
                if shown is not eta and math.isfinite(shown.high):
                    heapq.heappush(self._overdue, (shown.high, rid, now))
        return out

    def left(self, request_id: str, now: float, started: bool) -> None:
        """The request left the queue at ``now``: score its estimates if it started."""
        kept = self._given.pop(request_id, [])
        for at, raw, shown in kept if started else ():
            self._score(at, raw, shown, now, (request_id, at) in self._missed)
        for at, _, _ in kept:
            self._missed.discard((request_id, at))

    def _scaled(self, eta: Eta, now: float) -> Eta:
        if len(self._scores) < self.min_scores:
            return eta
        alpha = min(max(self.alpha, 0.0), 1.0)
        base, f, ranked = eta.median - now + self.floor_s, self.floor_s, self._sorted

        def at(q: float) -> float:
            score = ranked[min(max(int(q * len(ranked)), 0), len(ranked) - 1)]
            return now + max(base * math.exp(score) - f, 0.0)

        high = at(1.0 - alpha / 2) if math.isfinite(eta.high) else math.inf
        return replace(eta, low=min(at(alpha / 2), eta.median), high=max(high, eta.median))

    def _score(self, at: float, raw: Eta, shown: Eta, start: float, counted: bool = False) -> None:
        f = self.floor_s
        score = math.log((start - at + f) / (raw.median - at + f))
        if len(self._scores) == self._scores.maxlen:
            del self._sorted[bisect.bisect_left(self._sorted, self._scores[0])]
        self._scores.append(score)
        bisect.insort(self._sorted, score)
        if shown is not raw and not counted:  # only a calibrated range moves the level
            missed = not shown.low <= start <= shown.high
            self.alpha += self.gamma * (1.0 - self.coverage - missed)


def _compute_slices(profile: str) -> int:
    for model in CATALOG.values():
        p = model.profile(profile)
        if p:
            return p.compute_slices
    return COMPUTE_SLICES
