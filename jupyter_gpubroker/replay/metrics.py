"""The figures of a replay, computed from its outcomes and timeline.

- **Queue wait**: grant minus submit (after time compression); mean, median,
  p95 (linear interpolation between ranks) and max, overall and per job class.
- **Job completion time** (JCT): end minus submit.
- **Allocation utilization**: held GPU-equivalents integrated over time, over
  the capacity (GPUs) times the time it covers: ``utilization_busy`` over
  the busy period (instants with a job running or waiting),
  ``utilization_queued`` over the instants with a non-empty queue.
- **Fragmentation**: while the queue is non-empty, the free GPU-equivalents
  that cannot host the smallest waiting request as the devices are cut
  (MIG slices of other profiles, fewer free GPUs than it needs), averaged
  over that time, as a share of capacity.
- **Jain's index** of per-tenant normalized service: tenants are groups when
  every job has one, else users; a tenant's normalized service is
  ``sum(g * run) / sum(g * (wait + run))`` over its jobs (``g`` its
  GPU-equivalents): the share of its jobs' time in the system spent running
  (1 = never waited). Jain = ``(sum x)^2 / (n * sum x^2)``, 1 when all equal.
- **Starved**: jobs that waited longer than ``starve_after_s`` (default one
  day, the broker policy's own bound).
- **Cut at the limit**: with declared limits (:mod:`.limits`), the jobs that needed
  more than theirs and so ended at it, and (broker) those extended instead (None
  without limits).
- **Scheduler CPU time per decision**: process CPU time of one scheduling pass
  (``Broker.schedule``), averaged over the passes.
- **ETA accuracy** (when the replay asked for it, see :mod:`.accuracy`): the
  median relative error of the predicted start (its median) and of Slurm's
  ``squeue --start``, the share of estimates whose stated range covered
  the real start (``coverage``; ``raw_coverage`` for the predictor's range
  before calibration), and the share that started later than the predicted
  median (``late``: 0.5 when unbiased); the share of estimates that carried a
  promised start from time limits (``bounded``) and the share of those whose real
  start kept it (``bound_held``); over every estimate, over those made at
  submission and over the later half of them in time (``second_half``).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from ..broker.eta import Eta
from ..broker.limits import SLACK_S
from .accuracy import Estimate, relative_error
from .driver import Outcome, Replay, Timeline

STARVE_AFTER_S = 24 * 3600.0


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-quantile (0..1) with linear interpolation between ranks (NumPy's default)."""
    if not values:
        return math.nan
    xs = sorted(values)
    pos = q * (len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def wait_stats(outcomes: Sequence[Outcome]) -> dict[str, float]:
    waits = [o.wait_s for o in outcomes]
    return {
        "jobs": len(waits),
        "mean_wait_s": sum(waits) / len(waits) if waits else math.nan,
        "median_wait_s": percentile(waits, 0.5),
        "p95_wait_s": percentile(waits, 0.95),
        "max_wait_s": max(waits, default=math.nan),
    }


def jain(values: Iterable[float]) -> float:
    """Jain's fairness index: 1 when all values are equal, 1/n when one holds everything."""
    xs = list(values)
    squares = sum(x * x for x in xs)
    return sum(xs) ** 2 / (len(xs) * squares) if squares else math.nan


def normalized_service(outcomes: Sequence[Outcome]) -> dict[str, float]:
    """Per tenant (group if every job has one, else user): running over time in the system."""
    by_group = all(o.group for o in outcomes)
    ran: dict[str, float] = defaultdict(float)
    stayed: dict[str, float] = defaultdict(float)
    for o in outcomes:
        tenant = o.group if by_group else o.user
        ran[tenant] += o.gpu_equivalents * (o.end_s - o.start_s)
        stayed[tenant] += o.gpu_equivalents * (o.end_s - o.submit_s)
    return {t: ran[t] / stayed[t] for t in ran}


def utilization(timeline: Timeline, capacity: float) -> dict[str, float]:
    """Allocation utilization over the busy and queued periods, and fragmentation."""
    held = {"busy": 0.0, "queued": 0.0}
    span = {"busy": 0.0, "queued": 0.0}
    fragmented = 0.0
    t = timeline
    for i in range(len(t.at) - 1):
        dt = t.at[i + 1] - t.at[i]
        if t.queued[i] or t.running[i]:
            held["busy"] += t.allocated[i] * dt
            span["busy"] += dt
        if t.queued[i]:
            held["queued"] += t.allocated[i] * dt
            span["queued"] += dt
            fragmented += t.fragmented[i] * dt
    return {
        "utilization_busy": _ratio(held["busy"], capacity * span["busy"]),
        "utilization_queued": _ratio(held["queued"], capacity * span["queued"]),
        "fragmentation": _ratio(fragmented, capacity * span["queued"]),
        "queued_time_share": _ratio(span["queued"], span["busy"]),
    }


def eta_stats(estimates: Sequence[Estimate]) -> dict[str, dict[str, float]]:
    """ETA accuracy over all estimates, those made at submission and the later half
    of them by the instant they were made at (the calibration has learnt by then)."""
    split = percentile([e.at for e in estimates], 0.5)
    out = {}
    for label, chosen in (
        ("all", estimates),
        ("at_submit", [e for e in estimates if e.at_submit]),
        ("second_half", [e for e in estimates if e.at >= split]),
    ):
        known = [(e, e.predicted) for e in chosen if e.predicted is not None]
        raw = [(e, e.raw) for e in chosen if e.raw is not None]
        bounded = [(e, p.bound) for e, p in known if p.bound is not None]
        out[label] = {
            "estimates": len(chosen),
            "unknown": len(chosen) - len(known),
            "median_rel_error": percentile([relative_error(e, p.median) for e, p in known], 0.5),
            "coverage": _covered(known),
            "raw_coverage": _covered(raw),
            "late": _ratio(sum(e.start > p.median for e, p in known), len(known)),
            "bounded": _ratio(len(bounded), len(chosen)),
            "bound_held": _ratio(sum(e.start <= b + SLACK_S for e, b in bounded), len(bounded)),
            "squeue_median_rel_error": percentile(
                [relative_error(e, e.squeue) for e in chosen if e.squeue is not None], 0.5
            ),
        }
    return out


def summarize(run: Replay, starve_after_s: float = STARVE_AFTER_S) -> dict[str, Any]:
    """Every figure of one replay as one JSON-ready dict."""
    outcomes = run.outcomes
    classes = sorted({o.job_class.value for o in outcomes})
    service = normalized_service(outcomes)
    declared = any(j.limit_s is not None for j in run.trace.jobs)
    return {
        "trace": run.trace.name,
        "policy": run.policy,
        "inventory": run.inventory,
        "gpus": run.gpus,
        "compress": run.compress,
        "dynamic_mig": run.dynamic_mig,
        "notes": list(run.trace.notes),
        "skipped": {**run.trace.skipped, **run.skipped},
        **wait_stats(outcomes),
        "mean_jct_s": _mean([o.end_s - o.submit_s for o in outcomes]),
        **utilization(run.timeline, run.gpus),
        "jain": jain(service.values()),
        "tenants": len(service),
        "starved": sum(1 for o in outcomes if o.wait_s > starve_after_s),
        "starve_after_s": starve_after_s,
        "cut_at_limit": run.cut_at_limit if declared else None,
        "extended_at_limit": run.extended_at_limit if declared else None,
        "by_class": {
            c: wait_stats([o for o in outcomes if o.job_class.value == c]) for c in classes
        },
        "decisions": run.decisions,
        "cpu_ms_per_decision": _ratio(run.decision_cpu_s * 1e3, run.decisions),
        "wall_s": run.wall_s,
        **({"eta": eta_stats(run.etas)} if run.etas is not None else {}),
    }


def _covered(known: Sequence[tuple[Estimate, Eta]]) -> float:
    return _ratio(sum(p.low <= e.start <= p.high for e, p in known), len(known))


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan


def _ratio(a: float, b: float) -> float:
    return a / b if b else math.nan
