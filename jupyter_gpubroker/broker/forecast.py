"""Demand per hour of the week, learnt from the state file's own history.

The broker reacts to what is asked now; capacity that must be ready before a peak needs
to know when the peaks come. Each request the file recorded is a span of waiting (from its
submission to its grant, or to its end when it never got one) and a span of holding (its
lease). Those spans are summed into hours: per hour, the GPU-equivalents held and waiting
on average (their sum is the demand), and the requests asked, by size and class.

The forecast of an hour of the week is the spread of that hour in past weeks (up to
``weeks`` of them): its quantiles. With less than two weeks of history each hour of the
week has at most one past value, so the hour of the day over every past day stands in (the
``basis`` says which). By the hour of the week, each past week's demand is first moved
by how far the level (the mean demand of the week before a point) has risen or fallen
since then, with a week's more of the same: a seasonal median alone stays at the level of
weeks past, and on the openb trace missed its last four weeks by 40 to 56% (7 to 10%
moved). Before a day of history there is no forecast: "not enough history
yet", as AWS predictive scaling asks 24 hours before it forecasts. How far the forecast can
be trusted is measured, not claimed: each of the last ``backtest_weeks`` weeks is forecast
from what came before it alone and compared with what happened (its error per hour and how
often the p90 held). It refreshes as history grows: every call reads the file anew.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone, tzinfo
from typing import Any

from ..wire.times import iso

HOUR_S = 3600.0
DAY_S = 24 * HOUR_S
WEEK_S = 7 * DAY_S
HOURS_OF_WEEK = 168
MIN_HISTORY_S = DAY_S
"""Less history than this: no forecast."""
RECENT_HOURS = 24
"""Hours of what happened that the forecast returns beside its band (the admin page's chart)."""
QUANTILES = (0.5, 0.9)
DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")


@dataclass(frozen=True)
class Span:
    """One recorded request: what it asked for, when it waited and when it held."""

    submitted_at: float
    size: str
    job_class: str
    gpu_equivalents: float
    granted_at: float | None
    """None: never granted (withdrawn, cancelled or still waiting)."""
    ended_at: float
    """When its lease (or, never granted, its wait) ended; now for what still goes on."""


@dataclass
class Hours:
    """Hourly sums of the history from ``start`` (an hour's start) on."""

    start: float
    held: list[float]
    """Mean GPU-equivalents held in each hour."""
    waiting: list[float]
    """Mean GPU-equivalents waiting in each hour."""
    asked: list[dict[str, float]]
    """Per hour, GPU-equivalents asked by ``<class> <size>``."""

    def demand(self, i: int) -> float:
        return self.held[i] + self.waiting[i]


def hourly(spans: Iterable[Span], now: float) -> Hours | None:
    """The history in whole hours before ``now`` (None: nothing recorded)."""
    spans = list(spans)
    if not spans:
        return None
    start = math.floor(min(s.submitted_at for s in spans) / HOUR_S) * HOUR_S
    n = max(int((now - start) // HOUR_S), 1)  # whole hours: the current one is not over
    held, waiting = [0.0] * n, [0.0] * n
    asked: list[dict[str, float]] = [defaultdict(float) for _ in range(n)]
    for s in spans:
        i = int((s.submitted_at - start) // HOUR_S)
        if i < n:
            asked[i][f"{s.job_class} {s.size}"] += s.gpu_equivalents
        wait_end = s.granted_at if s.granted_at is not None else s.ended_at
        _spread(waiting, start, s.submitted_at, min(wait_end, now), s.gpu_equivalents)
        if s.granted_at is not None:
            _spread(held, start, s.granted_at, min(s.ended_at, now), s.gpu_equivalents)
    return Hours(start, held, waiting, [dict(a) for a in asked])


def _spread(bins: list[float], start: float, a: float, b: float, weight: float) -> None:
    """Add ``weight`` x the share of each hour that [a, b) covers."""
    i = int((a - start) // HOUR_S)
    while a < b and i < len(bins):
        edge = start + (i + 1) * HOUR_S
        bins[i] += weight * (min(b, edge) - a) / HOUR_S
        a, i = edge, i + 1


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ``values``, interpolated between order statistics."""
    ordered = sorted(values)
    x = q * (len(ordered) - 1)
    lo = int(x)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (x - lo)


@dataclass(frozen=True)
class HourForecast:
    """One hour of the week: the spread of its demand, held and waiting in past weeks."""

    hour: int
    """0 is Monday 00:00-01:00 in the forecast's time zone."""
    samples: int
    demand: dict[str, float]
    held: dict[str, float]
    waiting: dict[str, float]
    asked: dict[str, float]
    """Median GPU-equivalents asked in this hour, by ``<class> <size>``."""

    @property
    def label(self) -> str:
        day, h = divmod(self.hour, 24)
        return f"{DAYS[day]} {h:02d}:00-{(h + 1) % 24:02d}:00"

    def to_json(self) -> dict[str, Any]:
        return {
            "hour_of_week": self.hour,
            "label": self.label,
            "samples": self.samples,
            "demand": self.demand,
            "held": self.held,
            "waiting": self.waiting,
            "asked": self.asked,
        }


@dataclass(frozen=True)
class Backtest:
    """One past week forecast from what came before it, against what happened."""

    week_start: float
    hours: int
    mean_actual: float
    """Mean demand of the week, GPU-equivalents."""
    mean_abs_error: float
    """Mean |p50 - actual| per hour, GPU-equivalents."""
    p90_covered: float
    """Share of its hours whose demand stayed at or below the forecast p90."""

    @property
    def relative_error(self) -> float | None:
        """The error over the demand (weighted absolute percentage error), None if idle."""
        return self.mean_abs_error / self.mean_actual if self.mean_actual > 0 else None

    def to_json(self) -> dict[str, Any]:
        return {
            "week_start": iso(self.week_start),
            "hours": self.hours,
            "mean_actual": self.mean_actual,
            "mean_abs_error": self.mean_abs_error,
            "relative_error": self.relative_error,
            "p90_covered": self.p90_covered,
        }


@dataclass(frozen=True)
class Forecast:
    """Demand per hour of the week, or why there is none yet."""

    history_s: float
    basis: str
    """``hour of week``, ``hour of day`` (less than two weeks of history) or ``none``."""
    message: str
    hours: tuple[HourForecast, ...] = ()
    backtest: tuple[Backtest, ...] = field(default_factory=tuple)
    recent: tuple[tuple[float, int, float], ...] = ()
    """The last whole hours: (start, hour of the week, demand that happened)."""

    @property
    def ready(self) -> bool:
        return bool(self.hours)

    def to_json(self) -> dict[str, Any]:
        return {
            "ready": self.ready,
            "history_hours": round(self.history_s / HOUR_S, 3),
            "basis": self.basis,
            "message": self.message,
            "quantiles": [f"p{round(q * 100)}" for q in QUANTILES],
            "hours": [h.to_json() for h in self.hours],
            "backtest": [b.to_json() for b in self.backtest],
            "recent": [
                {"at": iso(at), "hour_of_week": how, "demand": round(demand, 4)}
                for at, how, demand in self.recent
            ],
        }


def forecast(
    spans: Iterable[Span],
    now: float,
    *,
    tz: tzinfo = timezone.utc,
    weeks: int = 8,
    backtest_weeks: int = 4,
    level: bool = True,
) -> Forecast:
    """The forecast from ``spans`` as of ``now`` (UTC seconds), hours of the week in ``tz``;
    ``level=False``: past weeks as they were, without the moves of the level since
    (``_level_moves``; what the benchmarks compare against)."""
    if weeks < 1 or backtest_weeks < 0:
        raise ValueError("weeks must be at least 1 and backtest_weeks at least 0")
    history = hourly(spans, now)
    span_s = 0.0 if history is None else now - history.start
    if history is None or span_s < MIN_HISTORY_S:
        had = _history_words(None if history is None else span_s)
        return Forecast(
            span_s,
            "none",
            f"not enough history yet: {had}, and a forecast needs a day of it",
        )
    upto = len(history.held)
    hours, basis = _hours(history, upto, tz, weeks, level)
    tests = tuple(
        t
        for k in range(backtest_weeks, 0, -1)
        if (t := _backtest(history, upto - k * HOURS_OF_WEEK, tz, weeks, level)) is not None
    )
    message = f"from {span_s / DAY_S:.1f} days of history, by {basis}"
    if not tests:
        message += "; its error is measured once a week has passed after the first day"
    starts = [(i, history.start + i * HOUR_S) for i in range(max(0, upto - RECENT_HOURS), upto)]
    recent = tuple((at, _hour_of_week(at, tz), history.demand(i)) for i, at in starts)
    return Forecast(span_s, basis, message, hours, tests, recent)


def ahead(
    found: Forecast, now: float, q: str = "p90", tz: tzinfo = timezone.utc
) -> tuple[float, HourForecast, HourForecast]:
    """The most demand the forecast's quantile ``q`` asks this hour and the next (what
    must be ready before the next hour begins), and those two hours' forecasts."""
    this, after = (found.hours[_hour_of_week(now + k * HOUR_S, tz)] for k in (0, 1))
    return max(this.demand[q], after.demand[q]), this, after


def _history_words(span_s: float | None) -> str:
    """How much history there is, in whole hours as a person says them."""
    if span_s is None:
        return "no history"
    hours = int(span_s // HOUR_S)
    if hours < 1:
        return "less than an hour of history"
    return "an hour of history" if hours == 1 else f"{hours} hours of history"


def _hour_of_week(t: float, tz: tzinfo) -> int:
    local = datetime.fromtimestamp(t, tz)
    return local.weekday() * 24 + local.hour


def _hours(
    history: Hours, upto: int, tz: tzinfo, weeks: int, level: bool = True
) -> tuple[tuple[HourForecast, ...], str]:
    """Each hour of the week's forecast from the history's hours before ``upto``;
    ``level``: each past week's demand moved by how far the level has moved since."""
    first = max(0, upto - weeks * HOURS_OF_WEEK)
    by_week: dict[int, list[int]] = defaultdict(list)
    for i in range(first, upto):
        by_week[_hour_of_week(history.start + i * HOUR_S, tz)].append(i)
    weekly = (upto - first) >= 2 * HOURS_OF_WEEK
    if not weekly:  # the hour of the day over every day stands in
        by_day: dict[int, list[int]] = defaultdict(list)
        for how, idx in by_week.items():
            by_day[how % 24].extend(idx)
        by_week = {how: by_day[how % 24] for how in range(HOURS_OF_WEEK)}
    moved = _level_moves(history, upto, weeks) if weekly and level else {}

    def demand(i: int) -> float:
        return max(history.demand(i) + moved.get((upto - 1 - i) // HOURS_OF_WEEK + 1, 0.0), 0.0)

    out = tuple(_one(history, how, by_week.get(how, []), demand) for how in range(HOURS_OF_WEEK))
    return out, "hour of week" if weekly else "hour of day"


def _level_moves(history: Hours, upto: int, weeks: int) -> dict[int, float]:
    """Week ``k`` back -> how much the level (the mean demand of the week before a point)
    rose from ``k`` weeks before ``upto`` to ``upto``: what a demand ``k`` weeks old needs
    added to stand for the coming week. Growth and decline carry over; a seasonal median
    alone stays at the level of weeks past. Before a whole week of history the level is
    the first week's (``upto`` has at least two weeks before it)."""
    total = [0.0]
    for i in range(upto):
        total.append(total[-1] + history.demand(i))

    def level(t: int) -> float:
        t = max(t, HOURS_OF_WEEK)
        return (total[t] - total[t - HOURS_OF_WEEK]) / HOURS_OF_WEEK

    now = level(upto)
    return {k: now - level(upto - k * HOURS_OF_WEEK) for k in range(1, weeks + 1)}


def _one(history: Hours, how: int, idx: list[int], demand: Callable[[int], float]) -> HourForecast:
    def spread(values: list[float]) -> dict[str, float]:
        if not values:
            return {f"p{round(q * 100)}": 0.0 for q in QUANTILES}
        return {f"p{round(q * 100)}": round(quantile(values, q), 4) for q in QUANTILES}

    keys = {k for i in idx for k in history.asked[i]}
    asked = {
        k: round(quantile([history.asked[i].get(k, 0.0) for i in idx], 0.5), 4)
        for k in sorted(keys)
    }
    return HourForecast(
        how,
        len(idx),
        spread([demand(i) for i in idx]),
        spread([history.held[i] for i in idx]),
        spread([history.waiting[i] for i in idx]),
        {k: v for k, v in asked.items() if v > 0},
    )


def _backtest(history: Hours, at: int, tz: tzinfo, weeks: int, level: bool) -> Backtest | None:
    """The week of hours from ``at`` forecast from the hours before it alone (None: less
    than a day before it, or not a whole week after it)."""
    if at < MIN_HISTORY_S / HOUR_S or at + HOURS_OF_WEEK > len(history.held):
        return None
    predicted, _ = _hours(history, at, tz, weeks, level)
    errors, covered, actual = [], 0, []
    for i in range(at, at + HOURS_OF_WEEK):
        f = predicted[_hour_of_week(history.start + i * HOUR_S, tz)].demand
        a = history.demand(i)
        actual.append(a)
        errors.append(abs(f["p50"] - a))
        covered += a <= f["p90"] + 1e-9
    n = len(errors)
    return Backtest(history.start + at * HOUR_S, n, sum(actual) / n, sum(errors) / n, covered / n)


def spans(rows: Iterable[dict[str, Any]]) -> list[Span]:
    """Spans from the store's ``demand`` rows. A request never granted asks what granted
    ones of its size held (else what its size says: N GPUs, a MIG profile's compute
    slices out of 7, one GPU for any other)."""
    rows = list(rows)
    held: dict[str, float] = {}
    for r in rows:
        if r["gpu_equivalents"] is not None:
            held.setdefault(r["size"], float(r["gpu_equivalents"]))
    return [
        Span(
            float(r["submitted_at"]),
            r["size"],
            r["job_class"],
            float(r["gpu_equivalents"])
            if r["gpu_equivalents"] is not None
            else held.get(r["size"], _asked(r["size"])),
            None if r["granted_at"] is None else float(r["granted_at"]),
            float(r["ended_at"]),
        )
        for r in rows
    ]


def _asked(size: str) -> float:
    """What a size key asks, in GPU-equivalents, with nothing granted to tell."""
    kind, _, value = size.partition("=")
    if kind == "gpus":
        return float(value.split("@")[0])
    if kind == "profile" and value[:1].isdigit():
        return int(value.split("g")[0]) / 7
    return 1.0


def hour_check(
    spans: Iterable[Span], hour_start: float, *, tz: tzinfo = timezone.utc, weeks: int = 8
) -> tuple[HourForecast, float] | None:
    """The forecast of the hour from ``hour_start``, from the history before it alone, and
    the demand that hour had (None: less than a day of history before it). What a
    forecast-only mode logs, hour after hour, to judge the forecast before trusting it."""
    history = hourly(spans, hour_start + HOUR_S)
    if history is None:
        return None
    at = int((hour_start - history.start) // HOUR_S)
    if at < MIN_HISTORY_S / HOUR_S or at >= len(history.held):
        return None
    predicted, _ = _hours(history, at, tz, weeks)
    return predicted[_hour_of_week(hour_start, tz)], history.demand(at)
