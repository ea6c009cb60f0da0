"""The NVML backend: the broker's inventory and device readings, read through pynvml.

It only ever calls pynvml, so the same code runs against a driver and against
the simulated library (:mod:`.simulated`); :func:`jupyter_gpubroker.nvml.open_backend`
chooses which.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import pynvml

from ..broker.models import (
    Device,
    DeviceEvent,
    DeviceReading,
    Gpu,
    Health,
    Inventory,
    ProcessInfo,
)
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
_WATCHED_EVENTS = pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeDoubleBitEccError
_GPM_METRICS = (pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL, pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL)
GPM_MIN_INTERVAL_S = 1.0
"""GPM metrics are computed between two samples; closer ones reuse the last result."""


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
        self._events: Any = None
        self._gpm_support: dict[str, bool] = {}
        self._gpm: dict[str, tuple[float, Any, tuple[float, float] | None]] = {}
        """MIG device UUID -> (when, GPM sample, metrics from the previous interval)."""
        self._gpm_lock = threading.Lock()
        """Readings may be taken on several threads; a GPM sample must be freed once."""
        self._thresholds: dict[str, tuple[int | None, int | None]] = {}
        """GPU UUID -> its (slowdown, shutdown) temperatures, which never change."""

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
            self._free_samples()
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

    def compute_pids(self, device_uuid: str) -> tuple[int, ...]:
        """Pids of the compute processes on a GPU or MIG device (the broker's process
        probe); ``()`` when there are none or NVML cannot tell (a lost GPU is drained by
        its health check instead)."""
        try:
            handle = pynvml.nvmlDeviceGetHandleByUUID(device_uuid)
            return tuple(p.pid for p in _processes(handle))
        except pynvml.NVMLError:
            return ()

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
        rates = None if util is None else (float(util.gpu), float(util.memory))
        if rates is None and is_mig_device_handle(handle):
            rates = self._gpm_rates(uuid, handle)
            if rates is not None:
                unsupported.remove("utilization_gpu")
                unsupported.remove("utilization_memory")
        temperature = probe(("temperature_c",), _temperature)
        slowdown, shutdown = (None, None) if temperature is None else self._limits(uuid, handle)
        return DeviceReading(
            uuid,
            utilization_gpu=None if rates is None else rates[0],
            utilization_memory=None if rates is None else rates[1],
            memory_used_mib=None if memory is None else memory.used // _MIB,
            memory_total_mib=None if memory is None else memory.total // _MIB,
            temperature_c=temperature,
            temperature_slowdown_c=slowdown,
            temperature_shutdown_c=shutdown,
            power_mw=probe(("power_mw",), pynvml.nvmlDeviceGetPowerUsage),
            power_limit_mw=probe(("power_limit_mw",), pynvml.nvmlDeviceGetEnforcedPowerLimit),
            clock_event_reasons=probe(
                ("clock_event_reasons",), pynvml.nvmlDeviceGetCurrentClocksEventReasons
            ),
            processes=probe(("processes",), _processes) or (),
            unsupported=tuple(unsupported),
        )

    def _limits(self, uuid: str, handle: Any) -> tuple[int | None, int | None]:
        """The GPU's own slowdown and shutdown temperatures, read once (None where NVML
        does not say)."""
        known = self._thresholds.get(uuid)
        if known is None:
            known = self._thresholds[uuid] = (
                _threshold(handle, pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN),
                _threshold(handle, pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN),
            )
        return known

    # -------------------------------------------------------------- GPM (MIG utilization)

    def _gpm_rates(self, uuid: str, handle: Any) -> tuple[float, float] | None:
        """A MIG device's (graphics activity, DRAM bandwidth) percent from GPM (Hopper and
        newer): NVML's classic utilization calls are not supported on MIG. Computed between
        this call's sample and the previous one; None on the first call or without GPM.
        DRAM bandwidth stands in for the classic call's memory utilization."""
        parent = pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle)
        if not self._has_gpm(parent):
            return None
        with self._gpm_lock:
            return self._gpm_interval(uuid, handle, parent)

    def _gpm_interval(self, uuid: str, handle: Any, parent: Any) -> tuple[float, float] | None:
        now = time.monotonic()
        last = self._gpm.get(uuid)
        if last is not None and now - last[0] < GPM_MIN_INTERVAL_S:
            return last[2]
        sample = pynvml.nvmlGpmSampleAlloc()
        try:
            gi = pynvml.nvmlDeviceGetGpuInstanceId(handle)
            pynvml.nvmlGpmMigSampleGet(parent, gi, sample)
            rates = None if last is None else _gpm_metrics(last[1], sample)
        except pynvml.NVMLError:
            pynvml.nvmlGpmSampleFree(sample)
            raise
        if last is not None:
            pynvml.nvmlGpmSampleFree(last[1])
        self._gpm[uuid] = (now, sample, rates)
        return rates

    def _has_gpm(self, parent: Any) -> bool:
        key = pynvml.nvmlDeviceGetUUID(parent)
        known = self._gpm_support.get(key)
        if known is None:
            try:
                known = bool(pynvml.nvmlGpmQueryDeviceSupport(parent).isSupportedDevice)
            except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_FunctionNotFound):
                known = False
            self._gpm_support[key] = known
        return known

    def _free_samples(self) -> None:
        for _, sample, _ in self._gpm.values():
            pynvml.nvmlGpmSampleFree(sample)
        self._gpm.clear()
        if self._events is not None:
            pynvml.nvmlEventSetFree(self._events)
            self._events = None

    # -------------------------------------------------------------- events

    def poll_events(self) -> list[DeviceEvent]:
        """Xid and double-bit ECC errors NVML delivered since the last call, without
        waiting. The first call registers for them on every GPU that reports them."""
        if self._events is None:
            self._events = self._register_events()
        found: list[DeviceEvent] = []
        while True:
            try:
                data = pynvml.nvmlEventSetWait_v2(self._events, 0)
            except pynvml.NVMLError_Timeout:
                return found
            except pynvml.NVMLError as e:  # a lost GPU, a driver in trouble: next time
                self.log.warning("reading NVML events failed: %s", e)
                return found
            found.append(self._event(data))

    def _register_events(self) -> Any:
        events = pynvml.nvmlEventSetCreate()
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            try:
                wanted = pynvml.nvmlDeviceGetSupportedEventTypes(handle) & _WATCHED_EVENTS
                if wanted:
                    pynvml.nvmlDeviceRegisterEvents(handle, wanted, events)
            except pynvml.NVMLError as e:
                self.log.warning("GPU %d: cannot watch Xid and ECC events (%s)", index, e)
        return events

    def _event(self, data: Any) -> DeviceEvent:
        """An event, named by its MIG device when NVML says which instance it hit."""
        uuid = pynvml.nvmlDeviceGetUUID(data.device)
        if data.gpuInstanceId != _NOT_AVAILABLE:
            for mig in _mig_handles(data.device):
                if pynvml.nvmlDeviceGetGpuInstanceId(mig) == data.gpuInstanceId:
                    uuid = pynvml.nvmlDeviceGetUUID(mig)
                    break
        if data.eventType & pynvml.nvmlEventTypeDoubleBitEccError:
            return DeviceEvent(uuid, "double_bit_ecc")
        return DeviceEvent(uuid, "xid", int(data.eventData))


def _gpm_metrics(first: Any, second: Any) -> tuple[float, float] | None:
    request = pynvml.c_nvmlGpmMetricsGet_t()
    request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = len(_GPM_METRICS)
    request.sample1, request.sample2 = first, second
    for i, metric in enumerate(_GPM_METRICS):
        request.metrics[i].metricId = metric
    pynvml.nvmlGpmMetricsGet(request)
    graphics, dram = (request.metrics[i] for i in range(len(_GPM_METRICS)))
    if graphics.nvmlReturn != pynvml.NVML_SUCCESS or dram.nvmlReturn != pynvml.NVML_SUCCESS:
        return None
    return float(graphics.value), float(dram.value)


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


def _threshold(handle: Any, kind: int) -> int | None:
    try:
        return int(pynvml.nvmlDeviceGetTemperatureThreshold(handle, kind))
    except pynvml.NVMLError:
        return None


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
