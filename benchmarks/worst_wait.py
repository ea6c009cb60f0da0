"""The longest waits: broker against FCFS and Slurm on the four target scenarios.

Issue 27's constraint on every scenario: the broker starves (waits over 24 h) no more
requests than FCFS, and its longest wait is at most 1.5x FCFS's, without giving back
its mean-wait gain. This runs ``fcfs``, ``slurm`` and ``broker`` (with optional policy
parameters) per scenario of ``benchmarks/replay.py`` and prints, per scenario, the
mean wait, the longest wait and its ratio to FCFS's, and the starved count.

    python benchmarks/worst_wait.py [--scenarios openb,philly] [--policies broker]
        [--param name=value ...] [--limit N] [--limits exact|tsafrir|loose] [--jobs 2]

``--limit N`` replays each trace's first N jobs (the same slice for every column);
``--limits`` gives every job a declared run-time limit from ``replay/limits.py``
(the baselines and ``squeue --start`` plan with it; a job past it ends there).
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from replay import (  # noqa: E402
    SCENARIOS,
    TARGET_SCENARIOS,
    TRACES,
    Scenario,
    _start_worker,
    scenario_trace,
)

from jupyter_gpubroker.broker.policy import make_policy  # noqa: E402
from jupyter_gpubroker.replay import replay, summarize  # noqa: E402
from jupyter_gpubroker.replay.limits import LIMIT_MODELS  # noqa: E402


def run_one(task: tuple[str, str, tuple[tuple[str, float], ...], int | None]) -> dict[str, Any]:
    name, policy, params, limit = task
    s: Scenario = next(x for x in SCENARIOS if x.name == name)
    trace = scenario_trace(s)
    if limit is not None:
        trace = trace.head(limit)
    result = replay(
        trace,
        make_policy(policy, **dict(params)),
        inventory=s.inventory,
        compress=s.compress,
        dynamic_mig=s.runs[0][1],
    )
    out = summarize(result)
    print(f"  {name} {policy} {dict(params) or ''}: {result.wall_s:.0f} s", flush=True)
    return {
        "scenario": name,
        "policy": policy,
        "params": dict(params),
        "mean_wait_s": out["mean_wait_s"],
        "max_wait_s": out["max_wait_s"],
        "starved": out["starved"],
        "cut_at_limit": out["cut_at_limit"],
    }


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| scenario | policy | mean wait | longest wait | / fcfs's longest | starved "
        "| cut at limit |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    fcfs = {r["scenario"]: r for r in rows if r["policy"] == "fcfs"}
    for r in rows:
        base = fcfs.get(r["scenario"])
        ratio = f"{r['max_wait_s'] / base['max_wait_s']:.2f}x" if base else "-"
        lines.append(
            f"| {r['scenario']} | {r['policy']} | {r['mean_wait_s']:,.0f} s | "
            f"{r['max_wait_s'] / 3600:,.1f} h | {ratio} | {r['starved']:,} | "
            f"{'-' if r['cut_at_limit'] is None else format(r['cut_at_limit'], ',')} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--traces", type=Path, default=TRACES)
    ap.add_argument("--scenarios", default=",".join(TARGET_SCENARIOS))
    ap.add_argument("--policies", default="fcfs,slurm,broker")
    ap.add_argument("--param", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("--limit", type=int, metavar="N", help="the first N jobs of each trace")
    ap.add_argument("--limits", choices=tuple(LIMIT_MODELS), help="declared run-time limits")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--json", type=Path, help="also write the rows here")
    args = ap.parse_args()
    params: list[tuple[str, float]] = []
    for p in args.param:
        k, _, v = p.partition("=")
        params.append((k, float(v) if v.lower() != "none" else None))  # type: ignore[arg-type]
    tasks = [
        (name, policy, tuple(params) if policy == "broker" else (), args.limit)
        for name in args.scenarios.split(",")
        for policy in args.policies.split(",")
    ]
    source = (args.traces, False, args.limits)
    with ProcessPoolExecutor(args.jobs, initializer=_start_worker, initargs=source) as pool:
        rows = list(pool.map(run_one, tasks))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    print(table(rows))


if __name__ == "__main__":
    main()
