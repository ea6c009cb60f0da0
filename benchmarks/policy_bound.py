"""How far better run-time prediction could take the broker policy, and where its
ranking itself stops.

``replay.py``'s ``oracle`` ranks by each job's true GPU-time and nothing else, so it
bounds what ordering can do, not what the broker's ranking (fair share, class
weights, expected service, the oldest-first tier) can do. This script replays the
broker's own ranking twice over a grid of its two main weights: as deployed (the
run-time predictor's median of past holds), and with the predictor replaced by each
job's true duration (``BrokerTrue``; the replay gives every request its true duration
as ``expected_duration_s``, which the deployed policy uses only for backfill). On each
of issue 13's scenarios it reports, against ``slurm`` and ``fcfs`` of the same run,
the defaults and the best grid point that keeps Jain's index >= slurm's and starves
no more than FCFS. The grid is chosen per scenario, in-sample: it flatters both
columns, which is what a bound should do.

    python benchmarks/policy_bound.py [--jobs N] [--traces DIR] [SCENARIO ...]

prints two markdown tables: the bound per scenario (``benchmarks/README.md``, "What
better prediction could reach") and every grid point (``notes-policy.md``).
"""

from __future__ import annotations

import argparse
import itertools
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jupyter_gpubroker.broker.models import Request
from jupyter_gpubroker.broker.policy import BrokerPolicy, Context, make_policy
from jupyter_gpubroker.replay import replay, summarize

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from replay import (  # noqa: E402
    SCENARIOS,
    TARGET_SCENARIOS,
    TRACES,
    _start_worker,
    scenario_trace,
)

Params = tuple[tuple[str, float], ...]
"""A grid point: (parameter, value) of the fair-share and the service weight."""
Got = dict[tuple[str, str, Params], tuple[float, float, int]]

FAIRSHARE = (300.0, 1000.0, 3000.0)
SERVICE = (1000.0, 3000.0, 10000.0)
GRID: tuple[Params, ...] = tuple(
    (("weight_fairshare", f), ("weight_service", s))
    for f, s in itertools.product(FAIRSHARE, SERVICE)
)
"""The weights tried; the defaults are one of them."""
DEFAULTS: Params = (
    ("weight_fairshare", BrokerPolicy.weight_fairshare),
    ("weight_service", BrokerPolicy.weight_service),
)


class _TrueHolds:
    """The broker's context, but a request's expected GPU-hours are its true ones."""

    def __init__(self, ctx: Any) -> None:
        self._ctx = ctx
        self._total = ctx.placer.total_gpu_equivalents  # ctx is the replay's Broker

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ctx, name)

    def expected_gpu_hours(self, request: Request) -> float:
        gpu_eq = self._ctx.size_fraction(request) * self._total
        return gpu_eq * (request.expected_duration_s or 0.0) / 3600.0


@dataclass
class BrokerTrue(BrokerPolicy):
    """The broker policy with perfect run-time prediction (no deployable policy has it)."""

    name: str = "broker, true run times"

    def ranker(self, ctx: Context, now: float) -> Any:
        return super().ranker(_TrueHolds(ctx), now)  # type: ignore[arg-type]


def run(task: tuple[str, str, Params]) -> tuple[Any, ...]:
    """One replay: (scenario, column, params) -> its mean wait, Jain's index, starved."""
    name, column, params = task
    s = next(s for s in SCENARIOS if s.name == name)
    trace = scenario_trace(s)
    policy = BrokerTrue(**dict(params)) if column == "true" else make_policy(column, **dict(params))
    out = summarize(replay(trace, policy, inventory=s.inventory, compress=s.compress))
    print(f"  {name} {column} {dict(params) or ''}: {out['wall_s']:.1f} s", file=sys.stderr)
    return name, column, params, out["mean_wait_s"], out["jain"], out["starved"]


def _got(rows: list[tuple[Any, ...]]) -> Got:
    return {(n, c, p): (w, j, st) for n, c, p, w, j, st in rows}


def _weights(params: Params) -> str:
    """The fair-share and service weights, as "1000/3000"."""
    return "/".join(f"{v:g}" for _, v in params)


def _cell(got: Got, n: str, column: str, params: Params) -> str:
    """Mean wait over slurm's, Jain's index, starved."""
    w, j, st = got[(n, column, params)]
    return f"{w / got[(n, 'slurm', ())][0]:.2f}x, {j:.4f}, {st:,}"


def grid(rows: list[tuple[Any, ...]], names: list[str]) -> str:
    """Every grid point of every scenario, as markdown."""
    got = _got(rows)
    lines = [
        "| scenario | fair share / service weight | broker | broker, true run times |",
        "|---|---|---|---|",
    ]
    for n in names:
        for p in GRID:
            cells = [_weights(p), _cell(got, n, "broker", p), _cell(got, n, "true", p)]
            lines.append(f"| {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def table(rows: list[tuple[Any, ...]], names: list[str]) -> str:
    """The bound per scenario, as markdown."""
    got = _got(rows)

    def best(n: str, column: str) -> str:
        slurm, fcfs = got[(n, "slurm", ())], got[(n, "fcfs", ())]
        ok = [
            (got[(n, column, p)][0], p)
            for p in GRID
            if got[(n, column, p)][1] >= slurm[1] and got[(n, column, p)][2] <= fcfs[2]
        ]
        if not ok:
            return "none"
        w, p = min(ok)
        return f"{w / slurm[0]:.2f}x ({_weights(p)})"

    lines = [
        "| scenario | slurm: mean wait, Jain | fcfs starved "
        "| broker | broker, true run times "
        "| best with Jain >= slurm's, starved <= fcfs's: broker "
        "| ... broker, true run times |",
        "|---|---|---:|---|---|---|---|",
    ]
    for n in names:
        sw, sj, _ = got[(n, "slurm", ())]
        lines.append(
            f"| {n} | {sw:,.0f} s, {sj:.4f} | {got[(n, 'fcfs', ())][2]:,} "
            f"| {_cell(got, n, 'broker', DEFAULTS)} | {_cell(got, n, 'true', DEFAULTS)} "
            f"| {best(n, 'broker')} | {best(n, 'true')} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("scenarios", nargs="*", default=list(TARGET_SCENARIOS))
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--traces", type=Path, default=TRACES)
    args = ap.parse_args()
    unknown = set(args.scenarios) - {s.name for s in SCENARIOS}
    if unknown:
        ap.error(f"unknown scenario(s): {', '.join(sorted(unknown))}")
    if not (args.traces / "openb_pod_list_default.csv").exists():
        ap.error(f"no traces in {args.traces} (pass --traces DIR)")
    tasks = [
        (n, c, p)
        for n in args.scenarios
        for c, p in [
            ("fcfs", ()),
            ("slurm", ()),
            *((c, p) for c in ("broker", "true") for p in GRID),
        ]
    ]
    with ProcessPoolExecutor(
        args.jobs, initializer=_start_worker, initargs=(args.traces, False)
    ) as ex:
        rows = list(ex.map(run, tasks))
    print(table(rows, args.scenarios), grid(rows, args.scenarios), sep="\n\n")


if __name__ == "__main__":
    main()
