"""How much of the start estimate's error is run times, how much is the queue's future.

Each scenario of ``replay.py`` is replayed twice under the broker policy; the two
runs are the same (the replay is deterministic and estimates move no decision: the
script checks that every wait is equal). The first records when each request
started. The second asks, at the instants the replay's ETA measurement asks
(every ``ETA_EVERY_S`` while requests wait, not at submission), each estimator
below; all list-schedule over the devices' free times (``eta.list_schedule``):

- ``broker``: the median the broker shows (``eta.predicted_starts``), and how often
  its stated 80% range held the real start;
- ``broker, queue as it stands``: its median before the queue's expected future
  (``eta.continued``): the run-time predictor's holds, the queue in priority order;
- ``true durations, no future``: every lease's and waiting request's true remaining
  duration, the queue in priority order now: ``squeue --start`` with exact limits
  (``eta.limit_starts``), the bound of knowing every duration but not the future;
- ``... and the real start order``: the same with the waiting requests in the order
  they really started (the tier and fair share reorder them), no arrivals;
- ``... and the real arrivals, in real start order``: the requests submitted later
  that started before the last of them too, none before its submission: a check of
  the measurement (0 when the list-schedule models the broker's placement);
- ``real arrivals placed by priority, true durations`` and ``... predicted
  durations``: ``eta.continued`` given the requests really submitted later (instead
  of the last hour again) and the true or the predictor's holds: the first checks
  that placing arrivals and tier entries by priority models the broker's order, the
  second is the bound of the broker's estimate with exact knowledge of arrivals.

    python benchmarks/eta_oracle.py [--limit N] [--traces DIR] SCENARIO ...

prints, per scenario, each estimator's median relative error (as ``replay.py``'s:
``|estimate - start|`` over the wait that remained, at least 60 s) and the share of
estimates the real start came later than (0.5 when unbiased).
"""

from __future__ import annotations

import argparse
import bisect
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from jupyter_gpubroker.broker.core import Broker
from jupyter_gpubroker.broker.eta import (
    Ends,
    Holds,
    continued,
    limit_starts,
    list_schedule,
    median,
    predicted,
)
from jupyter_gpubroker.broker.models import Lease, Request
from jupyter_gpubroker.replay import load, replay
from jupyter_gpubroker.replay.accuracy import FLOOR_S, EtaProbe
from jupyter_gpubroker.replay.metrics import percentile
from jupyter_gpubroker.replay.traces import Trace

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from replay import ETA_EVERY_S, SCENARIOS, TRACES  # noqa: E402

BROKER = "broker"
ORDERS = (
    "true durations, no future",
    "... and the real start order",
    "... and the real arrivals, in real start order",
)
PLACED = (
    "real arrivals placed by priority, true durations",
    "real arrivals placed by priority, predicted durations",
)
ESTIMATORS = (BROKER, "broker, queue as it stands", *ORDERS, *PLACED)


@dataclass
class OracleProbe(EtaProbe):
    """Numbers requests in submission order (the same in both runs) and records when
    each started; given ``known`` (the first run's), asks every estimator."""

    at_submit: bool = False
    known: dict[int, tuple[Request, float]] | None = None
    """Submission number -> (request, start) of the first run."""
    seq: dict[str, int] = field(default_factory=dict)
    started: dict[int, tuple[Request, float]] = field(default_factory=dict)
    rows: list[tuple[float, float, dict[str, float], bool]] = field(default_factory=list)
    """(instant, real start, estimator -> estimate, the broker's range held the start)."""
    _pending: dict[str, list[tuple[float, dict[str, float], tuple[float, float]]]] = field(
        default_factory=dict
    )
    _just: list[tuple[str, float]] = field(default_factory=list)
    """Requests granted in the pass whose ``after_pass`` comes next."""

    def __post_init__(self) -> None:
        known = self.known or {}
        self._by_submit = sorted((r.submitted_at, n) for n, (r, _) in known.items())
        self._submits = [t for t, _ in self._by_submit]

    def after_pass(self, broker: Broker, submitted: Sequence[str], now: float) -> None:
        for rid in submitted:
            self.seq[rid] = len(self.seq)
        for rid, at in self._just:
            self._started(broker, rid, at)
        self._just.clear()
        if self.known is None or now < self._next_sample:
            return
        entries = broker.queue()
        if not entries:
            return
        self._next_sample = now + self.every_s
        queue = [e.request for e in entries]
        said: dict[str, dict[str, float]] = {r.id: {} for r in queue}
        ranges: dict[str, tuple[float, float]] = {}
        for e in entries:
            if e.eta is not None:
                said[e.request.id][BROKER] = e.eta.median
                ranges[e.request.id] = (e.eta.low, e.eta.high)
        start = {r.id: self.known[self.seq[r.id]][1] for r in queue}
        in_order = sorted(queue, key=lambda r: (start[r.id], self.seq[r.id]))
        future = self._future(now, max(start.values()))
        start.update((r.id, s) for r, s in future)
        arrived = [r for r, _ in future]
        exact = _exact(broker)
        pred_ends, pred_holds = predicted(broker, broker.predictor, now)
        ends, holds = (lambda lease: median(pred_ends(lease))), (lambda r: median(pred_holds(r)))
        as_is = list_schedule(broker, queue, ends, holds, 1, now)
        found: dict[str, dict[str, float]] = {
            "broker, queue as it stands": {rid: s[0] for rid, s in as_is.items()},
            ORDERS[0]: _known(limit_starts(broker, queue, _true, now)),
            ORDERS[1]: _known(limit_starts(broker, in_order, _true, now)),
        }
        with_arrivals = sorted(in_order + arrived, key=lambda r: start[r.id])
        got = list_schedule(broker, with_arrivals, *exact, 1, now, lambda r: r.submitted_at)
        found[ORDERS[2]] = {r.id: got[r.id][0] for r in queue}
        true_first = _known(limit_starts(broker, queue, _true, now))
        found[PLACED[0]] = continued(broker, queue, true_first, arrived, *exact, now)
        first = {rid: s[0] for rid, s in as_is.items()}
        found[PLACED[1]] = continued(broker, queue, first, arrived, ends, holds, now)
        for name, starts in found.items():
            for rid, s in starts.items():
                if math.isfinite(s):
                    said[rid][name] = s
        for rid, values in said.items():
            self._pending.setdefault(rid, []).append(
                (now, values, ranges.get(rid, (math.nan, math.nan)))
            )

    def _future(self, now: float, until: float) -> list[tuple[Request, float]]:
        """The requests submitted after ``now`` that started by ``until``, renamed so
        that they cannot be taken for this run's requests."""
        assert self.known is not None
        out = []
        for t, n in self._by_submit[bisect.bisect_right(self._submits, now) :]:
            if t > until:
                break
            r, s = self.known[n]
            if s <= until:
                out.append((replace(r, id=f"future:{n}"), s))
        return out

    def granted(self, request_id: str, now: float) -> None:
        self._just.append((request_id, now))

    def _started(self, broker: Broker, request_id: str, now: float) -> None:
        self.started[self.seq[request_id]] = (broker.request(request_id), now)
        for at, values, (low, high) in self._pending.pop(request_id, []):
            self.rows.append((at, now, values, low <= now <= high))


def _true(r: Request) -> float:
    return r.expected_duration_s or 0.0


def _exact(broker: Broker) -> tuple[Ends, Holds]:
    def ends(lease: Lease) -> Sequence[float]:
        return (lease.granted_at + _true(broker.request(lease.request_id)),)

    return ends, lambda r: (_true(r),)


def _known(starts: dict[str, float | None]) -> dict[str, float]:
    return {rid: s for rid, s in starts.items() if s is not None}


def measure(name: str, traces: Path, limit: int | None) -> dict[str, tuple[float, float, int]]:
    """``figures`` of the scenario ``name`` (its first ``limit`` jobs)."""
    scenario = next(s for s in SCENARIOS if s.name == name)
    trace = load(traces / scenario.trace, scenario.fmt)
    t0 = time.perf_counter()
    out = figures(trace.head(limit) if limit else trace, scenario.inventory, scenario.compress)
    print(f"  {name}: two replays in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return out


def figures(trace: Trace, inventory: str, compress: float) -> dict[str, tuple[float, float, int]]:
    """Estimator -> (median relative error, share started later, estimates); ``coverage``
    -> (the broker's stated range's coverage, nan, estimates)."""
    kw = {"inventory": inventory, "compress": compress}
    first = OracleProbe(ETA_EVERY_S)
    run1 = replay(trace, "broker", probe=first, **kw)
    second = OracleProbe(ETA_EVERY_S, known=first.started)
    run2 = replay(trace, "broker", probe=second, **kw)
    if [o.wait_s for o in run1.outcomes] != [o.wait_s for o in run2.outcomes]:
        raise SystemExit(f"{trace.name}: the two replays differ: an estimate moved a decision")
    out = {}
    for est in ESTIMATORS:
        errs, late = [], 0
        for at, start, values, _ in second.rows:
            if est in values:
                errs.append(abs(values[est] - start) / max(start - at, FLOOR_S))
                late += start > values[est]
        out[est] = (percentile(errs, 0.5), late / len(errs) if errs else math.nan, len(errs))
    covered = [c for _, _, values, c in second.rows if BROKER in values]
    out["coverage"] = (sum(covered) / len(covered) if covered else math.nan, math.nan, len(covered))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("scenarios", nargs="+", choices=[s.name for s in SCENARIOS])
    ap.add_argument("--traces", type=Path, default=TRACES)
    ap.add_argument("--limit", type=int, help="replay only the first N jobs of the trace")
    args = ap.parse_args(argv)
    for name in args.scenarios:  # one at a time: each is two replays
        figures = measure(name, args.traces, args.limit)
        coverage = figures.pop("coverage")[0]
        head = name + (f", first {args.limit:,} jobs" if args.limit else "")
        print(f"| {head} | median relative error | started later | estimates |")
        print("|---|---:|---:|---:|")
        for est, (err, late, n) in figures.items():
            print(f"| {est} | {err:.3f} | {100 * late:.1f}% | {n:,} |")
        print(f"\nthe broker's stated 80% range covers {100 * coverage:.1f}%\n", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
