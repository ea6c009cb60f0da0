"""The real test cluster ``.ci/slurm-up`` starts on this machine: commands and waits the
Slurm tests share. Partition ``gpu``: gpu-a (gpu:h100:4) and gpu-b (gpu:1g.10gb:7 and
gpu:3g.40gb:2), always awake. Partition ``powersave``: gpu-a and gpu-c (gpu:h100:2), which
Slurm's power saving puts to sleep and wakes."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from traitlets.config import Config

NODES = ("gpu-a", "gpu-b")
"""The nodes that never sleep (``SuspendExcNodes``)."""
SLEEPER = "gpu-c"
"""The node under Slurm's power saving."""
GPU_PARTITION = Config({"SlurmInventory": {"partitions": ["gpu"]}})
"""A broker's config that reads the nodes that never sleep, gpu-a and gpu-b, alone."""
UP = "run .ci/slurm-up as root (it installs slurm-wlm and munge and starts the test cluster)"
CONF = Path(os.environ.get("SLURM_CONF", "/etc/slurm/slurm.conf"))
"""The test cluster's slurm.conf: the machine's, or the one of the cluster ``.ci/run``
started for its checkout (``$SLURM_CONF`` as the suite starts)."""


def sh(*argv: str, check: bool = True) -> str:
    """A Slurm command on the test cluster (whatever SLURM_CONF a test points the broker at)."""
    env = {**os.environ, "SLURM_CONF": str(CONF)}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
    if check and done.returncode != 0:
        raise AssertionError(f"{' '.join(argv)}: {done.stderr.strip()}")
    return done.stdout


def jobs() -> dict[str, dict[str, str]]:
    """Every job Slurm has: id -> state, node, gres, name, comment."""
    out = sh("squeue", "-h", "-o", "%i|%T|%N|%b|%j|%k")
    found = {}
    for line in out.splitlines():
        job_id, state, node, gres, name, comment = line.split("|", 5)
        found[job_id] = {
            "state": state,
            "node": node,
            "gres": gres,
            "name": name,
            "comment": comment,
        }
    return found


def job_details(job_id: str) -> str:
    """``scontrol show job`` of one job: where it runs and with which gres."""
    return sh("scontrol", "show", "job", "-o", "-d", job_id)


def until(what: str, check: Callable[[], Any], timeout_s: float = 120.0) -> Any:
    """Poll ``check()`` until it returns something true (no timing is asserted)."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.3)


def cleanup() -> None:
    for job_id in jobs():
        sh("scancel", job_id, check=False)
    until("the cluster's jobs to end", lambda: not jobs())
    sh("scontrol", "update", f"nodename={','.join(NODES)}", "state=resume", check=False)


def node_state(node: str) -> str:
    """A node's ``State`` as Slurm has it now: ``IDLE``, ``IDLE+POWERED_DOWN``, ..."""
    line = sh("scontrol", "show", "node", "-o", node)
    return line.split(" State=", 1)[1].split(" ", 1)[0]


def until_state(state: str, node: str = SLEEPER) -> None:
    """Wait until Slurm has ``node`` in ``state`` (``IDLE``: awake; ``IDLE+POWERED_DOWN``)."""
    until(f"{node} to be {state}", lambda: node_state(node) == state)


def put_to_sleep(node: str = SLEEPER) -> None:
    """Put ``node`` to sleep through Slurm's power saving, as an admin would, and wait
    until it sleeps (its SuspendProgram stopped its slurmd)."""
    if node_state(node) != "IDLE+POWERED_DOWN":
        until(f"{node} to run nothing", lambda: node_state(node) in ("IDLE", "IDLE+POWERED_DOWN"))
        sh("scontrol", "update", f"NodeName={node}", "State=POWER_DOWN", check=False)
        until_state("IDLE+POWERED_DOWN", node)
