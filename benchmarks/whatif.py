"""What-if speed: a month of a 64-GPU hub's own history replayed from its state file.

The workload: a synthetic month of notebook requests on ``dgx-h100-mig:64`` (a generator,
seeded: weekday office hours busy, nights and weekends quiet; MIG slices of one to three
compute slices and whole GPUs; holds log-normal around 90 minutes; 48 users in 6 groups;
no request states its run time, as a kernel's does not). The real core plays it once into
a state file (the "live" month, a file store as the broker keeps), with the machine
recorded as the running broker records it. Each lease is then given busy spans as a
running broker's idle reclaim records them (``busy``, synthetic and seeded: a first cell
at the grant, then cells of about 10 minutes between idle gaps of about 15, none past the
hold). Then ``whatif`` reads that file and replays it: as it was, with 8 GPUs more, and
with an idle timeout of 10 minutes (the rest of an idle-reclaimed lease's work asks again).

Timed (wall clock, the median of ``--repeat``): the baseline, the driver's plain replay of
the same trace in memory (what ``benchmarks/replay.py`` measures), and the what-if from the
file (reading it, rebuilding the machine and the jobs, replaying). The ratio is what-if /
baseline; the issue's bound is 60 s for the month. The unvaried what-if's waits and
GPU-hours are checked against the live month's (within 1%). The forecast of the same file
is backtested on its last two weeks (each from the weeks before it).

    python benchmarks/whatif.py [--days 30] [--gpus 64] [--repeat 3] [--json]

``--idle-timeout S`` is the varied timeout (default 600 s; the file's grace, 600 s, on top).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from jupyter_gpubroker import offline
from jupyter_gpubroker.broker.models import JobClass
from jupyter_gpubroker.broker.recorded import machine, record_machine
from jupyter_gpubroker.broker.store import Store
from jupyter_gpubroker.nvml import open_backend
from jupyter_gpubroker.replay import replay
from jupyter_gpubroker.replay.traces import Job, Trace
from jupyter_gpubroker.replay.whatif import Variation, compare, history

START = datetime(2026, 3, 2, tzinfo=timezone.utc).timestamp()  # a Monday
IDLE_FIGURES = ("requests", "mean_wait_s", "gpu_hours_held", "held_over_used", "kernels_lost")
SIZES = ((1 / 7, 0.5), (2 / 7, 0.2), (3 / 7, 0.15), (1.0, 0.15))
"""(GPUs, share of requests): slices of 1, 2 and 3 compute slices, and whole GPUs."""


def rate_per_hour(t: float, gpus: int) -> float:
    """Arrivals per hour at ``t``: office hours on weekdays ask a little more than the GPUs hold."""
    when = datetime.fromtimestamp(t, timezone.utc)
    scale = gpus / 64
    if when.weekday() >= 5:
        return 5 * scale
    return (85 if 8 <= when.hour < 18 else 10) * scale


def month(days: int, gpus: int, seed: int = 0) -> Trace:
    rng = random.Random(seed)
    jobs = []
    t = START
    while True:
        t += rng.expovariate(rate_per_hour(t, gpus) / 3600)
        if t >= START + days * 86400:
            break
        size = rng.choices([s for s, _ in SIZES], [w for _, w in SIZES])[0]
        hold = min(rng.lognormvariate(math.log(5400), 1.0), 12 * 3600)
        user = rng.randrange(48)
        jobs.append(
            Job(
                t,
                hold,
                size,
                f"u{user:02d}",
                f"g{user % 6}",
                JobClass.INTERACTIVE,
                states_duration=False,
            )
        )
    return Trace(f"synthetic {days}-day month", tuple(jobs))


def live(trace: Trace, inventory: str, path: Path) -> dict[str, float]:
    """The month through the core into a state file; its waits and GPU-hours."""
    with open_backend(inventory) as backend:
        gpus = machine(backend.inventory())
    store = Store(path)
    with store.transaction():
        record_machine(store, trace.jobs[0].submit_s, gpus, {"dynamic_mig": True})
    run = replay(trace, inventory=inventory, store=store)
    store.close()
    waits = [o.wait_s for o in run.outcomes]
    held = sum(o.gpu_equivalents * (o.end_s - o.start_s) for o in run.outcomes) / 3600
    return {"requests": len(waits), "mean_wait_s": statistics.fmean(waits), "gpu_hours": held}


def busy_spans(path: Path, seed: int = 0) -> None:
    """Give every lease of the file busy spans, as the broker's idle reclaim records them."""
    rng = random.Random(seed)
    store = Store(path)
    leases = store.conn.execute("SELECT id, granted_at, ended_at FROM leases").fetchall()
    rows = []
    for lease_id, start, end in leases:
        spans, t = [], start
        while t < end:
            b = min(t + rng.expovariate(1 / 600), end)
            spans.append([round(t, 1), round(b, 1)])
            t = b + rng.expovariate(1 / 900)
        rows.append((json.dumps(spans), lease_id))
    with store.transaction() as c:
        c.executemany("UPDATE leases SET busy=? WHERE id=?", rows)
    store.close()


def timed(fn: Any, repeat: int) -> tuple[float, Any]:
    walls, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        walls.append(time.perf_counter() - t0)
    return statistics.median(walls), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--days", type=int, default=30)
    ap.add_argument("--gpus", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--idle-timeout", type=float, default=600.0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    inventory = f"dgx-h100-mig:{args.gpus}"
    trace = month(args.days, args.gpus)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "state.sqlite"
        t0 = time.perf_counter()
        truth = live(trace, inventory, path)
        live_s = time.perf_counter() - t0
        busy_spans(path)
        base_s, _ = timed(lambda: replay(trace, inventory=inventory), args.repeat)
        now = START + args.days * 86400 + 86400
        whatif_s, found = timed(lambda: compare(history(path, now), Variation()), args.repeat)
        more_s, more = timed(lambda: compare(history(path, now), Variation(gpus=8)), 1)
        idle = Variation(idle_timeout=args.idle_timeout)
        idle_s, shorter = timed(lambda: compare(history(path, now), idle), 1)
        end = START + args.days * 86400  # the forecast as of the month's end
        ahead = offline.forecast(path, now=end, tz=timezone.utc, weeks=8, backtest_weeks=2)
    same = found["replayed"]
    result = {
        "requests": len(trace.jobs),
        "days": args.days,
        "inventory": inventory,
        "live_write_s": round(live_s, 2),
        "baseline_replay_s": round(base_s, 2),
        "whatif_s": round(whatif_s, 2),
        "ratio_whatif_over_baseline": round(whatif_s / base_s, 2),
        "whatif_plus_8_gpus_s": round(more_s, 2),
        "speed_x_real_time": round(args.days * 86400 / whatif_s),
        "live": truth,
        "whatif_unvaried": {k: same[k] for k in ("requests", "mean_wait_s", "gpu_hours_held")},
        "wait_within_1pct": math.isclose(same["mean_wait_s"], truth["mean_wait_s"], rel_tol=0.01),
        "plus_8_gpus": {k: more["what_if"][k] for k in ("mean_wait_s", "p95_wait_s")},
        "whatif_idle_timeout_s": round(idle_s, 2),
        "idle_timeout": {
            run: {k: shorter[run][k] for k in IDLE_FIGURES} for run in ("replayed", "what_if")
        },
        "forecast_backtest": [b.to_json() for b in ahead.backtest],
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for k, v in result.items():
        print(f"{k}: {v}")


if __name__ == "__main__":
    main()
