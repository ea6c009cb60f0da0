"""Who goes next: the ordering policies and their parameters.

A policy turns a waiting request into one number, its priority; the broker
grants in priority order and backfills around the top blocked request. Three
policies share the one broker (so a trace replay compares schedulers, not
implementations):

``fcfs``
    Strict first-come-first-served: priority is the submit time, the queue
    stops at the first request that does not fit (no backfill), devices are
    taken first-fit.
``slurm``
    Slurm's classic multifactor priority (``PriorityType=priority/multifactor``
    with the classic fair-share algorithm)::

        P = W_age * min(age / max_age, 1) + W_fairshare * 2^(-U/S) + W_size * size/total

    with EASY backfill, priorities recomputed every ``recalc_interval_s``
    (Slurm's ``PriorityCalcPeriod``), usage decayed with ``half_life_s``
    (``PriorityDecayHalfLife``). Defaults are Slurm's documented defaults
    scaled to one shared box (weights 1000, max age 7 days, half-life 7 days).
``broker``
    This project's policy, built for notebooks::

        P = W_class(window) + W_fairshare * F_user * F_group
            + W_service / (1 + E / E_ref)  [+ W_age * age_hours without max_wait_s]

    ``F = 2^(-U/S)`` as in Slurm, for the user and for the group charged, with
    Slurm's 7-day usage half-life; class weights come from the time-of-day
    window in force (interactive first by day); ``E`` is the request's expected
    GPU-hours from the median of its kind's past holds, the user's of its shape
    first (shortest expected service first, as Helios' QSSF), capped by its time
    limit where it declares one: the limit is enforced, so short declared work goes
    first as in Slurm and declaring less than one needs ends the lease. A grant charges
    an entry penalty (``entry_penalty_s`` of its GPU-equivalents) to the user's
    usage at once (as Kueue's admission fair sharing does), so a burst of one
    user's requests cannot take every free device in one pass. Only the user's:
    the group's usage grows as the lease runs, and charging it at the grant
    would also push back the user's groupmates, who made no burst.

    Waiting itself earns nothing until it threatens the bound ``max_wait_s``:
    past ``tier_fraction * max_wait_s`` a request jumps to a top tier served
    oldest-first (there it still waits for older requests and for devices to
    free, so a tier that started at ``max_wait_s`` itself would let requests
    cross it). While any waiting request has already waited ``max_wait_s``, the
    tier is off for the backlog: the overload is one no order can bound, and
    oldest-first would then be FCFS for the whole backlog, making every request
    late in turn (philly-640: twice the mean wait and 3.5 times the requests past
    the bound). Its head stays: the oldest waiting request, once it has waited
    ``head_fraction * max_wait_s``, always ranks first, so it gets the backfill
    reservation (as Slurm's backfill reserves for its top job) and starts as soon
    as the leases ahead of it free what it needs. So no wait is unbounded: a
    request waits at most until it is that old and every older one has started,
    plus one reservation. (With the whole tier off, philly-640's longest wait was 241 h,
    5.5 times FCFS's; issue 27.)
    Age from submission (``W_age``, only without ``max_wait_s``)
    turns the order into FCFS within hours, and FCFS order is what fair share
    and expected service are there to beat (``benchmarks/notes-policy.md``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from datetime import datetime, tzinfo
from typing import Any, Protocol

from ..wire.errors import InvalidRequest
from ..wire.sizes import number, said
from ..wire.times import zone
from .models import JobClass, Request

STARVING_TIER = 1e9
"""Added to the priority of a request in the broker policy's oldest-first tier."""


def tier_bonus(age: float, tier_start: float) -> float:
    """What puts a request that waited ``tier_start`` or longer in the top tier, oldest
    first; 0 before."""
    return STARVING_TIER + age if age >= tier_start else 0.0


_DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")


@dataclass(frozen=True)
class Window:
    """A time-of-day policy window: class weights in force between two local hours."""

    name: str
    start_hour: float
    end_hour: float
    days: frozenset[int] = frozenset(range(7))
    """Weekdays it applies on, Monday = 0."""
    class_weights: dict[str, float] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        for h in (self.start_hour, self.end_hour):
            if not 0 <= h <= 24:
                raise InvalidRequest(f"window {self.name!r}: hours run from 0 to 24, not {h:g}")
        for k, w in self.class_weights.items():
            if k not in {c.value for c in JobClass}:
                raise InvalidRequest(f"window {self.name!r}: unknown job class {k!r}")
            if not math.isfinite(w):
                raise InvalidRequest(f"window {self.name!r}: weight of {k!r} must be finite")

    def contains(self, local: datetime) -> bool:
        hour = local.hour + local.minute / 60
        if self.start_hour <= self.end_hour:
            return local.weekday() in self.days and self.start_hour <= hour < self.end_hour
        # Wraps past midnight: the part after midnight belongs to the previous day's window.
        if hour >= self.start_hour:
            return local.weekday() in self.days
        return hour < self.end_hour and (local.weekday() - 1) % 7 in self.days

    @classmethod
    def from_dict(cls, d: dict[str, object]) -> Window:
        """Build from config: ``{"name": "day", "start": "09:00", "end": "18:00",
        "days": "mon-fri", "weights": {"interactive": 2000, "batch": 0}}``."""
        try:
            name = str(d["name"])
            start, end = _hour(d["start"]), _hour(d["end"])
            given = dict(d.get("weights", {}))  # type: ignore[call-overload]
        except (KeyError, TypeError, ValueError) as e:
            raise InvalidRequest(f"bad policy window {said(d)}: {e}") from None
        weights = {
            str(k): number(
                v, f"window {name!r}: the weight of {k!r}", -MAX_PARAMETER, MAX_PARAMETER
            )
            for k, v in given.items()
        }
        return cls(name, start, end, _days(str(d.get("days", "mon-sun"))), weights)


def _hour(v: object) -> float:
    hh, _, mm = str(v).strip().partition(":")
    if not hh.isdecimal() or not (mm == "" or (mm.isdecimal() and int(mm) < 60)):
        raise ValueError(f"{v!r} is not a time of day (HH:MM)")
    return int(hh) + (int(mm) if mm else 0) / 60


def _days(spec: str) -> frozenset[int]:
    days: set[int] = set()
    for part in spec.lower().replace(" ", "").split(","):
        a, _, b = part.partition("-")
        if a not in _DAYS or (b and b not in _DAYS):
            raise InvalidRequest(f"bad day range {part!r}: use mon..sun, e.g. 'mon-fri'")
        i, j = _DAYS.index(a), _DAYS.index(b or a)
        days.update(range(i, j + 1) if i <= j else [*range(i, 7), *range(0, j + 1)])
    return frozenset(days)


class Context(Protocol):
    """What a policy may ask the broker about while ranking a request."""

    def fairshare(self, user: str, group: str) -> float:
        """``F_user * F_group`` in (0, 1]; 1 for an entity that used nothing."""
        ...

    def expected_gpu_hours(self, request: Request) -> float:
        """The request's expected service: GPU-equivalents times expected hours."""
        ...

    def size_fraction(self, request: Request) -> float:
        """The request's GPU-equivalents over the inventory's total."""
        ...

    def oldest_submitted_at(self) -> float | None:
        """When the oldest waiting request was submitted (None: none waits)."""
        ...


@dataclass
class Policy:
    """Parameters shared by every policy; the subclasses say how they rank."""

    name: str = "base"
    strict: bool = False
    """Stop at the first request that does not fit (no backfill)."""
    placement: str = "best_fit"
    half_life_s: float = 86400.0
    recalc_interval_s: float = 10.0
    entry_penalty_s: float = 0.0
    max_wait_s: float | None = None
    backfill_depth: int = 500
    """How many blocked candidates one pass examines for backfill (Slurm's bf_max_job_test)."""

    def __post_init__(self) -> None:
        if self.placement not in ("best_fit", "first_fit"):
            raise InvalidRequest(
                f"placement must be 'best_fit' or 'first_fit', not {self.placement!r}"
            )
        for name in ("half_life_s", "recalc_interval_s"):
            if not getattr(self, name) > 0:
                raise InvalidRequest(f"{name} must be positive")
        if self.entry_penalty_s < 0 or (self.max_wait_s is not None and self.max_wait_s <= 0):
            raise InvalidRequest("entry_penalty_s must be >= 0 and max_wait_s > 0")
        if self.backfill_depth < 0:
            raise InvalidRequest("backfill_depth must be >= 0")

    def priority(self, r: Request, ctx: Context, now: float) -> float:
        raise NotImplementedError

    def ranker(self, ctx: Context, now: float) -> Callable[[Request], float]:
        """``priority`` at ``now`` as a function of the request alone. The broker ranks
        with one ranker from one recalculation to the next (priorities are fixed
        between them), so a policy may compute what all requests share only once."""
        return lambda r: self.priority(r, ctx, now)

    def promotion(self, r: Request, ctx: Context, now: float) -> tuple[float, float] | None:
        """When the waiting ``r`` will jump to a higher tier, and what that will add to
        its priority at ``now``; None when it will not. Only the start estimates ask (a
        request that will enter the tier passes others)."""
        return None


@dataclass
class FcfsPolicy(Policy):
    name: str = "fcfs"
    strict: bool = True
    placement: str = "first_fit"

    def priority(self, r: Request, ctx: Context, now: float) -> float:
        return -r.submitted_at


@dataclass
class SlurmPolicy(Policy):
    name: str = "slurm"
    half_life_s: float = 7 * 86400.0
    recalc_interval_s: float = 300.0
    weight_age: float = 1000.0
    weight_fairshare: float = 1000.0
    weight_size: float = 1000.0
    max_age_s: float = 7 * 86400.0
    favor_small: bool = False
    """Slurm's ``PriorityFavorSmall``: off by default, so larger jobs rank higher."""

    def priority(self, r: Request, ctx: Context, now: float) -> float:
        age = min(max(now - r.submitted_at, 0.0) / self.max_age_s, 1.0)
        size = ctx.size_fraction(r)
        size_factor = 1.0 - size if self.favor_small else size
        return (
            self.weight_age * age
            + self.weight_fairshare * ctx.fairshare(r.user, r.group)
            + self.weight_size * size_factor
        )


def _default_windows() -> tuple[Window, ...]:
    return (
        Window("working-hours", 8, 19, _days("mon-fri"), {"interactive": 500.0, "batch": 0.0}),
        Window("off-hours", 0, 24, frozenset(range(7)), {"interactive": 500.0, "batch": 500.0}),
    )


@dataclass
class BrokerPolicy(Policy):
    name: str = "broker"
    weight_fairshare: float = 1000.0
    half_life_s: float = 7 * 86400.0
    weight_age_per_hour: float = 100.0
    """Per hour of waiting, only without ``max_wait_s`` (then nothing else bounds a wait)."""
    weight_service: float = 1000.0
    reference_gpu_hours: float = 1.0
    entry_penalty_s: float = 600.0
    max_wait_s: float | None = 24 * 3600.0
    """The wait no request should exceed (None: no bound, no oldest-first tier)."""
    tier_fraction: float = 0.75
    """The oldest-first tier starts at this fraction of ``max_wait_s``. Chosen on openb
    (the largest of 1, 0.75, 0.5 with no more requests past 24 h than FCFS at x4:
    1 starves 128 where FCFS starves none) and checked on Philly."""
    head_fraction: float = 1.5
    """The oldest waiting request ranks first once it has waited this many times
    ``max_wait_s``, even while the tier is off. Chosen on philly-640, the one scenario
    where the bound breaks (18, 24, 30, 36 and 48 h tried): earlier gives back the mean
    wait, 48 h lengthens the longest (``benchmarks/notes-policy.md``, issue 27)."""
    windows: tuple[Window, ...] = field(default_factory=_default_windows)
    """Checked in order; the first that contains the local time sets the class weights."""
    timezone: str = "UTC"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 < self.tier_fraction <= 1:
            raise InvalidRequest(f"tier_fraction must be in (0, 1], not {self.tier_fraction!r}")
        if not self.head_fraction > 0:
            raise InvalidRequest(f"head_fraction must be positive, not {self.head_fraction!r}")
        if not self.reference_gpu_hours > 0:
            raise InvalidRequest(
                f"reference_gpu_hours must be positive, not {self.reference_gpu_hours!r}"
            )
        self._tz: tzinfo = zone(self.timezone)
        self._window_cache: tuple[int, dict[str, float]] = (-1, {})

    def class_weights(self, now: float) -> dict[str, float]:
        """The weights of the window in force at ``now`` (cached per minute)."""
        minute = int(now // 60)
        if self._window_cache[0] != minute:
            local = datetime.fromtimestamp(now, self._tz)
            w = next((w.class_weights for w in self.windows if w.contains(local)), {})
            self._window_cache = (minute, w)
        return self._window_cache[1]

    def priority(self, r: Request, ctx: Context, now: float) -> float:
        return self.ranker(ctx, now)(r)

    def ranker(self, ctx: Context, now: float) -> Callable[[Request], float]:
        weights = self.class_weights(now)
        w_fairshare, w_service, ref = (
            self.weight_fairshare,
            self.weight_service,
            self.reference_gpu_hours,
        )
        fairshare, expected = ctx.fairshare, ctx.expected_gpu_hours
        w_age = self.weight_age_per_hour
        tier: float | None = None
        head: float | None = None
        if self.max_wait_s is not None:
            oldest = ctx.oldest_submitted_at()
            # While the bound is broken, oldest-first would make every request late.
            broken = oldest is not None and now - oldest >= self.max_wait_s
            tier = None if broken else self.tier_fraction * self.max_wait_s
            if oldest is not None and now - oldest >= self.head_fraction * self.max_wait_s:
                head = oldest

        def rank(r: Request) -> float:
            age = max(now - r.submitted_at, 0.0)
            p = (
                weights.get(r.job_class.value, 0.0)
                + w_fairshare * fairshare(r.user, r.group)
                + w_service / (1.0 + expected(r) / ref)
            )
            if self.max_wait_s is None:
                return p + w_age * age / 3600.0
            if r.submitted_at == head:  # the oldest, past its start: first even when off
                return p + tier_bonus(age, 0.0)
            return p if tier is None else p + tier_bonus(age, tier)

        return rank

    def promotion(self, r: Request, ctx: Context, now: float) -> tuple[float, float] | None:
        if self.max_wait_s is None:
            return None
        oldest, start = ctx.oldest_submitted_at(), self.tier_fraction * self.max_wait_s
        age = max(now - r.submitted_at, 0.0)
        if (oldest is not None and now - oldest >= self.max_wait_s) or age >= start:
            return None  # no tier (the bound is broken), or already in it
        return r.submitted_at + start, STARVING_TIER + age


POLICIES: dict[str, type[Policy]] = {
    "fcfs": FcfsPolicy,
    "slurm": SlurmPolicy,
    "broker": BrokerPolicy,
}


def configured_policy(
    name: str, params: dict[str, Any], windows: list[dict[str, Any]], tz: str
) -> Policy:
    """The policy as ``c.GPUBroker`` settings name it: its parameters, and for the broker
    policy its time zone and windows (the running broker's, and a replay of its file's)."""
    chosen = dict(params)
    if name == "broker":
        chosen.setdefault("timezone", tz)
        if windows:
            chosen["windows"] = tuple(Window.from_dict(w) for w in windows)
    return make_policy(name, **chosen)


def make_policy(name: str, **params: object) -> Policy:
    """A policy by name, with parameters overriding its defaults."""
    try:
        cls = POLICIES[name]
    except KeyError:
        raise InvalidRequest(
            f"unknown policy {name!r}; choose one of {', '.join(POLICIES)}"
        ) from None
    kinds = {f.name: f.type for f in fields(cls) if f.init}
    unknown = sorted(set(params) - set(kinds))
    if unknown:
        raise InvalidRequest(
            f"policy {name!r} has no parameter {', '.join(unknown)}; its parameters: "
            f"{', '.join(sorted(kinds))}"
        )
    for key, value in params.items():
        _check_parameter(f"the {name} policy's {key}", str(kinds[key]), value)
    return cls(**params)  # type: ignore[arg-type]


MAX_PARAMETER = 1e9
"""The largest number a policy parameter (a weight, seconds, a fraction) may be: beyond
``STARVING_TIER``'s reach, priorities would lose the tier, or overflow."""


def _check_parameter(what: str, kind: str, value: object) -> None:
    """Refuse a parameter that is not of its field's kind (``kind``, its annotation) in one
    sentence: a number from 0 to ``MAX_PARAMETER``, true or false, or text."""
    if kind == "bool":
        if not isinstance(value, bool):
            raise InvalidRequest(f"{what} is true or false, not {said(value)}")
    elif kind == "str":
        if not isinstance(value, str):
            raise InvalidRequest(f"{what} must be text, not {said(value)}")
    elif kind in ("int", "float") or (kind == "float | None" and value is not None):
        number(value, what, 0.0, MAX_PARAMETER, whole=kind == "int")
