"""Replay the two public traces under fcfs, slurm and broker; write the table and plot.

Every run goes through the package's own replay (``jupyter gpubroker replay`` is
the same code): the real broker core, a virtual clock, simulated NVML.

Scenarios (all in one run):

- ``openb``: Alibaba's GPU-sharing pods on 64 H100s in MIG mode
  (``dgx-h100-mig:64``), submit gaps compressed x3; every policy may re-cut
  idle MIG GPUs, so only ordering, backfill and placement differ;
- ``openb-x4``: the same at x4, an overload so deep that keeping every wait under
  a day forces nearly FCFS order; its ``oracle+tier`` column is the oracle under the
  broker's oldest-first tier, the bound of perfect prediction that starves no more
  than FCFS;
- ``openb-static``: the same (x3), with the baselines on a fixed MIG layout chosen
  from the trace (``inventories/openb-h100-64-static.yaml``), as Slurm and
  Kubernetes run MIG, and the broker re-cutting idle GPUs of that layout;
- ``philly``: Microsoft Philly's jobs on 96 DGX H100 (768 whole GPUs);
- ``philly-640``: the same on 640 GPUs, an overload where no order avoids
  waits of days (FCFS's own longest wait is 44 h).

The ``oracle`` column is not a policy anyone can deploy: it ranks by each job's
true GPU-time (its own duration), the bound that perfect prediction reaches
with the same backfill and placement. ``broker`` is the policy's defaults (what
``--policy broker`` runs); ``broker-fit`` is the broker policy with the
``CANDIDATES`` parameters that did best on the *other* trace (openb's columns
take Philly's fit and Philly's take openb's), so no column is tuned on what it
reports. The train/test section also fits on each trace's first half in time
(the jobs submitted before its median submission) and reports on the second.
The broker column measures the start estimates too (``ETA_EVERY_S``).

    python benchmarks/replay.py [--quick] [--traces DIR] [--out DIR] [--readme]
        [--limits exact|tsafrir|loose]
    python benchmarks/replay.py --check [--traces DIR]

``--limits`` gives every job of every scenario a declared run-time limit
(``jupyter_gpubroker/replay/limits.py``): every column's backfill and ``squeue --start``
plan with it, and a job past its limit ends at it. Without it each job states its true
duration (exact limits, as before).

``--readme`` writes the generated sections of ``benchmarks/README.md`` (between
its ``<!-- generated: NAME -->`` and ``<!-- end: NAME -->`` lines) from the run.

``--check`` is the full-trace test (the test suite runs on committed excerpts): each
trace loads with the counts documented in ``benchmarks/README.md``, and its first
``QUICK_JOBS`` jobs replay under every policy; it exits 1 naming what differs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jupyter_gpubroker.broker.models import Request
from jupyter_gpubroker.broker.policy import BrokerPolicy, Context, Policy, make_policy, tier_bonus
from jupyter_gpubroker.replay import (
    DEFAULT_COMPRESS,
    DEFAULT_INVENTORY,
    STARVE_AFTER_S,
    Trace,
    TraceError,
    load,
    replay,
    summarize,
)
from jupyter_gpubroker.replay.driver import Replay, Timeline
from jupyter_gpubroker.replay.limits import LIMIT_MODELS, declare
from jupyter_gpubroker.replay.metrics import wait_stats
from jupyter_gpubroker.replay.report import header, json_ready, table

HERE = Path(__file__).resolve().parent
TRACES = HERE.parent.parent / "shared" / "data" / "traces"
STATIC = os.path.relpath(HERE / "inventories" / "openb-h100-64-static.yaml")
QUICK_JOBS = 3000
BINS = 400
ETA_EVERY_S = 600.0
"""The broker column asks the start estimators at each submission and every 10 min."""
CANDIDATES: tuple[dict[str, float], ...] = (
    {},
    {"weight_service": 3000.0},
    {"tier_fraction": 0.5},
    {"weight_service": 3000.0, "tier_fraction": 0.5},
    {"half_life_s": 86400.0},
)
"""The broker policy's parameter sets a fit chooses from: the defaults, more weight on
expected service, an earlier oldest-first tier, both, and the one-day usage half-life
of the earlier default. (The age weight is not among them: with ``max_wait_s`` set,
waiting earns nothing before the tier.) The fit takes the lowest mean wait among those
that starve no more jobs than FCFS on the same jobs."""
FIT_ON = {
    "openb": "philly",
    "openb-x4": "philly",
    "openb-static": "philly",
    "philly": "openb",
    "philly-640": "openb",
}
"""Whose fit a scenario's ``broker-fit`` column runs: the other trace's."""


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


def oracle_with_tier() -> OracleSJF:
    """The oracle under the broker's default oldest-first tier."""
    broker = make_policy("broker")
    assert isinstance(broker, BrokerPolicy) and broker.max_wait_s is not None
    return OracleSJF("oracle+tier", tier_start_s=broker.tier_fraction * broker.max_wait_s)


ORACLES: dict[str, Callable[[], OracleSJF]] = {"oracle": OracleSJF, "oracle+tier": oracle_with_tier}
"""The columns no deployable policy runs: they know each job's true duration."""


@dataclass(frozen=True)
class Scenario:
    name: str
    fmt: str
    trace: str
    inventory: str
    compress: float
    runs: tuple[tuple[str, bool], ...]
    """(column, dynamic MIG) per column; a column is a policy name, ``broker-fit``
    or ``oracle``."""
    fit: bool = False
    """Fit the broker's parameters here: every candidate on the whole trace and on
    its first half."""


COLUMNS = ("fcfs", "slurm", "broker", "broker-fit")
SCENARIOS = (
    Scenario(
        "openb",
        "openb",
        "openb_pod_list_default.csv",
        "dgx-h100-mig:64",
        3.0,
        tuple((p, True) for p in (*COLUMNS, "oracle")),
        fit=True,
    ),
    Scenario(
        "openb-x4",
        "openb",
        "openb_pod_list_default.csv",
        "dgx-h100-mig:64",
        4.0,
        tuple((p, True) for p in (*COLUMNS, "oracle", "oracle+tier")),
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
        fit=True,
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


def split(trace: Trace) -> int:
    """Where a trace splits in time: the median job, moved back to the first job of
    its submit instant so that no instant falls in both halves."""
    k = len(trace.jobs) // 2
    while k > 0 and trace.jobs[k - 1].submit_s == trace.jobs[k].submit_s:
        k -= 1
    return k


@dataclass
class Run:
    summary: dict[str, Any]
    timeline: Timeline
    gpus: int


@dataclass(frozen=True)
class Task:
    """One replay: a scenario's trace (whole or its first half) under one policy."""

    scenario: str
    policy: str
    """``fcfs``, ``slurm``, ``broker`` or one of ``ORACLES``."""
    dynamic: bool
    params: tuple[tuple[str, float], ...] = ()
    half: bool = False
    eta: bool = False

    @staticmethod
    def broker(scenario: str, dynamic: bool, params: dict[str, float], **kw: bool) -> Task:
        return Task(scenario, "broker", dynamic, tuple(sorted(params.items())), **kw)


_loaded: dict[tuple[str, str], Trace] = {}
_source: tuple[Path, bool, str | None] = (TRACES, False, None)


def _start_worker(traces: Path, quick: bool, limits: str | None = None) -> None:
    global _source
    _source = (traces, quick, limits)


def scenario_trace(scenario: Scenario) -> Trace:
    """The scenario's trace, loaded once per process."""
    key = (scenario.trace, scenario.fmt)
    if key not in _loaded:
        traces, quick, limits = _source
        trace = load(traces / scenario.trace, scenario.fmt)
        trace = trace.head(QUICK_JOBS) if quick else trace
        _loaded[key] = declare(trace, limits) if limits else trace
    return _loaded[key]


def execute(task: Task) -> Run:
    """The replay of ``task``, its summary with ``second_half``: the waits of the jobs
    submitted from the trace's median instant on (those a first-half fit never saw)."""
    scenario = next(s for s in SCENARIOS if s.name == task.scenario)
    trace = scenario_trace(scenario)
    if task.half:
        trace = trace.head(split(trace))
    policy = (
        ORACLES[task.policy]()
        if task.policy in ORACLES
        else make_policy(task.policy, **dict(task.params))
    )
    result = replay(
        trace,
        policy,
        inventory=scenario.inventory,
        compress=scenario.compress,
        dynamic_mig=task.dynamic,
        eta_every_s=ETA_EVERY_S if task.eta else None,
        eta_at_submit=False,
    )
    summary = summarize(result)
    summary["second_half"] = second_half(result, trace)
    what = "first half" if task.half else "whole"
    print(
        f"  {task.scenario} {task.policy} {dict(task.params) or ''} ({what}): "
        f"{result.wall_s:.1f} s",
        flush=True,
    )
    return Run(summary, result.timeline, result.gpus)


def second_half(result: Replay, trace: Trace) -> dict[str, float]:
    jobs, k = trace.jobs, split(trace)
    if k >= len(jobs):
        return wait_stats([])
    at = jobs[0].submit_s + (jobs[k].submit_s - jobs[0].submit_s) / result.compress
    later = [o for o in result.outcomes if o.submit_s >= at]
    return {**wait_stats(later), "starved": sum(1 for o in later if o.wait_s > STARVE_AFTER_S)}


def params_text(params: dict[str, float]) -> str:
    return ", ".join(f"{k}={v:g}" for k, v in params.items()) or "the defaults"


@dataclass
class Fit:
    """Every candidate and FCFS on a whole trace and on its first half, and the choices."""

    whole: list[Run]
    """Per candidate; the first (the defaults) with the ETA probe: the broker column."""
    half: list[Run]
    fcfs_whole: Run
    fcfs_half: Run

    @property
    def chosen_whole(self) -> dict[str, float]:
        return best(self.whole, self.fcfs_whole)

    @property
    def chosen_half(self) -> dict[str, float]:
        return best(self.half, self.fcfs_half)


def best(runs: list[Run], fcfs: Run) -> dict[str, float]:
    """The candidate with the lowest mean wait among those starving no more than FCFS."""
    ok = [i for i, r in enumerate(runs) if r.summary["starved"] <= fcfs.summary["starved"]]
    return CANDIDATES[min(ok or range(len(runs)), key=lambda i: runs[i].summary["mean_wait_s"])]


def fit_tasks(s: Scenario) -> tuple[list[Task], list[Task], Task, Task]:
    """Every candidate on the whole trace (the defaults with the ETA probe, as the broker
    column) and on its first half, and FCFS on both."""
    dyn = s.runs[0][1]
    whole = [Task.broker(s.name, dyn, c, eta=not c) for c in CANDIDATES]
    half = [Task.broker(s.name, dyn, c, half=True) for c in CANDIDATES]
    return whole, half, Task(s.name, "fcfs", dyn), Task(s.name, "fcfs", dyn, half=True)


def column_task(s: Scenario, column: str, dynamic: bool, fits: dict[str, Fit]) -> Task:
    if column == "broker-fit":
        return Task.broker(s.name, dynamic, fits[FIT_ON[s.name]].chosen_whole)
    return Task(s.name, column, dynamic, eta=column == "broker")


def run_all(jobs: int) -> tuple[dict[str, Fit], dict[str, dict[str, Any]]]:
    """The fits, then every scenario's columns; ``jobs`` replays at a time."""
    done: dict[Task, Run] = {}

    def execute_all(tasks: list[Task]) -> None:
        todo = list(dict.fromkeys(t for t in tasks if t not in done))
        if jobs > 1:
            with ProcessPoolExecutor(jobs, initializer=_start_worker, initargs=_source) as pool:
                done.update(zip(todo, pool.map(execute, todo), strict=True))
        else:
            done.update((t, execute(t)) for t in todo)

    fitted = {s.name: fit_tasks(s) for s in SCENARIOS if s.fit}
    first = [t for w, h, fw, fh in fitted.values() for t in (*w, *h, fw, fh)]
    first += [
        Task(s.name, c, d, eta=c == "broker")
        for s in SCENARIOS
        for c, d in s.runs
        if c != "broker-fit"
    ]
    execute_all(first)
    fits = {
        name: Fit([done[t] for t in w], [done[t] for t in h], done[fw], done[fh])
        for name, (w, h, fw, fh) in fitted.items()
    }
    columns = {s.name: [(c, d, column_task(s, c, d, fits)) for c, d in s.runs] for s in SCENARIOS}
    execute_all([t for cs in columns.values() for _, _, t in cs])
    results = {}
    for s in SCENARIOS:
        runs = []
        for column, dynamic, task in columns[s.name]:
            r = done[task]
            label = f"broker-fit ({FIT_ON[s.name]})" if column == "broker-fit" else column
            if s.name == "openb-static":  # the column says which machine it ran on
                label += " (dynamic MIG)" if dynamic else " (static MIG)"
            runs.append((label, Run({**r.summary, "policy": label}, r.timeline, r.gpus)))
        window = queue_window([r.timeline for _, r in runs])
        origin = scenario_trace(s).jobs[0].submit_s
        results[s.name] = {
            "summaries": [r.summary for _, r in runs],
            "series": {c: binned(r.timeline, r.gpus, window, origin) for c, r in runs},
        }
    return fits, results


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
            dotted = s["policy"].startswith(("oracle", "broker-fit"))
            style = {"linestyle": ":"} if dotted else {}
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


def results_md(results: dict[str, dict[str, Any]]) -> str:
    """Every scenario's header and table."""
    parts = []
    for name, r in results.items():
        lines = "\n".join(f"- {line}" for line in header(r["summaries"][0]))
        parts.append(f"**{name}**\n\n{lines}\n\n{table(r['summaries'], markdown=True)}")
    return "\n\n".join(parts)


ETA_ROWS: tuple[tuple[str, str, str, str], ...] = (
    ("estimates (every 10 min while jobs wait)", "all", "estimates", "n"),
    ("of them unknown", "all", "unknown", "n"),
    ("median relative error, broker", "all", "median_rel_error", "f"),
    ("median relative error, squeue --start (exact limits)", "all", "squeue_median_rel_error", "f"),
    ("stated 80% range covers", "all", "coverage", "%"),
    ("the predictor's range before calibration covers", "all", "raw_coverage", "%"),
    ("started later than the median", "all", "late", "%"),
    ("later half in time: median relative error", "second_half", "median_rel_error", "f"),
    ("later half in time: stated 80% range covers", "second_half", "coverage", "%"),
    ("first estimate of each job: median relative error", "at_submit", "median_rel_error", "f"),
    ("first estimate of each job: stated 80% range covers", "at_submit", "coverage", "%"),
)


def eta_md(results: dict[str, dict[str, Any]]) -> str:
    """The start estimates of each scenario's broker column against the real starts."""
    etas = {
        name: next(s["eta"] for s in r["summaries"] if "eta" in s) for name, r in results.items()
    }
    rows = ["| | " + " | ".join(etas) + " |", "|---|" + "---:|" * len(etas)]
    for label, part, key, kind in ETA_ROWS:
        if _source[2]:
            label = label.replace("(exact limits)", f"({_source[2]} limits)")
        cells = (_cell(e[part][key], kind) for e in etas.values())
        rows.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def train_test_md(results: dict[str, dict[str, Any]], fits: dict[str, Fit]) -> str:
    """Mean waits with the parameters chosen elsewhere, against the defaults and the
    baselines, on the whole trace and on the jobs of its second half."""
    out = [
        "| reported on | fcfs | slurm | broker (defaults) | fit on the other trace "
        "| fit on the first half | fit on itself (in-sample) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    chosen = []
    for name, f in fits.items():
        by = {s["policy"]: s for s in results[name]["summaries"]}
        other = next(s for p, s in by.items() if p.startswith("broker-fit"))
        half = f.whole[CANDIDATES.index(f.chosen_half)].summary
        itself = f.whole[CANDIDATES.index(f.chosen_whole)].summary
        for part in ("whole", "second half"):

            def wait(s: dict[str, Any], part: str = part) -> str:
                v = s["mean_wait_s"] if part == "whole" else s["second_half"]["mean_wait_s"]
                return _cell(v, "s")

            fitted_half = wait(half) if part == "second half" else "(fit here)"
            cols = [by["fcfs"], by["slurm"], by["broker"], other]
            out.append(
                f"| {name}, {part} | "
                + " | ".join(wait(s) for s in cols)
                + f" | {fitted_half} | {wait(itself)} |"
            )
        chosen.append(
            f"- {name}: on the whole trace `{params_text(f.chosen_whole)}`; on its first "
            f"half (jobs before the median submission) `{params_text(f.chosen_half)}`"
        )
    return "\n".join([*out, "", "Chosen:", "", *chosen])


TARGET_SCENARIOS = ("openb", "openb-x4", "philly", "philly-640")
"""The scenarios issue 13's targets are stated on (openb-static is the MIG comparison)."""


def targets_md(results: dict[str, dict[str, Any]]) -> str:
    """Issue 13's targets, met or not, per scenario, from this run's tables."""
    names = [n for n in TARGET_SCENARIOS if n in results]
    by = {n: {s["policy"]: s for s in results[n]["summaries"]} for n in names}

    def ratio(n: str, of: str, to: str = "slurm") -> float:
        return float(by[n][of]["mean_wait_s"] / by[n][to]["mean_wait_s"])

    def row(label: str, cell: Callable[[dict[str, Any], str], tuple[bool, str]]) -> str:
        cells = []
        for n in names:
            ok, text = cell(by[n], n)
            cells.append(f"{'yes' if ok else 'no'}: {text}")
        return f"| {label} | " + " | ".join(cells) + " |"

    def eta(b: dict[str, Any], key: str) -> float:
        return float(b["broker"]["eta"]["all"][key])

    out = [
        "| target | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
        row(
            "broker <= slurm", lambda b, n: (ratio(n, "broker") <= 1, f"{ratio(n, 'broker'):.2f}x")
        ),
        row(
            "broker <= 0.7x fcfs",
            lambda b, n: (ratio(n, "broker", "fcfs") <= 0.7, f"{ratio(n, 'broker', 'fcfs'):.2f}x"),
        ),
        row(
            "Jain >= slurm's",
            lambda b, n: (
                b["broker"]["jain"] >= b["slurm"]["jain"],
                f"{b['broker']['jain']:.3f} vs {b['slurm']['jain']:.3f}",
            ),
        ),
        row(
            "starved <= fcfs's",
            lambda b, n: (
                b["broker"]["starved"] <= b["fcfs"]["starved"],
                f"{b['broker']['starved']:,} vs {b['fcfs']['starved']:,}",
            ),
        ),
        row(
            "utilization >= 90% while queued",
            lambda b, n: (
                b["broker"]["utilization_queued"] >= 0.9,
                f"{100 * b['broker']['utilization_queued']:.1f}%",
            ),
        ),
        row(
            "ETA median relative error <= 0.3",
            lambda b, n: (
                eta(b, "median_rel_error") <= 0.3,
                f"{eta(b, 'median_rel_error'):.3f}",
            ),
        ),
        row(
            "ETA 80% range covers 75-85%",
            lambda b, n: (
                0.75 <= eta(b, "coverage") <= 0.85,
                f"{100 * eta(b, 'coverage'):.1f}%",
            ),
        ),
    ]
    ratios = sorted(ratio(n, "broker") for n in names)
    k = len(ratios)
    median = (ratios[(k - 1) // 2] + ratios[k // 2]) / 2
    out += [
        "",
        f"Median scenario: broker {median:.2f}x slurm (target 0.85x: "
        f"{'met' if median <= 0.85 else 'not met'}).",
    ]
    bounds = [
        f"{n} {ratio(n, o):.2f}x slurm ({o}, {by[n][o]['starved']:,} starved)"
        for n in names
        for o in ("oracle", "oracle+tier")
        if o in by[n]
    ]
    if bounds:
        out.append(f"Oracle bounds (true durations, same backfill): {'; '.join(bounds)}.")
    return "\n".join(out)


def _cell(v: Any, kind: str) -> str:
    if v is None or (isinstance(v, float) and v != v):
        return "-"
    return {"n": f"{v:,}", "f": f"{v:.3f}", "%": f"{100 * v:.1f}%", "s": f"{v:,.0f} s"}[kind]


SECTIONS = ("results", "eta", "train-test", "targets")
"""The generated sections of benchmarks/README.md."""


def _section(name: str) -> re.Pattern[str]:
    return re.compile(rf"(<!-- generated: {name} -->\n).*?(<!-- end: {name} -->)", re.DOTALL)


def missing_sections(path: Path) -> list[str]:
    text = path.read_text() if path.exists() else ""
    return [name for name in SECTIONS if not _section(name).search(text)]


def _filled(body: str) -> Callable[[re.Match[str]], str]:
    return lambda m: m.group(1) + body + "\n" + m.group(2)


def write_readme(path: Path, sections: dict[str, str]) -> None:
    """Replace each generated section of ``path`` (``missing_sections`` checked them)."""
    text = path.read_text()
    for name, body in sections.items():
        text = _section(name).sub(_filled(body), text)
    path.write_text(text)


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
    ap.add_argument(
        "--limits",
        choices=LIMIT_MODELS,
        help="declared run-time limits for every job (default: each states its run time)",
    )
    ap.add_argument(
        "--jobs", type=int, default=1, metavar="N", help="run N replays at a time (processes)"
    )
    ap.add_argument(
        "--readme",
        action="store_true",
        help="write the tables into the generated sections of benchmarks/README.md",
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
    readme = args.out / "README.md"
    if args.readme and missing_sections(readme):
        sys.exit(
            f"{readme} lacks the generated sections {', '.join(missing_sections(readme))}: "
            "add their <!-- generated: NAME --> and <!-- end: NAME --> lines"
        )
    _start_worker(args.traces, args.quick, args.limits)
    try:
        for s in SCENARIOS:
            scenario_trace(s)
    except TraceError as e:
        sys.exit(f"{e}; give the folder holding the public traces with --traces")
    fits, results = run_all(args.jobs)
    (args.out / "results").mkdir(parents=True, exist_ok=True)
    summaries = {name: r["summaries"] for name, r in results.items()}
    fitted = {
        name: {
            "whole": params_text(f.chosen_whole),
            "first_half": params_text(f.chosen_half),
            "candidates": [
                {"params": params_text(c), "whole": w.summary, "first_half": h.summary}
                for c, w, h in zip(CANDIDATES, f.whole, f.half, strict=True)
            ],
        }
        for name, f in fits.items()
    }
    (args.out / "results" / "replay.json").write_text(
        json.dumps(json_ready({**summaries, "fits": fitted}), indent=1, allow_nan=False) + "\n"
    )
    plot(results, args.out / "replay.png")
    sections = {
        "results": results_md(results),
        "eta": eta_md(results),
        "train-test": train_test_md(results, fits),
        "targets": targets_md(results),
    }
    if args.readme:
        write_readme(readme, sections)
    for body in sections.values():
        print(f"\n{body}")
    print(f"\n{time.perf_counter() - t0:.0f} s in all")


if __name__ == "__main__":
    main()
