"""Suspend and resume a real GPU process through the product's path (issue 32 item 5).

Run it on a machine with an NVIDIA GPU, driver r570 or later, and ``cuda-bindings``
(``pip install cuda-bindings``; CuPy is used for the test process where it is installed):

    python benchmarks/device_suspend.py --gb 1 4 16 --json

For each size it starts a process that fills that much GPU memory with a known pattern,
suspends it with the broker's own ``Suspender`` over ``CudaCheckpointDriver`` (the checks,
then lock and checkpoint), checks with NVML (the broker's ``NvmlBackend``) that the process
is gone from the GPU and its memory free, restores it (onto another GPU of the same chip
where there is one, else onto its own), checks the pattern inside the process, and times the
checkpoint and the restore. It prints one JSON object. Without a GPU it says why and exits 2.
It stays under five minutes for the default sizes (1 and 4 GB): NVIDIA's checkpoint copies
memory to the host at several GB/s.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import textwrap
import time
from typing import Any

from jupyter_gpubroker.nvml import NvmlBackend
from jupyter_gpubroker.suspend import Suspender
from jupyter_gpubroker.suspend.cuda import CudaCheckpointDriver

HOLDER = textwrap.dedent(
    """
    import sys
    gb = float(sys.argv[1])
    n = int(gb * 2**30) // 4 * 4
    try:
        import cupy as cp
        a = cp.full(n // 4, 0xA5A5A5A5, dtype=cp.uint32)
        head = cp.arange(1 << 18, dtype=cp.uint32) * 2654435761
        a[: head.size] = head
        cp.cuda.runtime.deviceSynchronize()
        def check():
            same = bool((a[: head.size] == head).all())
            return same and bool((a[head.size :] == 0xA5A5A5A5).all())
    except ImportError:
        from cuda.bindings import driver as cu
        cu.cuInit(0)
        _, dev = cu.cuDeviceGet(0)
        _, ctx = cu.cuDevicePrimaryCtxRetain(dev)
        cu.cuCtxSetCurrent(ctx)
        _, ptr = cu.cuMemAlloc(n)
        cu.cuMemsetD32(ptr, 0xA5A5A5A5, n // 4)
        head = bytes((i * 131 + 7) % 256 for i in range(1 << 20))
        cu.cuMemcpyHtoD(ptr, head, len(head))
        cu.cuCtxSynchronize()
        def check():
            back = bytearray(len(head))
            cu.cuMemcpyDtoH(back, ptr, len(head))
            tail = bytearray(1 << 20)
            cu.cuMemcpyDtoH(tail, int(ptr) + n - len(tail), len(tail))
            return bytes(back) == head and tail == b"\\xa5" * len(tail)
    print("ready", flush=True)
    for line in sys.stdin:
        print("ok" if check() else "bad", flush=True)
    """
)


def on_gpu(backend: NvmlBackend, pid: int) -> dict[str, int]:
    """Where NVML lists ``pid``: UUID -> MiB."""
    return {
        uuid: p.used_memory_mib or 0
        for uuid, reading in backend.read_all().items()
        for p in reading.processes
        if p.pid == pid
    }


def one(backend: NvmlBackend, suspender: Suspender, gb: float) -> dict[str, Any]:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(gb)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdin is not None and holder.stdout is not None
    try:
        if holder.stdout.readline().strip() != "ready":
            return {"gb": gb, "error": "the test process did not start"}
        where = on_gpu(backend, holder.pid)
        (gpu,) = where
        t0 = time.perf_counter()
        outcome, suspension = suspender.suspend(list(where), {holder.pid: float(where[gpu])})
        checkpoint_s = time.perf_counter() - t0
        if suspension is None:
            return {"gb": gb, "error": outcome.reason, "lost": outcome.lost}
        gone = on_gpu(backend, holder.pid) == {}
        chip = {g.uuid: g.name for g in backend.inventory().gpus if not g.mig_enabled}
        others = [u for u, m in chip.items() if m == chip.get(gpu) and u != gpu]
        target = others[0] if others else gpu
        t0 = time.perf_counter()
        resumed = suspender.resume(suspension, [target])
        restore_s = time.perf_counter() - t0
        holder.stdin.write("check\n")
        holder.stdin.flush()
        intact = holder.stdout.readline().strip() == "ok"
        return {
            "gb": gb,
            "gpu_free_while_suspended": gone,
            "restored_onto": "another GPU" if target != gpu else "its own GPU",
            "resumed": resumed.done,
            "reason": resumed.reason,
            "pattern_intact": intact,
            "on_gpu_after": list(on_gpu(backend, holder.pid)) == [target],
            "checkpoint_s": round(checkpoint_s, 3),
            "restore_s": round(restore_s, 3),
            "checkpoint_s_per_gb": round(checkpoint_s / gb, 3),
            "restore_s_per_gb": round(restore_s / gb, 3),
        }
    finally:
        holder.kill()
        holder.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gb", type=float, nargs="+", default=[1.0, 4.0])
    parser.add_argument("--json", action="store_true", help="print JSON only")
    args = parser.parse_args()
    driver = CudaCheckpointDriver()
    why = driver.unavailable()
    if why is not None:
        print(json.dumps({"ran": False, "why": why}))
        return 2
    backend = NvmlBackend().open()
    try:
        suspender = Suspender(driver, lock_timeout_s=30.0)
        runs = [one(backend, suspender, gb) for gb in args.gb]
    finally:
        backend.close()
    print(json.dumps({"ran": True, "runs": runs}, indent=None if args.json else 1))
    ok = all(r.get("pattern_intact") and r.get("gpu_free_while_suspended") for r in runs)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
