"""The processes NVML lists on a GPU or MIG device, and each one's own SM utilization.

A GPU lent in shares runs several users' kernels at once; its utilization is theirs
together. ``nvmlDeviceGetProcessUtilization`` returns a sample per process for each of
the driver's sample periods in which it had some load, newer than the caller's
``lastSeenTimeStamp``. So this reader keeps, per GPU, the newest timestamp it has seen and
averages each process's samples since then: a process with none had no load. NVML answers
NotSupported on MIG.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from typing import Any

import pynvml

from ..broker.models import ProcessInfo

_MIB = 1 << 20
_NOT_AVAILABLE = pynvml.NVML_VALUE_NOT_AVAILABLE_uint.value
MIN_INTERVAL_S = 1.0
"""Readings closer than this reuse the last result: NVML may not have sampled again yet."""
RETRIES = 3
"""Tries when more samples arrive between the count query and the read."""


class ProcessLoads:
    """The per-process utilization of whole GPUs, read since the last reading of each."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[float, int, dict[int, float] | None]] = {}
        """GPU UUID -> (when read, newest sample's timestamp, what it read)."""
        self._lock = threading.Lock()
        """Readings may be taken on several threads; each sample counts in one of them."""

    def read(self, uuid: str, handle: Any) -> dict[int, float] | None:
        """pid -> its SM utilization in percent, the mean of its samples since the last
        reading (a process without one had no load: 0); None where NVML gives none."""
        with self._lock:
            now = time.monotonic()
            last = self._last.get(uuid)
            if last is not None and now - last[0] < MIN_INTERVAL_S:
                return last[2]
            since = 0 if last is None else last[1]
            try:
                samples = _samples(handle, since)
            except pynvml.NVMLError_GpuIsLost:
                raise
            except pynvml.NVMLError:  # NotSupported (MIG, older GPUs), NoPermission, ...
                self._last[uuid] = (now, since, None)
                return None
            by_pid: defaultdict[int, list[int]] = defaultdict(list)
            for s in samples:
                by_pid[s.pid].append(s.smUtil)
            loads = {pid: sum(sm) / len(sm) for pid, sm in by_pid.items()}
            newest = max([since, *(s.timeStamp for s in samples)])
            self._last[uuid] = (now, newest, loads)
            return loads


def _samples(handle: Any, since: int) -> list[Any]:
    """NVML's samples newer than ``since``; none when it has none (NotFound)."""
    tries = RETRIES
    while True:
        try:
            return list(pynvml.nvmlDeviceGetProcessUtilization(handle, since))
        except pynvml.NVMLError_NotFound:
            return []
        except pynvml.NVMLError_InsufficientSize:  # a period ended between the two calls
            tries -= 1
            if not tries:
                raise


def list_processes(handle: Any) -> tuple[ProcessInfo, ...]:
    """The compute processes, and the MPS clients, each once: a client is marked ``mps``
    whether NVML lists it in its compute query too or in its MPS query only."""
    clients = {p.pid: p for p in _mps_clients(handle)}
    listed = {p.pid: p for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)}
    return tuple(
        ProcessInfo(
            pid=pid,
            used_memory_mib=None if p.usedGpuMemory is None else p.usedGpuMemory // _MIB,
            gpu_instance_id=None if p.gpuInstanceId == _NOT_AVAILABLE else p.gpuInstanceId,
            compute_instance_id=(
                None if p.computeInstanceId == _NOT_AVAILABLE else p.computeInstanceId
            ),
            mps=pid in clients,
        )
        for pid, p in {**clients, **listed}.items()
    )


def _mps_clients(handle: Any) -> list[Any]:
    """NVML's processes with an MPS compute context; none where it cannot say."""
    try:
        return list(pynvml.nvmlDeviceGetMPSComputeRunningProcesses(handle))
    except pynvml.NVMLError:
        return []
