"""The longest waits and kept promises: broker against FCFS and Slurm under declared limits.

Issue 27's constraint on every scenario: the broker starves (waits over 24 h) no more
requests than FCFS, and its longest wait is at most 1.5x FCFS's, without giving back
its mean-wait gain. This runs ``fcfs``, ``slurm`` and ``broker`` (with optional policy
parameters) per scenario of ``benchmarks/replay.py`` and limit setting, and prints the
mean wait, the longest wait and its ratio to FCFS's, the starved count, and the jobs cut
or extended at their limits. With ``--eta-every`` the broker column also measures its
start estimates against the real starts: the share of them that carry a promised start,
the share of promised starts kept, the median relative error, the 80% range's coverage
and ``squeue --start``'s median relative error on the same limits.

    python benchmarks/worst_wait.py [--scenarios openb,philly] [--policies broker]
        [--param name=value ...] [--limit N] [--limits exact,tsafrir,loose]
        [--eta-every MINUTES] [--jobs 2] [--readme]

``--limit N`` replays each trace's first N jobs (the same slice for every column);
``--limits`` gives every job a declared run-time limit from ``replay/limits.py``, one
run per model named (the baselines and ``squeue --start`` plan with it; a job past it
ends there, or asks the broker for more time); without it each job states its run time
and declares no limit. ``--readme`` writes the tables into the ``limits`` section of
``benchmarks/README.md``.
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
    _cell,
    _section,
    _start_worker,
    scenario_trace,
    write_readme,
)

from jupyter_gpubroker.broker.policy import make_policy  # noqa: E402
from jupyter_gpubroker.replay import Trace, replay, summarize  # noqa: E402
from jupyter_gpubroker.replay.limits import LIMIT_MODELS, declare  # noqa: E402

README = Path(__file__).resolve().parent / "README.md"
SECTION = "limits"
NONE = "none"
"""The limit setting where each job states its run time and declares no limit."""
Task = tuple[str, str, tuple[tuple[str, float], ...], int | None, str, float | None]
_declared: dict[tuple[str, int | None, str], Trace] = {}


def scenario_limits(s: Scenario, limit: int | None, model: str) -> Trace:
    """The scenario's trace (its first ``limit`` jobs) with ``model``'s declared limits,
    made once per process."""
    key = (s.name, limit, model)
    if key not in _declared:
        trace = scenario_trace(s)
        trace = trace.head(limit) if limit is not None else trace
        _declared[key] = trace if model == NONE else declare(trace, model)
    return _declared[key]


def run_one(task: Task) -> dict[str, Any]:
    name, policy, params, limit, model, eta_every_s = task
    s: Scenario = next(x for x in SCENARIOS if x.name == name)
    result = replay(
        scenario_limits(s, limit, model),
        make_policy(policy, **dict(params)),
        inventory=s.inventory,
        compress=s.compress,
        dynamic_mig=s.runs[0][1],
        eta_every_s=eta_every_s if policy == "broker" else None,
        eta_at_submit=False,
    )
    out = summarize(result)
    print(f"  {name} {model} {policy} {dict(params) or ''}: {result.wall_s:.0f} s", flush=True)
    return {
        "scenario": name,
        "limits": model,
        "policy": policy,
        "params": dict(params),
        "wall_s": result.wall_s,
        **{k: out.get(k) for k in ("mean_wait_s", "max_wait_s", "starved")},
        **{k: out.get(k) for k in ("cut_at_limit", "extended_at_limit", "eta")},
    }


def table(rows: list[dict[str, Any]]) -> str:
    """Mean and longest waits per scenario and limit setting, against Slurm's and FCFS's."""
    lines = [
        "| scenario | limits | policy | mean wait | / slurm's | longest wait "
        "| / fcfs's longest | starved | cut at limit | extended at limit |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    base = {(r["scenario"], r["limits"], r["policy"]): r for r in rows}
    for r in rows:
        fcfs = base.get((r["scenario"], r["limits"], "fcfs"))
        slurm = base.get((r["scenario"], r["limits"], "slurm"))
        longest = _ratio(r["max_wait_s"], fcfs and fcfs["max_wait_s"])
        mean = _ratio(r["mean_wait_s"], slurm and slurm["mean_wait_s"])
        lines.append(
            f"| {r['scenario']} | {r['limits']} | {r['policy']} | {_cell(r['mean_wait_s'], 's')} "
            f"| {mean} | {r['max_wait_s'] / 3600:,.1f} h | {longest} | {r['starved']:,} "
            f"| {_cell(r['cut_at_limit'], 'n')} | {_cell(r['extended_at_limit'], 'n')} |"
        )
    return "\n".join(lines)


def _ratio(v: float, base: float | None) -> str:
    return f"{v / base:.2f}x" if base else "-"


def eta_table(rows: list[dict[str, Any]]) -> str:
    """The broker column's start estimates per scenario and limit setting."""
    lines = [
        "| scenario | limits | estimates | with a promised start | promises kept "
        "| median relative error | 80% range covers | squeue --start's median error |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        e = (r.get("eta") or {}).get("all")
        if r["policy"] != "broker" or not e:
            continue
        lines.append(
            f"| {r['scenario']} | {r['limits']} | {_cell(e['estimates'], 'n')} "
            f"| {_cell(e['bounded'], '%')} | {_cell(e['bound_held'], '%')} "
            f"| {_cell(e['median_rel_error'], 'f')} | {_cell(e['coverage'], '%')} "
            f"| {_cell(e['squeue_median_rel_error'], 'f')} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--traces", type=Path, default=TRACES)
    ap.add_argument("--scenarios", default=",".join(TARGET_SCENARIOS))
    ap.add_argument("--policies", default="fcfs,slurm,broker")
    ap.add_argument("--param", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("--limit", type=int, metavar="N", help="the first N jobs of each trace")
    ap.add_argument(
        "--limits",
        default=NONE,
        help=f"declared run-time limits, one run each: {', '.join(LIMIT_MODELS)} (comma-separated)",
    )
    ap.add_argument(
        "--eta-every", type=float, metavar="MINUTES", help="measure the broker's start estimates"
    )
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--json", type=Path, help="also write the rows here")
    ap.add_argument("--readme", action="store_true", help=f"write the {SECTION} section of README")
    args = ap.parse_args()
    models = args.limits.split(",")
    unknown = [m for m in models if m not in (*LIMIT_MODELS, NONE)]
    if unknown:
        sys.exit(f"unknown limit model {unknown[0]!r}: choose from {', '.join(LIMIT_MODELS)}")
    if args.readme and not _section(SECTION).search(README.read_text()):
        sys.exit(f"{README} lacks its <!-- generated: {SECTION} --> and end lines")
    params: list[tuple[str, float]] = []
    for p in args.param:
        k, _, v = p.partition("=")
        params.append((k, float(v) if v.lower() != "none" else None))  # type: ignore[arg-type]
    eta_every_s = args.eta_every * 60 if args.eta_every else None
    tasks: list[Task] = [
        (name, policy, tuple(params) if policy == "broker" else (), args.limit, m, eta_every_s)
        for name in args.scenarios.split(",")
        for m in models
        for policy in args.policies.split(",")
    ]
    source = (args.traces, False, None)
    with ProcessPoolExecutor(args.jobs, initializer=_start_worker, initargs=source) as pool:
        rows = list(pool.map(run_one, tasks))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    body = table(rows) + ("\n\n" + eta_table(rows) if eta_every_s else "")
    if args.readme:
        write_readme(README, {SECTION: body})
    print(body)


if __name__ == "__main__":
    main()
