"""The NVML backend: the broker's inventory and device readings, read through pynvml.

It only ever calls pynvml, so the same code runs against a driver and against
the simulated library (:mod:`.simulated`); :func:`jupyter_gpubroker.nvml.open_backend`
chooses which.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import pynvml

from ..broker.models import Device, DeviceReading, Gpu, Health, Inventory, ProcessInfo
from ..broker.profiles import GpuModel, model_for_name
from .presets import PRESET_NAMES

if TYPE_CHECKING:
    from types import TracebackType

    from .simulated import SimulatedNvml

SIMULATE_ENV = "GPUBROKER_SIMULATE"
"""Environment variable naming a simulated topology when none is configured."""

_T = TypeVar("_T")
_MIB = 1 << 20
_NOT_AVAILABLE = pynvml.NVML_VALUE_NOT_AVAILABLE_uint.value


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used on this machine (no driver, or no libnvidia-ml)."""


def is_mig_device_handle(handle: Any) -> bool:
    """Whether ``handle`` is a MIG device; pynvml returns the C ``c_uint``, not a bool."""
    answer = pynvml.nvmlDeviceIsMigDeviceHandle(handle)
    return bool(getattr(answer, "value", answer))


class NvmlBackend:
    """Inventory and readings from NVML; open it before use (or use it as a context manager).

    With a ``simulator`` the backend installs it on :meth:`open` and uninstalls it
    on :meth:`close`, so a simulated backend leaves pynvml as it found it.
    """

    def __init__(
        self, simulator: SimulatedNvml | None = None, log: logging.Logger | None = None
    ) -> None:
        self.simulator = simulator
        self.log = log or logging.getLogger(__name__)
        self._open = False

    def open(self) -> NvmlBackend:
        if self._open:
            return self
        if self.simulator is not None:
            self.simulator.install()
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            if self.simulator is not None:
                self.simulator.uninstall()
            if isinstance(e, (pynvml.NVMLError_LibraryNotFound, pynvml.NVMLError_DriverNotLoaded)):
                raise NvmlUnavailable(
                    f"No NVIDIA driver was found ({e}). To run on simulated GPUs instead, set "
                    f"{SIMULATE_ENV}=dgx-h100-mig in the environment or "
                    "c.GPUBroker.simulate = 'dgx-h100-mig' in the Jupyter config "
                    f"(presets: {', '.join(PRESET_NAMES)}; or the path of a topology file)."
                ) from e
            raise
        self._open = True
        return self

    def close(self) -> None:
        if not self._open:
            return
        self._open = False
        try:
            pynvml.nvmlShutdown()
        finally:
            if self.simulator is not None:
                self.simulator.uninstall()

    def __enter__(self) -> NvmlBackend:
        return self.open()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -------------------------------------------------------------- inventory

    def inventory(self) -> Inventory:
        """Every GPU NVML enumerates, and the grantable devices on them: the GPU itself
        when MIG is off, its MIG devices when MIG is on. A lost GPU is left out."""
        gpus: list[Gpu] = []
        devices: list[Device] = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            try:
                gpu, on_gpu = self._scan(index, handle)
            except pynvml.NVMLError_GpuIsLost:
                self.log.warning("GPU %d is lost (fell off the bus); leaving it out", index)
                continue
            gpus.append(gpu)
            devices += on_gpu
        return Inventory(tuple(gpus), tuple(devices))

    def gpu_devices(self, gpu_uuid: str) -> tuple[Device, ...]:
        """The grantable devices on one GPU, read afresh (after a MIG change)."""
        handle = pynvml.nvmlDeviceGetHandleByUUID(gpu_uuid)
        return tuple(self._scan(pynvml.nvmlDeviceGetIndex(handle), handle)[1])

    def _scan(self, index: int, handle: Any) -> tuple[Gpu, list[Device]]:
        uuid = pynvml.nvmlDeviceGetUUID(handle)
        name = pynvml.nvmlDeviceGetName(handle)
        memory_mib = pynvml.nvmlDeviceGetMemoryInfo(handle).total // _MIB
        mig = _mig_enabled(handle)
        model = model_for_name(name)
        gpu = Gpu(
            index=index,
            uuid=uuid,
            name=name,
            memory_mib=memory_mib,
            mig_enabled=mig,
            model=model.key if model else None,
            pci_bus_id=pynvml.nvmlDeviceGetPciInfo(handle).busId,
        )
        if not mig:
            return gpu, [Device(uuid, "gpu", index, uuid, memory_mib)]
        if model is None:
            self.log.warning(
                "GPU %d (%s) is not in the MIG profile catalog; its MIG devices are not offered",
                index,
                name,
            )
            return gpu, []
        found = (self._mig_device(gpu, model, handle, m) for m in _mig_handles(handle))
        return gpu, [d for d in found if d is not None]

    def _mig_device(self, gpu: Gpu, model: GpuModel, parent: Any, handle: Any) -> Device | None:
        """One MIG device. The broker, like mig-parted, makes one compute instance
        spanning each GPU instance, so the GPU instance's profile is the device's."""
        gi_id = pynvml.nvmlDeviceGetGpuInstanceId(handle)
        info = pynvml.nvmlGpuInstanceGetInfo(pynvml.nvmlDeviceGetGpuInstanceById(parent, gi_id))
        profile = next((p for p in model.profiles if p.profile_id == info.profileId), None)
        if profile is None:
            self.log.warning(
                "GPU %d: GPU instance %d has profile id %d, which the %s catalog lacks; skipped",
                gpu.index,
                gi_id,
                info.profileId,
                model.key,
            )
            return None
        return Device(
            uuid=pynvml.nvmlDeviceGetUUID(handle),
            kind="mig",
            gpu_index=gpu.index,
            gpu_uuid=gpu.uuid,
            memory_mib=pynvml.nvmlDeviceGetMemoryInfo(handle).total // _MIB,
            compute_slices=profile.compute_slices,
            profile=profile.name,
            start=info.placement.start,
            gpu_instance_id=gi_id,
            compute_instance_id=pynvml.nvmlDeviceGetComputeInstanceId(handle),
        )

    # -------------------------------------------------------------- readings

    def read(self, uuid: str) -> DeviceReading:
        """One sample of a GPU or MIG device. Never raises for NVML errors: a lost GPU
        reads as ``Health.LOST``, any other failure as ``Health.UNREACHABLE``."""
        try:
            return self._read(uuid, pynvml.nvmlDeviceGetHandleByUUID(uuid))
        except pynvml.NVMLError_GpuIsLost as e:
            return DeviceReading(uuid, health=Health.LOST, error=f"GPU is lost: {e}")
        except pynvml.NVMLError as e:
            return DeviceReading(uuid, health=Health.UNREACHABLE, error=str(e))

    def read_all(self, inventory: Inventory | None = None) -> dict[str, DeviceReading]:
        """Readings of every GPU and device of ``inventory`` (default: a fresh one). Pass
        the inventory the broker holds to see its GPUs that have since been lost."""
        inv = inventory if inventory is not None else self.inventory()
        uuids = dict.fromkeys([*(g.uuid for g in inv.gpus), *(d.uuid for d in inv.devices)])
        return {uuid: self.read(uuid) for uuid in uuids}

    def _read(self, uuid: str, handle: Any) -> DeviceReading:
        unsupported: list[str] = []

        def probe(fields: tuple[str, ...], call: Callable[[Any], _T]) -> _T | None:
            try:
                return call(handle)
            except pynvml.NVMLError_NotSupported:
                unsupported.extend(fields)
                return None

        util = probe(
            ("utilization_gpu", "utilization_memory"), pynvml.nvmlDeviceGetUtilizationRates
        )
        memory = probe(("memory_used_mib", "memory_total_mib"), pynvml.nvmlDeviceGetMemoryInfo)
        return DeviceReading(
            uuid,
            utilization_gpu=None if util is None else float(util.gpu),
            utilization_memory=None if util is None else float(util.memory),
            memory_used_mib=None if memory is None else memory.used // _MIB,
            memory_total_mib=None if memory is None else memory.total // _MIB,
            temperature_c=probe(("temperature_c",), _temperature),
            power_mw=probe(("power_mw",), pynvml.nvmlDeviceGetPowerUsage),
            power_limit_mw=probe(("power_limit_mw",), pynvml.nvmlDeviceGetEnforcedPowerLimit),
            clock_event_reasons=probe(
                ("clock_event_reasons",), pynvml.nvmlDeviceGetCurrentClocksEventReasons
            ),
            processes=probe(("processes",), _processes) or (),
            unsupported=tuple(unsupported),
        )


def _mig_enabled(handle: Any) -> bool:
    try:
        return bool(pynvml.nvmlDeviceGetMigMode(handle)[0] == pynvml.NVML_DEVICE_MIG_ENABLE)
    except pynvml.NVMLError_NotSupported:
        return False


def _mig_handles(parent: Any) -> Iterator[Any]:
    """The MIG devices of a GPU; indexes without one answer NotFound."""
    for index in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(parent)):
        try:
            yield pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, index)
        except pynvml.NVMLError_NotFound:
            continue


def _temperature(handle: Any) -> int:
    """The GPU temperature; ``TemperatureV`` is preferred since NVML 13, older drivers
    and pynvml versions lack it."""
    get_v = getattr(pynvml, "nvmlDeviceGetTemperatureV", None)
    if get_v is not None:
        try:
            return int(get_v(handle, pynvml.NVML_TEMPERATURE_GPU))
        except pynvml.NVMLError_FunctionNotFound:
            pass
    return int(pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU))


def _processes(handle: Any) -> tuple[ProcessInfo, ...]:
    return tuple(
        ProcessInfo(
            pid=p.pid,
            used_memory_mib=None if p.usedGpuMemory is None else p.usedGpuMemory // _MIB,
            gpu_instance_id=None if p.gpuInstanceId == _NOT_AVAILABLE else p.gpuInstanceId,
            compute_instance_id=(
                None if p.computeInstanceId == _NOT_AVAILABLE else p.computeInstanceId
            ),
        )
        for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
    )
