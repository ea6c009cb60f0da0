"""How far the demand forecast holds on the shared traces, each week forecast from before it.

Each trace is replayed through the real core into a state file on the replay's machine per
format (openb on ``dgx-h100-mig:64``, Philly on ``dgx-h100:768``) at its own pace (no time
compression: it would fold weeks into days), as if a broker had served it. Then
``broker.forecast`` reads that file as of the trace's last submission and backtests its
last ``--weeks`` weeks: the p50 of each hour of the week against the demand
(GPU-equivalents held and waiting) that hour had, and how often the p90 held; beside it,
the same forecast without the moves of the level (past weeks as they were).

    python benchmarks/forecast.py [--traces DIR] [--weeks 4] [--only openb] [--json]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from datetime import timezone
from pathlib import Path
from typing import Any

from jupyter_gpubroker import offline
from jupyter_gpubroker.broker.store import Store
from jupyter_gpubroker.replay import DEFAULT_INVENTORY, load, replay

TRACES = Path(__file__).resolve().parents[2] / "shared" / "data" / "traces"
FILES = {"openb": "openb_pod_list_default.csv", "philly": "philly_vc_jobs.csv"}


def backtest(fmt: str, path: Path, weeks: int) -> dict[str, Any]:
    trace = load(path, fmt)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "state.sqlite"
        store = Store(state)
        run = replay(trace, inventory=DEFAULT_INVENTORY[fmt], store=store)
        store.close()
        origin = trace.jobs[0].submit_s
        end = trace.jobs[-1].submit_s
        found = offline.forecast(state, now=end, tz=timezone.utc, weeks=8, backtest_weeks=weeks)
        plain = offline.forecast(
            state, now=end, tz=timezone.utc, weeks=8, backtest_weeks=weeks, level=False
        )
    return {
        "trace": fmt,
        "jobs": len(run.outcomes),
        "days": round((end - origin) / 86400, 1),
        "basis": found.basis,
        "message": found.message,
        "weeks": [b.to_json() for b in found.backtest],
        "weeks_without_level": [b.to_json() for b in plain.backtest],
        "wall_s": round(time.perf_counter() - t0, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--traces", type=Path, default=TRACES)
    ap.add_argument("--weeks", type=int, default=4)
    ap.add_argument("--only", choices=tuple(FILES))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    results = [
        backtest(fmt, args.traces / name, args.weeks)
        for fmt, name in FILES.items()
        if args.only in (None, fmt)
    ]
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(
        "| trace | week from | mean demand | mean error | error / demand | within p90 "
        "| without the level: error / demand | within p90 |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for r in results:
        for w, p in zip(r["weeks"], r["weeks_without_level"], strict=True):
            print(
                f"| {r['trace']} | {w['week_start'][:10]} | {w['mean_actual']:.1f} | "
                f"{w['mean_abs_error']:.1f} | {_share(w['relative_error'])} | "
                f"{w['p90_covered']:.0%} | {_share(p['relative_error'])} | {p['p90_covered']:.0%} |"
            )


def _share(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


if __name__ == "__main__":
    main()
