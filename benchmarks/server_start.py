"""A jupyter server's start with the extension against the same server without it.

Installing the package enables the extension in every server of the environment, so its
cost is paid by every start. Each run starts ``python -m jupyter_server`` (the other
extensions of the environment off, as in ``tests/live_server.py``) and times it from
the process's start to the first answer of ``GET /api/status``: the extension's whole
load (imports, the broker's start) happens before the server listens. The server's CPU
time until then is given too: on a machine others share, wall time follows their load.
Three servers, each ``--runs`` times in turn: without the extension; with it on a host
without GPUs (``host_root`` an empty directory: no driver, the broker stays off); with
it on a simulated ``dgx-h100-mig:1`` (the broker starts: state file, GPU locks, first
readings).

    python benchmarks/server_start.py [--runs 5] [--json]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from live_server import EXTENSIONS, TOKEN, free_port  # noqa: E402

from jupyter_gpubroker.paths import LOCK_DIR_ENV  # noqa: E402

SERVERS: dict[str, tuple[bool, list[str]]] = {  # name: (the extension on?, its options)
    "without the extension": (False, []),
    "with it, no GPUs": (True, ["--GPUBrokerExtension.host_root={home}/host"]),
    "with it, simulated": (True, ["--GPUBroker.simulate=dgx-h100-mig:1"]),
}


def cpu_s(pid: int) -> float:
    """A process's CPU time (user + system), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_s(home: Path, extension: bool, options: list[str]) -> tuple[float, float]:
    """Seconds from the server process's start to its first answer, and the CPU seconds
    it spent meanwhile (what a loaded machine does not change)."""
    port = free_port()
    env = {
        **os.environ,
        "HOME": str(home),
        "JUPYTER_CONFIG_DIR": str(home / "config"),
        "JUPYTER_DATA_DIR": str(home / "data"),
        "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
        LOCK_DIR_ENV: str(home / "gpu-locks"),
    }
    (home / "host").mkdir(parents=True, exist_ok=True)
    extensions = {**EXTENSIONS, "jupyter_gpubroker": extension}
    argv = [
        sys.executable,
        "-m",
        "jupyter_server",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={TOKEN}",
        "--ServerApp.open_browser=False",
        "--allow-root",
        f"--ServerApp.jpserver_extensions={extensions}",
        f"--GPUBroker.state_file={home}/state.sqlite",
        *(o.replace("{home}", str(home)) for o in options),
    ]
    started = time.perf_counter()
    proc = subprocess.Popen(
        argv, env=env, cwd=home, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        while True:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                conn.request("GET", "/api/status", headers={"Authorization": f"token {TOKEN}"})
                if conn.getresponse().status == 200:
                    return time.perf_counter() - started, cpu_s(proc.pid)
            except OSError:
                pass
            if proc.poll() is not None or time.perf_counter() - started > 120:
                raise RuntimeError(f"the server did not start: {argv}")
            time.sleep(0.01)
    finally:
        proc.terminate()
        proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    times: dict[str, list[float]] = {name: [] for name in SERVERS}
    cpu: dict[str, list[float]] = {name: [] for name in SERVERS}
    for _ in range(args.runs):  # in turn, so the machine's load falls on each alike
        for name, (extension, options) in SERVERS.items():
            with tempfile.TemporaryDirectory() as home:
                wall, spent = start_s(Path(home), extension, options)
            times[name].append(wall)
            cpu[name].append(spent)
    bare = statistics.median(times["without the extension"])
    bare_cpu = statistics.median(cpu["without the extension"])
    results: list[dict[str, Any]] = [
        {
            "server": name,
            "median_s": round(statistics.median(ts), 3),
            "min_s": round(min(ts), 3),
            "ratio_to_without": round(statistics.median(ts) / bare, 2),
            "cpu_median_s": round(statistics.median(cpu[name]), 3),
            "cpu_ratio_to_without": round(statistics.median(cpu[name]) / bare_cpu, 2),
            "runs": len(ts),
        }
        for name, ts in times.items()
    ]
    if args.json:
        print(json.dumps(results, indent=1))
        return
    for r in results:
        print(
            f"{r['server']:<24} median {r['median_s']:.2f} s (min {r['min_s']:.2f} s), "
            f"{r['ratio_to_without']:.2f}x the server without it; CPU {r['cpu_median_s']:.2f} s, "
            f"{r['cpu_ratio_to_without']:.2f}x"
        )


if __name__ == "__main__":
    main()
