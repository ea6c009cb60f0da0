"""A simulated libnvidia-ml: the C symbols pynvml calls, answered by Python.

:func:`install` puts a library object where pynvml keeps the loaded C library
(``pynvml.nvmlLib``), so every pynvml wrapper runs unchanged: it passes its
ctypes pointers, structs and buffers, this module writes the answers through
them and returns NVML return codes, and pynvml turns those into its
``NVMLError_*`` classes exactly as it does against a driver. Tests and the
demo therefore exercise the real backend, not a mock of it.

What it reproduces (see REFERENCE.md and the NVML API reference):

- enumeration, memory, PCI, utilization, temperature (also ``TemperatureV``),
  power, clock-event reasons, running processes (two-call buffer protocol);
- per-process utilization (``nvmlDeviceGetProcessUtilization``): a sample per process
  with some load in each sample period, only those newer than the caller's
  ``lastSeenTimeStamp``, NotFound when there is none, NotSupported under MIG; each
  process's own load set with :meth:`SimulatedNvml.set_process_load`, else the GPU's
  split evenly;
- MIG: GPU instances at the placements of the profile catalog (no overlap,
  per-profile maximum counts), compute instances in them, MIG device handles
  and UUIDs; InUse when destroying something still in use; NotSupported for
  utilization on MIG-enabled GPUs and on MIG devices;
- device nodes: a GPU's minor number (``/dev/nvidia<minor>``, its index here) and the
  driver's ``mig-minors`` table (:meth:`SimulatedNvml.mig_minors`), which names the
  ``/dev/nvidia-caps`` node of each GPU and compute instance;
- privileges (:data:`PRIVILEGES`, NVML's documented rules): GPU-instance and
  compute-instance lookups and placements need root or the ``mig/monitor``
  capability, creating and destroying instances root (or ``mig/config``); the memory
  and processes of a MIG-enabled GPU are refused to a caller with neither, and so are
  events that hit a single MIG slice; a MIG device's own attributes
  (``nvmlDeviceGetAttributes``) and readings need nothing;
- faults: a lost GPU answers GpuIsLost to every call on it and its MIG
  devices, to ``nvmlDeviceGetHandleByIndex`` for it, and (as NVML documents it may)
  to every ``nvmlDeviceGetHandleByUUID`` while it is lost; over-temperature raises the
  temperature past the slowdown threshold and sets the thermal clock-event reasons; a
  power cap holds the GPU at its power limit with the software power-cap reason; Xid
  and double-bit ECC errors arrive through event sets (``nvmlEventSetWait``);
- power management limits: the default, the constraints (two sevenths of the default up
  to it) and the limit set, which caps the draw; setting it needs root (NoPermission
  otherwise), refuses a MIG device handle and a limit outside the constraints
  (InvalidArgument);
- compute mode (``nvmlDeviceGetComputeMode``; setting it needs root) and, from driver
  r615 on (``driver_version``; CUDA 13.4), the driver's own memory limits of a cgroup
  (``nvmlDeviceSetMemoryLimits_v1``: root only, not on MIG device handles; NVML API
  reference, ``nvmlSetMemoryLimits_v1_t``); an older driver exports neither limit
  symbol, so pynvml answers FunctionNotFound;
- GPM on the GPUs that have it (Hopper: the H100 and H200 models; ``gpm=`` forces it on
  or off for every GPU): MIG activity between two ``nvmlGpmMigSampleGet`` samples, from
  the load integrated over time.

Choices where NVML documents nothing: GPU-wide sensors (utilization,
temperature, power, clocks) answer NotSupported on MIG device handles (or
``mig_sensor_error``, since NVML lists InvalidArgument among these calls' errors);
media engine counts follow the A100's (see :func:`_media`); a GPU
instance's id is the swizzle id of its memory slices; the sensors follow the
load set with :meth:`SimulatedNvml.set_load`; GPM reports a GPU instance's graphics
and SM activity as its compute instances' utilization, DRAM bandwidth as their
memory utilization; the driver samples processes every 1/6 s and keeps 20 s of samples
(:data:`PROCESS_SAMPLE_PERIOD_US`).
"""

from __future__ import annotations

import ctypes
import os
import random
import threading
import time
import uuid as uuidlib
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pynvml

from ..procstat import proc_environ, proc_stat
from ..wire.profiles import CATALOG, COMPUTE_SLICES, GpuModel, MigProfile, free_starts
from .presets import GpuSpec, Topology, TopologyError

DRIVER_VERSION = "570.86.15"
MEMORY_LIMITS_FROM = 615
"""The first driver branch whose NVML sets a cgroup's GPU memory limits (r615, CUDA 13.4:
NVIDIA's MPS documentation, "MPS v3 Memory Partitioning")."""
_CUDA_OF_DRIVER = ((615, 13040), (580, 13000), (575, 12090), (570, 12080), (0, 12020))
"""The CUDA version each driver branch reports (``nvmlSystemGetCudaDriverVersion``)."""
_LIMIT_SYMBOLS = frozenset({"nvmlDeviceSetMemoryLimits_v1", "nvmlDeviceGetMemoryLimits_v1"})
SLOWDOWN_C = 89
"""Temperature at which a simulated GPU starts slowing down (NVML's slowdown threshold)."""
SHUTDOWN_C = 92
MAX_OPERATING_C = 85
IDLE_C = 32
MAX_MIG_DEVICES = COMPUTE_SLICES
MIG_GPU_INSTANCE_IDS = 15
MIG_COMPUTE_INSTANCE_IDS = 8
"""GPU-instance ids 0-14 and compute-instance ids 0-7 per GPU: the driver's mig-minors
table has a line for each (``gpu0/gi3/ci3/access`` is minor 3 + 3 * 9 + 1 + 3 = 34)."""
PRIVILEGE_ENV = "GPUBROKER_SIMULATE_PRIVILEGE"
"""Overrides the simulated caller's privilege (one of :data:`PRIVILEGES`)."""
PRIVILEGES = ("root", "monitor", "none")
"""What the simulated caller may do: everything (root, or CAP_SYS_ADMIN); read MIG
instances as a user with the ``mig/monitor`` capability; or only what NVML allows any
user. The default is the running process's own: root when it runs as root, else none
(containers rarely carry the capability files)."""
GPM_MODELS = frozenset({"H100-80GB", "H200-141GB"})
"""The catalog's models with GPM (Hopper and newer); the A100 has none."""
LOAD_ENV = "GPUBROKER_SIMULATE_UTILIZATION"
"""In a real process's environment: its SM load in percent, which the simulated driver
gives it where it lists it on a whole GPU (:meth:`SimulatedNvml.load_from_environment`)."""
PROCESS_SAMPLE_PERIOD_US = 166_667
"""How often the simulated driver samples each process's utilization: every 1/6 s, the
shortest sample period NVML names for its utilization (``nvmlUtilization_t``: "between 1
second and 1/6 second depending on the product"); NVML names none for processes."""
PROCESS_SAMPLES_KEPT = 120
"""Sample periods the driver keeps per GPU (20 s): a reader that waits longer gets only
the newest, as from a real driver's bounded sample buffer."""

_T = TypeVar("_T")
_D = TypeVar("_D", bound="_Unit")
_MIB = 1 << 20
_NOT_AVAILABLE = pynvml.NVML_VALUE_NOT_AVAILABLE_uint.value
"""What NVML reports as GPU/compute instance id of a process on a GPU without MIG."""
_HANDLE_BASE = 0x7E57_0000
_THERMAL = (
    pynvml.nvmlClocksEventReasonSwThermalSlowdown | pynvml.nvmlClocksEventReasonHwThermalSlowdown
)
_SUPPORTED_EVENTS = (
    pynvml.nvmlEventTypeSingleBitEccError
    | pynvml.nvmlEventTypeDoubleBitEccError
    | pynvml.nvmlEventTypeXidCriticalError
)
_THRESHOLDS = {
    pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: SHUTDOWN_C,
    pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: SLOWDOWN_C,
    pynvml.NVML_TEMPERATURE_THRESHOLD_GPU_MAX: MAX_OPERATING_C,
}
_CI_SLICES = {
    pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE: 1,
    pynvml.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE: 2,
    pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE: 3,
    pynvml.NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE: 4,
    pynvml.NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE: 7,
}
"""Compute-instance profiles (their NVML id is the constant) and their compute slices."""
_CI_CHOICES = {1: (1,), 2: (1, 2), 3: (1, 2, 3), 4: (1, 2, 4), 7: (1, 2, 3, 4, 7)}
"""Compute slices a compute instance may have in a GPU instance of so many: a 4g instance
offers 1, 2 or 4, never 3 (the MIG user guide; go-nvml's A100/H100/H200 mocks)."""
_VERSION_REFUSED = pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
"""What a versioned ("V") profile-info call answers to a struct without its version. nvml.h
lists InvalidArgument for an invalid ``info->version``; the driver's generic version check
answers ArgumentVersionMismatch, which is what is simulated."""
_GPM_ACTIVITY = {
    pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL: 0,
    pynvml.NVML_GPM_METRIC_SM_UTIL: 0,
    pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: 1,
}
"""GPM metrics simulated: which activity integral (utilization, memory) each reports."""
_ERROR_TEXT = {
    pynvml.NVML_ERROR_IN_USE: "In use by another client",
    pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES: "Insufficient resources",
    pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH: "Argument version mismatch",
}
"""Driver texts of codes this library returns that pynvml has no text for."""
_DGX_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
_WITHOUT_INIT = frozenset({"nvmlInitWithFlags", "nvmlInit_v2", "nvmlErrorString"})
_CArg = type(ctypes.byref(ctypes.c_int()))


class _Fail(Exception):
    """Raised inside a C function to return ``code``."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


# ------------------------------------------------------------------ state


@dataclass(eq=False, kw_only=True)
class _Unit:
    """What runs processes and carries load: a whole GPU or a MIG device."""

    uuid: str
    handle: int
    utilization: int = 0
    memory_utilization: int = 0
    memory_used_mib: int = 0
    """Memory in use besides the listed processes."""
    pids: dict[int, int] = field(default_factory=dict)
    """pid -> used MiB (read through ``processes``)."""
    followed: set[int] = field(default_factory=set)
    """Pids of real OS processes: listed while they run, gone once they exit."""
    mps: set[int] = field(default_factory=set)
    """Pids of MPS clients: listed by the MPS process query as well as the compute one."""
    busy_s: float = 0.0
    memory_busy_s: float = 0.0
    """Utilization and memory utilization integrated over time (GPM's counters)."""
    accrued_at: float = field(default_factory=time.monotonic)

    @property
    def processes(self) -> dict[int, int]:
        """pid -> used MiB of what runs here now (a followed process that exited is gone)."""
        for pid in [p for p in self.followed if not _running(p)]:
            self.followed.discard(pid)
            self.mps.discard(pid)
            self.pids.pop(pid, None)
        return self.pids

    def used_mib(self) -> int:
        return self.memory_used_mib + sum(self.processes.values())

    def accrue(self, now: float | None = None) -> None:
        """Bring the activity integrals up to ``now`` (default: this instant), before the
        load changes or for a sample, which passes its own timestamp so that its counters
        and its time are read at one instant, as a real GPM sample's are."""
        now = time.monotonic() if now is None else now
        self.busy_s += self.utilization / 100 * (now - self.accrued_at)
        self.memory_busy_s += self.memory_utilization / 100 * (now - self.accrued_at)
        self.accrued_at = now


@dataclass(eq=False, kw_only=True)
class _Gpu(_Unit):
    index: int
    model: GpuModel
    spec: GpuSpec
    bus_id: str
    mig_enabled: bool
    instances: dict[int, _GpuInstance] = field(default_factory=dict)
    lost: bool = False
    overheat_c: int | None = None
    power_capped: bool = False
    power_limit_mw: int | None = None
    """The power management limit set (``nvmlDeviceSetPowerManagementLimit``); None: the
    model's default."""
    compute_mode: int = pynvml.NVML_COMPUTEMODE_DEFAULT
    memory_limits: dict[str, tuple[int, int]] = field(default_factory=dict)
    """cgroup path -> (soft, hard) limit in bytes, as ``nvmlDeviceSetMemoryLimits_v1``
    set them."""
    own_loads: dict[int, tuple[int, int]] = field(default_factory=dict)
    """pid -> the (SM, memory) utilization percent a test gave that process
    (:meth:`SimulatedNvml.set_process_load`)."""
    process_samples: deque[tuple[int, tuple[tuple[int, int, int], ...]]] = field(
        default_factory=lambda: deque(maxlen=PROCESS_SAMPLES_KEPT)
    )
    """The driver's per-process samples: (timestamp in µs, each (pid, SM, memory) with
    some load then), oldest first."""
    sampled_period: int = field(default_factory=lambda: _now_us() // PROCESS_SAMPLE_PERIOD_US)
    """The last sample instant recorded in ``process_samples``, in sample periods."""

    @property
    def gpu(self) -> _Gpu:
        return self

    def process_loads(self) -> dict[int, tuple[int, int]]:
        """Each process's (SM, memory) utilization now: its own where a test set some
        process's (0 for the others), else the GPU's split evenly among its processes."""
        running = self.processes
        if any(pid in self.own_loads for pid in running):
            return {pid: self.own_loads.get(pid, (0, 0)) for pid in running}
        n = max(len(running), 1)
        return {pid: (self.utilization // n, self.memory_utilization // n) for pid in running}

    def sample_processes(self) -> None:
        """Record the samples of each sample instant since the last one recorded (the
        newest ``PROCESS_SAMPLES_KEPT``), with the load as it has been since: called
        before the load or the processes change, and before the samples are read. A
        process with no load has no sample: NVML returns one per process "that had some
        non-zero utilization during the last sample period"."""
        period = _now_us() // PROCESS_SAMPLE_PERIOD_US
        first = max(self.sampled_period + 1, period - PROCESS_SAMPLES_KEPT + 1)
        if first <= period:
            loads = sorted(self.process_loads().items())
            row = tuple((pid, sm, mem) for pid, (sm, mem) in loads if sm or mem)
            for k in range(first, period + 1):
                self.process_samples.append((k * PROCESS_SAMPLE_PERIOD_US, row))
        self.sampled_period = max(self.sampled_period, period)

    @property
    def name(self) -> str:
        return self.spec.name or self.model.nvml_names[0]

    @property
    def pci_device_id(self) -> int:
        return self.spec.pci_device_id or self.model.pci_device_id

    @property
    def total_mib(self) -> int:
        return self.model.memory_mib

    def mig_devices(self) -> Iterator[_MigDevice]:
        for gi in self.instances.values():
            yield from gi.computes.values()

    def used_mib(self) -> int:
        if self.mig_enabled:
            return sum(m.used_mib() for m in self.mig_devices())
        return super().used_mib()

    def occupied(self) -> set[int]:
        return {s for gi in self.instances.values() for s in gi.profile.slots(gi.start)}

    def activity(self) -> float:
        """Busy percent of the whole chip, which the sensors follow (NVML hides it under MIG)."""
        if self.mig_enabled:
            return sum(m.utilization * m.slices for m in self.mig_devices()) / COMPUTE_SLICES
        return float(self.utilization)

    def temperature(self) -> int:
        return self.overheat_c or round(IDLE_C + 0.35 * self.activity())

    @property
    def enforced_mw(self) -> int:
        """The power limit the GPU holds to: the one set, else its model's default."""
        return self.model.power_limit_mw if self.power_limit_mw is None else self.power_limit_mw

    def power_mw(self) -> int:
        """Idle draw (a tenth of the default limit, whatever limit is set) rising with the
        load, never above the enforced limit."""
        if self.power_capped:
            return self.enforced_mw
        idle = self.model.power_limit_mw // 10
        drawn = round(idle + (self.model.power_limit_mw - idle) * self.activity() / 100)
        return min(drawn, self.enforced_mw)

    def clock_event_reasons(self) -> int:
        capped = int(pynvml.nvmlClocksEventReasonSwPowerCap) if self.power_capped else 0
        if self.overheat_c is not None:
            return int(_THERMAL) | capped
        if capped:
            return capped
        return int(pynvml.nvmlClocksEventReasonGpuIdle) if self.activity() == 0 else 0


@dataclass(eq=False, kw_only=True)
class _GpuInstance:
    gpu: _Gpu
    id: int
    profile: MigProfile
    start: int
    handle: int
    computes: dict[int, _MigDevice] = field(default_factory=dict)


@dataclass(eq=False, kw_only=True)
class _MigDevice(_Unit):
    """A compute instance and the MIG device it shows up as: one object, two handles."""

    gi: _GpuInstance
    id: int
    slices: int
    start: int
    profile_id: int
    slot: int
    """Its index for ``nvmlDeviceGetMigDeviceHandleByIndex``."""
    ci_handle: int

    @property
    def gpu(self) -> _Gpu:
        return self.gi.gpu

    @property
    def name(self) -> str:
        p = self.gi.profile
        part = "" if self.slices == p.compute_slices else f"{self.slices}c."
        return f"{self.gpu.name} MIG {part}{p.name}"

    @property
    def total_mib(self) -> int:
        return self.gi.profile.memory_mib


_Device = _Gpu | _MigDevice
"""What a device handle (``nvmlDevice_t``) stands for."""


@dataclass(frozen=True)
class _Event:
    gpu: _Gpu
    kind: int
    """The NVML event type."""
    data: int
    gpu_instance_id: int
    compute_instance_id: int


@dataclass(eq=False)
class _GpmSample:
    """What ``nvmlGpmMigSampleGet`` recorded: a GPU instance's activity integrals."""

    source: _GpuInstance | _Gpu | None = None
    at: float = 0.0
    busy: tuple[float, float] = (0.0, 0.0)
    rates: tuple[float, float] = (0.0, 0.0)
    """Utilization and memory utilization at the time (for two samples at one instant)."""


@dataclass(eq=False)
class _EventSet:
    handle: int
    masks: dict[_Gpu, int] = field(default_factory=dict)
    pending: deque[_Event] = field(default_factory=deque)


# ------------------------------------------------------------------ ctypes plumbing


def _running(pid: int) -> bool:
    """Whether OS process ``pid`` exists and is no zombie (an exited child not yet reaped
    has released its devices)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    stat = proc_stat(pid)
    return stat is None or not stat.ended  # no line (no /proc): believe kill


def _min_power_limit(model: GpuModel) -> int:
    """The lowest power limit NVML accepts: about two sevenths of the default, as the H100
    SXM's 200 W of 700 W (NVML documents no rule; each board has its own)."""
    return model.power_limit_mw * 2 // 7


def _val(arg: Any) -> Any:
    """The value of a ctypes scalar, or the argument itself (pynvml passes both)."""
    return getattr(arg, "value", arg)


def _out(ref: Any) -> Any:
    """The object an output argument points at (``byref(x)``, ``pointer(x)`` or ``x``)."""
    if ref is None:
        raise _Fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    if isinstance(ref, _CArg):
        return ref._obj  # type: ignore[attr-defined]  # what byref() points at
    if isinstance(ref, ctypes._Pointer):
        return ref.contents
    return ref


def _set(ref: Any, value: int) -> None:
    _out(ref).value = value


def _address(handle: Any) -> int | None:
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except ctypes.ArgumentError:
        return None


def _pointer(address: int, pointer_type: Any) -> Any:
    return ctypes.cast(ctypes.c_void_p(address), pointer_type)


def _set_handle(ref: Any, address: int) -> None:
    ctypes.c_void_p.from_buffer(_out(ref)).value = address


def _write_str(buffer: Any, length: Any, text: str) -> None:
    data = text.encode()
    if len(data) >= _val(length):
        raise _Fail(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
    _out(buffer).value = data


def _check_version(struct: Any, allowed: tuple[int, ...], code: int) -> None:
    if struct.version not in allowed:
        raise _Fail(code)


def _write_array(
    buffer: Any,
    count_ref: Any,
    items: Sequence[_T],
    write: Callable[[Any, int, _T], None],
    *,
    query_fails: bool,
) -> None:
    """Fill an NVML output array and its count. A NULL buffer asks for the count;
    when ``query_fails`` that answer is INSUFFICIENT_SIZE (the two-call protocol
    of the process lists) unless there is nothing to list."""
    count = _out(count_ref)
    if buffer is None:
        count.value = len(items)
        if items and query_fails:
            raise _Fail(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
        return
    array = _out(buffer)
    if len(array) < len(items):
        count.value = len(items)
        raise _Fail(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
    for i, item in enumerate(items):
        write(array, i, item)
    count.value = len(items)


def _write_process(array: Any, i: int, proc: tuple[int, int, int, int]) -> None:
    p = array[i]
    pid, mib, p.gpuInstanceId, p.computeInstanceId = proc
    p.pid, p.usedGpuMemory = pid, mib * _MIB


def _write_placement(array: Any, i: int, start_size: tuple[int, int]) -> None:
    array[i].start, array[i].size = start_size


def _write_handles(buffer: Any, count: Any, addresses: Sequence[int], pointer_type: Any) -> None:
    def write(array: Any, i: int, address: int) -> None:
        array[i] = _pointer(address, pointer_type)

    _write_array(buffer, count, addresses, write, query_fails=False)


def _fill_instance_info(
    info: Any, gpu: _Gpu, instance_id: int, profile_id: int, start: int, size: int
) -> None:
    """The fields GPU-instance and compute-instance info share."""
    info.device = _pointer(gpu.handle, pynvml.c_nvmlDevice_t)
    info.id, info.profileId = instance_id, profile_id
    info.placement.start, info.placement.size = start, size


def _text(value: bytes | str | None) -> str:
    """A ``char *`` field as pynvml's structures hand it over (text, or bytes)."""
    return value.decode() if isinstance(value, bytes) else value or ""


def _found(obj: _T | None) -> _T:
    """``obj``, or NotFound when a lookup found nothing."""
    if obj is None:
        raise _Fail(pynvml.NVML_ERROR_NOT_FOUND)
    return obj


def _gpu_instance_id(start: int, size: int) -> int:
    """The swizzle id of a placement: 0 for all 8 memory slices, 1-2 for halves,
    3-6 for quarters, 7-14 for eighths."""
    return {8: 0, 4: 1, 2: 3, 1: 7}[size] + start // size


def _new_uuid(prefix: str, rng: random.Random) -> str:
    return f"{prefix}-{uuidlib.UUID(int=rng.getrandbits(128))}"


# ------------------------------------------------------------------ the library


class _CFunction:
    """One exported symbol: called like a ctypes function, with settable attributes
    (pynvml sets ``restype`` on some)."""

    def __init__(self, sim: SimulatedNvml, name: str, impl: Callable[..., Any]) -> None:
        self._sim, self._name, self._impl = sim, name, impl

    def __call__(self, *args: Any) -> Any:
        with self._sim._lock:
            if self._name not in _WITHOUT_INIT and self._sim._init_count == 0:
                return pynvml.NVML_ERROR_UNINITIALIZED
            try:
                result = self._impl(*args)
            except _Fail as e:
                return e.code
        return pynvml.NVML_SUCCESS if result is None else result


class _Library:
    """What pynvml sees as the loaded ``libnvidia-ml``."""

    def __init__(self, sim: SimulatedNvml) -> None:
        self.sim = sim

    def __getattr__(self, name: str) -> _CFunction:
        impl = getattr(self.sim, name, None) if name.startswith("nvml") else None
        if impl is None or name in self.sim._hidden:
            raise AttributeError(name)
        if name in _LIMIT_SYMBOLS and self.sim.driver_branch < MEMORY_LIMITS_FROM:
            raise AttributeError(name)
        return _CFunction(self.sim, name, impl)


class SimulatedNvml:
    """A fake NVML driver for one :class:`Topology`.

    Its ``nvml*`` methods are the C symbols (reached through pynvml once
    installed); the other public methods set load and inject faults. Each
    simulated GPU or MIG device is named by its UUID, as in NVML.
    """

    def __init__(
        self,
        topology: Topology,
        *,
        gpm: bool | None = None,
        privilege: str | None = None,
        mig_sensor_error: int = pynvml.NVML_ERROR_NOT_SUPPORTED,
    ) -> None:
        self.topology = topology
        self.gpm = gpm
        """GPM on every GPU (True), on none (False), or as each GPU's model has it (None)."""
        self.privilege = _privilege(privilege or topology.privilege)
        """The simulated caller's privilege, one of :data:`PRIVILEGES`."""
        self.mig_sensor_error = mig_sensor_error
        """What temperature, power and clock-reason calls answer on a MIG device handle."""
        self.driver_version = DRIVER_VERSION
        """The driver NVML reports (``nvmlSystemGetDriverVersion``); from r615 on it sets
        cgroups' memory limits."""
        self._hidden: set[str] = set()
        self._lock = threading.RLock()
        self._handles: dict[int, tuple[str, Any]] = {}
        self._last_address = _HANDLE_BASE
        self._units: dict[str, _Device] = {}
        self._init_count = 0
        self._saved: tuple[Any, int] | None = None
        self._mig_ids = random.Random(f"{topology.seed}/mig")
        gpu_ids = random.Random(f"{topology.seed}/gpu")
        self._gpus: list[_Gpu] = []
        for spec in topology.gpus:
            gpu = self._build_gpu(len(self._gpus), spec, gpu_ids)
            self._gpus.append(gpu)
            for name, start in spec.instances:
                profile = gpu.model.profile(name)
                try:
                    if profile is None:
                        raise _Fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
                    gi = self._create_gpu_instance(gpu, profile, start)
                except _Fail:
                    raise TopologyError(
                        f"GPU {gpu.index} ({gpu.model.key}) cannot hold {name} at memory "
                        f"slice {start} next to its other instances (lay GPUs out with gpu_spec)"
                    ) from None
                self._create_compute_instance(gi, _full_ci_profile(gi))
        for index, pid in topology.processes:
            self.add_process(self._gpus[index].uuid, pid, follow=True)

    # -------------------------------------------------------------- install

    def install(self) -> SimulatedNvml:
        """Make pynvml use this library (and forget function pointers it cached)."""
        with pynvml.libLoadLock:
            if self._saved is None:
                self._saved = (pynvml.nvmlLib, pynvml._nvmlLib_refcount)
                pynvml.nvmlLib = _Library(self)
                pynvml._nvmlGetFunctionPointer_cache.clear()
        return self

    def uninstall(self) -> None:
        """Give pynvml back the library it had before :meth:`install`."""
        with pynvml.libLoadLock:
            lib = pynvml.nvmlLib
            if self._saved is None or not isinstance(lib, _Library) or lib.sim is not self:
                raise RuntimeError("this simulated NVML is not the library pynvml is using")
            pynvml.nvmlLib, pynvml._nvmlLib_refcount = self._saved
            self._saved = None
            pynvml._nvmlGetFunctionPointer_cache.clear()

    def mig_minors(self) -> str:
        """What the driver shows in ``/proc/driver/nvidia-caps/mig-minors``: the minor of
        the ``/dev/nvidia-caps/nvidia-cap<M>`` node guarding each GPU instance
        (``gpu<G>/gi<I>/access``) and compute instance (``gpu<G>/gi<I>/ci<C>/access``) that
        can exist on the GPU of minor G, after ``config`` and ``monitor``. The table is
        fixed by the driver, the same whatever instances exist: here for this machine's
        GPUs (a real driver lists every GPU minor it supports, numbered alike)."""
        lines = ["config 1", "monitor 2"]
        minor = 3
        for gpu in range(len(self._gpus)):
            for gi in range(MIG_GPU_INSTANCE_IDS):
                lines.append(f"gpu{gpu}/gi{gi}/access {minor}")
                minor += 1
                for ci in range(MIG_COMPUTE_INSTANCE_IDS):
                    lines.append(f"gpu{gpu}/gi{gi}/ci{ci}/access {minor}")
                    minor += 1
        return "\n".join(lines) + "\n"

    @property
    def driver_branch(self) -> int:
        return int(self.driver_version.split(".")[0])

    def memory_limit(self, uuid: str, cgroup: str) -> tuple[int, int] | None:
        """The (soft, hard) limit in bytes the driver holds ``cgroup`` to on a GPU."""
        with self._lock:
            return self._unit(uuid).gpu.memory_limits.get(cgroup)

    def hide_symbol(self, name: str) -> None:
        """Stop exporting ``name``, so pynvml answers FunctionNotFound like an older driver."""
        with pynvml.libLoadLock:
            self._hidden.add(name)
            pynvml._nvmlGetFunctionPointer_cache.pop(name, None)

    # -------------------------------------------------------------- load and faults

    def set_load(
        self,
        uuid: str,
        *,
        utilization: int | None = None,
        memory_utilization: int | None = None,
        memory_used_mib: int | None = None,
    ) -> None:
        """Set what a whole GPU or a MIG device is doing. Utilizations are percent; a
        MIG device's utilization is hidden by NVML but drives its GPU's power and heat."""
        with self._lock:
            unit = self._load_target(uuid)
            unit.accrue()
            _sample_processes(unit)
            if utilization is not None:
                unit.utilization = _percent(utilization, "utilization")
            if memory_utilization is not None:
                unit.memory_utilization = _percent(memory_utilization, "memory_utilization")
            if memory_used_mib is not None:
                if not 0 <= memory_used_mib <= unit.total_mib:
                    raise ValueError(
                        f"memory_used_mib must be between 0 and {unit.total_mib}, "
                        f"not {memory_used_mib}"
                    )
                unit.memory_used_mib = memory_used_mib

    def add_process(
        self,
        uuid: str,
        pid: int,
        used_memory_mib: int = 0,
        *,
        follow: bool = False,
        mps: bool = False,
    ) -> None:
        """Start a fake compute process on a whole GPU or a MIG device. ``follow``: ``pid``
        is a real OS process (a kernel), listed for as long as it runs, as NVML lists a
        process that keeps a device open until it exits. ``mps``: it is an MPS client,
        which NVML lists in its MPS query too; a process outside MPS is in the compute
        query only."""
        with self._lock:
            unit = self._load_target(uuid)
            _sample_processes(unit)
            unit.processes[pid] = used_memory_mib
            if follow:
                unit.followed.add(pid)
            (unit.mps.add if mps else unit.mps.discard)(pid)

    def set_process_load(
        self, uuid: str, pid: int, utilization: int, memory_utilization: int = 0
    ) -> None:
        """Give a process on a whole GPU its own load, which NVML's per-process samples
        report from the next sample period on; the GPU's utilization becomes its
        processes' own loads summed (at most 100), and a process given none has none."""
        with self._lock:
            unit = self._load_target(uuid)
            if not isinstance(unit, _Gpu):
                raise ValueError(f"{uuid} is a MIG device: NVML samples no process there")
            if pid not in unit.processes:
                raise ValueError(f"no simulated process {pid} on {uuid}")
            unit.accrue()
            unit.sample_processes()
            unit.own_loads[pid] = (
                _percent(utilization, "utilization"),
                _percent(memory_utilization, "memory_utilization"),
            )
            loads = [unit.own_loads[p] for p in unit.processes if p in unit.own_loads]
            unit.utilization = min(100, sum(sm for sm, _ in loads))
            unit.memory_utilization = min(100, sum(mem for _, mem in loads))

    def load_from_environment(self, pid: int) -> None:
        """Give a real process listed on whole GPUs the load its environment states
        (:data:`LOAD_ENV`) on each; a process that states none, or no whole percent, keeps
        the load it has."""
        value = (proc_environ(pid) or {}).get(LOAD_ENV.encode(), b"")
        if not value.isdigit() or int(value) > 100:
            return
        with self._lock:
            for gpu in self._gpus:
                if not gpu.mig_enabled and pid in gpu.processes:
                    self.set_process_load(gpu.uuid, pid, int(value))

    def remove_process(self, uuid: str, pid: int) -> None:
        with self._lock:
            unit = self._load_target(uuid)
            _sample_processes(unit)
            if isinstance(unit, _Gpu):
                unit.own_loads.pop(pid, None)
            unit.followed.discard(pid)
            unit.mps.discard(pid)
            if unit.processes.pop(pid, None) is None:
                raise ValueError(f"no simulated process {pid} on {uuid}")

    def process_memory(self, pid: int) -> dict[str, int]:
        """Where a process runs: UUID -> the MiB it uses there (what NVML's process lists
        say of it, one device at a time)."""
        with self._lock:
            return {
                uuid: unit.processes[pid]
                for uuid, unit in self._units.items()
                if pid in unit.processes
            }

    def room(self, uuid: str) -> tuple[str, int]:
        """A whole GPU's or MIG device's chip (its model's key) and free MiB."""
        with self._lock:
            unit = self._unit(uuid)
            return unit.gpu.model.key, unit.total_mib - unit.used_mib()

    def inject_gpu_lost(self, uuid: str) -> None:
        """Make the GPU (or the GPU of this MIG device) fall off the bus."""
        with self._lock:
            self._unit(uuid).gpu.lost = True

    def inject_overheat(self, uuid: str, temperature_c: int = SLOWDOWN_C + 2) -> None:
        """Heat the GPU past its slowdown threshold, so it reports thermal slowdown."""
        with self._lock:
            self._unit(uuid).gpu.overheat_c = temperature_c

    def inject_power_cap(self, uuid: str) -> None:
        """Hold the GPU at its power limit, so it reports the software power cap."""
        with self._lock:
            self._unit(uuid).gpu.power_capped = True

    def inject_xid(self, uuid: str, xid: int) -> None:
        """Raise an Xid error on a GPU or MIG device, delivered to every event set
        registered for Xid errors on its GPU."""
        self._deliver(uuid, pynvml.nvmlEventTypeXidCriticalError, xid)

    def inject_ecc_error(self, uuid: str) -> None:
        """Raise an uncorrectable (double-bit) ECC error on a GPU or MIG device."""
        self._deliver(uuid, pynvml.nvmlEventTypeDoubleBitEccError, 0)

    def _deliver(self, uuid: str, kind: int, data: int) -> None:
        """Queue an event in every event set registered for ``kind`` on the unit's GPU."""
        with self._lock:
            unit = self._unit(uuid)
            gpu = unit.gpu
            ids = (unit.gi.id, unit.id) if isinstance(unit, _MigDevice) else (_NOT_AVAILABLE,) * 2
            if isinstance(unit, _MigDevice) and self.privilege == "none":
                return  # NVML reports only whole-device events to such a caller
            for what, obj in self._handles.values():
                if what == "events" and obj.masks.get(gpu, 0) & kind:
                    obj.pending.append(_Event(gpu, kind, data, *ids))

    def clear_faults(self, uuid: str) -> None:
        """Undo lost, overheat and power-cap faults on the GPU of ``uuid``."""
        with self._lock:
            gpu = self._unit(uuid).gpu
            gpu.lost, gpu.overheat_c, gpu.power_capped = False, None, False

    # -------------------------------------------------------------- internals

    def _new_address(self) -> int:
        """A fresh fake address for a handle; never reused, so stale handles stay invalid."""
        self._last_address += 16
        return self._last_address

    def _build_gpu(self, index: int, spec: GpuSpec, rng: random.Random) -> _Gpu:
        model = CATALOG.get(spec.model)
        if model is None or (spec.instances and not spec.mig_enabled):
            raise TopologyError(f"GPU {index}: {spec} is not a GPU the simulator can build")
        bus = f"{index // len(_DGX_BUSES):08X}:{_DGX_BUSES[index % len(_DGX_BUSES)]:02X}:00.0"
        gpu = _Gpu(
            uuid=_new_uuid("GPU", rng),
            handle=self._new_address(),
            index=index,
            model=model,
            spec=spec,
            bus_id=bus,
            mig_enabled=spec.mig_enabled,
        )
        self._handles[gpu.handle] = ("device", gpu)
        self._units[gpu.uuid] = gpu
        return gpu

    def _unit(self, uuid: str) -> _Device:
        unit = self._units.get(uuid)
        if unit is None:
            raise ValueError(f"no simulated GPU or MIG device has UUID {uuid!r}")
        return unit

    def _load_target(self, uuid: str) -> _Device:
        unit = self._unit(uuid)
        if isinstance(unit, _Gpu) and unit.mig_enabled:
            raise ValueError(
                f"GPU {uuid} has MIG enabled: load and processes live on its MIG devices"
            )
        return unit

    def _lookup(self, handle: Any, kind: str) -> Any:
        entry = self._handles.get(_address(handle) or 0)
        if entry is None or entry[0] != kind:
            raise _Fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if kind not in ("events", "gpm") and entry[1].gpu.lost:
            raise _Fail(pynvml.NVML_ERROR_GPU_IS_LOST)
        return entry[1]

    def _device(self, handle: Any) -> _Device:
        device: _Device = self._lookup(handle, "device")
        return device

    def _whole_gpu(self, handle: Any) -> _Gpu:
        """A GPU handle, for calls that make no sense on a MIG device."""
        return self._typed(handle, _Gpu, pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def _sensor_gpu(self, handle: Any) -> _Gpu:
        """A GPU handle, for GPU-wide sensors, which a MIG device does not have."""
        return self._typed(handle, _Gpu, self.mig_sensor_error)

    def _require(self, needed: str) -> None:
        """Refuse with NoPermission unless the caller has ``needed`` ("monitor": the
        ``mig/monitor`` capability or root; "root": root or ``mig/config``)."""
        if PRIVILEGES.index(self.privilege) > PRIVILEGES.index(needed):
            raise _Fail(pynvml.NVML_ERROR_NO_PERMISSION)

    def _aggregate(self, device: _Device) -> None:
        """A MIG-enabled GPU's memory and processes are the sum over its instances, which
        NVML gives only to a caller who may see every instance."""
        if isinstance(device, _Gpu) and device.mig_enabled:
            self._require("monitor")

    def _mig_device(self, handle: Any) -> _MigDevice:
        return self._typed(handle, _MigDevice, pynvml.NVML_ERROR_NOT_SUPPORTED)

    def _typed(self, handle: Any, want: type[_D], refusal: int) -> _D:
        """The device behind ``handle`` if it is a ``want``; else fail with ``refusal``."""
        device = self._lookup(handle, "device")
        if not isinstance(device, want):
            raise _Fail(refusal)
        return device

    def _mig_gpu(self, handle: Any) -> _Gpu:
        gpu = self._whole_gpu(handle)
        if not gpu.mig_enabled:
            raise _Fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu

    def _profile_by_id(self, gpu: _Gpu, profile_id: int) -> MigProfile:
        profile = next((p for p in gpu.model.profiles if p.profile_id == profile_id), None)
        if profile is None:
            raise _Fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return profile

    def _create_gpu_instance(self, gpu: _Gpu, profile: MigProfile, start: int) -> _GpuInstance:
        same = sum(1 for gi in gpu.instances.values() if gi.profile == profile)
        if same >= profile.max_count or start not in free_starts(profile, gpu.occupied()):
            raise _Fail(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        gi_id = _gpu_instance_id(start, profile.size)
        gi = _GpuInstance(
            gpu=gpu, id=gi_id, profile=profile, start=start, handle=self._new_address()
        )
        self._handles[gi.handle] = ("gi", gi)
        gpu.instances[gi_id] = gi
        return gi

    def _ci_slices(self, gi: _GpuInstance, profile: int, engines: int) -> int:
        if not 0 <= profile < pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT:
            raise _Fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if engines != pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED:
            raise _Fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        slices = _CI_SLICES.get(profile)
        if slices not in _CI_CHOICES[gi.profile.compute_slices]:
            raise _Fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return slices

    def _create_compute_instance(self, gi: _GpuInstance, profile_id: int) -> _MigDevice:
        slices = self._ci_slices(gi, profile_id, pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
        taken = {s for m in gi.computes.values() for s in range(m.start, m.start + m.slices)}
        starts = [
            s
            for s in range(gi.profile.compute_slices - slices + 1)
            if taken.isdisjoint(range(s, s + slices))
        ]
        if not starts:
            raise _Fail(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        ci_id = min(set(range(len(gi.computes) + 1)) - set(gi.computes))
        used_slots = {m.slot for m in gi.gpu.mig_devices()}
        slot = min(set(range(MAX_MIG_DEVICES)) - used_slots)
        device = _MigDevice(
            uuid=_new_uuid("MIG", self._mig_ids),
            handle=self._new_address(),
            gi=gi,
            id=ci_id,
            slices=slices,
            start=starts[0],
            profile_id=profile_id,
            slot=slot,
            ci_handle=self._new_address(),
        )
        self._handles[device.handle] = ("device", device)
        self._handles[device.ci_handle] = ("ci", device)
        gi.computes[ci_id] = device
        self._units[device.uuid] = device
        return device

    def _temperature(self, handle: Any, sensor: int) -> int:
        gpu = self._sensor_gpu(handle)
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise _Fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpu.temperature()

    def _fill_memory(self, info: Any, handle: Any) -> None:
        device = self._device(handle)
        self._aggregate(device)
        total = device.total_mib
        info.total = total * _MIB
        info.used = min(device.used_mib(), total) * _MIB
        info.free = info.total - info.used

    def _fill_gi_profile(self, info: Any, handle: Any, constant: int) -> MigProfile:
        gpu = self._whole_gpu(handle)
        profile = next((p for p in gpu.model.profiles if p.nvml_profile == constant), None)
        if profile is None:
            valid = 0 <= constant < pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT
            raise _Fail(
                pynvml.NVML_ERROR_NOT_SUPPORTED if valid else pynvml.NVML_ERROR_INVALID_ARGUMENT
            )
        info.id = profile.profile_id
        info.sliceCount = profile.compute_slices
        info.instanceCount = profile.max_count
        info.multiprocessorCount = profile.sm_count
        info.memorySizeMB = profile.memory_mib
        info.decoderCount, info.jpegCount, info.ofaCount = _media(profile)
        return profile

    def _fill_ci_profile(self, info: Any, gi_handle: Any, profile: int, engines: int) -> int:
        gi = self._lookup(gi_handle, "gi")
        slices = self._ci_slices(gi, profile, engines)
        info.id = profile
        info.sliceCount = slices
        info.instanceCount = gi.profile.compute_slices // slices
        info.multiprocessorCount = gi.profile.sm_count * slices // gi.profile.compute_slices
        return slices

    def _processes(
        self, device: _Device, mps_only: bool = False
    ) -> list[tuple[int, int, int, int]]:
        """(pid, MiB, GPU instance id, compute instance id) of what runs on ``device``;
        ``mps_only``: of its MPS clients only."""
        if isinstance(device, _MigDevice):
            devices = [device]
        elif device.mig_enabled:
            devices = list(device.mig_devices())
        else:
            return [
                (pid, mib, _NOT_AVAILABLE, _NOT_AVAILABLE)
                for pid, mib in device.processes.items()
                if not mps_only or pid in device.mps
            ]
        return [
            (pid, mib, m.gi.id, m.id)
            for m in devices
            for pid, mib in m.processes.items()
            if not mps_only or pid in m.mps
        ]

    # -------------------------------------------------------------- C symbols: system

    def nvmlInitWithFlags(self, flags: Any) -> None:
        self._init_count += 1

    def nvmlInit_v2(self) -> None:
        self.nvmlInitWithFlags(0)

    def nvmlShutdown(self) -> None:
        self._init_count -= 1

    def nvmlErrorString(self, code: Any) -> bytes:
        code = _val(code)
        text = _ERROR_TEXT.get(code) or pynvml.NVMLError._errcode_to_string.get(code)
        return (text or "Unknown Error").encode()

    def nvmlSystemGetDriverVersion(self, buffer: Any, length: Any) -> None:
        _write_str(buffer, length, self.driver_version)

    def nvmlSystemGetCudaDriverVersion_v2(self, out: Any) -> None:
        _set(out, next(cuda for branch, cuda in _CUDA_OF_DRIVER if self.driver_branch >= branch))

    # -------------------------------------------------------------- C symbols: devices

    def nvmlDeviceGetCount_v2(self, count: Any) -> None:
        _set(count, len(self._gpus))

    def nvmlDeviceGetHandleByIndex_v2(self, index: Any, out: Any) -> None:
        i = _val(index)
        if not 0 <= i < len(self._gpus):
            raise _Fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if self._gpus[i].lost:
            raise _Fail(pynvml.NVML_ERROR_GPU_IS_LOST)
        _set_handle(out, self._gpus[i].handle)

    def nvmlDeviceGetHandleByUUID(self, uuid: Any, out: Any) -> None:
        if any(gpu.lost for gpu in self._gpus):
            raise _Fail(pynvml.NVML_ERROR_GPU_IS_LOST)
        _set_handle(out, _found(self._units.get((_val(uuid) or b"").decode())).handle)

    def nvmlDeviceGetIndex(self, handle: Any, out: Any) -> None:
        # On a MIG handle NVML answers its index for nvmlDeviceGetMigDeviceHandleByIndex.
        device = self._device(handle)
        _set(out, device.index if isinstance(device, _Gpu) else device.slot)

    def nvmlDeviceGetMinorNumber(self, handle: Any, out: Any) -> None:
        _set(out, self._whole_gpu(handle).index)  # /dev/nvidia<minor>; a MIG device has none

    def nvmlDeviceGetName(self, handle: Any, buffer: Any, length: Any) -> None:
        _write_str(buffer, length, self._device(handle).name)

    def nvmlDeviceGetUUID(self, handle: Any, buffer: Any, length: Any) -> None:
        _write_str(buffer, length, self._device(handle).uuid)

    def nvmlDeviceGetPciInfo_v3(self, handle: Any, ref: Any) -> None:
        gpu = self._device(handle).gpu
        info = _out(ref)
        domain, bus, _ = gpu.bus_id.split(":")
        info.busIdLegacy = info.busId = gpu.bus_id.encode()
        info.domain, info.bus, info.device = int(domain, 16), int(bus, 16), 0
        info.pciDeviceId = gpu.pci_device_id

    def nvmlDeviceGetMemoryInfo(self, handle: Any, ref: Any) -> None:
        self._fill_memory(_out(ref), handle)

    def nvmlDeviceGetMemoryInfo_v2(self, handle: Any, ref: Any) -> None:
        info = _out(ref)
        _check_version(info, (pynvml.nvmlMemory_v2,), pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        self._fill_memory(info, handle)
        info.reserved = 0

    def nvmlDeviceGetUtilizationRates(self, handle: Any, ref: Any) -> None:
        gpu = self._typed(handle, _Gpu, pynvml.NVML_ERROR_NOT_SUPPORTED)
        if gpu.mig_enabled:
            raise _Fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        util = _out(ref)
        util.gpu, util.memory = gpu.utilization, gpu.memory_utilization

    def nvmlDeviceGetProcessUtilization(
        self, handle: Any, samples: Any, count: Any, last_seen: Any
    ) -> None:
        """The samples of each process with some load, of every sample period newer than
        ``last_seen`` (µs; 0: every sample kept), so several per process; NotFound when
        there is none; NotSupported under MIG (NVML API reference)."""
        gpu = self._typed(handle, _Gpu, pynvml.NVML_ERROR_NOT_SUPPORTED)
        if gpu.mig_enabled:
            raise _Fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        gpu.sample_processes()
        since = _val(last_seen)
        found = [
            (at, pid, sm, mem)
            for at, row in gpu.process_samples
            if at > since
            for pid, sm, mem in row
        ]
        if not found:
            raise _Fail(pynvml.NVML_ERROR_NOT_FOUND)

        def write(array: Any, i: int, sample: tuple[int, int, int, int]) -> None:
            s = array[i]
            s.timeStamp, s.pid, s.smUtil, s.memUtil = sample
            s.encUtil = s.decUtil = 0

        _write_array(samples, count, found, write, query_fails=True)

    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle: Any, count: Any, infos: Any) -> None:
        device = self._device(handle)
        self._aggregate(device)
        _write_array(infos, count, self._processes(device), _write_process, query_fails=True)

    def nvmlDeviceGetMPSComputeRunningProcesses_v3(
        self, handle: Any, count: Any, infos: Any
    ) -> None:
        """The processes with an MPS compute context (NVML API reference,
        ``nvmlDeviceGetMPSComputeRunningProcesses_v3``): the MPS clients."""
        device = self._device(handle)
        self._aggregate(device)
        procs = self._processes(device, mps_only=True)
        _write_array(infos, count, procs, _write_process, query_fails=True)

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: Any, out: Any) -> None:
        _set(out, self._temperature(handle, _val(sensor)))

    def nvmlDeviceGetTemperatureV(self, handle: Any, ref: Any) -> None:
        info = _out(ref)
        _check_version(
            info, (pynvml.nvmlTemperature_v1,), pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        )
        info.temperature = self._temperature(handle, info.sensorType)

    def nvmlDeviceGetTemperatureThreshold(self, handle: Any, kind: Any, out: Any) -> None:
        self._sensor_gpu(handle)
        value = _THRESHOLDS.get(_val(kind))
        if value is None:
            raise _Fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        _set(out, value)

    def nvmlDeviceGetPowerUsage(self, handle: Any, out: Any) -> None:
        _set(out, self._sensor_gpu(handle).power_mw())

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any, out: Any) -> None:
        _set(out, self._sensor_gpu(handle).enforced_mw)

    def nvmlDeviceGetPowerManagementLimit(self, handle: Any, out: Any) -> None:
        _set(out, self._sensor_gpu(handle).enforced_mw)

    def nvmlDeviceGetPowerManagementDefaultLimit(self, handle: Any, out: Any) -> None:
        _set(out, self._sensor_gpu(handle).model.power_limit_mw)

    def nvmlDeviceGetPowerManagementLimitConstraints(
        self, handle: Any, low: Any, high: Any
    ) -> None:
        gpu = self._sensor_gpu(handle)
        _set(low, _min_power_limit(gpu.model))
        _set(high, gpu.model.power_limit_mw)

    def nvmlDeviceSetPowerManagementLimit(self, handle: Any, limit: Any) -> None:
        """Root only (NoPermission otherwise, as NVML documents), not on a MIG device
        handle, and within the limit constraints (InvalidArgument outside them)."""
        gpu, mw = self._sensor_gpu(handle), _val(limit)
        self._require("root")
        if not _min_power_limit(gpu.model) <= mw <= gpu.model.power_limit_mw:
            raise _Fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu.power_limit_mw = None if mw == gpu.model.power_limit_mw else mw

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any, out: Any) -> None:
        _set(out, self._sensor_gpu(handle).clock_event_reasons())

    # -------------------------------------------------------------- C symbols: MIG devices

    def nvmlDeviceGetComputeMode(self, handle: Any, out: Any) -> None:
        _set(out, self._whole_gpu(handle).compute_mode)

    def nvmlDeviceSetComputeMode(self, handle: Any, mode: Any) -> None:
        gpu, mode = self._whole_gpu(handle), _val(mode)
        self._require("root")
        if not 0 <= mode < pynvml.NVML_COMPUTEMODE_COUNT:
            raise _Fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu.compute_mode = mode

    def nvmlDeviceSetMemoryLimits_v1(self, handle: Any, ref: Any) -> None:
        gpu = self._typed(handle, _Gpu, pynvml.NVML_ERROR_NOT_SUPPORTED)  # no MIG handles
        self._require("root")
        limits = _out(ref)
        if not limits.nameSpace or limits.softLimit > limits.hardLimit:
            raise _Fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        cgroup = _text(limits.nameSpace)
        if limits.softLimit == 0 and limits.hardLimit == pynvml.NVML_DEVICE_MEMORY_LIMIT_MAX:
            gpu.memory_limits.pop(cgroup, None)  # NVML's way of clearing them
        else:
            gpu.memory_limits[cgroup] = (limits.softLimit, limits.hardLimit)

    def nvmlDeviceGetMemoryLimits_v1(self, handle: Any, ref: Any) -> None:
        gpu = self._typed(handle, _Gpu, pynvml.NVML_ERROR_NOT_SUPPORTED)
        limits = _out(ref)
        soft, hard = gpu.memory_limits.get(
            _text(limits.nameSpace), (0, pynvml.NVML_DEVICE_MEMORY_LIMIT_MAX)
        )
        limits.softLimit, limits.hardLimit, limits.currentUsed = soft, hard, 0

    def nvmlDeviceGetMigMode(self, handle: Any, current: Any, pending: Any) -> None:
        gpu = self._whole_gpu(handle)
        if not gpu.model.profiles:  # a GPU without MIG (an L40S, an RTX card)
            raise _Fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        mode = int(gpu.mig_enabled)
        _set(current, mode)
        _set(pending, mode)

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any, out: Any) -> None:
        _set(out, MAX_MIG_DEVICES if self._whole_gpu(handle).mig_enabled else 0)

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: Any, out: Any) -> None:
        gpu, i = self._whole_gpu(handle), _val(index)
        if not 0 <= i < MAX_MIG_DEVICES:
            raise _Fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        _set_handle(out, _found(next((m for m in gpu.mig_devices() if m.slot == i), None)).handle)

    def nvmlDeviceIsMigDeviceHandle(self, handle: Any, out: Any) -> None:
        _set(out, int(isinstance(self._device(handle), _MigDevice)))

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, handle: Any, out: Any) -> None:
        _set_handle(out, self._mig_device(handle).gpu.handle)

    def nvmlDeviceGetGpuInstanceId(self, handle: Any, out: Any) -> None:
        _set(out, self._mig_device(handle).gi.id)

    def nvmlDeviceGetComputeInstanceId(self, handle: Any, out: Any) -> None:
        _set(out, self._mig_device(handle).id)

    def nvmlDeviceGetAttributes_v2(self, handle: Any, ref: Any) -> None:
        device = self._mig_device(handle)  # NVML: MIG device handles only
        profile, attrs = device.gi.profile, _out(ref)
        attrs.gpuInstanceSliceCount = profile.compute_slices
        attrs.computeInstanceSliceCount = device.slices
        attrs.multiprocessorCount = profile.sm_count * device.slices // profile.compute_slices
        attrs.sharedCopyEngineCount = profile.size
        attrs.sharedDecoderCount, attrs.sharedJpegCount, attrs.sharedOfaCount = _media(profile)
        attrs.sharedEncoderCount = 0
        attrs.memorySizeMB = profile.memory_mib

    # -------------------------------------------------------------- C symbols: GPU instances

    def nvmlDeviceGetGpuInstanceProfileInfo(self, handle: Any, profile: Any, ref: Any) -> None:
        self._fill_gi_profile(_out(ref), handle, _val(profile))

    def nvmlDeviceGetGpuInstanceProfileInfoV(self, handle: Any, profile: Any, ref: Any) -> None:
        info = _out(ref)
        # The caller must set the version (nvml.h); pynvml's default path leaves it 0.
        _check_version(info, (pynvml.nvmlGpuInstanceProfileInfo_v2,), _VERSION_REFUSED)
        info.name = f"MIG {self._fill_gi_profile(info, handle, _val(profile)).name}".encode()

    def nvmlDeviceGetGpuInstancePossiblePlacements_v2(
        self, handle: Any, profile_id: Any, placements: Any, count: Any
    ) -> None:
        self._require("monitor")
        profile = self._profile_by_id(self._whole_gpu(handle), _val(profile_id))
        starts = [(s, profile.size) for s in profile.starts]
        _write_array(placements, count, starts, _write_placement, query_fails=False)

    def nvmlDeviceCreateGpuInstance(self, handle: Any, profile_id: Any, out: Any) -> None:
        self._require("root")
        gpu = self._mig_gpu(handle)
        profile = self._profile_by_id(gpu, _val(profile_id))
        starts = free_starts(profile, gpu.occupied())
        if not starts:
            raise _Fail(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        _set_handle(out, self._create_gpu_instance(gpu, profile, starts[0]).handle)

    def nvmlDeviceCreateGpuInstanceWithPlacement(
        self, handle: Any, profile_id: Any, placement: Any, out: Any
    ) -> None:
        self._require("root")
        gpu = self._mig_gpu(handle)
        profile = self._profile_by_id(gpu, _val(profile_id))
        where = _out(placement)
        if where.size != profile.size or where.start not in profile.starts:
            raise _Fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        _set_handle(out, self._create_gpu_instance(gpu, profile, where.start).handle)

    def nvmlDeviceGetGpuInstances(
        self, handle: Any, profile_id: Any, instances: Any, count: Any
    ) -> None:
        self._require("monitor")
        gpu = self._mig_gpu(handle)
        profile = self._profile_by_id(gpu, _val(profile_id))
        found = [gi.handle for _, gi in sorted(gpu.instances.items()) if gi.profile == profile]
        _write_handles(instances, count, found, pynvml.c_nvmlGpuInstance_t)

    def nvmlDeviceGetGpuInstanceById(self, handle: Any, gi_id: Any, out: Any) -> None:
        self._require("monitor")
        _set_handle(out, _found(self._mig_gpu(handle).instances.get(_val(gi_id))).handle)

    def nvmlGpuInstanceGetInfo(self, gi_handle: Any, ref: Any) -> None:
        gi = self._lookup(gi_handle, "gi")
        _fill_instance_info(
            _out(ref), gi.gpu, gi.id, gi.profile.profile_id, gi.start, gi.profile.size
        )

    def nvmlGpuInstanceDestroy(self, gi_handle: Any) -> None:
        self._require("root")
        gi = self._lookup(gi_handle, "gi")
        if gi.computes:
            raise _Fail(pynvml.NVML_ERROR_IN_USE)
        del gi.gpu.instances[gi.id]
        del self._handles[gi.handle]

    # -------------------------------------------------------------- C symbols: compute instances

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(
        self, gi_handle: Any, profile: Any, engines: Any, ref: Any
    ) -> None:
        self._fill_ci_profile(_out(ref), gi_handle, _val(profile), _val(engines))

    def nvmlGpuInstanceGetComputeInstanceProfileInfoV(
        self, gi_handle: Any, profile: Any, engines: Any, ref: Any
    ) -> None:
        info = _out(ref)
        _check_version(info, (pynvml.nvmlComputeInstanceProfileInfo_v2,), _VERSION_REFUSED)
        slices = self._fill_ci_profile(info, gi_handle, _val(profile), _val(engines))
        info.name = f"MIG {slices}c.{self._lookup(gi_handle, 'gi').profile.name}".encode()

    def nvmlGpuInstanceCreateComputeInstance(
        self, gi_handle: Any, profile_id: Any, out: Any
    ) -> None:
        self._require("root")
        device = self._create_compute_instance(self._lookup(gi_handle, "gi"), _val(profile_id))
        _set_handle(out, device.ci_handle)

    def nvmlGpuInstanceGetComputeInstances(
        self, gi_handle: Any, profile_id: Any, instances: Any, count: Any
    ) -> None:
        self._require("monitor")
        gi = self._lookup(gi_handle, "gi")
        found = [
            m.ci_handle for _, m in sorted(gi.computes.items()) if m.profile_id == _val(profile_id)
        ]
        _write_handles(instances, count, found, pynvml.c_nvmlComputeInstance_t)

    def nvmlGpuInstanceGetComputeInstanceById(self, gi_handle: Any, ci_id: Any, out: Any) -> None:
        self._require("monitor")
        _set_handle(out, _found(self._lookup(gi_handle, "gi").computes.get(_val(ci_id))).ci_handle)

    def nvmlComputeInstanceGetInfo_v2(self, ci_handle: Any, ref: Any) -> None:
        device = self._lookup(ci_handle, "ci")
        info = _out(ref)
        info.gpuInstance = _pointer(device.gi.handle, pynvml.c_nvmlGpuInstance_t)
        _fill_instance_info(
            info, device.gpu, device.id, device.profile_id, device.start, device.slices
        )

    def nvmlComputeInstanceDestroy(self, ci_handle: Any) -> None:
        self._require("root")
        device = self._lookup(ci_handle, "ci")
        if device.processes:
            raise _Fail(pynvml.NVML_ERROR_IN_USE)
        del device.gi.computes[device.id]
        del self._handles[device.ci_handle], self._handles[device.handle]
        del self._units[device.uuid]

    # -------------------------------------------------------------- C symbols: GPM

    def nvmlGpmQueryDeviceSupport(self, handle: Any, ref: Any) -> None:
        info = _out(ref)
        _check_version(
            info, (pynvml.NVML_GPM_SUPPORT_VERSION,), pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        )
        info.isSupportedDevice = int(self._has_gpm(self._whole_gpu(handle)))

    def _has_gpm(self, gpu: _Gpu) -> bool:
        return gpu.model.key in GPM_MODELS if self.gpm is None else self.gpm

    def nvmlGpmSampleAlloc(self, out: Any) -> None:
        address = self._new_address()
        self._handles[address] = ("gpm", _GpmSample())
        _set_handle(out, address)

    def nvmlGpmSampleFree(self, sample: Any) -> None:
        self._lookup(sample, "gpm")
        del self._handles[_address(sample) or 0]

    def nvmlGpmMigSampleGet(self, handle: Any, gi_id: Any, sample: Any) -> None:
        gpu = self._mig_gpu(handle)
        if not self._has_gpm(gpu):
            raise _Fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        gi = _found(gpu.instances.get(_val(gi_id)))
        self._gpm_sample(self._lookup(sample, "gpm"), gi, list(gi.computes.values()))

    def nvmlGpmSampleGet(self, handle: Any, sample: Any) -> None:
        """nvml.h: "This API supports the device handle and MIG device handle". A MIG
        device samples its GPU instance (as nvmlGpmMigSampleGet does), a GPU the whole chip."""
        device = self._device(handle)
        if not self._has_gpm(device.gpu):
            raise _Fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        record = self._lookup(sample, "gpm")
        if isinstance(device, _MigDevice):
            self._gpm_sample(record, device.gi, list(device.gi.computes.values()))
        elif device.mig_enabled:
            self._gpm_sample(record, device, list(device.mig_devices()))
        else:
            self._gpm_sample(record, device, [device])

    def _gpm_sample(
        self, record: _GpmSample, source: _GpuInstance | _Gpu, units: list[_Unit]
    ) -> None:
        """Record the activity integrals of ``units``, weighted by their compute slices,
        as a share of ``source``."""
        now = time.monotonic()
        for unit in units:
            unit.accrue(now)
        whole = (
            source.profile.compute_slices if isinstance(source, _GpuInstance) else COMPUTE_SLICES
        )

        def share(value: Callable[[_Unit], float]) -> float:
            return sum(value(m) * _slices(m) for m in units) / whole

        record.source, record.at = source, now
        record.busy = (share(lambda m: m.busy_s), share(lambda m: m.memory_busy_s))
        record.rates = (share(lambda m: m.utilization), share(lambda m: m.memory_utilization))

    def nvmlGpmMetricsGet(self, ref: Any) -> None:
        request = _out(ref)
        _check_version(
            request,
            (pynvml.NVML_GPM_METRICS_GET_VERSION,),
            pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
        )
        first: _GpmSample = self._lookup(request.sample1, "gpm")
        second: _GpmSample = self._lookup(request.sample2, "gpm")
        if first.source is None or first.source is not second.source:
            raise _Fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        elapsed = second.at - first.at
        for i in range(request.numMetrics):
            metric = request.metrics[i]
            which = _GPM_ACTIVITY.get(metric.metricId)
            if which is None:
                metric.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
                continue
            delta = second.busy[which] - first.busy[which]
            metric.value = 100 * delta / elapsed if elapsed > 0 else second.rates[which]
            metric.nvmlReturn = pynvml.NVML_SUCCESS

    # -------------------------------------------------------------- C symbols: events

    def nvmlEventSetCreate(self, out: Any) -> None:
        events = _EventSet(self._new_address())
        self._handles[events.handle] = ("events", events)
        _set_handle(out, events.handle)

    def nvmlDeviceGetSupportedEventTypes(self, handle: Any, out: Any) -> None:
        self._whole_gpu(handle)
        _set(out, _SUPPORTED_EVENTS)

    def nvmlDeviceRegisterEvents(self, handle: Any, types: Any, event_set: Any) -> None:
        gpu, wanted = self._whole_gpu(handle), _val(types)
        if wanted & ~_SUPPORTED_EVENTS:
            raise _Fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        events = self._event_set(event_set)
        events.masks[gpu] = events.masks.get(gpu, 0) | wanted

    def nvmlEventSetWait_v2(self, event_set: Any, ref: Any, timeout_ms: Any) -> None:
        events = self._event_set(event_set)
        if not events.pending:
            raise _Fail(pynvml.NVML_ERROR_TIMEOUT)
        event = events.pending.popleft()
        data = _out(ref)
        data.device = _pointer(event.gpu.handle, pynvml.c_nvmlDevice_t)
        data.eventType, data.eventData = event.kind, event.data
        data.gpuInstanceId, data.computeInstanceId = (
            event.gpu_instance_id,
            event.compute_instance_id,
        )

    def nvmlEventSetFree(self, event_set: Any) -> None:
        del self._handles[self._event_set(event_set).handle]

    def _event_set(self, handle: Any) -> _EventSet:
        events: _EventSet = self._lookup(handle, "events")
        return events


def _now_us() -> int:
    """The CPU time NVML stamps its samples with, in microseconds."""
    return time.time_ns() // 1000


def _sample_processes(unit: _Unit) -> None:
    """Record a whole GPU's per-process samples up to now, before its load changes."""
    if isinstance(unit, _Gpu):
        unit.sample_processes()


def _percent(value: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 100:
        raise ValueError(f"{what} is a whole percent from 0 to 100, not {value!r}")
    return value


def _privilege(chosen: str | None) -> str:
    """The simulated caller's privilege: ``chosen``, else ``$GPUBROKER_SIMULATE_PRIVILEGE``,
    else the running process's own (root, or none)."""
    value = chosen or os.environ.get(PRIVILEGE_ENV) or ("root" if os.geteuid() == 0 else "none")
    if value not in PRIVILEGES:
        raise TopologyError(
            f"the simulated privilege must be one of {', '.join(PRIVILEGES)}, not {value!r}"
        )
    return value


def _media(profile: MigProfile) -> tuple[int, int, int]:
    """(decoders, JPEG engines, OFA engines) of a GPU-instance profile, as on the A100:
    a media-extensions profile and the whole GPU have all three kinds."""
    if "+me" in profile.name:
        return 1, 1, 1
    if profile.compute_slices == COMPUTE_SLICES:
        return 5, 1, 1
    return profile.size // 2, 0, 0


def _slices(unit: _Unit) -> int:
    """Compute slices of a MIG device, or all of a GPU's."""
    return unit.slices if isinstance(unit, _MigDevice) else COMPUTE_SLICES


def _full_ci_profile(gi: _GpuInstance) -> int:
    """The compute-instance profile that takes a whole GPU instance."""
    return next(int(p) for p, n in _CI_SLICES.items() if n == gi.profile.compute_slices)


def install(topology: Topology) -> SimulatedNvml:
    """Simulate ``topology`` under pynvml; undo with :func:`uninstall`."""
    return SimulatedNvml(topology).install()


def uninstall() -> None:
    """Give pynvml back the library it had before the installed simulation, if any."""
    lib = pynvml.nvmlLib
    if isinstance(lib, _Library):
        lib.sim.uninstall()
