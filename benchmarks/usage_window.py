"""Usage reads: the admin page's four charts and a user's total, before and after the window.

The workload: a state file (WAL, as a broker leaves it) with a year of ended leases in
its ledger (``--rows``, default 100,000, ending evenly over 365 days, one to eight GPUs or
a slice, 200 users in 20 groups) and ``--live`` leases held now (default 200, 1g.10gb
slices of a simulated dgx-h100-mig:64, granted by the real broker).

Two reads, each timed as the broker makes it (``Broker.usage``, what ``GET usage`` and
the hub's pages call):
- the admin page: usage by user, group, profile and day over its default 30 days;
- "My GPUs": one user's total over all time (no window to bound the scan).

"Before" is the accounting module of ``--before`` (default 22892cd, the last commit whose
``holdings`` read the whole ledger and then each active lease's request one by one), read
from git and run against the same store, as its ``Broker.usage`` ran it; "after" is this
checkout's ``Broker.usage``. Both return the same figures (checked). The runs alternate;
each figure is the median CPU time of ``--repeat`` runs, and the ratio is after / before.

    python benchmarks/usage_window.py [--rows 100000] [--live 200] [--repeat 7] [--json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import random
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import timezone
from pathlib import Path
from types import ModuleType
from typing import Any

from jupyter_gpubroker.broker.clock import VirtualClock
from jupyter_gpubroker.broker.core import Broker
from jupyter_gpubroker.broker.store import Store
from jupyter_gpubroker.nvml import open_backend
from jupyter_gpubroker.wire.sizes import Size

DAY = 86400.0
NOW = 1_790_000_000.0
ADMIN_BY = ("user", "group", "profile", "day")
"""The admin page's charts (``hub_spawner.pages.USAGE_BY``), over its 30 default days."""


def old_accounting(rev: str) -> ModuleType:
    """``broker/accounting.py`` as it was at ``rev``, as a module of the broker package
    (its relative imports resolve to this checkout's store, policy and errors)."""
    root = Path(__file__).resolve().parents[1]
    source = subprocess.run(
        ["git", "show", f"{rev}:jupyter_gpubroker/broker/accounting.py"],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    spec = importlib.util.spec_from_loader("jupyter_gpubroker.broker._accounting_before", None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    module.__package__ = "jupyter_gpubroker.broker"
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    exec(compile(source, f"{rev}:accounting.py", "exec"), module.__dict__)
    return module


def build(path: Path, rows: int, live: int, seed: int = 1) -> Broker:
    """The state file: ``live`` leases granted by the broker, ``rows`` ledger rows."""
    with open_backend("dgx-h100-mig:64") as backend:
        inventory = backend.inventory()
    broker = Broker(Store(path), inventory, clock=VirtualClock(NOW - 3600.0))
    for i in range(live):
        broker.submit(f"u{i % 200}", Size(profile="1g.10gb"), groups=[f"g{i % 20}"])
    broker.clock.advance(3600.0)  # type: ignore[attr-defined]
    rng = random.Random(seed)
    ledger = []
    for i in range(rows):
        end = NOW - 365 * DAY * (i + 0.5) / rows
        duration = rng.uniform(600.0, 12 * 3600.0)
        gpus = rng.choice((1 / 7, 1.0, 2.0, 4.0, 8.0))
        profile = "1g.10gb" if gpus < 1 else "gpu"
        user = rng.randrange(200)
        job_class = rng.choice(("interactive", "batch"))
        ledger.append(
            (f"l-old{i}", f"u{user}", f"g{user % 20}", profile, job_class, gpus)
            + (end - duration, end, gpus * duration / 3600.0)
        )
    conn = sqlite3.connect(path)  # foreign keys off: these leases are only in the ledger
    conn.executemany("INSERT INTO ledger VALUES (?,?,?,?,?,?,?,?,?)", ledger)
    conn.commit()
    conn.close()
    return broker


def before_usage(old: ModuleType, broker: Broker) -> Callable[..., dict[str, float]]:
    """``Broker.usage`` as ``--before`` had it: every holding, then the window."""

    def usage(since: float | None = None, by: str = "user") -> dict[str, float]:
        now = broker.clock.now()
        rows = old.holdings(broker.store, now)
        lo = since if since is not None else -math.inf
        found = old.usage(rows, since=lo, until=now, by=by, tz=timezone.utc)
        return {row.key: row.gpu_hours for row in found}

    return usage


def timed(read: Callable[[], Any]) -> float:
    """The CPU seconds ``read`` takes (this process's: the machine may be shared)."""
    start = time.process_time()
    read()
    return time.process_time() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000, help="ended leases in the ledger")
    parser.add_argument("--live", type=int, default=200, help="leases held now (at most 448)")
    parser.add_argument("--repeat", type=int, default=7, help="runs of each read, alternated")
    parser.add_argument("--before", default="22892cd", help="the commit to compare with")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        broker = build(Path(tmp) / "state.sqlite", args.rows, args.live)
        old = before_usage(old_accounting(args.before), broker)
        since = broker.clock.now() - 30 * DAY
        reads: dict[str, dict[str, Callable[[], Any]]] = {
            "admin page (4 groupings, 30 days)": {
                "before": lambda: [old(since, by) for by in ADMIN_BY],
                "after": lambda: [broker.usage(since, None, by) for by in ADMIN_BY],
            },
            "a user's total (all time)": {
                "before": lambda: old(None, "user"),
                "after": lambda: broker.usage(None, None, "user"),
            },
        }
        results = {}
        for name, ways in reads.items():
            got = {way: read() for way, read in ways.items()}
            assert _same(got["before"], got["after"]), f"{name}: the figures differ"
            times: dict[str, list[float]] = {way: [] for way in ways}
            for _ in range(args.repeat):
                for way, read in ways.items():
                    times[way].append(timed(read))
            before, after = (statistics.median(times[w]) for w in ("before", "after"))
            results[name] = {
                "before_cpu_ms": round(before * 1000, 2),
                "after_cpu_ms": round(after * 1000, 2),
                "after_over_before": round(after / before, 4),
            }
        broker.store.close()
    report = {"rows": args.rows, "live": args.live, "before": args.before, "reads": results}
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"{args.rows:,} ledger rows, {args.live} live leases; before = {args.before}")
        for name, r in results.items():
            print(
                f"{name}: {r['before_cpu_ms']:.1f} -> {r['after_cpu_ms']:.1f} CPU ms "
                f"(after / before {r['after_over_before']:.3f})"
            )
    return 0


def _same(a: Any, b: Any) -> bool:
    """The same keys and GPU-hours (to float rounding: the rows are summed in another order)."""
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a.keys() == b.keys() and all(math.isclose(a[k], b[k], rel_tol=1e-9) for k in a)


if __name__ == "__main__":
    sys.exit(main())
