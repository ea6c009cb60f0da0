"""Two shares of one real GPU held to their memory by MPS, through the product's path
(issue 46 item 8). Prepared; it has not run on a GPU yet.

Run it on a machine with an NVIDIA GPU without MIG in the default compute mode,
``nvidia-cuda-mps-control`` on the PATH and ``cuda-bindings`` (``pip install
cuda-bindings``):

    python benchmarks/device_shares.py --json

The broker's own core grants two shares of the GPU (``--share-gb``, 2 GB each by
default) on a state file of its own, and the broker's ``ShareEnforcement``, capped at
MPS, starts the MPS control daemon for them as it does for kernels. Each client is a
CUDA process started with its share's environment (``ShareEnforcement.env``: the
daemon's pipe and log directories and ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``). Client A
allocates past its limit; NVIDIA documents that such an allocation fails with an
out-of-memory error. Client B holds less than its limit, then allocates and writes
again after A's refusal. The script prints one JSON object and stops the daemon as the
broker does when the last share ends. Without a GPU, MPS or CUDA it says why and exits
2. It takes well under a minute: it moves a few GB at most.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import asdict
from pathlib import Path
from typing import Any

from jupyter_gpubroker.broker.config import BrokerConfig
from jupyter_gpubroker.broker.core import Broker
from jupyter_gpubroker.broker.sharing import Sharing
from jupyter_gpubroker.broker.store import Store
from jupyter_gpubroker.nvml import NvmlBackend
from jupyter_gpubroker.runtime.sharing import ShareEnforcement, SharingSettings, read_facts
from jupyter_gpubroker.wire.sizes import Size

CLIENT = textwrap.dedent(
    """
    import json, sys
    from cuda.bindings import driver as cu
    steps_mib = [int(x) for x in sys.argv[1:]]
    (err,) = cu.cuInit(0)
    if err != cu.CUresult.CUDA_SUCCESS:
        print(json.dumps({"init": err.name}), flush=True)
        sys.exit(0)
    _, dev = cu.cuDeviceGet(0)
    _, ctx = cu.cuDevicePrimaryCtxRetain(dev)
    cu.cuCtxSetCurrent(ctx)
    held, results = [], []
    for mib in steps_mib:
        err, ptr = cu.cuMemAlloc(mib * 2**20)
        if err == cu.CUresult.CUDA_SUCCESS:
            cu.cuMemsetD8(ptr, 0x5A, mib * 2**20)
            (err,) = cu.cuCtxSynchronize()
            held.append(ptr)
        results.append({"mib": mib, "result": err.name})
        print(json.dumps(results[-1]), flush=True)
        line = sys.stdin.readline()  # the script says when to take the next step
        if not line:
            break
    """
)


class Client:
    """One CUDA process in its share's environment, taking one allocation per step."""

    def __init__(self, env: dict[str, str], steps_mib: list[int]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CLIENT, *map(str, steps_mib)],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def step(self) -> dict[str, Any]:
        """The next allocation's result (the first comes without asking)."""
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        return json.loads(line) if line else {"exited": self.proc.poll()}

    def go_on(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("next\n")
        self.proc.stdin.flush()

    def end(self) -> str:
        self.proc.kill()
        _, err = self.proc.communicate(timeout=30)
        return err.strip()[-500:]


def unavailable() -> str | None:
    """Why this machine cannot run it (None: it can)."""
    try:
        found = importlib.util.find_spec("cuda.bindings") is not None
    except ModuleNotFoundError:  # no ``cuda`` package at all
        found = False
    if not found:
        return "cuda-bindings is not installed (pip install cuda-bindings)"
    try:
        subprocess.run(["nvidia-cuda-mps-control", "-h"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "nvidia-cuda-mps-control is not on the PATH"
    return None


def run(backend: NvmlBackend, share_gb: float, work: Path) -> dict[str, Any]:
    inventory = backend.inventory()
    gpus = [g for g in inventory.gpus if not g.mig_enabled]
    if not gpus:
        return {"ran": False, "why": "every GPU here has MIG on: a slice is never shared"}
    core = Broker(
        Store(str(work / "state.sqlite")),
        inventory,
        config=BrokerConfig(sharing=Sharing("shared")),
    )
    settings = SharingSettings(share_enforcement="mps", mps_dir=str(work / "mps"))
    log = logging.getLogger("device_shares")
    enforcement = ShareEnforcement.open(settings, inventory, True, lambda _: None, False, log)
    enforcement.attach(core)
    leases = []
    for holder in ("a", "b"):
        r = core.submit("bench", Size(share_gb=share_gb), holder=holder)
        leases.append(core.lease(r.lease_id or ""))
    a, b = leases
    report: dict[str, Any] = {
        "ran": True,
        "host": asdict(read_facts(settings.mps_control, "", False)),
        "gpu": a.devices[0],
        "same_gpu": a.devices == b.devices,
        "mechanism": enforcement.of(a).mechanism,
        "why": enforcement.of(a).why,
        "share_mib": a.share_mib,
        "env_a": enforcement.env(a),
    }
    base = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_MPS")}
    env_a = {**base, "CUDA_VISIBLE_DEVICES": a.devices[0], **enforcement.env(a)}
    env_b = {**base, "CUDA_VISIBLE_DEVICES": b.devices[0], **enforcement.env(b)}
    half, over = a.share_mib // 2, a.share_mib
    client_a = Client(env_a, [half, over])  # half, then past its limit
    client_b = Client(env_b, [half, 256])  # half, then more within it
    try:
        report["a_first"], report["b_first"] = client_a.step(), client_b.step()
        client_a.go_on()
        report["a_over_limit"] = client_a.step()
        client_b.go_on()
        report["b_after"] = client_b.step()
        report["b_alive"] = client_b.proc.poll() is None
    finally:
        report["a_stderr"], report["b_stderr"] = client_a.end(), client_b.end()
        for lease in leases:
            core.release(lease.id)
        enforcement.close()
    report["daemon_dir_removed"] = not any((work / "mps").glob("g*"))
    report["a_refused_as_documented"] = (
        report["a_over_limit"].get("result") == "CUDA_ERROR_OUT_OF_MEMORY"
    )
    report["b_kept_running"] = report["b_alive"] and (
        report["b_after"].get("result") == "CUDA_SUCCESS"
    )
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--share-gb", type=float, default=2.0, help="each share's memory")
    parser.add_argument("--json", action="store_true", help="print JSON on one line")
    args = parser.parse_args()
    why = unavailable()
    if why is not None:
        print(json.dumps({"ran": False, "why": why}))
        return 2
    try:
        backend = NvmlBackend().open()
    except Exception as e:  # no driver, no GPU: said, not raised
        print(json.dumps({"ran": False, "why": f"NVML did not open ({e})"}))
        return 2
    try:
        with tempfile.TemporaryDirectory(prefix="gpushare", dir="/tmp") as work:
            report = run(backend, args.share_gb, Path(work))
    finally:
        backend.close()
    print(json.dumps(report, indent=None if args.json else 1))
    if not report.get("ran"):
        return 2
    ok = report["a_refused_as_documented"] and report["b_kept_running"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
