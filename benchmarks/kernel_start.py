"""Kernel start time through gpubroker-provisioner (slice free) vs the local provisioner.

One jupyter server (the extension on a simulated ``dgx-h100-mig``) serves both
kernelspecs; starts alternate between them so both see the same machine
load. A start is ``POST /api/kernels`` until the reply (the kernel process is
launched), then the kernel is deleted (its slice released) before the next.

    python benchmarks/kernel_start.py [--runs 20] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from jupyter_gpubroker import kernelspec
from jupyter_gpubroker.wire.sizes import Size

TOKEN = "kernel-start-bench"


def _call(base: str, method: str, path: str, body: dict | None = None) -> dict:
    request = urllib.request.Request(
        f"{base}{path}",
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"token {TOKEN}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        raw = response.read()
    return json.loads(raw) if raw else {}


def _start_server(tmp: Path) -> tuple[subprocess.Popen[bytes], str]:
    gpu_name, gpu_spec = kernelspec.spec_for(Size(profile="1g.10gb"))
    plain_spec = {k: v for k, v in gpu_spec.items() if k != "metadata"}
    for name, spec in ((gpu_name, gpu_spec), ("plain", plain_spec)):
        d = tmp / "data" / "kernels" / name
        d.mkdir(parents=True)
        (d / "kernel.json").write_text(json.dumps(spec))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {
        **os.environ,
        "HOME": str(tmp),
        "JUPYTER_DATA_DIR": str(tmp / "data"),
        "JUPYTER_CONFIG_DIR": str(tmp / "config"),
        "JUPYTER_RUNTIME_DIR": str(tmp / "runtime"),
        "JUPYTER_TOKEN": TOKEN,
        "GPUBROKER_SIMULATE": "dgx-h100-mig",
        "GPUBROKER_STATE": str(tmp / "state.sqlite"),
        "GPUBROKER_LOCK_DIR": str(tmp / "gpu-locks"),  # its simulated GPUs, not the machine's
        "GPUBROKER_USER_LOCK_DIR": str(tmp / "user-gpu-locks"),
    }
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyter_server",
            f"--port={port}",
            "--no-browser",
            "--allow-root",
            "--ServerApp.log_level=WARN",
        ],
        env=env,
        cwd=tmp,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,  # kernels deleted mid-start print their interrupted imports
    )
    base = f"http://127.0.0.1:{port}"
    for _ in range(120):
        try:
            _call(base, "GET", "/api/status")
            return proc, base
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError("jupyter server did not start")


def run(runs: int) -> dict[str, float]:
    gpu_name = kernelspec.spec_for(Size(profile="1g.10gb"))[0]
    times: dict[str, list[float]] = {"plain": [], gpu_name: []}
    with tempfile.TemporaryDirectory() as tmp:
        proc, base = _start_server(Path(tmp))
        try:
            for i in range(runs + 1):
                for name in (gpu_name, "plain") if i % 2 else ("plain", gpu_name):
                    t0 = time.perf_counter()
                    kernel = _call(base, "POST", "/api/kernels", {"name": name})
                    elapsed = time.perf_counter() - t0
                    _call(base, "DELETE", f"/api/kernels/{kernel['id']}")
                    if i:  # the first round warms both paths up
                        times[name].append(elapsed)
            assert _call(base, "GET", "/gpubroker/api/v1/leases")["leases"] == []
        finally:
            proc.terminate()
            proc.wait(30)
    plain, gpu = statistics.median(times["plain"]), statistics.median(times[gpu_name])
    return {
        "runs": runs,
        "plain_median_ms": plain * 1e3,
        "gpu_median_ms": gpu * 1e3,
        "extra_median_ms": (gpu - plain) * 1e3,
        "ratio": gpu / plain,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.runs < 1:
        ap.error("--runs must be >= 1")
    r = run(args.runs)
    if args.json:
        print(json.dumps(r))
        return
    print(f"{r['runs']} starts each, slice free")
    print(f"local provisioner      median {r['plain_median_ms']:8.1f} ms")
    print(f"gpubroker-provisioner  median {r['gpu_median_ms']:8.1f} ms")
    print(f"extra                  median {r['extra_median_ms']:8.1f} ms  ({r['ratio']:.3f}x)")


if __name__ == "__main__":
    main()
