"""The CUDA checkpoint API as the broker uses it: one process's GPU state moved to host
memory and back, driven from another process (the kernel's server, of the same user).

NVIDIA's driver (r570 and later) keeps a state per CUDA process:

    running --lock--> locked --checkpoint--> checkpointed --restore--> locked --unlock--> running

A lock that times out leaves the process running; an error during checkpoint or restore may
leave it ``failed`` (NVIDIA does not keep it in a good state), and a restore that runs out of
GPU memory leaves it checkpointed but never restorable again (NVIDIA/cuda-checkpoint#44).
``docs/suspend.md`` cites the documentation this follows. :class:`CheckpointDriver` is that
API; ``cuda.py`` calls the driver through ``cuda-bindings``, ``simulated.py`` follows the
same states on the simulated NVML.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Protocol


class ProcessState(enum.Enum):
    """``CUprocessState``, by the names NVIDIA gives its values."""

    RUNNING = 0
    LOCKED = 1
    CHECKPOINTED = 2
    FAILED = 3


class CheckpointError(Exception):
    """A checkpoint call the driver refused or failed; ``reason`` is a plain sentence."""

    def __init__(
        self, reason: str, *, timed_out: bool = False, out_of_memory: bool = False
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.timed_out = timed_out
        """A lock that did not get the process within its timeout (left running)."""
        self.out_of_memory = out_of_memory
        """A restore that found too little GPU memory: the driver cannot restore that
        process again (NVIDIA/cuda-checkpoint#44), though it says it is checkpointed."""


class CheckpointDriver(Protocol):
    """The five calls of CUDA's checkpoint API, by process id."""

    def unavailable(self) -> str | None:
        """Why this host cannot checkpoint a process (None: it can)."""

    def about(self) -> str:
        """Which driver this is, in words (its CUDA version, where it has one)."""

    def state(self, pid: int) -> ProcessState: ...

    def lock(self, pid: int, timeout_ms: int) -> None:
        """Block the process's CUDA calls once its submitted work has finished; give up after
        ``timeout_ms`` (a ``CheckpointError`` with ``timed_out``, the process left running)."""

    def checkpoint(self, pid: int) -> None:
        """Copy a locked process's GPU memory to host memory and release its GPUs."""

    def restore(self, pid: int, gpu_pairs: Mapping[str, str]) -> None:
        """Put a checkpointed process back on GPUs (old UUID -> new UUID, every GPU it had,
        each of the same chip, with the memory free); it is left locked. One that finds too
        little memory fails with ``out_of_memory`` and leaves the process stuck for good."""

    def unlock(self, pid: int) -> None: ...
