"""MIG utilization through GPM (where the GPU has it) and hardware events, read through the
real backend over the simulated library."""

from __future__ import annotations

import time

import pytest

from jupyter_gpubroker.broker.models import DeviceEvent
from jupyter_gpubroker.nvml import NvmlBackend, SimulatedNvml, load_topology
from jupyter_gpubroker.nvml import backend as backend_module


def open_backend(topology: str, gpm: bool | None) -> tuple[SimulatedNvml, NvmlBackend]:
    sim = SimulatedNvml(load_topology(topology), gpm=gpm)
    return sim, NvmlBackend(sim).open()


def test_gpm_gives_mig_slices_their_utilization(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backend_module, "GPM_MIN_INTERVAL_S", 0.05)
    sim, backend = open_backend("dgx-h100-mig:1", gpm=True)
    try:
        busy, idle = (d.uuid for d in backend.inventory().devices[:2])
        sim.set_load(busy, utilization=70, memory_utilization=30)
        first = backend.read(busy)
        assert first.utilization_gpu is None  # one GPM sample: no interval yet
        time.sleep(0.06)
        second, quiet = backend.read(busy), backend.read(idle)
        assert second.utilization_gpu == pytest.approx(70, abs=1)
        assert second.utilization_memory == pytest.approx(30, abs=1)
        assert "utilization_gpu" not in second.unsupported
        assert backend.read(busy).utilization_gpu == second.utilization_gpu  # too soon: reused
        time.sleep(0.06)
        assert backend.read(idle).utilization_gpu == 0 and quiet.utilization_gpu is None
    finally:
        backend.close()


def test_without_gpm_a_slice_reports_no_utilization() -> None:
    sim, backend = open_backend("dgx-h100-mig:1", gpm=False)
    try:
        uuid = backend.inventory().devices[0].uuid
        sim.set_load(uuid, utilization=70)
        for _ in range(2):
            reading = backend.read(uuid)
            assert reading.utilization_gpu is None and "utilization_gpu" in reading.unsupported
    finally:
        backend.close()


@pytest.mark.parametrize(
    ("topology", "has_gpm"),
    [("dgx-h100-mig:1", True), ("h200-mig-balanced:1", True), ("workstation-a100", False)],
)
def test_hopper_presets_offer_gpm_as_real_hoppers_do(
    monkeypatch: pytest.MonkeyPatch, topology: str, has_gpm: bool
) -> None:
    """By default each simulated GPU has GPM as its model does, so a MIG slice of a
    simulated H100 or H200 reports utilization and one of an A100 does not."""
    monkeypatch.setattr(backend_module, "GPM_MIN_INTERVAL_S", 0.05)
    sim, backend = open_backend(topology, gpm=None)
    try:
        uuid = next(d.uuid for d in backend.inventory().devices if d.kind == "mig")
        sim.set_load(uuid, utilization=60)
        backend.read(uuid)
        time.sleep(0.06)
        reading = backend.read(uuid)
        if has_gpm:
            assert reading.utilization_gpu == pytest.approx(60, abs=1)
        else:
            assert reading.utilization_gpu is None and "utilization_gpu" in reading.unsupported
    finally:
        backend.close()


def test_xid_and_ecc_events_are_polled_without_waiting() -> None:
    sim, backend = open_backend("dgx-h100-mig:2", gpm=False)
    try:
        inventory = backend.inventory()
        slice_, other_gpu = inventory.devices[0].uuid, inventory.gpus[1].uuid
        assert backend.poll_events() == []  # registers on every GPU
        sim.inject_xid(slice_, 79)
        sim.inject_ecc_error(other_gpu)
        assert backend.poll_events() == [
            DeviceEvent(slice_, "xid", 79),  # named by the MIG device it hit
            DeviceEvent(other_gpu, "double_bit_ecc"),
        ]
        assert backend.poll_events() == []
    finally:
        backend.close()
