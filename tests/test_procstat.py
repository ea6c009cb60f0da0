"""The one reader of ``/proc/<pid>/stat``: a killed process its parent has not reaped has
ended, a running one has not, and a command name with a parenthesis fools neither."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jupyter_gpubroker.procstat import proc_stat, runs

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc")


def test_a_zombie_has_ended_and_a_running_process_has_not() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        stat = proc_stat(child.pid)
        assert stat is not None and stat.ppid == os.getpid() and runs(child.pid)
        os.kill(child.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while runs(child.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        zombie = proc_stat(child.pid)  # not reaped yet: its line is still there
        assert zombie is not None and zombie.ended and zombie.start_ticks == stat.start_ticks
    finally:
        child.kill()
        child.wait()
    assert proc_stat(child.pid) is None and not runs(child.pid)


def test_a_command_name_with_a_parenthesis_is_read_after_it() -> None:
    name = "x) Z 1 2 3"
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import ctypes,time; ctypes.CDLL(None).prctl(15, {name!r}.encode()); time.sleep(60)",
        ]
    )
    try:
        deadline = time.monotonic() + 10
        while name.encode() not in Path(f"/proc/{child.pid}/stat").read_bytes():
            assert time.monotonic() < deadline, "the child did not rename itself"
            time.sleep(0.05)
        stat = proc_stat(child.pid)
        assert stat is not None and not stat.ended and stat.ppid == os.getpid()
    finally:
        child.kill()
        child.wait()
