"""One broker per GPU of the machine, whatever its user or state file: the machine-wide
per-GPU locks (``c.GPUBroker.gpu_lock_dir``), held by another real process."""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from runtime_helpers import make

from jupyter_gpubroker.broker.errors import GpuInUse
from jupyter_gpubroker.nvml import seed_for
from jupyter_gpubroker.paths import LOCK_DIR_ENV
from jupyter_gpubroker.statelock import GpuLocks

HOLD = """
import sys
from pathlib import Path
from jupyter_gpubroker.statelock import GpuLocks
held = GpuLocks(Path(sys.argv[1]))
held.acquire([sys.argv[2]], "http://other:8888/gpubroker/api/v1")
print("held", flush=True)
sys.stdin.read()
"""


def test_a_broker_refuses_a_gpu_another_process_manages_until_that_process_dies(
    tmp_path: Path,
) -> None:
    locks = Path(os.environ[LOCK_DIR_ENV]) / "machine"
    rt = make(tmp_path, gpu_lock_dir=str(locks))
    first, second = (g.uuid for g in _inventory(tmp_path))
    other = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(locks), second],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert other.stdout is not None and other.stdout.readline() == b"held\n"
        with pytest.raises(GpuInUse) as refused:
            rt.start()
        assert refused.value.message.startswith(
            f"GPU {second} is already managed by another GPU broker (pid {other.pid} on "
            f"{socket.gethostname()}, serving http://other:8888/gpubroker/api/v1): brokers "
            "that share a machine grant the same GPUs twice; run one broker for everyone as "
            "the JupyterHub service"
        )
        mine = GpuLocks(locks)
        mine.acquire([first])  # the refused broker kept none of the GPUs it had locked
        mine.release()
    finally:
        other.send_signal(signal.SIGKILL)  # no clean-up runs: the lock dies with it
        other.wait()
    try:
        assert rt.start().inventory.gpus
    finally:
        rt.stop()
    # every user's broker can lock there: a shared, sticky directory, files all may open
    assert stat.S_IMODE(locks.stat().st_mode) == 0o1777
    assert stat.S_IMODE((locks / f"{first}.lock").stat().st_mode) == 0o666


def test_simulated_machines_are_their_own_and_keep_their_gpus(tmp_path: Path) -> None:
    """Two simulated brokers on one host (two demos, a demo and a test run) simulate two
    machines: neither holds the other's GPUs. A restart on the same state file finds the
    same GPUs; an explicit seed shares one simulated machine (and its locks)."""
    locks = str(Path(os.environ[LOCK_DIR_ENV]) / "shared")
    one = make(tmp_path / "one", gpu_lock_dir=locks)
    two = make(tmp_path / "two", gpu_lock_dir=locks)
    try:
        mine = {g.uuid for g in one.start().inventory.gpus}
        theirs = {g.uuid for g in two.start().inventory.gpus}
        assert len(mine) == len(theirs) == 2 and not mine & theirs
    finally:
        two.stop()
        one.stop()
    again = make(tmp_path / "one", gpu_lock_dir=locks)
    try:
        assert {g.uuid for g in again.start().inventory.gpus} == mine
        same_machine = make(tmp_path / "three", gpu_lock_dir=locks)
        same_machine.simulate_seed = again.simulate_seed
        with pytest.raises(GpuInUse):
            same_machine.start()
    finally:
        again.stop()


def _inventory(tmp_path: Path):  # type: ignore[no-untyped-def]
    """The GPUs a broker with state under ``tmp_path`` simulates."""
    probe = make(
        tmp_path / "probe",
        gpu_lock_dir=str(tmp_path / "probe-locks"),
        simulate_seed=seed_for(str(tmp_path / "state.sqlite")),
    )
    try:
        return probe.start().inventory.gpus
    finally:
        probe.stop()
