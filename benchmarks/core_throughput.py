"""Grant decisions per second of the broker core with a deep queue.

Default workload: the ``dgx-h100-mig`` preset scaled to 64 GPUs (448
``1g.10gb`` slices, simulated NVML through the real backend), every slice
held, 10,000 requests waiting from 50 users in 5 groups, both job classes.
Each cycle a random lease is released and one scheduling pass grants the
freed slice. A *decision* is that pass (rank, fit, place, commit the grant to
the SQLite file); the release is timed apart.

``--cluster``: a cluster-sized inventory, 1,024 nodes of 8 H100s, one node in
8 in MIG mode with 7 x ``1g.10gb`` per GPU (7,168 whole GPUs and 7,168
slices), built from the inventory types with ``Gpu.node``/``Device.node`` set
as an engine's view does. 100,000 requests wait after the cluster is filled:
``1g.10gb``, 1, 2, 4 or 8 whole GPUs (on one node), both classes, 2,000
users in 100 groups, each with an expected duration (10 min to 12 h), so
EASY reservations and backfill are in play. Each cycle releases a random
lease and runs one pass; a pass may grant several requests, or none when the
freed devices are reserved for the top blocked request. Decisions per second
count passes; grants per second count the grants those passes made.

Baseline, measured in the same run on the same state file (as large as the
queue makes it): the bare durable write of a grant (the same SQL in one
transaction, no scheduling), so the figure that matters is the ratio: what the
scheduler adds on top of the write it must make anyway. The CPU time per
decision (``time.process_time``) is reported too: the machines here are shared,
and a pass preempted by another process costs wall time, not CPU. Memory: the
process's resident set grown while the broker was built and filled
(``/proc/self/statm``).

``--shares``: 1,024 shared GPUs without MIG (128 nodes of 8 L40S 48 GB, lent as
``shared``), filled with shares of 2 to 24 GB, then 10,000 more shares waiting (2,000
users in 100 groups, both classes, 10 min to 12 h stated durations). Each cycle releases
a random share and runs one pass: the freed memory goes to the waiting shares that fit,
best fit, with the top blocked share's reservation and backfill in play.

``--without-writes``: after setup, the state file's statements and transactions
are no-ops (the bare write is then timed on a file of its own): what the
pure-Python pass costs, a bound on what any faster write could give.

    python benchmarks/core_throughput.py [--cluster | --shares] [--cycles N] [--queued N]
        [--without-writes] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from jupyter_gpubroker.broker.core import Broker, BrokerConfig
from jupyter_gpubroker.broker.models import Device, Gpu, Inventory, JobClass, Lease, Request
from jupyter_gpubroker.broker.sharing import Sharing
from jupyter_gpubroker.broker.store import Store
from jupyter_gpubroker.nvml import open_backend
from jupyter_gpubroker.wire.profiles import CATALOG
from jupyter_gpubroker.wire.sizes import Size

CLUSTER_SIZES = (
    (Size(profile="1g.10gb"), 0.45),
    (Size(gpus=1), 0.25),
    (Size(gpus=2), 0.13),
    (Size(gpus=4), 0.11),
    (Size(gpus=8), 0.06),
)
DURATIONS_S = (600.0, 1800.0, 3600.0, 4 * 3600.0, 12 * 3600.0)
SHARE_SIZES = (
    (Size(share_gb=2), 0.2),
    (Size(share_gb=4), 0.25),
    (Size(share_gb=8), 0.25),
    (Size(share_gb=12), 0.1),
    (Size(share_gb=16), 0.1),
    (Size(share_gb=24), 0.1),
)


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def rss_mib() -> float:
    """The process's resident set now, in MiB."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def cluster_inventory(nodes: int, gpus_per_node: int = 8, mig_every: int = 8) -> Inventory:
    """``nodes`` nodes of H100s; every ``mig_every``-th node's GPUs cut 7 x 1g.10gb."""
    model = CATALOG["H100-80GB"]
    slice_ = model.profile("1g.10gb")
    assert slice_ is not None
    gpus: list[Gpu] = []
    devices: list[Device] = []
    for n in range(nodes):
        node = f"node{n:04d}"
        mig = n % mig_every == mig_every - 1
        for i in range(gpus_per_node):
            uuid = f"GPU-{node}-{i}"
            gpus.append(
                Gpu(i, uuid, model.nvml_names[0], model.memory_mib, mig, model.key, node=node)
            )
            if not mig:
                devices.append(Device(uuid, "gpu", i, uuid, model.memory_mib, node=node))
                continue
            for start in range(7):
                devices.append(
                    Device(
                        f"MIG-{node}-{i}-{start}",
                        "mig",
                        i,
                        uuid,
                        slice_.memory_mib,
                        slice_.compute_slices,
                        slice_.name,
                        start,
                        start + 1,
                        0,
                        node=node,
                    )
                )
    return Inventory(tuple(gpus), tuple(devices))


def shared_inventory(nodes: int = 128, gpus_per_node: int = 8) -> Inventory:
    """``nodes`` nodes of L40S GPUs (MIG-less), as an engine's view names them."""
    model = CATALOG["L40S-48GB"]
    gpus, devices = [], []
    for n in range(nodes):
        node = f"node{n:04d}"
        for i in range(gpus_per_node):
            uuid = f"GPU-{node}-{i}"
            gpus.append(
                Gpu(i, uuid, model.nvml_names[0], model.memory_mib, False, model.key, node=node)
            )
            devices.append(Device(uuid, "gpu", i, uuid, model.memory_mib, node=node))
    return Inventory(tuple(gpus), tuple(devices))


def _without_writes(store: Store) -> None:
    """Make the state file's statements of a grant and a release no-ops: what the pass
    costs without its durable write (a bound, never how the broker runs)."""
    for name in ("insert_lease", "end_lease", "end_request"):  # all a cycle writes
        setattr(store, name, lambda *args, **kwargs: None)
    store.transaction = contextlib.nullcontext  # type: ignore[method-assign,assignment]


def run(
    cycles: int,
    queued: int,
    seed: int,
    cluster: bool = False,
    writes: bool = True,
    shares: bool = False,
) -> dict[str, float]:
    rng = random.Random(seed)
    rss0 = rss_mib()
    backend = None
    config = BrokerConfig()
    if shares:
        inventory = shared_inventory()
        config = BrokerConfig(sharing=Sharing("shared"))
        sizes, weights = zip(*SHARE_SIZES, strict=True)
    elif cluster:
        inventory = cluster_inventory(1024)
    else:
        backend = open_backend("dgx-h100-mig:64")
        inventory = backend.inventory()
    slices = len(inventory.devices)
    if not shares:
        sizes, weights = zip(*CLUSTER_SIZES, strict=True)
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "state.sqlite")
        broker = Broker(store, inventory, config=config)

        def tenant_request(schedule: bool) -> None:
            """One of 2,000 users' requests, of the sizes drawn."""
            user = rng.randrange(2000)
            broker.submit(
                f"user{user}",
                rng.choices(sizes, weights)[0],
                groups=[f"group{user % 100}"],
                job_class=rng.choice(("interactive", "batch")),
                expected_duration_s=rng.choice(DURATIONS_S),
                schedule=schedule,
            )

        for _ in range(slices + queued):
            if cluster or shares:
                tenant_request(schedule=False)
                continue
            broker.submit(
                f"user{rng.randrange(50)}",
                Size(profile="1g.10gb"),
                groups=[f"group{rng.randrange(5)}"],
                job_class=rng.choice(("interactive", "batch")),
                schedule=False,
            )
        while broker.schedule():  # one pass examines a bounded number of blocked requests
            pass
        while shares and len(broker.live_requests()) - len(broker.leases()) < queued:
            # shares of 9 GB on average: about 5 a GPU; more until ``queued`` wait
            tenant_request(schedule=True)
        if not cluster and not shares:
            assert len(broker.leases()) == slices, "the first pass must fill every slice"
        setup_rss = rss_mib() - rss0
        waiting = len(broker.live_requests()) - len(broker.leases())
        if not writes:
            _without_writes(store)

        decide: list[float] = []
        cpu: list[float] = []
        release: list[float] = []
        grants = 0
        for _ in range(cycles):
            leases = broker.leases()
            victim = leases[rng.randrange(len(leases))]
            t0 = time.perf_counter()
            broker.release(victim.id, schedule=False)
            t1, c1 = time.perf_counter(), time.process_time()
            granted = broker.schedule()
            t2, c2 = time.perf_counter(), time.process_time()
            cpu.append(c2 - c1)
            assert cluster or shares or len(granted) == 1
            grants += len(granted)
            release.append(t1 - t0)
            decide.append(t2 - t1)

        write = _bare_grant_writes(
            Store(Path(tmp) / "bare.sqlite") if not writes else store, broker.leases()[0], cycles
        )
    if backend is not None:
        backend.close()
    return {
        "devices": slices,
        "leases": len(broker.leases()),
        "queued": waiting,
        "cycles": cycles,
        "grants": grants,
        "decisions_per_s": cycles / sum(decide),
        "grants_per_s": grants / sum(decide),
        "p50_ms": percentile(decide, 0.5) * 1e3,
        "p99_ms": percentile(decide, 0.99) * 1e3,
        "max_ms": max(decide) * 1e3,
        "cpu_ms_per_decision": sum(cpu) / cycles * 1e3,
        "release_p50_ms": percentile(release, 0.5) * 1e3,
        "bare_write_p50_ms": statistics.median(write) * 1e3,
        "decision_over_bare_write": statistics.median(decide) / statistics.median(write),
        "broker_rss_mib": setup_rss,
    }


def _bare_grant_writes(store: Store, template: Lease, n: int) -> list[float]:
    """The grant's SQL alone (one transaction per grant) on the broker's own file."""
    requests = [
        Request(f"bare-r{i}", "user", (), Size(profile="1g.10gb"), JobClass.BATCH, 0.0)
        for i in range(n)
    ]
    seq = store.next_seq()
    with store.transaction():
        for i, r in enumerate(requests):
            store.insert_request(r, seq + i)
    times = []
    for i, r in enumerate(requests):
        lease = replace(template, id=f"bare-l{i}", request_id=r.id, devices=(f"bare-dev{i}",))
        t0 = time.perf_counter()
        with store.transaction():
            store.insert_lease(lease, lease.expires_at, 1 << 30)  # a share's: room to spare
        times.append(time.perf_counter() - t0)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--cluster", action="store_true", help="1,024 nodes of 8 GPUs, 100,000 mixed requests"
    )
    ap.add_argument(
        "--shares",
        action="store_true",
        help="1,024 shared L40S GPUs, full of shares, 10,000 more shares waiting",
    )
    ap.add_argument("--cycles", type=int, default=5000)
    ap.add_argument(
        "--queued", type=int, help="requests beyond capacity (10,000; --cluster 100,000)"
    )
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--without-writes",
        action="store_true",
        help="make the state file's writes no-ops after setup: the pure-Python pass, a bound",
    )
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()
    queued = args.queued if args.queued is not None else 100_000 if args.cluster else 10_000
    if args.cycles < 1 or queued < args.cycles:
        ap.error("--cycles must be >= 1 and --queued >= --cycles (each cycle grants one request)")
    result = run(
        args.cycles,
        queued,
        args.seed,
        args.cluster,
        writes=not args.without_writes,
        shares=args.shares,
    )
    if args.json:
        print(json.dumps(result))
        return
    print(f"{result['devices']} devices, {result['queued']} queued, {result['cycles']} cycles")
    print(f"grant decisions/s      {result['decisions_per_s']:10.0f}")
    if args.cluster or args.shares:
        print(f"grants/s               {result['grants_per_s']:10.0f}  ({result['grants']} grants)")
    print(f"decision p50 / p99 ms  {result['p50_ms']:10.3f} / {result['p99_ms']:.3f}")
    print(f"decision max ms        {result['max_ms']:10.3f}")
    print(f"CPU ms per decision    {result['cpu_ms_per_decision']:10.3f}")
    print(f"release p50 ms         {result['release_p50_ms']:10.3f}")
    print(f"bare grant write p50 ms {result['bare_write_p50_ms']:9.3f}")
    print(f"decision / bare write  {result['decision_over_bare_write']:10.2f}x")
    print(f"broker memory (RSS)    {result['broker_rss_mib']:10.0f} MiB")


if __name__ == "__main__":
    main()
