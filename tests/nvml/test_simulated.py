"""The simulated libnvidia-ml, exercised only through the real pynvml wrappers."""

from __future__ import annotations

import ctypes
import re
import time

import pynvml
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jupyter_gpubroker.nvml import (
    SimulatedNvml,
    Topology,
    TopologyError,
    install,
    load_topology,
    uninstall,
)
from jupyter_gpubroker.nvml.presets import GpuSpec, gpu_spec
from jupyter_gpubroker.nvml.simulated import DRIVER_VERSION, IDLE_C, PROCESS_SAMPLE_PERIOD_US
from jupyter_gpubroker.wire.profiles import CATALOG, free_starts

MIB = 1 << 20
UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
H100 = CATALOG["H100-80GB"]
THERMAL = (
    pynvml.nvmlClocksEventReasonSwThermalSlowdown | pynvml.nvmlClocksEventReasonHwThermalSlowdown
)


# Not in nvidia-ml-py 12.535, the lowest version the package allows: its process struct
# is ``c_nvmlProcessInfo_t`` (the v3 layout), and it has no TemperatureV to call.
PROCESS_INFO_V3 = getattr(pynvml, "c_nvmlProcessInfo_v3_t", pynvml.c_nvmlProcessInfo_t)
TEMPERATURE_V = getattr(pynvml, "nvmlDeviceGetTemperatureV", None)
PERIOD_S = 1.2 * PROCESS_SAMPLE_PERIOD_US / 1e6
"""A little over one of the simulated driver's process sample periods."""


def gpu(index: int) -> object:
    return pynvml.nvmlDeviceGetHandleByIndex(index)


def temperature(handle: object) -> int:
    """The GPU temperature; where this pynvml has TemperatureV, both calls must agree."""
    t = int(pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU))
    if TEMPERATURE_V is not None:
        assert TEMPERATURE_V(handle, pynvml.NVML_TEMPERATURE_GPU) == t
    return t


def mig(parent: object, index: int) -> object:
    return pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, index)


def uuid_of(handle: object) -> str:
    return str(pynvml.nvmlDeviceGetUUID(handle))


def all_uuids() -> list[str]:
    """Every GPU, each followed by its MIG devices, in NVML's order."""
    found = []
    for i in range(pynvml.nvmlDeviceGetCount()):
        h = gpu(i)
        found.append(uuid_of(h))
        for j in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(h)):
            try:
                found.append(uuid_of(mig(h, j)))
            except pynvml.NVMLError_NotFound:
                continue
    return found


def create(handle: object, profile: str, start: int, size: int | None = None) -> object:
    p = H100.profile(profile)
    assert p is not None
    placement = pynvml.c_nvmlGpuInstancePlacement_t(start, p.size if size is None else size)
    return pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(
        handle, p.profile_id, ctypes.byref(placement)
    )


# ------------------------------------------------------------------ enumeration


def test_enumerates_gpus_with_their_catalog_identity(simulate):
    simulate("dgx-h100")
    assert pynvml.nvmlDeviceGetCount() == 8
    h = gpu(3)
    assert pynvml.nvmlDeviceGetName(h) == "NVIDIA H100 80GB HBM3"
    assert pynvml.nvmlDeviceGetMemoryInfo(h).total == H100.memory_mib * MIB
    assert pynvml.nvmlDeviceGetEnforcedPowerLimit(h) == H100.power_limit_mw
    pci = pynvml.nvmlDeviceGetPciInfo(h)
    assert (pci.pciDeviceId, pci.busId) == (H100.pci_device_id, "00000000:5D:00.0")
    assert pynvml.nvmlDeviceGetIndex(h) == 3
    uuid = uuid_of(h)
    assert re.fullmatch(f"GPU-{UUID}", uuid)
    assert uuid_of(pynvml.nvmlDeviceGetHandleByUUID(uuid)) == uuid
    assert pynvml.nvmlSystemGetDriverVersion() == DRIVER_VERSION
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        gpu(8)
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetHandleByUUID("GPU-00000000-0000-0000-0000-000000000000")


def test_calls_need_an_initialised_library():
    sim = install(load_topology("dgx-h100"))
    try:
        with pytest.raises(pynvml.NVMLError_Uninitialized):
            pynvml.nvmlDeviceGetCount()
        pynvml.nvmlInit()
        assert pynvml.nvmlDeviceGetCount() == 8
        pynvml.nvmlShutdown()
        with pytest.raises(pynvml.NVMLError_Uninitialized):
            pynvml.nvmlDeviceGetCount()
    finally:
        sim.uninstall()


def test_install_and_uninstall_restore_pynvml():
    sim = SimulatedNvml(load_topology("dgx-h100"))
    with pytest.raises(RuntimeError, match="not the library pynvml is using"):
        sim.uninstall()
    uninstall()  # nothing installed: nothing to do
    sim.install()
    pynvml.nvmlInit()
    pynvml.nvmlDeviceGetCount()
    assert "nvmlDeviceGetCount_v2" in pynvml._nvmlGetFunctionPointer_cache
    uninstall()
    assert pynvml.nvmlLib is None
    assert pynvml._nvmlLib_refcount == 0
    assert not pynvml._nvmlGetFunctionPointer_cache


@pytest.mark.parametrize(
    "spec, message",
    [
        (GpuSpec("V100"), "not a GPU the simulator can build"),
        (GpuSpec("H100-80GB", False, (("1g.10gb", 0),)), "not a GPU the simulator can build"),
        (GpuSpec("H100-80GB", True, (("1g.5gb", 0),)), "cannot hold 1g.5gb at memory slice 0"),
        (GpuSpec("H100-80GB", True, (("3g.40gb", 0), ("2g.20gb", 2))), "2g.20gb at memory slice 2"),
    ],
)
def test_hand_made_gpus_are_checked(spec, message):
    with pytest.raises(TopologyError, match=message):
        SimulatedNvml(Topology("hand-made", (spec,)))


def test_uuids_are_unique_deterministic_and_survive_scaling(simulate):
    simulate("dgx-h100-mig")
    first = all_uuids()
    simulate("dgx-h100-mig")
    again = all_uuids()
    simulate("dgx-h100-mig:16")
    scaled = all_uuids()
    simulate("h200-mig-balanced")
    other = all_uuids()
    assert first == again
    assert len(set(scaled)) == len(scaled) == 16 * 8
    assert scaled[: len(first)] == first
    assert not set(other) & set(first)
    assert all(re.fullmatch(f"(GPU|MIG)-{UUID}", u) for u in first + other)


def test_error_texts_come_from_the_library(simulate):
    simulate("dgx-h100")
    assert str(pynvml.NVMLError_InUse()) == "In use by another client"
    assert pynvml.nvmlErrorString(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES) == (
        "Insufficient resources"
    )


def test_a_hidden_symbol_is_function_not_found(simulate):
    """As an older driver without the symbol: every pynvml looks it up this way."""
    sim = simulate("dgx-h100")
    assert temperature(gpu(0)) == IDLE_C
    assert pynvml._nvmlGetFunctionPointer("nvmlDeviceGetTemperatureV")
    sim.hide_symbol("nvmlDeviceGetTemperatureV")
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        pynvml._nvmlGetFunctionPointer("nvmlDeviceGetTemperatureV")
    if TEMPERATURE_V is not None:
        with pytest.raises(pynvml.NVMLError_FunctionNotFound):
            TEMPERATURE_V(gpu(0), pynvml.NVML_TEMPERATURE_GPU)
    assert pynvml.nvmlDeviceGetTemperature(gpu(0), pynvml.NVML_TEMPERATURE_GPU) == IDLE_C


# ------------------------------------------------------------------ load and memory


def test_utilization_is_not_supported_under_mig(simulate):
    sim = simulate("workstation-a100")
    mig_gpu, whole = gpu(0), gpu(1)
    for handle in (mig_gpu, mig(mig_gpu, 0)):
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetUtilizationRates(handle)
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetProcessUtilization(handle, 0)
    sim.set_load(uuid_of(whole), utilization=80, memory_utilization=30)
    util = pynvml.nvmlDeviceGetUtilizationRates(whole)
    assert (util.gpu, util.memory) == (80, 30)
    with pytest.raises(pynvml.NVMLError_NotFound):  # no process to sample yet
        pynvml.nvmlDeviceGetProcessUtilization(whole, 0)
    sim.add_process(uuid_of(whole), 11)
    sim.add_process(uuid_of(whole), 12)
    time.sleep(PERIOD_S)  # a sample period ends with both running
    samples = pynvml.nvmlDeviceGetProcessUtilization(whole, 0)
    assert {(s.pid, s.smUtil, s.memUtil) for s in samples} == {(11, 40, 15), (12, 40, 15)}


def process_samples(handle: object, since: int = 0) -> list[tuple[int, int, int, int]]:
    """NVML's per-process samples newer than ``since``: (timestamp, pid, SM, memory)."""
    found = pynvml.nvmlDeviceGetProcessUtilization(handle, since)
    return [(s.timeStamp, s.pid, s.smUtil, s.memUtil) for s in found]


def test_each_process_has_its_own_load_and_the_gpu_their_sum(simulate):
    sim = simulate("l40s-4")
    handle = gpu(0)
    uuid = uuid_of(handle)
    for pid, mib in ((21, 4096), (22, 1024), (23, 512)):
        sim.add_process(uuid, pid, mib)
    sim.set_process_load(uuid, 21, 60, memory_utilization=20)
    sim.set_process_load(uuid, 22, 10)
    assert pynvml.nvmlDeviceGetUtilizationRates(handle).gpu == 70  # what the GPU shows
    time.sleep(PERIOD_S)
    samples = process_samples(handle)
    # 23 was given no load: NVML samples only processes with some in the period
    assert {(pid, sm, mem) for _, pid, sm, mem in samples} == {(21, 60, 20), (22, 10, 0)}
    with pytest.raises(ValueError, match="no simulated process 24"):
        sim.set_process_load(uuid, 24, 10)
    with pytest.raises(ValueError, match="whole percent"):
        sim.set_process_load(uuid, 21, 101)


def test_process_samples_are_only_those_newer_than_the_last_seen(simulate):
    sim = simulate("l40s-4")
    handle = gpu(0)
    uuid = uuid_of(handle)
    sim.add_process(uuid, 31)
    sim.set_process_load(uuid, 31, 50)
    time.sleep(3 * PERIOD_S)
    first = process_samples(handle)
    assert len(first) >= 2  # one per period: several for one process
    assert {(pid, sm) for _, pid, sm, _ in first} == {(31, 50)}
    stamps = [at for at, *_ in first]
    assert stamps == sorted(set(stamps))
    assert abs(stamps[-1] / 1e6 - time.time()) < 1  # CPU time in microseconds
    newest = stamps[-1]
    with pytest.raises(pynvml.NVMLError_NotFound):  # nothing newer yet
        process_samples(handle, newest)
    sim.set_process_load(uuid, 31, 20)
    time.sleep(2 * PERIOD_S)
    later = process_samples(handle, newest)
    assert later and all(at > newest for at, *_ in later)
    assert [sm for *_, sm, _ in later][-1] == 20  # the load since it changed
    assert set(process_samples(handle)) >= set(first) | set(later)  # 0: all kept
    sim.set_process_load(uuid, 31, 0)  # idle from now on: no more samples
    time.sleep(2 * PERIOD_S)
    idle_since = max(at for at, *_ in process_samples(handle))
    time.sleep(2 * PERIOD_S)
    with pytest.raises(pynvml.NVMLError_NotFound):
        process_samples(handle, idle_since)


def test_a_mig_device_has_no_process_load_to_set(simulate):
    sim = simulate("workstation-a100")
    slice_uuid = uuid_of(mig(gpu(0), 0))
    sim.add_process(slice_uuid, 41)
    with pytest.raises(ValueError, match="MIG device"):
        sim.set_process_load(slice_uuid, 41, 30)


def test_memory_counts_load_and_processes(simulate):
    sim = simulate("h200-mig-balanced")
    parent = gpu(0)
    first, second = mig(parent, 0), mig(parent, 1)
    sim.set_load(uuid_of(first), memory_used_mib=1000)
    sim.add_process(uuid_of(first), 7, used_memory_mib=500)
    sim.add_process(uuid_of(second), 8, used_memory_mib=250)
    info = pynvml.nvmlDeviceGetMemoryInfo(first)
    assert (info.total, info.used, info.free) == (71424 * MIB, 1500 * MIB, (71424 - 1500) * MIB)
    assert pynvml.nvmlDeviceGetMemoryInfo(parent).used == 1750 * MIB
    v2 = pynvml.nvmlDeviceGetMemoryInfo(first, version=pynvml.nvmlMemory_v2)
    assert (v2.total, v2.used, v2.reserved) == (71424 * MIB, 1500 * MIB, 0)
    with pytest.raises(pynvml.NVMLError_ArgumentVersionMismatch):
        pynvml.nvmlDeviceGetMemoryInfo(first, version=1)


def test_load_settings_are_checked(simulate):
    sim = simulate("workstation-a100")
    with pytest.raises(ValueError, match="MIG enabled"):
        sim.set_load(uuid_of(gpu(0)), utilization=10)
    with pytest.raises(ValueError, match="MIG enabled"):
        sim.add_process(uuid_of(gpu(0)), 1)
    with pytest.raises(ValueError, match="percent"):
        sim.set_load(uuid_of(gpu(1)), utilization=101)
    with pytest.raises(ValueError, match="between 0 and 40960"):
        sim.set_load(uuid_of(gpu(1)), memory_used_mib=50_000)
    with pytest.raises(ValueError, match="no simulated GPU"):
        sim.set_load("GPU-nope", utilization=1)
    with pytest.raises(ValueError, match="no simulated process 5"):
        sim.remove_process(uuid_of(gpu(1)), 5)


def test_mig_load_heats_and_powers_its_gpu(simulate):
    sim = simulate("dgx-h100-mig")
    parent = gpu(0)
    idle_power = pynvml.nvmlDeviceGetPowerUsage(parent)
    assert pynvml.nvmlDeviceGetCurrentClocksEventReasons(parent) == (
        pynvml.nvmlClocksEventReasonGpuIdle
    )
    for j in range(7):
        sim.set_load(uuid_of(mig(parent, j)), utilization=100)
    assert pynvml.nvmlDeviceGetPowerUsage(parent) == H100.power_limit_mw > idle_power
    assert pynvml.nvmlDeviceGetTemperature(parent, pynvml.NVML_TEMPERATURE_GPU) > IDLE_C
    assert pynvml.nvmlDeviceGetCurrentClocksEventReasons(parent) == 0
    assert pynvml.nvmlDeviceGetPowerUsage(gpu(1)) == idle_power


def test_a_power_capped_gpu_draws_its_limit_and_says_why_until_cleared(simulate):
    sim = simulate("dgx-h100:2")
    sim.inject_power_cap(uuid_of(gpu(0)))
    assert pynvml.nvmlDeviceGetPowerUsage(gpu(0)) == H100.power_limit_mw
    assert pynvml.nvmlDeviceGetCurrentClocksEventReasons(gpu(0)) == (
        pynvml.nvmlClocksEventReasonSwPowerCap
    )
    assert pynvml.nvmlDeviceGetCurrentClocksEventReasons(gpu(1)) == (
        pynvml.nvmlClocksEventReasonGpuIdle
    )
    sim.clear_faults(uuid_of(gpu(0)))
    assert pynvml.nvmlDeviceGetPowerUsage(gpu(0)) < H100.power_limit_mw
    assert (
        pynvml.nvmlDeviceGetTemperatureThreshold(gpu(0), pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)
        == 89
    )


def test_running_processes_use_the_two_call_protocol(simulate):
    sim = simulate("workstation-a100")
    whole = gpu(1)
    for pid, mib in ((101, 1000), (102, 2000), (103, 0)):
        sim.add_process(uuid_of(whole), pid, mib)
    fn = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetComputeRunningProcesses_v3")
    count = ctypes.c_uint(0)
    assert fn(whole, ctypes.byref(count), None) == pynvml.NVML_ERROR_INSUFFICIENT_SIZE
    assert count.value == 3
    small = (PROCESS_INFO_V3 * 2)()
    count = ctypes.c_uint(2)
    assert fn(whole, ctypes.byref(count), small) == pynvml.NVML_ERROR_INSUFFICIENT_SIZE
    assert count.value == 3
    procs = pynvml.nvmlDeviceGetComputeRunningProcesses(whole)
    assert sorted((p.pid, p.usedGpuMemory, p.gpuInstanceId) for p in procs) == [
        (101, 1000 * MIB, 0xFFFFFFFF),
        (102, 2000 * MIB, 0xFFFFFFFF),
        (103, 0, 0xFFFFFFFF),
    ]


def test_mps_clients_are_listed_by_the_mps_query_and_a_process_outside_mps_is_not(simulate):
    """As NVML: every compute process in the compute query; only those with an MPS
    compute context in the MPS query."""
    sim = simulate("workstation-a100")
    whole = gpu(1)
    sim.add_process(uuid_of(whole), 201, 1000, mps=True)
    sim.add_process(uuid_of(whole), 202, 2000)
    listed = pynvml.nvmlDeviceGetComputeRunningProcesses(whole)
    assert sorted(p.pid for p in listed) == [201, 202]
    clients = pynvml.nvmlDeviceGetMPSComputeRunningProcesses(whole)
    assert [(p.pid, p.usedGpuMemory) for p in clients] == [(201, 1000 * MIB)]
    sim.add_process(uuid_of(whole), 201, 1000)  # it started again outside MPS
    assert pynvml.nvmlDeviceGetMPSComputeRunningProcesses(whole) == []


def test_mig_processes_carry_their_instance_ids(simulate):
    sim = simulate("workstation-a100")
    parent = gpu(0)
    first, second = mig(parent, 0), mig(parent, 1)
    sim.add_process(uuid_of(first), 201, 100)
    sim.add_process(uuid_of(second), 202, 200)
    ids = [
        (pynvml.nvmlDeviceGetGpuInstanceId(h), pynvml.nvmlDeviceGetComputeInstanceId(h))
        for h in (first, second)
    ]
    assert [
        (p.pid, p.gpuInstanceId, p.computeInstanceId)
        for p in pynvml.nvmlDeviceGetComputeRunningProcesses(first)
    ] == [(201, *ids[0])]
    listed = pynvml.nvmlDeviceGetComputeRunningProcesses(parent)
    assert sorted((p.pid, p.gpuInstanceId) for p in listed) == [(201, ids[0][0]), (202, ids[1][0])]
    assert pynvml.nvmlDeviceGetComputeRunningProcesses(mig(parent, 2)) == []


# ------------------------------------------------------------------ faults


def test_a_lost_gpu_answers_gpu_is_lost_with_its_mig_devices(simulate):
    sim = simulate("h200-mig-balanced")
    parent, other = gpu(0), gpu(1)
    slice_ = mig(parent, 2)
    sim.inject_gpu_lost(uuid_of(slice_))  # a MIG device takes its whole GPU along
    calls = (
        pynvml.nvmlDeviceGetName,
        pynvml.nvmlDeviceGetUUID,
        pynvml.nvmlDeviceGetMemoryInfo,
        pynvml.nvmlDeviceGetComputeRunningProcesses,
        pynvml.nvmlDeviceIsMigDeviceHandle,
    )
    for handle in (parent, slice_):
        for call in calls:
            with pytest.raises(pynvml.NVMLError_GpuIsLost):
                call(handle)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetMaxMigDeviceCount(parent)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        temperature(parent)
    if TEMPERATURE_V is not None:
        with pytest.raises(pynvml.NVMLError_GpuIsLost):
            TEMPERATURE_V(parent, pynvml.NVML_TEMPERATURE_GPU)
    assert pynvml.nvmlDeviceGetName(other) == "NVIDIA H200"
    sim.clear_faults(uuid_of(other))  # clearing another GPU leaves GPU 0 lost
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetName(slice_)


def test_clearing_faults_brings_a_gpu_back(simulate):
    sim = simulate("dgx-h100")
    uuid = uuid_of(gpu(0))
    sim.inject_gpu_lost(uuid)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetPowerUsage(gpu(0))
    sim.clear_faults(uuid)
    assert pynvml.nvmlDeviceGetUUID(gpu(0)) == uuid


def test_overheat_passes_slowdown_and_sets_thermal_reasons(simulate):
    sim = simulate("dgx-h100")
    h = gpu(2)
    slowdown = pynvml.nvmlDeviceGetTemperatureThreshold(
        h, pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
    )
    assert temperature(h) < slowdown
    assert pynvml.nvmlDeviceGetCurrentClocksEventReasons(h) & THERMAL == 0
    sim.inject_overheat(uuid_of(h))
    assert temperature(h) > slowdown
    assert pynvml.nvmlDeviceGetCurrentClocksEventReasons(h) & THERMAL == THERMAL
    assert pynvml.nvmlDeviceGetCurrentClocksEventReasons(gpu(3)) & THERMAL == 0
    sim.clear_faults(uuid_of(h))
    assert temperature(h) < slowdown


def test_xid_errors_reach_registered_event_sets(simulate):
    sim = simulate("h200-mig-balanced")
    parent = gpu(0)
    slice_ = mig(parent, 1)
    events = pynvml.nvmlEventSetCreate()
    xid = pynvml.nvmlEventTypeXidCriticalError
    assert pynvml.nvmlDeviceGetSupportedEventTypes(parent) & xid
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceRegisterEvents(parent, pynvml.nvmlEventTypePState, events)
    pynvml.nvmlDeviceRegisterEvents(parent, xid, events)
    with pytest.raises(pynvml.NVMLError_Timeout):
        pynvml.nvmlEventSetWait(events, 0)
    sim.inject_xid(uuid_of(parent), 79)
    sim.inject_xid(uuid_of(slice_), 43)
    sim.inject_xid(uuid_of(gpu(1)), 13)  # not registered: not delivered
    first = pynvml.nvmlEventSetWait(events, 0)
    assert (first.eventType, first.eventData, first.gpuInstanceId) == (xid, 79, 0xFFFFFFFF)
    assert uuid_of(first.device) == uuid_of(parent)
    second = pynvml.nvmlEventSetWait(events, 0)
    assert (second.eventData, second.gpuInstanceId, second.computeInstanceId) == (
        43,
        pynvml.nvmlDeviceGetGpuInstanceId(slice_),
        pynvml.nvmlDeviceGetComputeInstanceId(slice_),
    )
    with pytest.raises(pynvml.NVMLError_Timeout):
        pynvml.nvmlEventSetWait(events, 0)
    pynvml.nvmlEventSetFree(events)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlEventSetWait(events, 0)


# ------------------------------------------------------------------ MIG


def test_mig_device_handles(simulate):
    simulate("h200-mig-balanced")
    parent = gpu(0)
    assert pynvml.nvmlDeviceGetMigMode(parent) == [1, 1]
    assert pynvml.nvmlDeviceGetMaxMigDeviceCount(parent) == 7
    first = mig(parent, 0)
    assert pynvml.nvmlDeviceIsMigDeviceHandle(first).value == 1
    assert pynvml.nvmlDeviceIsMigDeviceHandle(parent).value == 0
    parent_again = pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(first)
    assert uuid_of(parent_again) == uuid_of(parent)
    uuid = uuid_of(first)
    assert re.fullmatch(f"MIG-{UUID}", uuid)
    assert uuid_of(pynvml.nvmlDeviceGetHandleByUUID(uuid)) == uuid
    assert pynvml.nvmlDeviceGetName(first) == "NVIDIA H200 MIG 3g.71gb"
    assert pynvml.nvmlDeviceGetMemoryInfo(first).total == 71424 * MIB
    gi = pynvml.nvmlDeviceGetGpuInstanceById(parent, pynvml.nvmlDeviceGetGpuInstanceId(first))
    info = pynvml.nvmlGpuInstanceGetInfo(gi)
    assert (info.profileId, info.placement.start, info.placement.size) == (9, 4, 4)
    assert uuid_of(info.device) == uuid_of(parent)
    ci = pynvml.nvmlGpuInstanceGetComputeInstanceById(
        gi, pynvml.nvmlDeviceGetComputeInstanceId(first)
    )
    ci_info = pynvml.nvmlComputeInstanceGetInfo(ci)
    assert (ci_info.profileId, ci_info.placement.size) == (
        pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE,
        3,
    )
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetGpuInstanceId(parent)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        mig(parent, 7)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetMaxMigDeviceCount(first)
    for sensor in (pynvml.nvmlDeviceGetPowerUsage, pynvml.nvmlDeviceGetEnforcedPowerLimit):
        with pytest.raises(pynvml.NVMLError_NotSupported):
            sensor(first)


@pytest.mark.parametrize("model", sorted(CATALOG))
def test_profile_info_matches_the_catalog(simulate, model):
    simulate(Topology("one", (gpu_spec(model, {}),)))
    h = gpu(0)
    for p in CATALOG[model].profiles:
        info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(h, p.nvml_profile)
        assert (info.id, info.memorySizeMB, info.instanceCount, info.sliceCount, info.name) == (
            p.profile_id,
            p.memory_mib,
            p.max_count,
            p.compute_slices,
            f"MIG {p.name}",
        )
        assert pynvml.nvmlDeviceGetGpuInstanceProfileInfo(h, p.nvml_profile, 1).id == p.profile_id
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetGpuInstanceProfileInfo(h, pynvml.NVML_GPU_INSTANCE_PROFILE_8_SLICE)


def test_possible_placements_are_the_catalog_starts(simulate, empty_h100):
    simulate(empty_h100)
    h = gpu(0)
    for p in H100.profiles:
        count = ctypes.c_uint()
        pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(
            h, p.profile_id, None, ctypes.byref(count)
        )
        placements = (pynvml.c_nvmlGpuInstancePlacement_t * count.value)()
        pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(
            h, p.profile_id, placements, ctypes.byref(count)
        )
        assert [(x.start, x.size) for x in placements] == [(s, p.size) for s in p.starts]


def test_instances_may_not_overlap_nor_exceed_their_count(simulate, empty_h100):
    simulate(empty_h100)
    h = gpu(0)
    gi = create(h, "3g.40gb", 0)
    with pytest.raises(pynvml.NVMLError_InsufficientResources):
        create(h, "2g.20gb", 2)  # slices 2-3 belong to the 3g instance
    with pytest.raises(pynvml.NVMLError_InsufficientResources):
        create(h, "7g.80gb", 0)
    create(h, "1g.10gb+me", 4)
    with pytest.raises(pynvml.NVMLError_InsufficientResources):
        create(h, "1g.10gb+me", 5)  # slice 5 is free, but one +me instance is the most
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        create(h, "3g.40gb", 2)  # 3g starts only at 0 or 4
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        create(h, "3g.40gb", 4, size=2)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(
            h, 99, ctypes.byref(pynvml.c_nvmlGpuInstancePlacement_t(0, 1))
        )
    listed = (pynvml.c_nvmlGpuInstance_t * 2)()
    count = ctypes.c_uint()
    pynvml.nvmlDeviceGetGpuInstances(h, 9, listed, ctypes.byref(count))
    assert count.value == 1
    assert pynvml.nvmlGpuInstanceGetInfo(listed[0]).id == pynvml.nvmlGpuInstanceGetInfo(gi).id
    chosen = pynvml.nvmlDeviceCreateGpuInstance(h, 19)  # the driver picks the first free start
    assert pynvml.nvmlGpuInstanceGetInfo(chosen).placement.start == 5


def test_a_full_gpu_has_no_room(simulate):
    simulate("dgx-h100-mig")
    with pytest.raises(pynvml.NVMLError_InsufficientResources):
        create(gpu(0), "1g.10gb", 3)
    with pytest.raises(pynvml.NVMLError_InsufficientResources):
        pynvml.nvmlDeviceCreateGpuInstance(gpu(0), 19)


def test_mig_changes_need_mig_mode(simulate, empty_h100):
    simulate(empty_h100)
    h = gpu(1)
    assert pynvml.nvmlDeviceGetMigMode(h) == [0, 0]
    assert pynvml.nvmlDeviceGetMaxMigDeviceCount(h) == 0
    with pytest.raises(pynvml.NVMLError_NotSupported):
        create(h, "1g.10gb", 0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetGpuInstanceById(h, 7)
    with pytest.raises(pynvml.NVMLError_NotFound):
        mig(h, 0)


def test_destroying_what_is_in_use_fails(simulate):
    sim = simulate("dgx-h100-mig")
    h = gpu(0)
    slice_ = mig(h, 0)
    uuid = uuid_of(slice_)
    gi = pynvml.nvmlDeviceGetGpuInstanceById(h, pynvml.nvmlDeviceGetGpuInstanceId(slice_))
    ci = pynvml.nvmlGpuInstanceGetComputeInstanceById(
        gi, pynvml.nvmlDeviceGetComputeInstanceId(slice_)
    )
    with pytest.raises(pynvml.NVMLError_InUse):
        pynvml.nvmlGpuInstanceDestroy(gi)  # its compute instance remains
    sim.add_process(uuid, 4242, 512)
    with pytest.raises(pynvml.NVMLError_InUse):
        pynvml.nvmlComputeInstanceDestroy(ci)
    sim.remove_process(uuid, 4242)
    pynvml.nvmlComputeInstanceDestroy(ci)
    pynvml.nvmlGpuInstanceDestroy(gi)
    with pytest.raises(pynvml.NVMLError_NotFound):
        mig(h, 0)
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetHandleByUUID(uuid)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetUUID(slice_)  # a stale handle
    assert len(all_uuids()) == 8 * 8 - 1
    recreated = create(h, "1g.10gb", 0)  # the freed slice can be cut again
    pynvml.nvmlGpuInstanceCreateComputeInstance(recreated, 0)
    assert uuid_of(mig(h, 0)) != uuid


def test_compute_instances_share_their_gpu_instance(simulate, empty_h100):
    simulate(empty_h100)
    h = gpu(0)
    gi = create(h, "3g.40gb", 4)
    shared = pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
    info = pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
        gi, pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE, shared
    )
    assert (info.sliceCount, info.instanceCount, info.name) == (1, 3, "MIG 1c.3g.40gb")
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
            gi, pynvml.NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE, shared
        )
    for _ in range(3):
        pynvml.nvmlGpuInstanceCreateComputeInstance(
            gi, pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE
        )
    with pytest.raises(pynvml.NVMLError_InsufficientResources):
        pynvml.nvmlGpuInstanceCreateComputeInstance(
            gi, pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE
        )
    listed = (pynvml.c_nvmlComputeInstance_t * 3)()
    count = ctypes.c_uint()
    pynvml.nvmlGpuInstanceGetComputeInstances(gi, 0, listed, ctypes.byref(count))
    starts = [pynvml.nvmlComputeInstanceGetInfo(listed[i]).placement.start for i in range(3)]
    assert (count.value, starts) == (3, [0, 1, 2])
    names = {pynvml.nvmlDeviceGetName(mig(h, j)) for j in range(3)}
    assert names == {"NVIDIA H100 80GB HBM3 MIG 1c.3g.40gb"}


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([p.name for p in H100.profiles]), st.integers(0, 7), st.booleans()
        ),
        max_size=20,
    )
)
def test_creation_succeeds_exactly_when_the_catalog_allows(steps):
    """Random creations (and destructions of the oldest instance) against a model."""
    sim = install(Topology("empty", (gpu_spec("H100-80GB", {}),)))
    try:
        pynvml.nvmlInit()
        h = gpu(0)
        placed: list[tuple[str, int, object]] = []
        for name, start, destroy_oldest in steps:
            if destroy_oldest and placed:
                pynvml.nvmlGpuInstanceDestroy(placed.pop(0)[2])
                continue
            p = H100.profile(name)
            assert p is not None
            occupied = {s for n, at, _ in placed for s in H100.profile(n).slots(at)}
            fits = start in free_starts(p, occupied)
            below_max = sum(n == name for n, _, _ in placed) < p.max_count
            if start not in p.starts:
                with pytest.raises(pynvml.NVMLError_InvalidArgument):
                    create(h, name, start)
            elif fits and below_max:
                placed.append((name, start, create(h, name, start)))
            else:
                with pytest.raises(pynvml.NVMLError_InsufficientResources):
                    create(h, name, start)
    finally:
        sim.uninstall()
