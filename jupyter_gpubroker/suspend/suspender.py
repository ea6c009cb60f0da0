"""Suspending a kernel's GPU processes and resuming them, with a plain outcome for every
way it can go wrong.

NVIDIA documents (r570) that a process is not kept in a good state after an error during
checkpoint or restore, so everything that can be checked is checked before the first
checkpoint: MIG (not supported by the driver), the driver itself, each process's state, the
host's free memory, and a lock with a timeout (which leaves a process running when it
fails). Until the first checkpoint a refusal loses nothing: the caller falls back to the
configured action with the reason. A checkpoint the driver refuses but that leaves its
process locked loses nothing either: the processes already checkpointed are put back.

A restore is checked first too: it starts only once every GPU it goes to has the memory
free that came from the GPU it pairs (``room``). NVIDIA's restore that runs out of GPU
memory leaves the process stuck for good (NVIDIA/cuda-checkpoint#44); one that cannot start
yet says so (``Outcome.waiting``) and is tried again later.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ..wire.text import duration, memory
from .driver import CheckpointDriver, CheckpointError, ProcessState

SUSPENDED = "suspended"
"""The cause of a lease that ended because its kernel was suspended."""
HOST_HEADROOM = 1.25
"""The host must have this many times the GPU memory free before a suspend: the copy
must not push the server or the kernel itself out of memory."""


@dataclass(frozen=True)
class Outcome:
    """What a suspend or a resume came to, in a sentence for the kernel's user."""

    done: bool
    reason: str
    lost: bool = False
    """The kernel's GPU state may be lost (the driver failed midway)."""
    waiting: bool = False
    """A restore not started: a GPU it goes to has not the memory free yet."""


@dataclass(frozen=True)
class Suspension:
    """A suspended kernel: its processes and the devices their memory came from."""

    pids: tuple[int, ...]
    devices: tuple[str, ...]
    host_mib: float
    device_mib: tuple[float, ...] = ()
    """MiB that came from each of ``devices`` (empty: ``host_mib`` spread evenly, as a
    suspension stored before these were kept)."""

    def needs(self) -> tuple[float, ...]:
        """The GPU memory each of ``devices``' replacements must have free for a restore."""
        if len(self.device_mib) == len(self.devices):
            return self.device_mib
        return (self.host_mib / max(len(self.devices), 1),) * len(self.devices)


def host_available_mib() -> float:
    """``MemAvailable`` from ``/proc/meminfo``, in MiB."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    return 0.0


class Suspender:
    """Suspends and resumes through a :class:`CheckpointDriver`."""

    def __init__(
        self,
        driver: CheckpointDriver,
        *,
        lock_timeout_s: float = 10.0,
        host_mib: Callable[[], float] = host_available_mib,
        room: Callable[[str], float | None] | None = None,
    ) -> None:
        """``room``: a GPU's free MiB now, read from NVML (None: NVML cannot say); without
        it a restore is not checked first (the replay, whose GPUs are always empty)."""
        self.driver = driver
        self.lock_timeout_s = lock_timeout_s
        self.host_mib = host_mib
        self.room = room

    def check(self, devices: Sequence[str], processes: Mapping[int, float]) -> str | None:
        """Why these processes (pid -> GPU MiB) on ``devices`` cannot be suspended (None:
        they can be tried)."""
        if any(d.startswith("MIG-") for d in devices):
            return "a MIG slice cannot be suspended: NVIDIA's checkpoint does not support MIG"
        why = self.driver.unavailable()
        if why is not None:
            return f"this machine cannot suspend a kernel: {why}"
        for pid in processes:
            try:
                state = self.driver.state(pid)
            except CheckpointError as e:
                return f"the driver cannot suspend the kernel's process {pid}: {e.reason}"
            if state is not ProcessState.RUNNING:
                return f"the kernel's process {pid} is {state.name.lower()}, not running"
        need, free = sum(processes.values()), self.host_mib()
        if need * HOST_HEADROOM > free:
            return (
                f"the machine has {memory(free)} of memory free, not enough to hold the "
                f"kernel's {memory(need)} of GPU memory"
            )
        return None

    def suspend(
        self,
        devices: Sequence[str],
        processes: Mapping[int, float],
        on_devices: Mapping[str, float] | None = None,
    ) -> tuple[Outcome, Suspension | None]:
        """Lock, then checkpoint, every process; the outcome says what happened.
        ``on_devices``: the processes' MiB on each device (what a restore needs there)."""
        why = self.check(devices, processes)
        if why is not None:
            return Outcome(False, why), None
        if not processes:  # it has not used its GPU yet: nothing to copy
            outcome = Outcome(True, "suspended, nothing of it on the GPU")
            return outcome, Suspension((), tuple(devices), 0.0)
        pids = tuple(sorted(processes))
        locked: list[int] = []
        try:
            for pid in pids:
                self.driver.lock(pid, int(self.lock_timeout_s * 1000))
                locked.append(pid)
        except CheckpointError as e:
            self._unlock(locked)
            if e.timed_out:
                why = f"the kernel's GPU work did not pause within {duration(self.lock_timeout_s)}"
            else:
                why = f"the driver could not pause the kernel: {e.reason}"
            return Outcome(False, why), None
        done: list[int] = []
        for pid in pids:
            try:
                self.driver.checkpoint(pid)
            except CheckpointError as e:
                return self._undo(pid, e, done, locked, devices), None
            done.append(pid)
        need = sum(processes.values())
        outcome = Outcome(True, f"suspended, its {memory(need)} of GPU memory on the host")
        per_device = tuple(float((on_devices or {}).get(d, 0.0)) for d in devices)
        return outcome, Suspension(pids, tuple(devices), need, per_device if on_devices else ())

    def no_room(self, suspension: Suspension, devices: Sequence[str]) -> str | None:
        """Why a restore onto ``devices`` cannot start now (None: each has the memory its
        pair needs free, or there is nothing to restore or no way to look)."""
        if self.room is None or not suspension.pids:
            return None
        for new, need in zip(devices, suspension.needs(), strict=True):
            free = self.room(new)
            if free is None:
                return f"NVML cannot say how much memory {new} has free"
            if free < need:
                return (
                    f"{new} has {memory(free)} free, not the {memory(need)} the kernel's "
                    "memory needs there"
                )
        return None

    def resume(self, suspension: Suspension, devices: Sequence[str]) -> Outcome:
        """Restore every process onto ``devices`` (in the order of the suspended ones) and
        unlock it, once each has the memory free (``no_room``: else nothing is tried)."""
        pairs = dict(zip(suspension.devices, devices, strict=True))
        why = self.no_room(suspension, devices)
        if why is not None:
            return Outcome(False, f"its restore waits: {why}", waiting=True)
        for pid in suspension.pids:
            try:
                self.driver.restore(pid, pairs)
                self.driver.unlock(pid)
            except CheckpointError as e:
                lost = e.out_of_memory or self._state(pid) is not ProcessState.CHECKPOINTED
                kept = "is lost" if lost else "stays on the host"
                why = f"its restore failed ({e.reason}); its GPU memory {kept}"
                return Outcome(False, why, lost=lost)
        return Outcome(True, "resumed, its GPU memory back on the GPU")

    # -- undoing a suspend that failed midway

    def _undo(
        self,
        failed: int,
        error: CheckpointError,
        done: Sequence[int],
        locked: Sequence[int],
        devices: Sequence[str],
    ) -> Outcome:
        """Put back what was checkpointed before ``failed``'s checkpoint failed."""
        home = {d: d for d in devices}
        for pid in done:
            with contextlib.suppress(CheckpointError):  # its state says below if it is lost
                self.driver.restore(pid, home)
        self._unlock(locked)
        lost = [p for p in locked if self._state(p) is not ProcessState.RUNNING]
        if not lost:
            return Outcome(False, f"the driver cannot suspend this kernel: {error.reason}")
        return Outcome(
            False,
            f"suspending failed and the kernel's GPU memory is lost: {error.reason}",
            lost=True,
        )

    def _unlock(self, pids: Sequence[int]) -> None:
        for pid in pids:
            try:
                if self.driver.state(pid) is ProcessState.LOCKED:
                    self.driver.unlock(pid)
            except CheckpointError:
                pass  # left as it is: _undo reads its state

    def _state(self, pid: int) -> ProcessState | None:
        try:
            return self.driver.state(pid)
        except CheckpointError:
            return None
