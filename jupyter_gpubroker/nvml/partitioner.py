"""Dynamic MIG: create and destroy MIG slices on request of the broker core.

Only used when the deployment enables dynamic MIG (creating instances needs
root or the mig-config capability). Every failure surfaces as the core's
:class:`~jupyter_gpubroker.wire.errors.PartitionFailed`, with a sentence
saying why, so the core never sees an NVML type.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from contextlib import contextmanager

import pynvml

from ..broker.models import Device
from ..wire.errors import PartitionFailed
from ..wire.profiles import model_for_name
from .backend import NvmlBackend, is_mig_device_handle

_FULL_COMPUTE_INSTANCE = {
    1: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE,
    2: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE,
    3: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE,
    4: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE,
    7: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE,
}
"""Compute slices of a GPU instance -> the compute-instance profile spanning all of them."""

_REASONS: dict[type[pynvml.NVMLError], str] = {
    pynvml.NVMLError_InUse: "it is in use (processes run on it, or compute instances remain)",
    pynvml.NVMLError_InsufficientResources: (
        "there is no room: the placement overlaps an existing instance, "
        "or the GPU already holds the most instances of this profile"
    ),
    pynvml.NVMLError_NotSupported: "MIG is not enabled on that GPU",
    pynvml.NVMLError_NoPermission: "creating and destroying MIG instances needs root "
    "or the mig-config capability",
    pynvml.NVMLError_NotFound: "NVML knows no such device",
    pynvml.NVMLError_GpuIsLost: "the GPU is lost (fell off the bus)",
}


@contextmanager
def _failures(action: str) -> Iterator[None]:
    """Turn NVML errors raised while doing ``action`` into PartitionFailed."""
    try:
        yield
    except pynvml.NVMLError as e:
        reason = _REASONS.get(type(e), "NVML refused")
        raise PartitionFailed(f"cannot {action}: {reason} (NVML: {e})") from e


class MigPartitioner:
    """Creates and destroys MIG slices through the backend's NVML."""

    def __init__(self, backend: NvmlBackend) -> None:
        self.backend = backend

    def create(self, gpu_uuid: str, profile: str, start: int) -> Device:
        """Create a GPU instance of ``profile`` at memory slice ``start`` and one compute
        instance spanning it; return the new slice as the inventory shows it."""
        action = f"create {profile} at memory slice {start} on GPU {gpu_uuid}"
        with _failures(action):
            handle = self.backend.handle(gpu_uuid)
            name = pynvml.nvmlDeviceGetName(handle)
            model = model_for_name(name)
            found = model.profile(profile) if model else None
            if model is None or found is None:
                where = (
                    f"{model.key} GPUs have" if model else f"{name} (not in the MIG catalog) has"
                )
                raise PartitionFailed(f"cannot {action}: {where} no MIG profile {profile!r}")
            if start not in found.starts:
                starts = ", ".join(map(str, found.starts))
                raise PartitionFailed(
                    f"cannot {action}: {profile} may start only at memory slice {starts}"
                )
            # version=1: needs no struct version (pynvml 13.615 sets it; older may not).
            info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, found.nvml_profile, 1)
            placement = pynvml.c_nvmlGpuInstancePlacement_t(start, found.size)
            gi = pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(
                handle, info.id, ctypes.byref(placement)
            )
            try:
                ci_info = pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                    gi,
                    _FULL_COMPUTE_INSTANCE[found.compute_slices],
                    pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
                    1,
                )
                ci = pynvml.nvmlGpuInstanceCreateComputeInstance(gi, ci_info.id)
            except pynvml.NVMLError:
                pynvml.nvmlGpuInstanceDestroy(gi)
                raise
            ids = (pynvml.nvmlGpuInstanceGetInfo(gi).id, pynvml.nvmlComputeInstanceGetInfo(ci).id)
            devices = self.backend.gpu_devices(gpu_uuid)
        device = next(
            (d for d in devices if (d.gpu_instance_id, d.compute_instance_id) == ids), None
        )
        if device is None:
            raise PartitionFailed(f"created {profile} on GPU {gpu_uuid}, but NVML does not list it")
        return device

    def destroy(self, device_uuid: str) -> None:
        """Destroy a MIG slice: its compute instance, then its GPU instance. A GPU
        instance that still holds other compute instances (made outside the broker) stays."""
        action = f"destroy MIG device {device_uuid}"
        with _failures(action):
            handle = self.backend.handle(device_uuid)
            if not is_mig_device_handle(handle):
                raise PartitionFailed(f"cannot {action}: it is a whole GPU, not a MIG device")
            parent = pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle)
            gi = pynvml.nvmlDeviceGetGpuInstanceById(
                parent, pynvml.nvmlDeviceGetGpuInstanceId(handle)
            )
            ci = pynvml.nvmlGpuInstanceGetComputeInstanceById(
                gi, pynvml.nvmlDeviceGetComputeInstanceId(handle)
            )
            pynvml.nvmlComputeInstanceDestroy(ci)
            try:
                pynvml.nvmlGpuInstanceDestroy(gi)
            except pynvml.NVMLError_InUse:
                self.backend.log.info("%s: its GPU instance keeps other compute instances", action)
