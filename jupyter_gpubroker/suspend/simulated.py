"""CUDA's checkpoint API on the simulated NVML: the documented states and errors, with a
checkpointed process's memory off its devices (gone from NVML's process lists) and back on
the ones it is restored to. The faults NVIDIA documents can be injected per process. A
restore onto a GPU without the memory fails as NVIDIA's does and leaves the process stuck
for good: checkpointed, but never restorable again (NVIDIA/cuda-checkpoint#44).

The driver's states are the machine's, not its caller's: NVIDIA's driver keeps a
checkpointed process's memory in that process, so a broker restarted on the same machine
finds what it checkpointed, and a process that exits takes its memory with it. Here the
machine is the simulated NVML: every driver over one ``SimulatedNvml`` sees the same
states."""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..nvml.simulated import SimulatedNvml
from .driver import CheckpointError, ProcessState


@dataclass
class _Process:
    state: ProcessState = ProcessState.RUNNING
    host: dict[str, int] = field(default_factory=dict)
    """UUID -> MiB copied to the host at the checkpoint (empty otherwise)."""
    real: bool = False
    """An OS process (a kernel): gone, with its state, once it exits."""
    stuck: bool = False
    """A restore ran out of GPU memory: no restore takes it back (NVIDIA/cuda-checkpoint#44)."""


@dataclass
class _Machine:
    """The driver's side of one simulated machine: its CUDA processes' states."""

    processes: dict[int, _Process] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


_MACHINES: weakref.WeakKeyDictionary[SimulatedNvml, _Machine] = weakref.WeakKeyDictionary()


class SimulatedCheckpointDriver:
    """The checkpoint API of a driver over ``nvml``; a process is a CUDA process while the
    simulated NVML lists it on a device (or the driver holds its checkpoint)."""

    def __init__(self, nvml: SimulatedNvml, *, unavailable: str | None = None) -> None:
        self.nvml = nvml
        self.why_unavailable = unavailable
        """Why the simulated driver has no checkpoint API (a driver older than r570)."""
        self.busy: set[int] = set()
        """Processes whose submitted work never finishes: a lock on them times out."""
        self.refuse: dict[int, str] = {}
        """Processes whose checkpoint the driver refuses (e.g. UVM or IPC memory), leaving
        them locked: pid -> the driver's words."""
        self.breaks: dict[int, str] = {}
        """Processes a checkpoint or restore leaves ``failed``: pid -> the driver's words."""
        self.calls: list[tuple[str, int]] = []
        """Every call made, in order: (name, pid)."""
        machine = _MACHINES.setdefault(nvml, _Machine())
        self._processes, self._lock = machine.processes, machine.lock

    def unavailable(self) -> str | None:
        return self.why_unavailable

    def about(self) -> str:
        return "the simulated checkpoint driver" + (
            ", without the checkpoint API" if self.why_unavailable else ""
        )

    def held(self) -> dict[int, dict[str, int]]:
        """pid -> UUID -> MiB held on the host for each checkpointed process; a process
        that exited is gone, its memory freed with it, as the real driver frees it."""
        with self._lock:
            for pid in [p for p, x in self._processes.items() if x.real and not _runs(p)]:
                del self._processes[pid]
            return {p: dict(x.host) for p, x in self._processes.items() if x.host}

    def _process(self, pid: int, call: str) -> _Process:
        self.calls.append((call, pid))
        if self.why_unavailable is not None:
            raise CheckpointError(self.why_unavailable)
        process = self._processes.get(pid)
        if process is not None and process.real and not _runs(pid):
            del self._processes[pid]  # exited: its memory, on the host too, went with it
            process = None
        if process is None:
            if not self.nvml.process_memory(pid):
                raise CheckpointError(f"process {pid} does not use the GPU")
            process = self._processes[pid] = _Process(real=_runs(pid))
        return process

    @staticmethod
    def _require(process: _Process, state: ProcessState, pid: int) -> None:
        if process.state is not state:
            raise CheckpointError(
                f"process {pid} is {process.state.name.lower()}, not {state.name.lower()}"
            )

    def state(self, pid: int) -> ProcessState:
        with self._lock:
            return self._process(pid, "state").state

    def lock(self, pid: int, timeout_ms: int) -> None:
        with self._lock:
            process = self._process(pid, "lock")
            self._require(process, ProcessState.RUNNING, pid)
            if pid in self.busy:
                raise CheckpointError(
                    f"process {pid} did not pause its GPU work within {timeout_ms} ms",
                    timed_out=True,
                )
            process.state = ProcessState.LOCKED

    def checkpoint(self, pid: int) -> None:
        with self._lock:
            process = self._process(pid, "checkpoint")
            self._require(process, ProcessState.LOCKED, pid)
            if pid in self.breaks:
                process.state = ProcessState.FAILED
                raise CheckpointError(self.breaks[pid])
            if pid in self.refuse:
                raise CheckpointError(self.refuse[pid])
            process.host = self.nvml.process_memory(pid)
            for uuid in process.host:
                self.nvml.remove_process(uuid, pid)
            process.state = ProcessState.CHECKPOINTED

    def restore(self, pid: int, gpu_pairs: Mapping[str, str]) -> None:
        with self._lock:
            process = self._process(pid, "restore")
            self._require(process, ProcessState.CHECKPOINTED, pid)
            if process.stuck:  # CUDA_ERROR_OPERATING_SYSTEM, from then on
                raise CheckpointError("OS call failed or operation not supported on this OS")
            missing = process.host.keys() - gpu_pairs.keys()
            if missing:
                raise CheckpointError(f"no GPU given for {', '.join(sorted(missing))}")
            for old, mib in process.host.items():
                new = gpu_pairs[old]
                old_chip, _ = self.nvml.room(old)
                try:
                    new_chip, free = self.nvml.room(new)
                except ValueError:
                    raise CheckpointError(f"there is no GPU {new}") from None
                if new_chip != old_chip or new.startswith("MIG-"):
                    raise CheckpointError(f"{new} is not a GPU of the same chip as {old}")
                if free < mib:  # CUDA_ERROR_OUT_OF_MEMORY, and the process is stuck
                    process.stuck = True
                    raise CheckpointError("out of memory", out_of_memory=True)
            if pid in self.breaks:
                process.state = ProcessState.FAILED
                raise CheckpointError(self.breaks[pid])
            for old, mib in process.host.items():  # a real OS process: listed while it runs
                self.nvml.add_process(gpu_pairs[old], pid, mib, follow=process.real)
            process.host = {}
            process.state = ProcessState.LOCKED

    def unlock(self, pid: int) -> None:
        with self._lock:
            process = self._process(pid, "unlock")
            self._require(process, ProcessState.LOCKED, pid)
            process.state = ProcessState.RUNNING
            del self._processes[pid]  # running again: a CUDA process while NVML lists it


def _runs(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")
