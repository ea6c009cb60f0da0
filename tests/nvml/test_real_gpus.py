"""What a real machine does that a friendly simulator would not: NVML's privileges, a
GPU lost before it has a handle, a GPU name no catalog knows."""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import replace

import pynvml
import pytest

from jupyter_gpubroker.broker.core import Broker
from jupyter_gpubroker.broker.models import DeviceEvent, Health
from jupyter_gpubroker.broker.store import Store
from jupyter_gpubroker.nvml import (
    MigPartitioner,
    NvmlBackend,
    SimulatedNvml,
    Topology,
    TopologyError,
    load_topology,
)
from jupyter_gpubroker.nvml.backend import UNPRIVILEGED
from jupyter_gpubroker.nvml.presets import GpuSpec, gpu_spec
from jupyter_gpubroker.nvml.simulated import PRIVILEGE_ENV
from jupyter_gpubroker.wire.errors import PartitionFailed
from jupyter_gpubroker.wire.sizes import Size

MIXED = "workstation-a100"
"""GPU 0 cut into 3g.20gb + 2g.10gb + 2x 1g.5gb, GPU 1 whole."""


def as_caller(spec: str | Topology, privilege: str) -> Topology:
    topology = load_topology(spec) if isinstance(spec, str) else spec
    return replace(topology, privilege=privilege)


# ------------------------------------------------------------------ privileges


@pytest.mark.parametrize("privilege", ["monitor", "none"])
def test_an_unprivileged_broker_offers_every_mig_device_with_its_profile(privilege, caplog):
    """The broker embedded in a user's Jupyter server is not root: NVML refuses it the
    GPU-instance lookups, yet it offers every slice with the profile root sees."""
    with NvmlBackend(SimulatedNvml(as_caller(MIXED, "root"))) as backend:
        as_root = backend.inventory()
    caplog.set_level(logging.WARNING)
    with NvmlBackend(SimulatedNvml(as_caller(MIXED, privilege))) as backend:
        seen = backend.inventory()
        backend.inventory()
        parent = backend.read(seen.gpus[0].uuid)
        slices = [backend.read(d.uuid) for d in seen.devices]
    placed = {"monitor": [d.start for d in as_root.devices], "none": [None] * 5}[privilege]
    assert [d.start for d in seen.devices] == placed
    assert [replace(d, start=None) for d in seen.devices] == [
        replace(d, start=None) for d in as_root.devices
    ]
    assert Counter(d.profile for d in seen.devices) == {
        "3g.20gb": 1,
        "2g.10gb": 1,
        "1g.5gb": 2,
        None: 1,
    }
    assert seen.gpus == as_root.gpus
    said = [r.message for r in caplog.records if r.message == UNPRIVILEGED]
    assert len(said) == (privilege == "none")
    assert all(r.health is Health.OK for r in [parent, *slices])
    if privilege == "none":  # the GPU's totals are the privileged callers'
        assert {"memory_used_mib", "processes"} <= set(parent.unsupported)
        assert seen.devices[0].label == "GPU 0 / 3g.20gb"


@pytest.mark.parametrize(
    "privilege, lookup, change",
    [
        ("root", None, None),
        ("monitor", None, pynvml.NVMLError_NoPermission),
        ("none", pynvml.NVMLError_NoPermission, pynvml.NVMLError_NoPermission),
    ],
)
def test_the_simulator_keeps_nvmls_privilege_rules(simulate, privilege, lookup, change):
    sim = simulate(
        Topology("a100-3g", (gpu_spec("A100-40GB", {"3g.20gb": 1}),), privilege=privilege)
    )
    gpu = pynvml.nvmlDeviceGetHandleByIndex(0)
    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 0)
    gi_id = pynvml.nvmlDeviceGetGpuInstanceId(mig)
    attrs = pynvml.nvmlDeviceGetAttributes(mig)  # anyone may read a slice's attributes
    assert (attrs.gpuInstanceSliceCount, attrs.memorySizeMB) == (3, 19968)
    calls = [
        lambda: pynvml.nvmlDeviceGetGpuInstanceById(gpu, gi_id),
        lambda: pynvml.nvmlDeviceGetMemoryInfo(gpu),
        lambda: pynvml.nvmlDeviceGetComputeRunningProcesses(gpu),
    ]
    for call in calls:
        if lookup is None:
            call()
        else:
            with pytest.raises(lookup):
                call()
    if change is None:
        pynvml.nvmlDeviceCreateGpuInstance(gpu, 19)  # a 1g.5gb next to the 3g.20gb
    else:
        with pytest.raises(change):
            pynvml.nvmlDeviceCreateGpuInstance(gpu, 19)
    assert sim.privilege == privilege


def test_an_unprivileged_partitioner_says_what_it_needs():
    with NvmlBackend(SimulatedNvml(as_caller(MIXED, "monitor"))) as backend:
        gpu = backend.inventory().gpus[0].uuid
        with pytest.raises(PartitionFailed, match="needs root or the mig-config capability"):
            MigPartitioner(backend).create(gpu, "1g.5gb", 6)


def test_without_privilege_an_xid_on_one_slice_is_not_reported():
    """NVML reports only whole-device events to a caller without MIG privileges."""
    sim = SimulatedNvml(as_caller("dgx-h100-mig:1", "none"))
    with NvmlBackend(sim) as backend:
        inventory = backend.inventory()
        assert backend.poll_events() == []
        sim.inject_xid(inventory.devices[0].uuid, 79)
        sim.inject_xid(inventory.gpus[0].uuid, 48)
        assert backend.poll_events() == [DeviceEvent(inventory.gpus[0].uuid, "xid", 48)]


def test_the_simulated_privilege_defaults_to_the_process_own(monkeypatch):
    monkeypatch.delenv(PRIVILEGE_ENV, raising=False)
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    assert SimulatedNvml(load_topology("dgx-h100:1")).privilege == "none"
    monkeypatch.setattr("os.geteuid", lambda: 0)
    assert SimulatedNvml(load_topology("dgx-h100:1")).privilege == "root"
    monkeypatch.setenv(PRIVILEGE_ENV, "monitor")
    assert SimulatedNvml(load_topology("dgx-h100:1")).privilege == "monitor"
    monkeypatch.setenv(PRIVILEGE_ENV, "admin")
    with pytest.raises(TopologyError, match="one of root, monitor, none, not 'admin'"):
        SimulatedNvml(load_topology("dgx-h100:1"))


# ------------------------------------------------------------------ a GPU lost early


def test_a_gpu_lost_at_handle_time_leaves_the_others_in_service(caplog):
    """nvmlDeviceGetHandleByIndex answers GpuIsLost for a lost GPU, and lookups by UUID
    may fail while any GPU is lost: only that GPU leaves service."""
    sim = SimulatedNvml(load_topology("dgx-h100-mig:3"))
    with NvmlBackend(sim) as backend:
        before = backend.inventory()
        lost = before.gpus[1].uuid
        sim.inject_gpu_lost(lost)
        with pytest.raises(pynvml.NVMLError_GpuIsLost):
            pynvml.nvmlDeviceGetHandleByIndex(1)
        inventory = backend.inventory()
        assert [g.index for g in inventory.gpus] == [0, 2]
        assert len(inventory.devices) == 14
        readings = backend.read_all(before)
        assert {u for u, r in readings.items() if r.health is Health.LOST} == {lost} | {
            d.uuid for d in before.devices if d.gpu_uuid == lost
        }
        assert sum(r.health is Health.OK for r in readings.values()) == 16
        assert backend.compute_pids(inventory.devices[0].uuid) == ()
        assert backend.poll_events() == []  # registers on the GPUs it can reach
        sim.inject_xid(inventory.devices[-1].uuid, 79)
        assert backend.poll_events() == [DeviceEvent(inventory.devices[-1].uuid, "xid", 79)]
    assert "GPU 1 is lost" in caplog.text


# ------------------------------------------------------------------ an unknown GPU name


H200_HBM3E = replace(
    gpu_spec("H200-141GB", {"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1}),
    name="NVIDIA H200 141GB HBM3e",
    pci_device_id=0x233310DE,
)
"""go-nvml's H200 mock, a name the catalog does not know."""


def test_a_mig_gpu_no_catalog_knows_is_offered_with_profiles_read_from_nvml():
    topology = Topology("h200-hbm3e", (H200_HBM3E, GpuSpec("H200-141GB")), privilege="root")
    with NvmlBackend(SimulatedNvml(topology)) as backend:
        inventory = backend.inventory()
        unknown = inventory.gpus[0]
        assert (unknown.name, unknown.model, unknown.mig_enabled) == (
            "NVIDIA H200 141GB HBM3e",
            None,
            True,
        )
        assert [(d.profile, d.memory_mib, d.compute_slices) for d in inventory.devices] == [
            ("3g.71gb", 71424, 3),
            ("2g.35gb", 35584, 2),
            ("1g.18gb", 17920, 1),
            ("1g.18gb", 17920, 1),
            (None, 143771, 7),
        ]
        broker = Broker(Store(), inventory)
        r = broker.submit("ann", Size(profile="3g.71gb"))
        assert r.lease_id is not None
        [device] = broker.lease(r.lease_id).devices
        assert inventory.device(device).profile == "3g.71gb"
