"""CUDA's checkpoint API through NVIDIA's ``cuda-bindings`` (``cuda.bindings.driver``),
imported when first used: a host without the package, the driver or a driver new enough
says why instead (:meth:`CudaCheckpointDriver.unavailable`).

Not yet run on a GPU: see ``docs/suspend.md``."""

from __future__ import annotations

import platform
import uuid as uuid_module
from collections.abc import Mapping
from functools import cached_property
from typing import Any

from .driver import CheckpointError, ProcessState

MIN_DRIVER = 12080
"""``cuDriverGetVersion`` of r570, the first driver with the checkpoint calls in its API."""


class CudaCheckpointDriver:
    """The checkpoint calls of this host's CUDA driver. The caller's process initialises
    CUDA (``cuInit``), which NVIDIA's restore needs where persistence mode is off."""

    @cached_property
    def _loaded(self) -> tuple[Any, str | None]:
        if platform.machine() != "x86_64":
            return None, f"NVIDIA's checkpoint API runs on x86-64 only, not {platform.machine()}"
        try:
            from cuda.bindings import driver as cu
        except ImportError:
            return None, "the cuda-bindings package is not installed"
        if not hasattr(cu, "cuCheckpointProcessLock"):
            return None, "the installed cuda-bindings is older than CUDA 12.8"
        try:
            _check(cu, cu.cuInit(0))
            version = _check(cu, cu.cuDriverGetVersion())
        except CheckpointError as e:
            return None, f"the CUDA driver does not start: {e.reason}"
        if version < MIN_DRIVER:
            return None, "the NVIDIA driver is older than r570, the first with checkpoints"
        self._version = version
        return cu, None

    _version = 0
    """``cuDriverGetVersion`` once loaded (12080: CUDA 12.8)."""

    def unavailable(self) -> str | None:
        return self._loaded[1]

    def about(self) -> str:
        if self._loaded[0] is None:
            return "the machine's CUDA driver, without the checkpoint API"
        major, minor = divmod(self._version, 1000)
        return f"the machine's CUDA driver (CUDA {major}.{minor // 10}), with the checkpoint API"

    @property
    def _cu(self) -> Any:
        cu, why = self._loaded
        if cu is None:
            raise CheckpointError(why or "no CUDA driver")
        return cu

    def state(self, pid: int) -> ProcessState:
        cu = self._cu
        return ProcessState(int(_check(cu, cu.cuCheckpointProcessGetState(pid))))

    def lock(self, pid: int, timeout_ms: int) -> None:
        cu = self._cu
        args = cu.CUcheckpointLockArgs()
        args.timeoutMs = timeout_ms
        result = cu.cuCheckpointProcessLock(pid, args)
        if result[0] == cu.CUresult.CUDA_ERROR_TIMEOUT:
            raise CheckpointError(
                f"process {pid} did not pause its GPU work within {timeout_ms} ms",
                timed_out=True,
            )
        _check(cu, result)

    def checkpoint(self, pid: int) -> None:
        cu = self._cu
        _check(cu, cu.cuCheckpointProcessCheckpoint(pid, None))

    def restore(self, pid: int, gpu_pairs: Mapping[str, str]) -> None:
        cu = self._cu
        if all(old == new for old, new in gpu_pairs.items()):
            # back where it was: no pairs, NVIDIA's default restore (a pair list, even of
            # the same GPUs, fails in a process that sees only some GPUs: cuda-python#1983)
            _check(cu, cu.cuCheckpointProcessRestore(pid, None), out_of_memory=True)
            return
        pairs = []
        for old, new in gpu_pairs.items():
            pair = cu.CUcheckpointGpuPair()
            pair.oldUuid = _cu_uuid(cu, old)
            pair.newUuid = _cu_uuid(cu, new)
            pairs.append(pair)
        args = cu.CUcheckpointRestoreArgs()
        args.gpuPairs = pairs
        args.gpuPairsCount = len(pairs)
        _check(cu, cu.cuCheckpointProcessRestore(pid, args), out_of_memory=True)

    def unlock(self, pid: int) -> None:
        cu = self._cu
        _check(cu, cu.cuCheckpointProcessUnlock(pid, None))


def _cu_uuid(cu: Any, nvml_uuid: str) -> Any:
    """NVML's "GPU-<uuid>" as the driver's 16-byte ``CUuuid``."""
    value = cu.CUuuid()
    value.bytes = uuid_module.UUID(nvml_uuid.removeprefix("GPU-")).bytes
    return value


def _check(cu: Any, result: tuple[Any, ...], *, out_of_memory: bool = False) -> Any:
    """A driver call's value, or its error as a ``CheckpointError`` in the driver's words
    (``out_of_memory``: a restore's, flagged where the GPU lacked the memory)."""
    err, *value = result
    if err != cu.CUresult.CUDA_SUCCESS:
        _, words = cu.cuGetErrorString(err)
        oom = out_of_memory and err == cu.CUresult.CUDA_ERROR_OUT_OF_MEMORY
        raise CheckpointError(
            words.decode() if isinstance(words, bytes) else str(err), out_of_memory=oom
        )
    return value[0] if value else None
