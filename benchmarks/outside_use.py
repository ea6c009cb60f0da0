"""The sampling pass with and without matching NVML's processes to the leases.

A broker on a simulated machine of 64 whole H100s (``dgx-h100:64``: 64 grantable
devices) runs its real sampling pass (``Sampler.sample``: read every GPU through the
simulated NVML, record the samples, judge health, alerts and idle reclaim) while 500 real
OS processes are listed on the GPUs: 48 leases, each held by a real shell ("the kernel",
whose pid its renewal reports) with 10 children on its GPU, half of the kernels running
as ``nobody`` under a lease of another user (so they are matched by ancestry, not by
owner), and 20 processes ``nobody`` started on the 16 free GPUs (outside use). The
baseline is today's pass: the same sampler with the matching off
(``sampler.outside = None``), measured in the same run, passes alternating.

    python benchmarks/outside_use.py [--passes 40] [--json FILE]   (as root)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from traitlets.config import Config

from jupyter_gpubroker.monitor.outside import ProcessTable
from jupyter_gpubroker.runtime import GPUBroker
from jupyter_gpubroker.wire.sizes import Size

NOBODY = 65534
LEASES, CHILDREN, STRAYS = 48, 10, 20


def kernel(user: int | None) -> tuple[subprocess.Popen[bytes], list[int]]:
    """A shell with ``CHILDREN`` sleeping children; (it, their pids)."""
    script = f"for i in $(seq {CHILDREN}); do sleep 600 & echo $!; done; wait"
    sh = subprocess.Popen(["/bin/sh", "-c", script], user=user, stdout=subprocess.PIPE)
    assert sh.stdout is not None
    return sh, [int(sh.stdout.readline()) for _ in range(CHILDREN)]


def run(passes: int) -> dict[str, Any]:
    top = Path(tempfile.mkdtemp(prefix="outside-bench-"))
    c = Config()
    c.GPUBroker.simulate = "dgx-h100:64"
    c.GPUBroker.state_file = str(top / "state.sqlite")
    c.GPUBroker.gpu_lock_dir = str(top / "locks")
    c.GPUBroker.user_gpu_lock_dir = str(top / "user-locks")
    c.GPUBroker.lease_ttl = 3600.0
    rt = GPUBroker(config=c)
    rt.start()
    started: list[subprocess.Popen[bytes]] = []
    children: list[int] = []
    try:
        sim, sampler = rt.backend.simulator, rt.sampler  # type: ignore[union-attr]
        assert sim is not None and sampler is not None and sampler.outside is not None
        watch = sampler.outside
        listed = 0
        for i in range(LEASES):
            lease = rt.core.lease(rt.core.submit(f"user{i}", Size(gpus=1)).lease_id)
            sh, mine = kernel(NOBODY if i % 2 else None)
            started.append(sh)
            children += mine
            watch.holder_pids[lease.id] = sh.pid
            for pid in mine:
                sim.add_process(lease.devices[0], pid, 100, follow=True)
                listed += 1
        held = {d for x in rt.core.leases() for d in x.devices}
        free = [d.uuid for d in rt.core.inventory.devices if d.uuid not in held]
        for i in range(STRAYS):
            p = subprocess.Popen(["sleep", "600"], user=NOBODY)
            started.append(p)
            sim.add_process(free[i % len(free)], p.pid, 100, follow=True)
            listed += 1
        on: list[float] = []
        off: list[float] = []
        for _ in range(3):  # warm both paths
            sampler.sample()
        for i in range(2 * passes):
            sampler.outside = watch if i % 2 == 0 else None
            t0 = time.perf_counter()
            sampler.sample()
            (on if i % 2 == 0 else off).append(time.perf_counter() - t0)
        sampler.outside = watch
        seen = sum(len(v) for v in watch.now_seen().values())
        pids = [p.pid for r in sampler.latest.values() for p in r.processes]
        t0 = time.perf_counter()
        for _ in range(passes):
            procs = ProcessTable().read(pids)
        first_read_s = (time.perf_counter() - t0) / passes
        t0 = time.perf_counter()
        for _ in range(passes):
            procs = watch.processes.read(pids)
        proc_read_s = (time.perf_counter() - t0) / passes
        readings = sampler.latest
        t0 = time.perf_counter()
        for _ in range(passes):
            watch.step(readings, procs)
        match_s = (time.perf_counter() - t0) / passes
        return {
            "devices": len(rt.core.inventory.devices),
            "processes": listed,
            "outside_seen": seen,
            "passes": passes,
            "pass_without_matching_ms": statistics.median(off) * 1000,
            "pass_with_matching_ms": statistics.median(on) * 1000,
            "ratio": statistics.median(on) / statistics.median(off),
            "reading_processes_first_time_ms": first_read_s * 1000,
            "reading_processes_ms": proc_read_s * 1000,
            "matching_ms": match_s * 1000,
        }
    finally:
        for pid in children:
            os.kill(pid, signal.SIGKILL)
        for p in started:
            p.kill()
            p.wait()
        rt.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passes", type=int, default=40)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if os.geteuid() != 0:
        parser.error("run it as root: its processes run as another user too")
    result = run(args.passes)
    for k, v in result.items():
        print(f"{k}: {v:.3f}" if isinstance(v, float) else f"{k}: {v}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
