"""Run-time prediction from history: how long a request will hold its grant, and how
much longer a lease already held for ``elapsed`` seconds will run.

Hold times are kept per (user, class, shape), (user, class), (group, class) and
(class): the newest ``max_samples`` of each, weighted by recency (a sample
``half_life`` samples older weighs half as much). An estimate comes from the
finest key with at least ``min_samples`` samples, else the finest with any, so a
user's 8-GPU jobs are judged by their own 8-GPU history once there is some
(Helios' QSSF keys by user and GPU demand).

Quantiles, not a mean: hold times are heavy-tailed (one tenant runs one-minute
and month-long jobs), so a mean says little and a range says what is known.

A lease already held for a while is judged by the holds of its key that lasted
longer than it has so far (the conditional distribution): a lease held 3 h is
unlikely to end in 2 s. When no hold was ever that long, its end is unknown
(``None``), never "now".
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections import deque
from dataclasses import dataclass, field

from ..wire.sizes import Size

Key = tuple[str, str, str, str]
"""(user, group, job class, shape); "" where a coarser key leaves a part out."""


def request_shape(size: Size) -> str:
    """What a request will hold, as the history of hold times keys it: ``gpu:N`` for N
    whole GPUs, the profile for a MIG slice, "" when only the grant will tell."""
    if size.gpus is not None:
        return f"gpu:{size.gpus}"
    return size.profile or ""


def held_shape(profile: str, gpu_equivalents: float) -> str:
    """What a lease held, in the same terms (its ``profile`` is ``gpu`` for whole GPUs)."""
    return f"gpu:{round(gpu_equivalents)}" if profile == "gpu" else profile


@dataclass(frozen=True)
class Estimate:
    """A duration in seconds: the low, median and high quantiles, and what they rest on."""

    low: float
    median: float
    high: float
    samples: int
    basis: str
    """Which history: ``user+shape``, ``user``, ``group`` or ``class``."""


@dataclass
class _History:
    """The newest hold times of one key and, computed on demand, their weighted sort."""

    held: deque[float]
    order: list[tuple[float, int]] = field(default_factory=list)
    """(hold time, arrival) of each of ``held``, sorted: the order of the weighted sort
    (equal times oldest first, as their weights rank them), kept at each learn so the
    weights' sums need no sort."""
    arrivals: int = 0
    """How many holds were ever learnt here: the next one's arrival."""
    values: list[float] | None = None
    """Sorted hold times, with ``cum`` the running sum of their recency weights."""
    cum: list[float] | None = None
    whole: tuple[float, float, float] | None = None
    """The quantiles of all of them (a new request's hold), kept: the policy asks often."""
    estimate: Estimate | None = None
    """``whole`` as the estimate of a new request's hold from this history."""


class Predictor:
    """Recency-weighted quantiles of past hold times, per user, group, class and shape."""

    def __init__(
        self,
        *,
        max_samples: int = 64,
        half_life: float = 16.0,
        min_samples: int = 3,
        quantiles: tuple[float, float, float] = (0.1, 0.5, 0.9),
    ) -> None:
        if max_samples < 1 or min_samples < 1 or not half_life > 0:
            raise ValueError("max_samples, min_samples and half_life must be positive")
        low, median, high = quantiles
        if not 0 <= low <= median <= high <= 1:
            raise ValueError(f"quantiles must rise within [0, 1], not {quantiles!r}")
        self.max_samples, self.min_samples, self.quantiles = max_samples, min_samples, quantiles
        self._weights = [2.0 ** (-i / half_life) for i in range(max_samples)]
        """Weight of the i-th newest sample."""
        self._history: dict[Key, _History] = {}
        self.shortest = math.inf
        """The shortest hold ever learnt: every estimate is one of the holds learnt, so
        none is shorter."""
        self._holds: dict[Key, Estimate | None] = {}
        """``hold`` answers by query: the policy ranks every queued bucket with them."""
        self._readers: dict[Key, set[Key]] = {}
        """History key -> the queries whose kept answer read it (forgotten when it learns)."""

    @staticmethod
    def keys(user: str, group: str, job_class: str, shape: str) -> list[tuple[str, Key]]:
        """(basis, key) of every history a hold is learnt under and looked up by, finest
        first; no group level for a request without a group."""
        keys = [("user+shape", (user, "", job_class, shape)), ("user", (user, "", job_class, ""))]
        if group:
            keys.append(("group", ("", group, job_class, "")))
        keys.append(("class", ("", "", job_class, "")))
        return keys

    def learn(self, user: str, group: str, job_class: str, shape: str, held_s: float) -> None:
        """Record one ended hold (seconds) under every key it belongs to."""
        self.shortest = min(self.shortest, held_s)
        for _, key in self.keys(user, group, job_class, shape):
            h = self._history.get(key)
            if h is None:
                h = self._history[key] = _History(deque(maxlen=self.max_samples))
            if len(h.held) == self.max_samples:  # the oldest leaves
                del h.order[bisect.bisect_left(h.order, (h.held[0], h.arrivals - len(h.held)))]
            h.held.append(held_s)
            bisect.insort(h.order, (held_s, h.arrivals))
            h.arrivals += 1
            h.values = h.cum = h.whole = h.estimate = None
            for query in self._readers.pop(key, ()):
                self._holds.pop(query, None)

    def hold(self, user: str, group: str, job_class: str, shape: str) -> Estimate | None:
        """How long a new request of this user, group, class and shape will hold its
        grant; None without any history of its class."""
        query = (user, group, job_class, shape)
        if query in self._holds:
            return self._holds[query]
        found, read = self._estimate(user, group, job_class, shape, 0.0)
        self._holds[query] = found
        for key in read:
            self._readers.setdefault(key, set()).add(query)
        return found

    def remaining(
        self, user: str, group: str, job_class: str, shape: str, elapsed: float
    ) -> Estimate | None:
        """How much longer a lease held for ``elapsed`` seconds will run, from the holds
        that lasted longer than that; None when none did (its end is unknown)."""
        return self._estimate(user, group, job_class, shape, elapsed)[0]

    def _estimate(
        self, user: str, group: str, job_class: str, shape: str, elapsed: float
    ) -> tuple[Estimate | None, list[Key]]:
        """``remaining``'s answer and the history keys it read (finest first, up to the
        first with enough samples): a change to any of them may change the answer."""
        best: tuple[Estimate, int] | None = None
        read: list[Key] = []
        for basis, key in self.keys(user, group, job_class, shape):
            read.append(key)
            h = self._history.get(key)
            if h is None:
                continue
            first = bisect.bisect_right(self._sorted(h)[0], elapsed) if elapsed > 0 else 0
            n = len(h.held) - first
            if n == 0:
                continue
            if best is None or (best[1] < self.min_samples <= n):
                if elapsed == 0:  # a new request's hold: the whole history
                    if h.estimate is None or h.estimate.basis != basis:  # "" shape: 2 bases
                        h.estimate = Estimate(*self._quantiles(h, 0, 0.0), n, basis)
                    best = (h.estimate, n)
                else:
                    low, median, high = self._quantiles(h, first, elapsed)
                    best = (Estimate(low, median, high, n, basis), n)
            if n >= self.min_samples:
                break
        return (best[0] if best else None), read

    def _sorted(self, h: _History) -> tuple[list[float], list[float]]:
        if h.values is None or h.cum is None:
            newest, weights = h.arrivals - 1, self._weights
            h.values = [v for v, _ in h.order]
            h.cum = list(itertools.accumulate(weights[newest - a] for _, a in h.order))
        return h.values, h.cum

    def _quantiles(self, h: _History, first: int, elapsed: float) -> tuple[float, float, float]:
        """The low, median and high quantile of the holds from ``first`` on, less ``elapsed``."""
        found = h.whole if first == 0 else None
        if found is None:
            values, cum = self._sorted(h)
            low, median, high = (self._quantile(values, cum, first, q) for q in self.quantiles)
            found = (low, median, high)
            if first == 0:
                h.whole = found
        return found[0] - elapsed, found[1] - elapsed, found[2] - elapsed

    @staticmethod
    def _quantile(values: list[float], cum: list[float], first: int, q: float) -> float:
        """The weighted ``q``-quantile of ``values[first:]``."""
        base = cum[first - 1] if first else 0.0
        i = bisect.bisect_left(cum, base + q * (cum[-1] - base), lo=first)
        return values[min(i, len(values) - 1)]
