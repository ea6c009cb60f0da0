"""The driver's own limit on a share's memory: a cgroup of its own for the share's
kernel, and NVML's memory limits on it (driver r615 and CUDA 13.4 on: NVIDIA's MPS
documentation, "MPS v3 Memory Partitioning"; NVML's ``nvmlDeviceSetMemoryLimits_v1``).
The hard limit is what an allocation past it fails on (out of memory); the soft limit,
set equal, leaves no borrowing. Root only, cgroup v2, never a MIG device.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from pathlib import Path

import pynvml

SetLimit = Callable[[str, str, int, int], None]
"""(GPU UUID, cgroup path, soft bytes, hard bytes): NVML's call, or a test's."""


def nvml_set_limit(gpu: str, cgroup: str, soft: int, hard: int) -> None:
    """``nvmlDeviceSetMemoryLimits_v1`` on ``gpu`` for ``cgroup``."""
    handle = pynvml.nvmlDeviceGetHandleByUUID(gpu)
    limits = pynvml.c_nvmlSetMemoryLimits_v1_t(cgroup.encode(), soft, hard)
    pynvml.nvmlDeviceSetMemoryLimits_v1(handle, limits)


class CgroupLimits:
    """Each share's kernel in a cgroup of its own under ``root``, held there by the driver."""

    def __init__(
        self, root: Path, set_limit: SetLimit = nvml_set_limit, log: logging.Logger | None = None
    ):
        self.root, self.set_limit = root, set_limit
        self.log = log or logging.getLogger(__name__)
        self.held: dict[str, tuple[str, int]] = {}
        """Lease id -> (GPU, pid put in its cgroup)."""

    def path(self, lease_id: str) -> Path:
        return self.root / f"gpubroker-{lease_id}"

    def hold(self, lease_id: str, gpu: str, pid: int, mib: int) -> None:
        """Put ``pid`` (the kernel) in the share's cgroup, and cap the cgroup at ``mib``
        on ``gpu``; once per lease and pid."""
        if self.held.get(lease_id) == (gpu, pid):
            return
        cgroup = self.path(lease_id)
        cgroup.mkdir(mode=0o755, exist_ok=True)
        (cgroup / "cgroup.procs").write_text(f"{pid}\n")
        self.set_limit(gpu, str(cgroup), mib << 20, mib << 20)
        self.held[lease_id] = (gpu, pid)

    def end(self, lease_id: str) -> None:
        """Lift the share's limit and remove its cgroup once its processes are gone."""
        gpu_pid = self.held.pop(lease_id, None)
        if gpu_pid is None:
            return
        cgroup = self.path(lease_id)
        with contextlib.suppress(pynvml.NVMLError):
            self.set_limit(gpu_pid[0], str(cgroup), 0, pynvml.NVML_DEVICE_MEMORY_LIMIT_MAX)
        with contextlib.suppress(OSError):  # a process still in it: the kernel keeps it
            cgroup.rmdir()
