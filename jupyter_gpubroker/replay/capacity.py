"""Capacity that follows demand, replayed: how many GPUs a policy keeps up, hour by hour.

The machine is cut into nodes of ``node_gpus`` GPUs in index order (a DGX H100 is 8).
A node is off, starting or up; the replay drains the GPUs of a node that is not up, so
the core grants nothing there, and a node is counted as kept up from the moment it is
asked for (a cloud bills a node while it boots). Three policies:

- ``Capacity`` (static peak): every node up all along, never changed. The baseline.
- ``Reactive``: scales on waiting work only, as cluster-autoscaler does. After a pass
  where GPU-equivalents still wait, it asks for as many nodes as they fill, less those
  already starting (its estimator bins pending pods onto new nodes); each is up
  ``start_delay_s`` later. A node that held nothing for ``unneeded_s`` is turned off, but
  not within ``unneeded_s`` of the last scale-up, and never while anything waits. The
  defaults are cluster-autoscaler's own: ``--scale-down-unneeded-time`` and
  ``--scale-down-delay-after-add`` are both 10 minutes. It starts with no node up.
- ``ForecastAhead``: the reactive policy with a floor. It keeps up at least the
  forecast's quantile ``quantile`` of demand for this hour and the next, times
  ``1 + headroom`` (``broker.forecast``, read from the replay's own store as the
  broker reads its state file). The forecast is refreshed every ``refresh_s`` from
  the history before that instant alone. It is not ready before a day of history, as
  AWS predictive scaling needs 24 hours; until then the policy is reactive. A forecast
  never turns off a node that holds something, nor any node while work waits.

Each policy keeps the steps of its capacity, so the GPU-hours it kept up over any window
can be read afterwards (``gpu_hours``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..broker.forecast import DAY_S, HOUR_S, WEEK_S, Forecast, ahead, forecast, hourly, spans
from ..broker.recorded import demand

if TYPE_CHECKING:
    from ..broker.core import Broker
    from ..broker.models import Lease
    from .sizing import Sizer
    from .traces import Trace

NODE_GPUS = 8
START_DELAY_S = 300.0
"""A node's start delay: what issue 48 asks the reactive policy to pay."""
UNNEEDED_S = 600.0
"""cluster-autoscaler's ``--scale-down-unneeded-time`` and ``--scale-down-delay-after-add``."""
DRAIN_REASON = "powered down by the capacity policy"
_EPS = 1e-9


def peak_demand(trace: Trace, sizer: Sizer) -> float:
    """The most GPU-equivalents the trace's jobs hold at once when each starts as it is
    submitted (as ``sizer`` sizes them; jobs no device could host left out): what static
    peak provisioning keeps up."""
    steps: list[tuple[float, float]] = []
    for j in trace.jobs:
        size = sizer.size(j.gpus)
        if size is not None:
            gpus = sizer.gpu_equivalents(size)
            steps += [(j.submit_s, gpus), (j.submit_s + j.duration_s, -gpus)]
    held = peak = 0.0
    for _, gpus in sorted(steps):  # at one instant, ends (negative) before starts
        held += gpus
        peak = max(peak, held)
    return peak


class Capacity:
    """Static peak provisioning: ``nodes`` nodes up from the start, never changed."""

    name = "static peak"

    def __init__(self, nodes: int, node_gpus: int = NODE_GPUS) -> None:
        if nodes < 1 or node_gpus < 1:
            raise ValueError("a machine needs at least one node of at least one GPU")
        self.nodes, self.node_gpus = nodes, node_gpus
        self.steps: list[tuple[float, int]] = []
        """(since when, nodes kept up or starting)."""
        self.broker: Broker | None = None
        self._up: list[bool] = []
        self._gpus: list[list[str]] = []
        self._node_of: dict[str, int] = {}

    def attach(self, broker: Broker, now: float) -> None:
        """Take the machine over at the replay's first instant."""
        gpus = sorted(broker.inventory.gpus, key=lambda g: g.index)
        if len(gpus) != self.nodes * self.node_gpus:
            raise ValueError(
                f"the machine has {len(gpus)} GPUs, not {self.nodes} nodes of {self.node_gpus}"
            )
        self.broker = broker
        self._gpus = [[] for _ in range(self.nodes)]
        for k, g in enumerate(gpus):
            self._gpus[k // self.node_gpus].append(g.uuid)
            self._node_of[g.uuid] = k // self.node_gpus
        self._up = [True] * self.nodes
        self._step(now)

    def kept(self) -> int:
        """Nodes kept up now, starting ones included."""
        return sum(self._up)

    def next_at(self) -> float:
        """The next instant the policy wants a pass at (inf: none)."""
        return math.inf

    def granted(self, lease: Lease) -> None:
        """A lease began on devices of this machine."""

    def released(self, lease: Lease, now: float) -> None:
        """A lease ended."""

    def after_pass(self, now: float, waiting: float) -> bool:
        """Act on the pass just run, ``waiting`` GPU-equivalents still waiting; True when
        GPUs came up (the replay runs another pass)."""
        return False

    def gpu_hours(self, start: float, end: float) -> float:
        """GPU-hours kept up (or starting) from ``start`` to ``end``."""
        total = 0.0
        for k, (since, nodes) in enumerate(self.steps):
            until = self.steps[k + 1][0] if k + 1 < len(self.steps) else math.inf
            total += nodes * max(0.0, min(until, end) - max(since, start))
        return total * self.node_gpus / HOUR_S

    def describe(self) -> dict[str, Any]:
        return {"policy": self.name, "nodes": self.nodes, "node_gpus": self.node_gpus}

    def _step(self, now: float) -> None:
        kept = self.kept()
        if self.steps and self.steps[-1][0] == now:
            self.steps[-1] = (now, kept)
        elif not self.steps or self.steps[-1][1] != kept:
            self.steps.append((now, kept))


class Reactive(Capacity):
    """Scales up on waiting work only, after a start delay; down after idle time."""

    name = "reactive"

    def __init__(
        self,
        nodes: int,
        node_gpus: int = NODE_GPUS,
        *,
        start_delay_s: float = START_DELAY_S,
        unneeded_s: float = UNNEEDED_S,
    ) -> None:
        super().__init__(nodes, node_gpus)
        if start_delay_s < 0 or unneeded_s < 0:
            raise ValueError("the start delay and the unneeded time cannot be negative")
        self.start_delay_s, self.unneeded_s = start_delay_s, unneeded_s
        self._starting: dict[int, float] = {}
        """Node -> when it is up."""
        self._busy: list[int] = []
        """Per node: the leases on it."""
        self._idle_since: dict[int, float] = {}
        """Up nodes that hold nothing -> since when."""
        self._on: dict[str, set[int]] = {}
        """Lease id -> the nodes it holds devices of."""
        self._added_at = -math.inf
        self._last = -math.inf
        self._waiting = 0.0

    def attach(self, broker: Broker, now: float) -> None:
        super().attach(broker, now)
        self._up = [False] * self.nodes
        self._busy = [0] * self.nodes
        self._last = now
        for uuids in self._gpus:
            for uuid in uuids:
                broker.drain(uuid, DRAIN_REASON)
        self._step(now)

    def kept(self) -> int:
        return sum(self._up) + len(self._starting)

    def floor(self, now: float) -> float:
        """GPUs to keep up whatever waits (none: purely reactive)."""
        return 0.0

    def next_at(self) -> float:
        due = list(self._starting.values())
        if self._idle_since and not self._waiting:
            due += [
                max(t + self.unneeded_s, self._added_at + self.unneeded_s)
                for t in self._idle_since.values()
            ]
        return min((t for t in due if t > self._last), default=math.inf)

    def granted(self, lease: Lease) -> None:
        assert self.broker is not None
        placer = self.broker.placer
        nodes = set()
        for d in lease.devices:
            device = placer.devices.get(d)
            nodes.add(self._node_of[device.gpu_uuid if device is not None else d])
        self._on[lease.id] = nodes
        for n in nodes:
            self._busy[n] += 1
            self._idle_since.pop(n, None)

    def released(self, lease: Lease, now: float) -> None:
        for n in self._on.pop(lease.id, ()):
            self._busy[n] -= 1
            if not self._busy[n] and self._up[n]:
                self._idle_since[n] = now

    def after_pass(self, now: float, waiting: float) -> bool:
        self._last, self._waiting = now, waiting
        floor = math.ceil(self.floor(now) / self.node_gpus - _EPS)
        asked = math.ceil(waiting / self.node_gpus - _EPS) - len(self._starting)
        self._start(max(asked, floor - self.kept()), now)
        came = [n for n, t in self._starting.items() if t <= now]
        assert self.broker is not None
        for n in came:
            del self._starting[n]
            self._up[n] = True
            self._idle_since[n] = now
            for uuid in self._gpus[n]:
                self.broker.devices.undrain(uuid, "powered up by the capacity policy")
        if not waiting:
            self._stop_idle(floor, now)
        self._step(now)
        return bool(came)

    def _start(self, n: int, now: float) -> None:
        off = [k for k in range(self.nodes) if not self._up[k] and k not in self._starting]
        for k in off[: max(n, 0)]:
            self._starting[k] = now + self.start_delay_s
            self._added_at = now

    def _stop_idle(self, floor: int, now: float) -> None:
        """Turn off the nodes idle for ``unneeded_s``, highest first, down to ``floor``."""
        if now - self._added_at < self.unneeded_s:
            return
        idle = sorted(
            (n for n, t in self._idle_since.items() if now - t >= self.unneeded_s), reverse=True
        )
        assert self.broker is not None
        for n in idle[: max(0, self.kept() - floor)]:
            del self._idle_since[n]
            self._up[n] = False
            for uuid in self._gpus[n]:
                self.broker.drain(uuid, DRAIN_REASON)

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "start_delay_s": self.start_delay_s,
            "unneeded_s": self.unneeded_s,
        }


@dataclass(frozen=True)
class Used:
    """The forecast one hour was served by: its p50, p90 and the quantile acted on."""

    p50: float
    p90: float
    acted: float


class ForecastAhead(Reactive):
    """The reactive policy, with the forecast of this hour and the next as its floor."""

    name = "forecast-ahead"

    def __init__(
        self,
        nodes: int,
        node_gpus: int = NODE_GPUS,
        *,
        quantile: str = "p90",
        headroom: float = 0.0,
        weeks: int = 8,
        refresh_s: float = DAY_S,
        **reactive: float,
    ) -> None:
        super().__init__(nodes, node_gpus, **reactive)
        if quantile not in ("p50", "p90"):
            raise ValueError(f"the forecast's quantiles are p50 and p90, not {quantile!r}")
        if headroom < 0 or weeks < 1 or refresh_s <= 0:
            raise ValueError("headroom cannot be negative, weeks and refresh must be positive")
        self.quantile, self.headroom = quantile, headroom
        self.weeks, self.refresh_s = weeks, refresh_s
        self.used: dict[float, Used] = {}
        """Hour start -> the forecast that served it (a forecast-only mode's log)."""
        self._found: Forecast | None = None
        self._refresh_at = -math.inf
        self._hour = (-math.inf, 0.0)

    def floor(self, now: float) -> float:
        hour = math.floor(now / HOUR_S) * HOUR_S
        if hour == self._hour[0]:
            return self._hour[1]
        if now >= self._refresh_at:
            assert self.broker is not None
            self._refresh_at = math.floor(now / self.refresh_s) * self.refresh_s + self.refresh_s
            rows = demand(self.broker.store, now - self.weeks * WEEK_S, now)
            self._found = forecast(spans(rows), now, weeks=self.weeks, backtest_weeks=0)
        gpus = 0.0
        if self._found is not None and self._found.ready:
            most, this, _ = ahead(self._found, now, self.quantile)
            gpus = most * (1 + self.headroom)
            q = this.demand
            self.used[hour] = Used(q["p50"], q["p90"], q[self.quantile])
        self._hour = (hour, gpus)
        return gpus

    def next_at(self) -> float:
        hour = math.floor(self._last / HOUR_S) * HOUR_S + HOUR_S
        stuck = self._waiting > 0 and all(self._up)  # nothing an hour could change
        return min(super().next_at(), math.inf if stuck else hour)

    def error(self, start: float, end: float) -> dict[str, float]:
        """How the forecast that served the whole hours from ``start`` to ``end`` compared
        with the demand they had (held and waiting, from the replay's store): the p50's
        absolute error over the demand, and the share of hours within the p90 and within
        what the policy kept for them (the quantile it acted on, headroom included)."""
        pairs = self._served(start, end)
        n, actual = len(pairs), sum(a for _, a in pairs)
        kept = 1 + self.headroom
        return {
            "hours": n,
            "mean_demand": actual / n if n else math.nan,
            "p50_error": sum(abs(u.p50 - a) for u, a in pairs) / actual if actual else math.nan,
            "p90_covered": sum(a <= u.p90 + _EPS for u, a in pairs) / n if n else math.nan,
            "acted_covered": sum(a <= u.acted * kept + _EPS for u, a in pairs) / n
            if n
            else math.nan,
        }

    def _served(self, start: float, end: float) -> list[tuple[Used, float]]:
        """(forecast, demand) of each whole hour in the window that a forecast served."""
        assert self.broker is not None
        found = hourly(spans(demand(self.broker.store, start - HOUR_S, end)), end)
        if found is None:
            return []
        pairs = []
        for at, used in self.used.items():
            i = int((at - found.start) // HOUR_S)
            if start <= at and at + HOUR_S <= end and 0 <= i < len(found.held):
                pairs.append((used, found.demand(i)))
        return pairs

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "quantile": self.quantile,
            "headroom": self.headroom,
            "weeks": self.weeks,
            "refresh_s": self.refresh_s,
        }
