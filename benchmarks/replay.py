"""Replay the two public traces under fcfs, slurm and broker; write the table and plot.

Every run goes through the package's own replay (``jupyter gpubroker replay`` is
the same code): the real broker core, a virtual clock, simulated NVML.

Scenarios (all in one run):

- ``openb``: Alibaba's GPU-sharing pods on 64 H100s in MIG mode
  (``dgx-h100-mig:64``), submit gaps compressed x3; every policy may re-cut
  idle MIG GPUs, so only ordering, backfill and placement differ;
- ``openb-static``: the same, with the baselines on a fixed MIG layout chosen
  from the trace (``inventories/openb-h100-64-static.yaml``), as Slurm and
  Kubernetes run MIG, and the broker re-cutting idle GPUs of that layout;
- ``philly``: Microsoft Philly's jobs on 96 DGX H100 (768 whole GPUs);
- ``philly-640``: the same on 640 GPUs, an overload where no order avoids
  waits of days (FCFS's own longest wait is 44 h).

The ``oracle`` column is not a policy anyone can deploy: it ranks by each job's
true GPU-time (its own duration), the bound that perfect prediction reaches
with the same backfill and placement. ``broker-tuned`` is the broker policy
with the parameters that did best on these same traces (so it flatters itself):
see ``TUNED``; the defaults are what ``--policy broker`` runs.

    python benchmarks/replay.py [--quick] [--traces DIR] [--out DIR]
    python benchmarks/replay.py --check [--traces DIR]

``--check`` is the full-trace test (the test suite runs on committed excerpts): each
trace loads with the counts documented in ``benchmarks/README.md``, and its first
``QUICK_JOBS`` jobs replay under every policy; it exits 1 naming what differs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jupyter_gpubroker.broker.models import Request
from jupyter_gpubroker.broker.policy import Context, Policy, make_policy, tier_bonus
from jupyter_gpubroker.replay import (
    DEFAULT_COMPRESS,
    DEFAULT_INVENTORY,
    Trace,
    TraceError,
    load,
    replay,
    summarize,
)
from jupyter_gpubroker.replay.driver import Timeline
from jupyter_gpubroker.replay.report import header, json_ready, table

HERE = Path(__file__).resolve().parent
TRACES = HERE.parent.parent / "shared" / "data" / "traces"
STATIC = os.path.relpath(HERE / "inventories" / "openb-h100-64-static.yaml")
QUICK_JOBS = 3000
BINS = 400
TUNED: dict[str, object] = {
    "weight_age_per_hour": 1.0,
    "weight_service": 3000.0,
    "half_life_s": 7 * 86400.0,
    "max_wait_s": 16 * 3600.0,
}
"""Ordering by fair share and expected service, age only past 16 h (then oldest first)."""


@dataclass
class OracleSJF(Policy):
    """Shortest true GPU-time first: uses the job's own duration, which no policy may.

    With ``tier_start_s``, the broker's oldest-first tier on top (the bound of perfect
    prediction under the broker's starvation protection)."""

    name: str = "oracle"
    tier_start_s: float | None = None

    def priority(self, r: Request, ctx: Context, now: float) -> float:
        p = -ctx.size_fraction(r) * (r.expected_duration_s or 0.0)
        if self.tier_start_s is None:
            return p
        return p + tier_bonus(max(now - r.submitted_at, 0.0), self.tier_start_s)


@dataclass(frozen=True)
class Scenario:
    name: str
    fmt: str
    trace: str
    inventory: str
    compress: float
    runs: tuple[tuple[str, bool], ...]
    """(column, dynamic MIG) per column; a column is a policy name, ``broker-tuned``
    or ``oracle``."""


COLUMNS = ("fcfs", "slurm", "broker", "broker-tuned")
SCENARIOS = (
    Scenario(
        "openb",
        "openb",
        "openb_pod_list_default.csv",
        "dgx-h100-mig:64",
        3.0,
        tuple((p, True) for p in (*COLUMNS, "oracle")),
    ),
    Scenario(
        "openb-static",
        "openb",
        "openb_pod_list_default.csv",
        STATIC,
        3.0,
        (("fcfs", False), ("slurm", False), ("broker", True)),
    ),
    Scenario(
        "philly",
        "philly",
        "philly_vc_jobs.csv",
        "dgx-h100:768",
        1.0,
        tuple((p, False) for p in (*COLUMNS, "oracle")),
    ),
    Scenario(
        "philly-640",
        "philly",
        "philly_vc_jobs.csv",
        "dgx-h100:640",
        1.0,
        tuple((p, False) for p in COLUMNS),
    ),
)


def queue_window(timelines: list[Timeline]) -> tuple[float, float]:
    """From the first to the last instant any replay had a queue, with a margin: the
    span worth plotting (openb queues for a few of its 145 days)."""
    queued = [t.at[i] for t in timelines for i, q in enumerate(t.queued) if q]
    if not queued:
        return timelines[0].at[0], max(t.at[-1] for t in timelines)
    margin = 0.1 * (max(queued) - min(queued))
    return min(queued) - margin, max(queued) + margin


def binned(
    timeline: Timeline, capacity: float, window: tuple[float, float], origin: float
) -> dict[str, list[float]]:
    """Time-weighted means of queue length and utilization over equal spans of ``window``."""
    t0, t1 = window
    width = (t1 - t0) / BINS or 1.0
    queued, held = [0.0] * BINS, [0.0] * BINS
    for i in range(len(timeline.at) - 1):
        a, b = max(timeline.at[i], t0), min(timeline.at[i + 1], t1)
        if a >= b:
            continue
        first, last = (min(int((x - t0) / width), BINS - 1) for x in (a, b))
        for k in range(first, last + 1):
            overlap = min(b, t0 + (k + 1) * width) - max(a, t0 + k * width)
            if overlap > 0:
                queued[k] += timeline.queued[i] * overlap
                held[k] += timeline.allocated[i] * overlap
    return {
        "day": [(t0 - origin + (k + 0.5) * width) / 86400 for k in range(BINS)],
        "queued": [q / width for q in queued],
        "utilization": [h / width / capacity for h in held],
    }


def policy_for(column: str) -> str | Policy:
    if column == "oracle":
        return OracleSJF()
    if column == "broker-tuned":
        return make_policy("broker", **TUNED)
    return column


def run(scenario: Scenario, traces: Path, quick: bool) -> dict[str, Any]:
    trace = load(traces / scenario.trace, scenario.fmt)
    if quick:
        trace = trace.head(QUICK_JOBS)
    out: dict[str, Any] = {"summaries": [], "series": {}}
    runs = []
    for column, dynamic in scenario.runs:
        result = replay(
            trace,
            policy_for(column),
            inventory=scenario.inventory,
            compress=scenario.compress,
            dynamic_mig=dynamic,
        )
        summary = summarize(result)
        summary["policy"] = column
        if scenario.name == "openb-static":  # the column says which machine it ran on
            summary["policy"] += " (dynamic MIG)" if dynamic else " (static MIG)"
        out["summaries"].append(summary)
        runs.append((summary["policy"], result))
        print(f"  {scenario.name} {summary['policy']}: {summary['wall_s']:.1f} s", flush=True)
    window = queue_window([r.timeline for _, r in runs])
    for column, r in runs:
        out["series"][column] = binned(r.timeline, r.gpus, window, trace.jobs[0].submit_s)
    return out


DOCUMENTED = {
    ("openb", "openb_pod_list_default.csv"): {
        "jobs": 7064,  # 8,152 tasks less 1,088 CPU-only ones
        "skipped": {"CPU-only tasks (num_gpu 0)": 1088},
        "shares of one GPU": 3078,
        "users": 32,
    },
    ("philly", "philly_vc_jobs.csv"): {
        "jobs": 82247,
        "skipped": {},
        "shares of one GPU": 0,
        "users": 15,  # the virtual clusters, each its own user and group
    },
}
"""What each full trace loads to, as benchmarks/README.md describes it."""


def facts(trace: Trace) -> dict[str, object]:
    return {
        "jobs": len(trace.jobs),
        "skipped": trace.skipped,
        "shares of one GPU": sum(1 for j in trace.jobs if j.gpus < 1),
        "users": len({j.user for j in trace.jobs}),
    }


def check(traces: Path) -> list[str]:
    """What differs from the documented full traces, and any slice replay that breaks an
    invariant of the figures (none: the traces are as the results describe them)."""
    problems = []
    for (fmt, file), documented in DOCUMENTED.items():
        trace = load(traces / file, fmt)
        found = facts(trace)
        problems += [
            f"{file}: {key} is {found[key]!r}, documented {want!r}"
            for key, want in documented.items()
            if found[key] != want
        ]
        head = trace.head(QUICK_JOBS)
        for policy in ("fcfs", "slurm", "broker"):
            result = replay(
                head, policy, inventory=DEFAULT_INVENTORY[fmt], compress=DEFAULT_COMPRESS[fmt]
            )
            s = summarize(result)
            where = f"{file}, first {QUICK_JOBS} jobs, {policy}"
            if s["jobs"] + sum(result.skipped.values()) != QUICK_JOBS:
                problems.append(f"{where}: {s['jobs']} replayed + {result.skipped} skipped")
            if not 0 <= s["median_wait_s"] <= s["p95_wait_s"] <= s["max_wait_s"]:
                problems.append(f"{where}: waits out of order {s}")
            if not (0 < s["utilization_busy"] <= 1 and 0 < s["jain"] <= 1):
                problems.append(f"{where}: utilization or Jain's index outside (0, 1] {s}")
        print(f"checked {file}", flush=True)
    return problems


def plot(results: dict[str, dict[str, Any]], path: Path) -> None:
    import matplotlib  # only here: --check runs with the test extras, without matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = ("openb", "philly")
    fig, axes = plt.subplots(2, len(shown), figsize=(13, 7), sharex="col")
    for col, name in enumerate(shown):
        summaries = results[name]["summaries"]
        for s in summaries:
            series = results[name]["series"][s["policy"]]
            style = {"linestyle": ":"} if s["policy"] in ("oracle", "broker-tuned") else {}
            axes[0][col].plot(series["day"], series["queued"], label=s["policy"], **style)
            axes[1][col].plot(
                series["day"], [100 * u for u in series["utilization"]], **style, linewidth=0.8
            )
        first = summaries[0]
        axes[0][col].set_title(
            f"{name}: {first['inventory']}, x{first['compress']:g} time compression"
        )
        axes[0][col].set_ylabel("waiting requests")
        axes[1][col].set_ylabel("GPUs allocated (%)")
        axes[1][col].set_xlabel("days since the first submission")
        axes[0][col].legend()
    fig.suptitle("Trace replay through the broker core: queue length and allocation over time")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--traces", type=Path, default=TRACES, help="folder holding the traces")
    ap.add_argument("--out", type=Path, default=HERE, help="where replay.png and results/ go")
    ap.add_argument(
        "--quick", action="store_true", help=f"first {QUICK_JOBS} jobs of each trace only"
    )
    ap.add_argument(
        "--check",
        action="store_true",
        help="check the full traces against their documented counts; write nothing",
    )
    args = ap.parse_args()
    t0 = time.perf_counter()
    if args.check:
        try:
            problems = check(args.traces)
        except TraceError as e:
            sys.exit(f"{e}; give the folder holding the public traces with --traces")
        print("\n".join(problems) or f"the traces in {args.traces} are as documented")
        sys.exit(1 if problems else 0)
    results = {s.name: run(s, args.traces, args.quick) for s in SCENARIOS}
    (args.out / "results").mkdir(parents=True, exist_ok=True)
    summaries = {name: r["summaries"] for name, r in results.items()}
    (args.out / "results" / "replay.json").write_text(
        json.dumps(json_ready(summaries), indent=1, allow_nan=False) + "\n"
    )
    plot(results, args.out / "replay.png")
    for name, r in results.items():
        print(f"\n### {name}\n")
        print("\n".join(f"- {line}" for line in header(r["summaries"][0])))
        print()
        print(table(r["summaries"], markdown=True))
    print(f"\n{time.perf_counter() - t0:.0f} s in all")


if __name__ == "__main__":
    main()
