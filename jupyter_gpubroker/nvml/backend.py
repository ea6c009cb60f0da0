"""The NVML backend: the broker's inventory and device readings, read through pynvml.

It only ever calls pynvml, so the same code runs against a driver and against
the simulated library (:mod:`.simulated`); :func:`jupyter_gpubroker.nvml.open_backend`
chooses which.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
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
from ..wire.profiles import model_for_name
from .presets import PRESET_NAMES
from .processes import ProcessLoads, list_processes

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
_UNAVAILABLE = (pynvml.NVMLError_NotSupported, pynvml.NVMLError_NoPermission)
"""What a reading that NVML does not give this caller, on this device, answers."""
_NOT_ON_A_SLICE = (pynvml.NVMLError_NotSupported, pynvml.NVMLError_InvalidArgument)
"""What GPU-wide sensors answer on a MIG device handle (NVML documents neither)."""
_PROFILE_SUFFIXES = {
    "NVML_GPU_INSTANCE_PROFILE_1_SLICE": "",
    "NVML_GPU_INSTANCE_PROFILE_2_SLICE": "",
    "NVML_GPU_INSTANCE_PROFILE_3_SLICE": "",
    "NVML_GPU_INSTANCE_PROFILE_4_SLICE": "",
    "NVML_GPU_INSTANCE_PROFILE_6_SLICE": "",
    "NVML_GPU_INSTANCE_PROFILE_7_SLICE": "",
    "NVML_GPU_INSTANCE_PROFILE_8_SLICE": "",
    "NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1": "+me",
    "NVML_GPU_INSTANCE_PROFILE_2_SLICE_REV1": "+me",
    "NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2": "",
    "NVML_GPU_INSTANCE_PROFILE_1_SLICE_GFX": "+gfx",
    "NVML_GPU_INSTANCE_PROFILE_2_SLICE_GFX": "+gfx",
    "NVML_GPU_INSTANCE_PROFILE_4_SLICE_GFX": "+gfx",
    "NVML_GPU_INSTANCE_PROFILE_1_SLICE_NO_ME": "-me",
    "NVML_GPU_INSTANCE_PROFILE_2_SLICE_NO_ME": "-me",
    "NVML_GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME": "+me.all",
    "NVML_GPU_INSTANCE_PROFILE_2_SLICE_ALL_ME": "+me.all",
}
"""GPU-instance profile constants (those this pynvml has) and the attribute mig-parted
appends to their names."""
UNPRIVILEGED = (
    "NVML does not let this GPU broker look up MIG instances (it runs neither as root nor "
    "with the mig/monitor capability): it offers the MIG slices as they are, but cannot "
    "create or destroy them, read a MIG-enabled GPU's total memory and processes, or see "
    "an Xid error that hits a single slice"
)
"""Said once, when NVML first refuses the broker a GPU-instance lookup."""


@dataclass(frozen=True)
class NvmlProfile:
    """A GPU-instance profile as NVML describes it on one GPU."""

    name: str
    """mig-parted's name for it, e.g. ``3g.40gb``."""
    slices: int
    memory_mib: int
    media: tuple[int, int, int]
    """Decoders, JPEG and OFA engines: what tells ``1g.10gb`` from ``1g.10gb+me``."""


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
        self._profiles: dict[str, dict[int, NvmlProfile]] = {}
        """GPU UUID -> its GPU-instance profiles by NVML profile id, which never change."""
        self.unprivileged = False
        """NVML refused this broker a GPU-instance lookup (said once in the log)."""
        self._loads = ProcessLoads()

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
            try:
                gpu, on_gpu = self._scan(index, pynvml.nvmlDeviceGetHandleByIndex(index))
            except pynvml.NVMLError_GpuIsLost:
                self.log.warning("GPU %d is lost (fell off the bus); leaving it out", index)
                continue
            gpus.append(gpu)
            devices += on_gpu
        return Inventory(tuple(gpus), tuple(devices))

    def gpu_devices(self, gpu_uuid: str) -> tuple[Device, ...]:
        """The grantable devices on one GPU, read afresh (after a MIG change)."""
        handle = self.handle(gpu_uuid)
        return tuple(self._scan(pynvml.nvmlDeviceGetIndex(handle), handle)[1])

    def handle(self, uuid: str) -> Any:
        """The handle of a GPU or MIG device. NVML may refuse every lookup by UUID while
        any GPU is lost; then the devices are walked by index, so that only the lost
        GPU's own lookups fail (GpuIsLost)."""
        try:
            return pynvml.nvmlDeviceGetHandleByUUID(uuid)
        except pynvml.NVMLError_GpuIsLost:
            for index in range(pynvml.nvmlDeviceGetCount()):
                try:
                    gpu = pynvml.nvmlDeviceGetHandleByIndex(index)
                    if pynvml.nvmlDeviceGetUUID(gpu) == uuid:
                        return gpu
                    if _mig_enabled(gpu):
                        for mig in _mig_handles(gpu):
                            if pynvml.nvmlDeviceGetUUID(mig) == uuid:
                                return mig
                except pynvml.NVMLError_GpuIsLost:
                    continue
            raise

    def _scan(self, index: int, handle: Any) -> tuple[Gpu, list[Device]]:
        uuid = pynvml.nvmlDeviceGetUUID(handle)
        name = pynvml.nvmlDeviceGetName(handle)
        mig = _mig_enabled(handle)
        model = model_for_name(name)
        try:
            memory_mib = pynvml.nvmlDeviceGetMemoryInfo(handle).total // _MIB
        except pynvml.NVMLError_NoPermission:  # a MIG-enabled GPU, to an unprivileged caller
            memory_mib = model.memory_mib if model else 0
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
        profiles = self._profiles.get(uuid)
        if profiles is None:
            profiles = self._profiles[uuid] = _nvml_profiles(handle, memory_mib)
        found = (self._mig_device(gpu, profiles, handle, m) for m in _mig_handles(handle))
        return gpu, [d for d in found if d is not None]

    def _mig_device(
        self, gpu: Gpu, profiles: dict[int, NvmlProfile], parent: Any, handle: Any
    ) -> Device | None:
        """One MIG device, its profile read from NVML. The broker, like mig-parted, makes
        one compute instance spanning each GPU instance, so the GPU instance's profile is
        the device's. Its placement needs a GPU-instance lookup, which NVML refuses an
        unprivileged caller: the profile then comes from the device's own attributes."""
        gi_id = pynvml.nvmlDeviceGetGpuInstanceId(handle)
        start: int | None = None
        try:
            gi = pynvml.nvmlDeviceGetGpuInstanceById(parent, gi_id)
        except pynvml.NVMLError_NoPermission:
            if not self.unprivileged:
                self.unprivileged = True
                self.log.warning(UNPRIVILEGED)
            profile = _profile_from_attributes(profiles, pynvml.nvmlDeviceGetAttributes(handle))
        else:
            info = pynvml.nvmlGpuInstanceGetInfo(gi)
            profile, start = profiles.get(info.profileId), info.placement.start
        if profile is None:
            self.log.warning(
                "GPU %d: GPU instance %d has a profile NVML does not list; skipped",
                gpu.index,
                gi_id,
            )
            return None
        return Device(
            uuid=pynvml.nvmlDeviceGetUUID(handle),
            kind="mig",
            gpu_index=gpu.index,
            gpu_uuid=gpu.uuid,
            memory_mib=pynvml.nvmlDeviceGetMemoryInfo(handle).total // _MIB,
            compute_slices=profile.slices,
            profile=profile.name,
            start=start,
            gpu_instance_id=gi_id,
            compute_instance_id=pynvml.nvmlDeviceGetComputeInstanceId(handle),
        )

    # -------------------------------------------------------------- readings

    def read(self, uuid: str) -> DeviceReading:
        """One sample of a GPU or MIG device. Never raises for NVML errors: a lost GPU
        reads as ``Health.LOST``, any other failure as ``Health.UNREACHABLE``."""
        try:
            return self._read(uuid, self.handle(uuid))
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
            return tuple(p.pid for p in list_processes(self.handle(device_uuid)))
        except pynvml.NVMLError:
            return ()

    def _read(self, uuid: str, handle: Any) -> DeviceReading:
        """A MIG device has no sensors of its own (NVML answers NotSupported or
        InvalidArgument): its GPU's temperature, power and clock reasons are its."""
        unsupported: list[str] = []
        mig = is_mig_device_handle(handle)
        parent = pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle) if mig else None

        def probe(
            fields: tuple[str, ...], call: Callable[[Any], _T], gpu_wide: bool = False
        ) -> _T | None:
            try:
                try:
                    return call(handle)
                except _NOT_ON_A_SLICE:
                    if not (gpu_wide and mig):
                        raise
                    return call(parent)
            except _UNAVAILABLE:
                unsupported.extend(fields)
                return None

        util = probe(
            ("utilization_gpu", "utilization_memory"), pynvml.nvmlDeviceGetUtilizationRates
        )
        memory = probe(("memory_used_mib", "memory_total_mib"), pynvml.nvmlDeviceGetMemoryInfo)
        rates = None if util is None else (float(util.gpu), float(util.memory))
        if rates is None and mig:
            rates = self._gpm_rates(uuid, handle)
            if rates is not None:
                unsupported.remove("utilization_gpu")
                unsupported.remove("utilization_memory")
        temperature = probe(("temperature_c",), _temperature, gpu_wide=True)
        sensors = parent if mig else handle
        slowdown, shutdown = (None, None) if temperature is None else self._limits(uuid, sensors)
        return DeviceReading(
            uuid,
            utilization_gpu=None if rates is None else rates[0],
            utilization_memory=None if rates is None else rates[1],
            memory_used_mib=None if memory is None else memory.used // _MIB,
            memory_total_mib=None if memory is None else memory.total // _MIB,
            temperature_c=temperature,
            temperature_slowdown_c=slowdown,
            temperature_shutdown_c=shutdown,
            power_mw=probe(("power_mw",), pynvml.nvmlDeviceGetPowerUsage, True),
            power_limit_mw=probe(("power_limit_mw",), pynvml.nvmlDeviceGetEnforcedPowerLimit, True),
            clock_event_reasons=probe(
                ("clock_event_reasons",), pynvml.nvmlDeviceGetCurrentClocksEventReasons, True
            ),
            processes=self._with_loads(uuid, handle, probe(("processes",), list_processes) or ()),
            unsupported=tuple(unsupported),
        )

    def _with_loads(
        self, uuid: str, handle: Any, processes: tuple[ProcessInfo, ...]
    ) -> tuple[ProcessInfo, ...]:
        """A whole GPU's processes with their own utilization; NVML places a MIG slice's
        in a GPU instance and gives them none."""
        if not processes or processes[0].gpu_instance_id is not None:
            return processes
        loads = self._loads.read(uuid, handle)
        if loads is None:
            return processes
        return tuple(replace(p, utilization=loads.get(p.pid, 0.0)) for p in processes)

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
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
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


def _nvml_profiles(handle: Any, total_mib: int) -> dict[int, NvmlProfile]:
    """A MIG-enabled GPU's GPU-instance profiles, asked of NVML one profile constant at a
    time (the v1 call, which needs no struct version, whatever pynvml sets), named by mig-parted's
    rule. Constants the GPU lacks answer NotSupported or InvalidArgument."""
    found: dict[int, NvmlProfile] = {}
    for constant, suffix in _PROFILE_SUFFIXES.items():
        if not hasattr(pynvml, constant):
            continue
        try:
            info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, getattr(pynvml, constant), 1)
        except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_InvalidArgument):
            continue
        gb = _profile_gb(info.memorySizeMB, total_mib)
        found.setdefault(
            info.id,
            NvmlProfile(
                f"{info.sliceCount}g.{gb}gb{suffix}",
                info.sliceCount,
                info.memorySizeMB,
                (info.decoderCount, info.jpegCount, info.ofaCount),
            ),
        )
    return found


def _profile_gb(memory_mib: int, total_mib: int) -> int:
    """mig-parted's (go-nvlib's) memory figure of a profile name: its share of the GPU's
    memory rounded up to eighths, times the GPU's memory in whole GiB rounded up (half
    rounds away from zero, as Go's does). Without the GPU's memory, its own GiB."""
    if total_mib <= 0:
        return math.ceil(memory_mib / 1024)
    eighths = math.ceil(memory_mib / total_mib * 8) / 8
    return math.floor(eighths * math.ceil(total_mib / 1024) + 0.5)


def _profile_from_attributes(profiles: dict[int, NvmlProfile], attrs: Any) -> NvmlProfile | None:
    """The profile of a MIG device whose GPU instance NVML does not let the caller look
    up: the one with the device's slices, memory and media engines."""
    media = (attrs.sharedDecoderCount, attrs.sharedJpegCount, attrs.sharedOfaCount)
    return next(
        (
            p
            for p in profiles.values()
            if (p.slices, p.memory_mib, p.media)
            == (attrs.gpuInstanceSliceCount, attrs.memorySizeMB, media)
        ),
        None,
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
    get_v = getattr(pynvml, "nvmlDeviceGetTemperatureV", None)  # not in nvidia-ml-py 12.535
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
