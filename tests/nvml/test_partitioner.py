"""Dynamic MIG through the partitioner, on the simulated library."""

from __future__ import annotations

import ctypes

import pynvml
import pytest

from jupyter_gpubroker.nvml import MigPartitioner
from jupyter_gpubroker.wire.errors import PartitionFailed


def test_create_and_destroy_round_trip(open_sim, empty_h100):
    backend = open_sim(empty_h100)
    partitioner = MigPartitioner(backend)
    gpu = backend.inventory().gpus[0]
    made = partitioner.create(gpu.uuid, "3g.40gb", 4)
    assert (made.kind, made.profile, made.start, made.gpu_uuid) == ("mig", "3g.40gb", 4, gpu.uuid)
    assert (made.memory_mib, made.compute_slices, made.compute_instance_id) == (40448, 3, 0)
    other = partitioner.create(gpu.uuid, "2g.20gb", 0)
    assert backend.inventory().device(made.uuid) == made
    partitioner.destroy(made.uuid)
    inv = backend.inventory()
    assert inv.device(made.uuid) is None
    assert inv.device(other.uuid) == other
    again = partitioner.create(gpu.uuid, "3g.40gb", 4)
    assert again.uuid != made.uuid and again.start == 4


@pytest.mark.parametrize(
    "gpu_index, profile, start, message",
    [
        (0, "3g.40gb", 2, "3g.40gb may start only at memory slice 0, 4"),
        (0, "1g.5gb", 0, "H100-80GB GPUs have no MIG profile '1g.5gb'"),
        (1, "1g.10gb", 0, "MIG is not enabled on that GPU"),
    ],
)
def test_create_refusals_say_why(open_sim, empty_h100, gpu_index, profile, start, message):
    backend = open_sim(empty_h100)
    gpu = backend.inventory().gpus[gpu_index]
    with pytest.raises(PartitionFailed, match=message) as err:
        MigPartitioner(backend).create(gpu.uuid, profile, start)
    assert err.value.code == "partition_failed"
    assert [d.kind for d in backend.inventory().devices] == ["gpu"]  # nothing was made


def test_a_full_gpu_has_no_room(open_sim):
    backend = open_sim("dgx-h100-mig")
    gpu = backend.inventory().gpus[0]
    with pytest.raises(PartitionFailed, match="there is no room"):
        MigPartitioner(backend).create(gpu.uuid, "1g.10gb", 0)
    with pytest.raises(PartitionFailed, match="NVML knows no such device"):
        MigPartitioner(backend).create("GPU-00000000-0000-0000-0000-000000000000", "1g.10gb", 0)


def test_a_failed_compute_instance_rolls_back_its_gpu_instance(open_sim, empty_h100):
    backend = open_sim(empty_h100)
    gpu = backend.inventory().gpus[0]
    backend.simulator.hide_symbol("nvmlGpuInstanceCreateComputeInstance")
    with pytest.raises(PartitionFailed, match="NVML refused \\(NVML: Function Not Found\\)"):
        MigPartitioner(backend).create(gpu.uuid, "2g.20gb", 2)
    handle = pynvml.nvmlDeviceGetHandleByUUID(gpu.uuid)
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetGpuInstanceById(handle, 4)  # the 2g instance at slice 2


def test_destroying_a_slice_in_use_fails_and_keeps_it(open_sim):
    backend = open_sim("h200-mig-balanced")
    partitioner = MigPartitioner(backend)
    device = backend.inventory().devices[0]
    backend.simulator.add_process(device.uuid, 999, 4096)
    with pytest.raises(PartitionFailed, match="it is in use"):
        partitioner.destroy(device.uuid)
    assert backend.inventory().device(device.uuid) == device
    backend.simulator.remove_process(device.uuid, 999)
    partitioner.destroy(device.uuid)
    assert backend.inventory().device(device.uuid) is None


def test_destroy_needs_a_mig_device(open_sim):
    backend = open_sim("workstation-a100")
    whole = backend.inventory().gpus[1]
    with pytest.raises(PartitionFailed, match="it is a whole GPU, not a MIG device"):
        MigPartitioner(backend).destroy(whole.uuid)
    with pytest.raises(PartitionFailed, match="NVML knows no such device"):
        MigPartitioner(backend).destroy("MIG-00000000-0000-0000-0000-000000000000")


def test_destroy_keeps_a_gpu_instance_other_compute_instances_use(open_sim, empty_h100):
    backend = open_sim(empty_h100)
    gpu = backend.inventory().gpus[0]
    handle = pynvml.nvmlDeviceGetHandleByUUID(gpu.uuid)
    placement = pynvml.c_nvmlGpuInstancePlacement_t(0, 2)
    gi = pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(handle, 14, ctypes.byref(placement))
    for _ in range(2):
        pynvml.nvmlGpuInstanceCreateComputeInstance(
            gi, pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE
        )
    first, second = backend.gpu_devices(gpu.uuid)
    assert (first.profile, second.profile) == ("2g.20gb", "2g.20gb")
    MigPartitioner(backend).destroy(first.uuid)
    assert backend.gpu_devices(gpu.uuid) == (second,)
    assert pynvml.nvmlGpuInstanceGetInfo(gi).profileId == 14
