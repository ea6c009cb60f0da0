"""``jupyter gpubroker demo``: JupyterLab with the broker on a simulated GPU machine.

Everything the demo writes (GPU kernelspecs, the broker's state file) lives in
a temporary directory that is removed when the server stops, so a demo leaves
nothing behind in the user's Jupyter setup.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from . import kernelspec
from .broker.models import Size
from .nvml import SIMULATE_ENV, open_backend
from .paths import STATE_FILE_ENV

TOUR = Path("binder") / "gpu-broker-tour.ipynb"


def demo_sizes(simulate: str) -> list[Size]:
    """One kernelspec per MIG profile the simulated machine offers, and one whole GPU."""
    with open_backend(simulate) as backend:
        devices = backend.inventory().devices
    sizes = [Size(profile=p) for p in sorted({d.profile for d in devices if d.profile})]
    if any(d.kind == "gpu" for d in devices):
        sizes.append(Size(gpus=1))
    return sizes


def run_demo(simulate: str, *, port: int = 8888, browser: bool = True, lab: bool = True) -> int:
    sizes: list[Size | None] = [None, *demo_sizes(simulate)]  # None: the tour's on-demand kernel
    with tempfile.TemporaryDirectory(prefix="gpubroker-demo-") as tmp:
        names = [kernelspec.spec_for(s)[1]["display_name"] for s in sizes]
        for size in sizes:
            kernelspec.install(size, prefix=tmp)
        jupyter_path = os.pathsep.join(
            p for p in (str(Path(tmp) / "share" / "jupyter"), os.environ.get("JUPYTER_PATH")) if p
        )
        env = {
            **os.environ,
            "JUPYTER_PATH": jupyter_path,
            SIMULATE_ENV: simulate,
            STATE_FILE_ENV: str(Path(tmp) / "state.sqlite"),
        }
        cmd = [sys.executable, "-m", "jupyterlab" if lab else "jupyter_server", f"--port={port}"]
        if not browser:
            cmd.append("--no-browser")
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            cmd.append("--allow-root")
        if lab and TOUR.exists():
            cmd.append(f"--LabApp.default_url=/lab/tree/{TOUR.as_posix()}")
        print(f"jupyter-gpubroker demo on a simulated '{simulate}' machine", flush=True)
        print("GPU kernels: " + ", ".join(str(n) for n in names), flush=True)
        print(f"state: {env[STATE_FILE_ENV]} (removed on exit); Ctrl-C to stop", flush=True)
        proc = subprocess.Popen(cmd, env=env)
        try:
            return proc.wait()
        except KeyboardInterrupt:
            proc.send_signal(signal.SIGINT)
            proc.send_signal(signal.SIGINT)  # jupyter asks for confirmation on the first one
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
            return 0
