"""Grant decisions per second of the broker core with a deep queue.

Workload: the ``dgx-h100-mig`` preset scaled to 64 GPUs (448 ``1g.10gb``
slices, simulated NVML through the real backend), every slice held, 10,000
requests waiting from 50 users in 5 groups, both job classes. Each cycle a
random lease is released and one scheduling pass grants the freed slice. A
*decision* is that pass (rank, fit, place, commit the grant to the SQLite
file); the release is timed apart.

Baseline, measured in the same run on the same file: the bare durable write
of a grant (the same SQL in one transaction, no scheduling), so the figure
that matters is the ratio: what the scheduler adds on top of the write it
must make anyway.

    python benchmarks/core_throughput.py [--cycles 5000] [--queued 10000] [--json]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from jupyter_gpubroker.broker.core import Broker
from jupyter_gpubroker.broker.models import JobClass, Lease, Request, Size
from jupyter_gpubroker.broker.store import Store
from jupyter_gpubroker.nvml import open_backend


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def run(cycles: int, queued: int, seed: int) -> dict[str, float]:
    rng = random.Random(seed)
    backend = open_backend("dgx-h100-mig:64")
    inventory = backend.inventory()
    slices = len(inventory.devices)
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "state.sqlite")
        broker = Broker(store, inventory)
        for _ in range(slices + queued):
            broker.submit(
                f"user{rng.randrange(50)}",
                Size(profile="1g.10gb"),
                groups=[f"group{rng.randrange(5)}"],
                job_class=rng.choice(("interactive", "batch")),
                schedule=False,
            )
        broker.schedule()
        assert len(broker.leases()) == slices, "the first pass must fill every slice"

        decide: list[float] = []
        release: list[float] = []
        for _ in range(cycles):
            leases = broker.leases()
            victim = leases[rng.randrange(len(leases))]
            t0 = time.perf_counter()
            broker.release(victim.id, schedule=False)
            t1 = time.perf_counter()
            granted = broker.schedule()
            t2 = time.perf_counter()
            assert len(granted) == 1
            release.append(t1 - t0)
            decide.append(t2 - t1)

        write = _bare_grant_writes(Path(tmp) / "bare.sqlite", broker.leases()[0], cycles)
    backend.close()
    return {
        "slices": slices,
        "queued": queued,
        "cycles": cycles,
        "decisions_per_s": cycles / sum(decide),
        "p50_ms": percentile(decide, 0.5) * 1e3,
        "p99_ms": percentile(decide, 0.99) * 1e3,
        "max_ms": max(decide) * 1e3,
        "release_p50_ms": percentile(release, 0.5) * 1e3,
        "bare_write_p50_ms": statistics.median(write) * 1e3,
        "decision_over_bare_write": statistics.median(decide) / statistics.median(write),
    }


def _bare_grant_writes(path: Path, template: Lease, n: int) -> list[float]:
    """The grant's SQL alone (one transaction per grant) on a fresh file."""
    store = Store(path)
    requests = [
        Request(f"r{i}", "user", (), Size(profile="1g.10gb"), JobClass.BATCH, 0.0) for i in range(n)
    ]
    with store.transaction():
        for i, r in enumerate(requests):
            store.insert_request(r, i + 1)
    times = []
    for i, r in enumerate(requests):
        lease = replace(template, id=f"l{i}", request_id=r.id, devices=(f"dev{i}",))
        t0 = time.perf_counter()
        with store.transaction():
            store.insert_lease(lease, lease.expires_at)
        times.append(time.perf_counter() - t0)
    store.close()
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--cycles", type=int, default=5000)
    ap.add_argument("--queued", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()
    if args.cycles < 1 or args.queued < args.cycles:
        ap.error("--cycles must be >= 1 and --queued >= --cycles (each cycle grants one request)")
    result = run(args.cycles, args.queued, args.seed)
    if args.json:
        print(json.dumps(result))
        return
    print(f"{result['slices']} slices, {result['queued']} queued, {result['cycles']} cycles")
    print(f"grant decisions/s      {result['decisions_per_s']:10.0f}")
    print(f"decision p50 / p99 ms  {result['p50_ms']:10.3f} / {result['p99_ms']:.3f}")
    print(f"decision max ms        {result['max_ms']:10.3f}")
    print(f"release p50 ms         {result['release_p50_ms']:10.3f}")
    print(f"bare grant write p50 ms {result['bare_write_p50_ms']:9.3f}")
    print(f"decision / bare write  {result['decision_over_bare_write']:10.2f}x")


if __name__ == "__main__":
    main()
