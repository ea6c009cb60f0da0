"""Which pid namespace a process id is to be read in.

A pid names a process only within one pid namespace. A kernel in a container of its own
knows itself by a pid that the broker's ``/proc`` lacks, or holds for another process; a
broker in a container of its own reads every pid of the host's that way. So a renewal
that names its holder process says which namespace it counted in (``own``), and the
broker reads that pid only where the namespace is its own. NVIDIA's driver, for its part,
listed GPU processes by the host's pids (NVIDIA/nvidia-docker#1483); newer drivers
translate them for a caller in a container (NVIDIA/open-gpu-kernel-modules#614). A broker
outside the host's namespace on real GPUs therefore cannot tell whose processes NVML lists
(``nvml_unseen``).
"""

from __future__ import annotations

import os
import re

from .wire.text import BROKER_PID_NAMESPACE

HOST = "pid:[4026531836]"
"""The host's (the initial) pid namespace: Linux gives it this inode, ``PROC_PID_INIT_INO``."""
FORMAT = re.compile(r"pid:\[[0-9]{1,20}\]")
"""How ``/proc/self/ns/pid`` reads."""


def own() -> str:
    """This process's pid namespace, as ``/proc/self/ns/pid`` names it ("" where unreadable)."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def nvml_unseen(namespace: str, simulated: bool) -> str | None:
    """Why a broker in ``namespace`` cannot match the processes NVML lists to its kernels
    (None: it can). A simulated NVML lists the pids the broker itself gave it."""
    if simulated or namespace == HOST:
        return None
    return BROKER_PID_NAMESPACE
