"""``jupyter gpubroker demo``: JupyterLab with the broker on a simulated GPU machine.

Everything the demo writes (GPU kernelspecs, the broker's state file, a copy of
the tour and any notebook made during the demo) lives in a temporary directory
that is removed when the server stops, so a demo leaves nothing behind in the
user's Jupyter setup or in the directory it was started from. Ctrl-C and
SIGTERM both stop the server (its kernels with it) before that directory goes.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from types import FrameType

from . import kernelspec
from .nvml import SIMULATE_ENV, open_backend
from .paths import STATE_FILE_ENV
from .wire.sizes import Size

TOUR = Path(__file__).parent / "tour" / "gpu-broker-tour.ipynb"
"""The tour notebook, package data (so an installed wheel has it); binder/ copies it."""
STOP_TIMEOUT_S = 30
"""How long the server may take to shut its kernels down before it is killed."""


def demo_sizes(simulate: str) -> list[Size]:
    """One kernelspec per MIG profile the simulated machine offers, and one whole GPU."""
    with open_backend(simulate) as backend:
        devices = backend.inventory().devices
    sizes = [Size(profile=p) for p in sorted({d.profile for d in devices if d.profile})]
    if any(d.kind == "gpu" for d in devices):
        sizes.append(Size(gpus=1))
    return sizes


SUSPEND_OPTIONS = (
    "--GPUBroker.reclaim_action=suspend",
    "--GPUBroker.idle_timeout=60",
    "--GPUBroker.grace=30",
    "--GPUBroker.simulate_kernel_memory=2048",
)
"""The demo's ``--suspend``: idle kernels suspended after a minute and a half, each GPU
kernel listed on its simulated GPU with 2 GiB (docs/suspend.md)."""


def run_demo(
    simulate: str,
    *,
    port: int | None = None,
    browser: bool = True,
    lab: bool = True,
    suspend: bool = False,
) -> int:
    """Serve JupyterLab on ``simulate`` from a temporary directory; ``port`` None is
    Jupyter's own choice (``$JUPYTER_PORT``, else 8888 or the next free one);
    ``suspend``: idle kernels are suspended (``SUSPEND_OPTIONS``)."""
    sizes: list[Size | None] = [None, *demo_sizes(simulate)]  # None: the tour's on-demand kernel
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        with tempfile.TemporaryDirectory(prefix="gpubroker-demo-") as tmp:
            options = SUSPEND_OPTIONS if suspend else ()
            return _serve(
                Path(tmp), simulate, sizes, port=port, browser=browser, lab=lab, options=options
            )
    except KeyboardInterrupt:  # before the server started
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    """SIGTERM stops the demo as Ctrl-C does, so the temporary directory is removed."""
    raise KeyboardInterrupt


def _serve(
    tmp: Path,
    simulate: str,
    sizes: list[Size | None],
    *,
    port: int | None,
    browser: bool,
    lab: bool,
    options: tuple[str, ...] = (),
) -> int:
    """Run the server in ``tmp`` until it exits or the demo is interrupted; ``options``:
    more of its command line."""
    names = [kernelspec.spec_for(s)[1]["display_name"] for s in sizes]
    for size in sizes:
        kernelspec.install(size, prefix=str(tmp))
    notebooks = tmp / "notebooks"
    notebooks.mkdir()
    shutil.copy(TOUR, notebooks / TOUR.name)
    jupyter_path = os.pathsep.join(
        p for p in (str(tmp / "share" / "jupyter"), os.environ.get("JUPYTER_PATH")) if p
    )
    env = {
        **os.environ,
        "JUPYTER_PATH": jupyter_path,
        SIMULATE_ENV: simulate,
        STATE_FILE_ENV: str(tmp / "state.sqlite"),
    }
    cmd = [
        sys.executable,
        "-m",
        "jupyterlab" if lab else "jupyter_server",
        f"--ServerApp.root_dir={notebooks}",
        *options,
    ]
    if port is not None:
        cmd.append(f"--port={port}")
    if not browser:
        cmd.append("--no-browser")
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")
    if lab:
        cmd.append(f"--LabApp.default_url=/lab/tree/{TOUR.name}")
    _check_broker(simulate, env[STATE_FILE_ENV])
    print(f"jupyter-gpubroker demo on a simulated '{simulate}' machine", flush=True)
    print("GPU kernels: " + ", ".join(str(n) for n in names), flush=True)
    print(f"state: {env[STATE_FILE_ENV]} (removed on exit); Ctrl-C to stop", flush=True)
    proc = subprocess.Popen(cmd, env=env, cwd=notebooks)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        _stop(proc)
        return 0


def _check_broker(simulate: str, state_file: str) -> None:
    """Start and stop here, once, the broker the server is about to run (same machine,
    state file and locks), so that a demo whose broker cannot run (its GPUs' locks held
    or unusable, say) says why and exits instead of printing the URL of a server with
    no broker behind it. Raises the broker's error, one sentence."""
    from .runtime import GPUBroker

    broker = GPUBroker(simulate=simulate, state_file=state_file)
    broker.start()
    broker.stop()


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Terminate the server and wait until it is gone (jupyter-server stops on SIGTERM
    without asking, shutting its kernels down first). Another Ctrl-C meanwhile is
    ignored: leaving would remove the directory under a server still running."""
    handlers = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        proc.terminate()
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
