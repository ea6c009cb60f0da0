"""Suspend, restore and move a real GPU process through the product's path (issues 32, 47).

Run it on a machine with an NVIDIA GPU, driver r580 or later, and ``cuda-bindings``
(``pip install cuda-bindings``; CuPy is used for the test process where it is installed):

    python benchmarks/device_suspend.py --gb 1 4 --json

It prints one JSON object with four parts, all through the broker's own ``Suspender`` over
``CudaCheckpointDriver`` and its NVML backend:

- ``canary``: the verdict ``reclaim_action = "auto"`` would reach here at start, from the
  broker's own canary (``suspend.canary.prove``), and why;
- ``copy``: the host-device copy bandwidth (pinned memory, GB/s each way), measured in the
  same run: the bound a checkpoint's copy to the host meets;
- ``runs``: for each size, a canary process filling that much GPU memory with a known
  pattern, suspended, checked gone from the GPU with NVML, restored (onto another GPU of the
  same chip where there is one, as a drain's move does), its pattern checked; the checkpoint
  and restore times and GB/s;
- ``no_room``: a restore onto a GPU without the memory free is refused before it starts (a
  restore that runs out of memory leaves the process stuck for good: cuda-checkpoint#44),
  and goes once the memory is free.

Without a GPU it says why and exits 2. The defaults stay under eight minutes.
``--simulate PRESET`` runs the same steps on the simulated NVML and checkpoint driver (the
tests do, so the script is known to work before a GPU is lent); it measures no copy.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
import time
from typing import Any

from jupyter_gpubroker.nvml import NvmlBackend, open_backend
from jupyter_gpubroker.suspend import Suspender
from jupyter_gpubroker.suspend.canary import Canary, ProcessCanary, SimulatedCanary, prove
from jupyter_gpubroker.suspend.host import checkpoint_driver

MIB = 2**20
COPY = textwrap.dedent(
    """
    import json, sys, time
    from cuda.bindings import driver as cu
    def ok(r):
        if r[0] != cu.CUresult.CUDA_SUCCESS:
            raise SystemExit(f"CUDA error {r[0]}")
        return r[1] if len(r) > 1 else None
    n = int(float(sys.argv[1]) * 2**30)
    ok(cu.cuInit(0))
    ok(cu.cuCtxSetCurrent(ok(cu.cuDevicePrimaryCtxRetain(ok(cu.cuDeviceGet(0))))))
    dev, host = ok(cu.cuMemAlloc(n)), ok(cu.cuMemAllocHost(n))
    def best(copy):
        times = []
        for _ in range(3):
            t0 = time.perf_counter(); copy(); ok(cu.cuCtxSynchronize())
            times.append(time.perf_counter() - t0)
        return round(n / 1e9 / min(times), 1)
    print(json.dumps({
        "to_host_gb_s": best(lambda: ok(cu.cuMemcpyDtoH(host, dev, n))),
        "to_gpu_gb_s": best(lambda: ok(cu.cuMemcpyHtoD(dev, host, n))),
    }))
    """
)


def mib(gb: float) -> int:
    """GB (10^9 bytes, as NVIDIA and the broker say sizes) in the MiB NVML counts."""
    return int(gb * 1e9 / MIB)


def whole_gpus(backend: NvmlBackend) -> list[tuple[str, str]]:
    """(UUID, model) of each GPU not in MIG mode: NVIDIA's checkpoint does not do MIG."""
    return [(g.uuid, g.name) for g in backend.inventory().gpus if not g.mig_enabled]


def on_gpu(backend: NvmlBackend, pid: int) -> dict[str, float]:
    """Where NVML lists ``pid``: UUID -> MiB."""
    return {
        uuid: float(p.used_memory_mib or 0)
        for uuid, reading in backend.read_all().items()
        for p in reading.processes
        if p.pid == pid
    }


def free_mib(backend: NvmlBackend, uuid: str) -> float | None:
    reading = backend.read(uuid)
    total, used = reading.memory_total_mib, reading.memory_used_mib
    return None if total is None or used is None else float(total - used)


def start(backend: NvmlBackend, gpu: str, mib: int) -> Canary:
    """A process holding ``mib`` MiB of a known pattern on ``gpu``: the broker's canary."""
    if backend.simulator is not None:
        return SimulatedCanary(backend.simulator, gpu, mib)
    return ProcessCanary(gpu, mib)


def copy_bandwidth(gpu: str, gb: float) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", COPY, str(gb)],
        capture_output=True,
        text=True,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": gpu},
        timeout=120,
    )
    if done.returncode != 0:
        return {"error": (done.stderr or done.stdout).strip()[-300:]}
    return dict(json.loads(done.stdout))


def one(
    backend: NvmlBackend, suspender: Suspender, gpu: str, target: str, gb: float
) -> dict[str, Any]:
    holder = start(backend, gpu, mib(gb))
    try:
        where = on_gpu(backend, holder.pid)
        t0 = time.perf_counter()
        outcome, suspension = suspender.suspend([gpu], {holder.pid: sum(where.values())}, where)
        checkpoint_s = time.perf_counter() - t0
        if suspension is None:
            return {"gb": gb, "error": outcome.reason, "lost": outcome.lost}
        gone = on_gpu(backend, holder.pid) == {}
        t0 = time.perf_counter()
        resumed = suspender.resume(suspension, [target])
        restore_s = time.perf_counter() - t0
        return {
            "gb": gb,
            "gpu_free_while_suspended": gone,
            "restored_onto": "another GPU" if target != gpu else "its own GPU",
            "resumed": resumed.done,
            "reason": resumed.reason,
            "pattern_intact": holder.check() is None,
            "on_gpu_after": list(on_gpu(backend, holder.pid)) == [target],
            "checkpoint_s": round(checkpoint_s, 3),
            "restore_s": round(restore_s, 3),
            "checkpoint_gb_s": round(gb / checkpoint_s, 2),
            "restore_gb_s": round(gb / restore_s, 2),
        }
    finally:
        holder.stop()


def no_room(backend: NvmlBackend, suspender: Suspender, gpu: str, gb: float) -> dict[str, Any]:
    """Suspend a process of ``gb`` GB, fill its GPU until less than that is free, and try
    to restore it there: refused before it starts; then free the GPU and restore it."""
    holder = start(backend, gpu, mib(gb))
    filler = None
    try:
        where = on_gpu(backend, holder.pid)
        _, suspension = suspender.suspend([gpu], {holder.pid: sum(where.values())}, where)
        if suspension is None:
            return {"error": "the process could not be suspended"}
        free = free_mib(backend, gpu) or 0.0
        filler = start(backend, gpu, int(free - mib(gb) / 2))
        refused = suspender.resume(suspension, [gpu])
        filler.stop()
        filler = None
        for _ in range(100):  # the filler's memory is freed a moment after it exits
            if (free_mib(backend, gpu) or 0.0) >= mib(gb):
                break
            time.sleep(0.1)
        resumed = suspender.resume(suspension, [gpu])
        return {
            "gb": gb,
            "refused_before_it_started": refused.waiting and not refused.lost,
            "refusal": refused.reason,
            "restored_once_free": resumed.done,
            "pattern_intact": holder.check() is None,
        }
    finally:
        if filler is not None:
            filler.stop()
        holder.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gb", type=float, nargs="+", default=[1.0, 4.0])
    parser.add_argument("--json", action="store_true", help="print JSON only")
    parser.add_argument("--simulate", metavar="PRESET", help="the simulated NVML, e.g. dgx-h100:2")
    args = parser.parse_args()
    try:
        backend = open_backend(args.simulate or "")
    except Exception as e:  # no driver, no GPU: said in the one JSON line
        print(json.dumps({"ran": False, "why": str(e)}))
        return 2
    driver = checkpoint_driver(backend.simulator)
    why = driver.unavailable()
    if why is not None:
        backend.close()
        print(json.dumps({"ran": False, "why": why}))
        return 2
    try:
        gpus = whole_gpus(backend)
        if not gpus:
            print(json.dumps({"ran": False, "why": "every GPU here is in MIG mode"}))
            return 2
        gpu, model = gpus[0]
        same_chip = [u for u, m in gpus if m == model]
        target = same_chip[1] if len(same_chip) > 1 else gpu
        suspender = Suspender(
            driver, lock_timeout_s=30.0, room=lambda uuid: free_mib(backend, uuid)
        )
        verdict = prove(
            suspender,
            lambda uuid: start(backend, uuid, 256),
            lambda pid: on_gpu(backend, pid),
            [gpu, target],
        )
        report: dict[str, Any] = {
            "ran": True,
            "gpu": model,
            "gpus_of_that_model": len(same_chip),
            "canary": {"action": verdict.action, "reason": verdict.reason},
            "copy": {} if backend.simulator else copy_bandwidth(gpu, 1.0),
            "runs": [one(backend, suspender, gpu, target, gb) for gb in args.gb],
            "no_room": no_room(backend, suspender, gpu, min(args.gb)),
        }
    finally:
        backend.close()
    print(json.dumps(report, indent=None if args.json else 1))
    runs_ok = all(
        r.get("pattern_intact") and r.get("gpu_free_while_suspended") for r in report["runs"]
    )
    room_ok = report["no_room"].get("refused_before_it_started") and report["no_room"].get(
        "pattern_intact"
    )
    return 0 if runs_ok and room_ok and verdict.action == "suspend" else 1


if __name__ == "__main__":
    sys.exit(main())
