"""A real process standing for a share's kernel, with the load the simulated driver gives
it once the broker lists it (``LOAD_ENV`` in its environment)."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Mapping

from jupyter_gpubroker.nvml.simulated import LOAD_ENV
from jupyter_gpubroker.procstat import proc_environ


def loaded_process(load: int, env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
    """``sleep`` with ``load`` percent (and ``env``: a share's MPS settings), returned once
    its environment reads as given: Popen returns while the kernel may still be loading the
    program, and the broker reads the environment as soon as it is told the pid."""
    proc = subprocess.Popen(
        ["sleep", "600"], env={**os.environ, **(env or {}), LOAD_ENV: str(load)}
    )
    deadline = time.monotonic() + 10
    while LOAD_ENV.encode() not in (proc_environ(proc.pid) or {}):
        assert time.monotonic() < deadline, "the process never showed its environment"
        time.sleep(0.01)
    return proc
