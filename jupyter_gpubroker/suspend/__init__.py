"""Suspending idle kernels: their GPU memory moved to the host through CUDA's checkpoint
API, the GPU given to the next holder, the kernel resumed on its next cell.

``driver``: the API as the broker uses it; ``cuda``: the real one (``cuda-bindings``);
``simulated``: the same states on the simulated NVML; ``suspender``: the checks and the
outcomes. ``docs/suspend.md`` has NVIDIA's documentation and what is not done yet.
"""

from .driver import CheckpointDriver, CheckpointError, ProcessState
from .suspender import SUSPENDED, Outcome, Suspender, Suspension

__all__ = [
    "CheckpointDriver",
    "CheckpointError",
    "Outcome",
    "ProcessState",
    "SUSPENDED",
    "Suspender",
    "Suspension",
]
