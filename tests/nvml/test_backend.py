"""The real backend, running unchanged over the simulated library."""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter

import pynvml
import pytest

from jupyter_gpubroker.broker.models import Health, Inventory, ProcessInfo
from jupyter_gpubroker.nvml import (
    NvmlBackend,
    SimulatedNvml,
    load_topology,
    open_backend,
    processes,
)
from jupyter_gpubroker.nvml.simulated import IDLE_C, PROCESS_SAMPLE_PERIOD_US, SLOWDOWN_C
from jupyter_gpubroker.wire.profiles import CATALOG, COMPUTE_SLICES

PERIOD_S = 1.2 * PROCESS_SAMPLE_PERIOD_US / 1e6
"""A little over one of the simulated driver's process sample periods."""


def check_inventory(inv: Inventory) -> None:
    """What every inventory must satisfy, whatever the machine."""
    uuids = [g.uuid for g in inv.gpus] + [d.uuid for d in inv.devices if d.kind == "mig"]
    assert len(uuids) == len(set(uuids))
    assert [g.index for g in inv.gpus] == sorted(g.index for g in inv.gpus)
    for gpu in inv.gpus:
        model = CATALOG[gpu.model or ""]
        assert (gpu.name, gpu.memory_mib) == (model.nvml_names[0], model.memory_mib)
        assert gpu.pci_bus_id.endswith(":00.0")
        on_gpu = [d for d in inv.devices if d.gpu_uuid == gpu.uuid]
        if not gpu.mig_enabled:
            [whole] = on_gpu
            assert (whole.kind, whole.uuid, whole.memory_mib) == ("gpu", gpu.uuid, gpu.memory_mib)
            assert (whole.compute_slices, whole.profile, whole.start) == (
                COMPUTE_SLICES,
                None,
                None,
            )
            continue
        slots: list[int] = []
        for d in on_gpu:
            profile = model.profile(d.profile or "")
            assert profile is not None and d.kind == "mig" and d.gpu_index == gpu.index
            assert d.start in profile.starts
            assert (d.memory_mib, d.compute_slices) == (profile.memory_mib, profile.compute_slices)
            assert d.gpu_instance_id is not None and d.compute_instance_id == 0
            slots += profile.slots(d.start)
        assert len(slots) == len(set(slots))


@pytest.mark.parametrize(
    "preset, gpus, profiles",
    [
        ("dgx-h100", 8, {None: 8}),
        ("dgx-h100-mig", 8, {"1g.10gb": 56}),
        ("h200-mig-balanced", 2, {"1g.18gb": 4, "2g.35gb": 2, "3g.71gb": 2}),
        ("workstation-a100", 2, {"3g.20gb": 1, "2g.10gb": 1, "1g.5gb": 2, None: 1}),
        ("dgx-h100-mig:64", 64, {"1g.10gb": 448}),
    ],
)
def test_inventory_of_each_preset(open_sim, preset, gpus, profiles):
    inv = open_sim(preset).inventory()
    assert len(inv.gpus) == gpus
    assert Counter(d.profile for d in inv.devices) == profiles
    check_inventory(inv)


def test_reading_a_whole_gpu(open_sim):
    backend = open_sim("workstation-a100")
    whole = next(d for d in backend.inventory().devices if d.kind == "gpu")
    backend.simulator.set_load(
        whole.uuid, utilization=75, memory_utilization=40, memory_used_mib=2048
    )
    backend.simulator.add_process(whole.uuid, 321, 1024)
    r = backend.read(whole.uuid)
    assert (r.health, r.error, r.unsupported) == (Health.OK, None, ())
    assert (r.utilization_gpu, r.utilization_memory) == (75.0, 40.0)
    assert (r.memory_used_mib, r.memory_total_mib) == (3072, 40960)
    assert IDLE_C < r.temperature_c < SLOWDOWN_C
    assert 40_000 < r.power_mw < r.power_limit_mw == 400_000
    assert r.clock_event_reasons == 0
    # its own load: none while NVML has no sample of it yet (a sixth of a second; a
    # starved machine may take that long between the two calls), else all of the GPU's
    (p,) = r.processes
    assert (p.pid, p.used_memory_mib, p.gpu_instance_id, p.compute_instance_id, p.mps) == (
        321,
        1024,
        None,
        None,
        False,
    )
    assert p.utilization in (0.0, 75.0)
    backend.simulator.add_process(whole.uuid, 322, 512, mps=True)
    found = {(q.pid, q.used_memory_mib, q.mps) for q in backend.read(whole.uuid).processes}
    assert found == {(321, 1024, False), (322, 512, True)}


def own_loads(backend: NvmlBackend, uuid: str) -> dict[int, float | None]:
    return {p.pid: p.utilization for p in backend.read(uuid).processes}


def test_each_process_reads_its_own_utilization_since_the_last_reading(open_sim, monkeypatch):
    """Two kernels on one shared L40S: the GPU reads their 70% together, each process its
    own share of it; the next reading averages the samples since this one."""
    monkeypatch.setattr(processes, "MIN_INTERVAL_S", 0.0)
    backend = open_sim("l40s-4")
    uuid = backend.inventory().gpus[0].uuid
    sim = backend.simulator
    for pid in (51, 52, 53):
        sim.add_process(uuid, pid, 2048)
    sim.set_process_load(uuid, 51, 60)
    sim.set_process_load(uuid, 52, 10)
    time.sleep(3 * PERIOD_S)
    r = backend.read(uuid)
    assert r.utilization_gpu == 70.0
    assert {p.pid: p.utilization for p in r.processes} == {51: 60.0, 52: 10.0, 53: 0.0}
    sim.set_process_load(uuid, 51, 20)
    time.sleep(3 * PERIOD_S)
    assert own_loads(backend, uuid)[51] == 20.0  # only samples newer than the last reading
    sim.set_process_load(uuid, 51, 40)
    time.sleep(PERIOD_S)
    sim.set_process_load(uuid, 51, 80)
    time.sleep(PERIOD_S)
    assert 40.0 < own_loads(backend, uuid)[51] < 80.0  # several samples, averaged
    sim.set_process_load(uuid, 51, 0)
    sim.set_process_load(uuid, 52, 0)
    time.sleep(2 * PERIOD_S)
    own_loads(backend, uuid)  # the samples of the periods before they went idle
    time.sleep(2 * PERIOD_S)
    assert own_loads(backend, uuid) == {51: 0.0, 52: 0.0, 53: 0.0}  # NVML: NotFound


def test_a_reading_within_a_second_of_the_last_reuses_its_loads(open_sim):
    backend = open_sim("l40s-4")
    uuid = backend.inventory().gpus[0].uuid
    backend.simulator.add_process(uuid, 61)
    backend.simulator.set_process_load(uuid, 61, 30)
    assert own_loads(backend, uuid) == {61: 0.0}
    time.sleep(3 * PERIOD_S)  # new samples, but NVML may not have sampled a reader's period
    assert own_loads(backend, uuid) == {61: 0.0}


def test_no_process_utilization_where_nvml_gives_none(open_sim):
    """A MIG slice's processes, and a whole GPU's whose driver refuses the call, have no
    utilization of their own (None, not 0)."""
    backend = open_sim("workstation-a100")
    inv = backend.inventory()
    mig = next(d for d in inv.devices if d.kind == "mig")
    whole = next(d for d in inv.devices if d.kind == "gpu")
    backend.simulator.add_process(mig.uuid, 71, 100)
    backend.simulator.add_process(whole.uuid, 72, 100)
    backend.simulator.hide_symbol("nvmlDeviceGetProcessUtilization")  # FunctionNotFound
    assert own_loads(backend, mig.uuid) == {71: None}
    assert own_loads(backend, whole.uuid) == {72: None}
    assert backend.read(whole.uuid).health is Health.OK


@pytest.mark.parametrize(
    "refusal", [pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_INVALID_ARGUMENT]
)
def test_a_mig_slice_reads_its_gpus_sensors(refusal):
    """NVML documents no answer for GPU-wide sensors on a MIG handle and lists both
    NotSupported and InvalidArgument among these calls' errors: either way a slice shows
    its GPU's temperature, power and clock reasons, and stays reachable."""
    sim = SimulatedNvml(load_topology("h200-mig-balanced"), mig_sensor_error=refusal)
    with NvmlBackend(sim) as backend:
        device = backend.inventory().devices[1]
        sim.set_load(device.uuid, memory_used_mib=512)
        sim.add_process(device.uuid, 77, 256)
        sim.inject_overheat(device.uuid, temperature_c=91)
        r = backend.read(device.uuid)
        parent = backend.read(device.gpu_uuid)
    assert (r.health, r.error) == (Health.OK, None)
    assert set(r.unsupported) == {"utilization_gpu", "utilization_memory"}
    assert r.utilization_gpu is None
    assert (r.temperature_c, r.temperature_slowdown_c) == (91, SLOWDOWN_C)
    assert (r.power_mw, r.power_limit_mw, r.clock_event_reasons) == (
        parent.power_mw,
        parent.power_limit_mw,
        parent.clock_event_reasons,
    )
    assert r.power_limit_mw == 700_000 and r.clock_event_reasons
    assert (r.memory_used_mib, r.memory_total_mib) == (768, device.memory_mib)
    assert r.processes == (
        ProcessInfo(77, 256, device.gpu_instance_id, device.compute_instance_id),
    )
    assert parent.unsupported == ("utilization_gpu", "utilization_memory")
    assert parent.temperature_c == 91 and parent.memory_used_mib == 768
    assert [p.pid for p in parent.processes] == [77]


def test_a_lost_gpu_reads_as_lost_and_leaves_the_inventory(open_sim):
    backend = open_sim("dgx-h100-mig")
    inv = backend.inventory()
    lost = inv.gpus[0]
    backend.simulator.inject_gpu_lost(lost.uuid)
    readings = backend.read_all(inv)
    on_lost = {lost.uuid} | {d.uuid for d in inv.devices if d.gpu_uuid == lost.uuid}
    assert len(on_lost) == 8 and len(readings) == 64
    assert {u for u, r in readings.items() if r.health is Health.LOST} == on_lost
    assert "GPU is lost" in (readings[lost.uuid].error or "")
    assert readings[lost.uuid].utilization_gpu is None
    fresh = backend.inventory()
    assert (len(fresh.gpus), len(fresh.devices)) == (7, 49)
    assert fresh.gpu(lost.uuid) is None


def test_an_unknown_device_reads_as_unreachable(open_sim):
    backend = open_sim("dgx-h100")
    r = backend.read("MIG-00000000-0000-0000-0000-000000000000")
    assert (r.health, r.error) == (Health.UNREACHABLE, "Not Found")


def test_overheat_shows_in_the_reading(open_sim):
    backend = open_sim("dgx-h100")
    uuid = backend.inventory().gpus[5].uuid
    backend.simulator.inject_overheat(uuid, temperature_c=95)
    r = backend.read(uuid)
    assert r.temperature_c == 95
    assert r.clock_event_reasons == (
        pynvml.nvmlClocksEventReasonSwThermalSlowdown
        | pynvml.nvmlClocksEventReasonHwThermalSlowdown
    )


def test_temperature_falls_back_when_pynvml_lacks_temperature_v(open_sim, monkeypatch):
    """nvidia-ml-py 12.535, the lowest version the package allows, has no
    nvmlDeviceGetTemperatureV."""
    monkeypatch.delattr(pynvml, "nvmlDeviceGetTemperatureV", raising=False)
    backend = open_sim("dgx-h100")
    uuid = backend.inventory().gpus[0].uuid
    backend.simulator.inject_overheat(uuid, temperature_c=93)
    assert backend.read(uuid).temperature_c == 93


def test_temperature_falls_back_when_the_driver_lacks_temperature_v(open_sim):
    if not hasattr(pynvml, "nvmlDeviceGetTemperatureV"):
        pytest.skip("this nvidia-ml-py has no nvmlDeviceGetTemperatureV to call")
    backend = open_sim("dgx-h100")
    uuid = backend.inventory().gpus[0].uuid
    backend.simulator.inject_overheat(uuid, temperature_c=93)
    backend.simulator.hide_symbol("nvmlDeviceGetTemperatureV")
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        pynvml.nvmlDeviceGetTemperatureV(pynvml.nvmlDeviceGetHandleByIndex(0), 0)
    assert backend.read(uuid).temperature_c == 93


def test_read_all_covers_gpus_and_devices(open_sim):
    backend = open_sim("workstation-a100")
    readings = backend.read_all()
    inv = backend.inventory()
    assert set(readings) == {g.uuid for g in inv.gpus} | {d.uuid for d in inv.devices}
    assert len(readings) == 6
    assert all(r.health is Health.OK for r in readings.values())


def test_a_simulated_backend_leaves_pynvml_as_it_found_it():
    with open_backend("dgx-h100") as backend:
        assert pynvml.nvmlLib is not None
        assert len(backend.inventory().gpus) == 8
    assert pynvml.nvmlLib is None
    backend.close()  # closing twice is harmless
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        backend.inventory()


def test_a_followed_process_is_listed_on_its_device_until_it_exits(open_sim):
    """The broker's process probe: a kernel that keeps its MIG slice open shows on it for
    as long as the process runs, as NVML shows it."""
    backend = open_sim("h200-mig-balanced")
    device = backend.inventory().devices[1]
    assert backend.compute_pids(device.uuid) == ()
    kernel = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        backend.simulator.add_process(device.uuid, kernel.pid, 300, follow=True)
        assert backend.compute_pids(device.uuid) == (kernel.pid,)
        assert backend.read(device.uuid).processes[0].pid == kernel.pid
    finally:
        kernel.kill()
        kernel.wait()
    assert backend.compute_pids(device.uuid) == ()
    assert backend.read(device.uuid).processes == ()
    assert backend.compute_pids("MIG-no-such-device") == ()
