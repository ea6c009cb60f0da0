"""The simulator against what real GPUs and NVML's header say (issue 28, item 5).

Profile memory: ``nvidia-smi mig -lgip`` on real GPUs prints each profile's memory in
GiB to two decimals; the captures used (public blog posts and notes) are an H100 80GB
HBM3 and an H100 PCIe (both 9.75, 19.62, 19.62, 39.50, 39.50, 79.25 GiB), two A100 80GB
(9.50, 19.50, 19.50, 39.25, 39.25, 79.00) and an A100 40GB (4.75, 9.62, 9.62, 19.50,
19.50, 39.25). No H200 capture was found: its values are not checked here.
"""

from __future__ import annotations

import ctypes
import time

import pynvml
import pytest

from jupyter_gpubroker.nvml import MigPartitioner
from jupyter_gpubroker.nvml.backend import _gpm_metrics
from jupyter_gpubroker.nvml.presets import Topology, gpu_spec
from jupyter_gpubroker.wire import text
from jupyter_gpubroker.wire.profiles import CATALOG

LGIP_GIB = {
    "H100-80GB": {
        "1g.10gb": "9.75",
        "1g.10gb+me": "9.75",
        "1g.20gb": "19.62",
        "2g.20gb": "19.62",
        "3g.40gb": "39.50",
        "4g.40gb": "39.50",
        "7g.80gb": "79.25",
    },
    "A100-80GB": {
        "1g.10gb": "9.50",
        "1g.10gb+me": "9.50",
        "1g.20gb": "19.50",
        "2g.20gb": "19.50",
        "3g.40gb": "39.25",
        "4g.40gb": "39.25",
        "7g.80gb": "79.00",
    },
    "A100-40GB": {
        "1g.5gb": "4.75",
        "1g.5gb+me": "4.75",
        "1g.10gb": "9.62",
        "2g.10gb": "9.62",
        "3g.20gb": "19.50",
        "4g.20gb": "19.50",
        "7g.40gb": "39.25",
    },
}
"""Each profile's memory as ``nvidia-smi mig -lgip`` prints it on a real GPU."""


def _lgip(mib: int) -> str:
    """MiB as nvidia-smi's -lgip column shows it: GiB, two decimals, rounded down."""
    return f"{mib * 100 // 1024 / 100:.2f}"


@pytest.mark.parametrize("model", list(LGIP_GIB))
def test_profile_memory_is_what_nvidia_smi_shows(simulate, model):
    simulate(Topology("one", (gpu_spec(model, {}),)))
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    shown = {}
    for constant in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
        try:
            info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, constant, 1)
        except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_InvalidArgument):
            continue
        shown[info.id] = _lgip(info.memorySizeMB)
    by_id = {p.profile_id: p.name for p in CATALOG[model].profiles}
    assert {by_id[i]: gib for i, gib in shown.items()} == LGIP_GIB[model]


def test_h100_slices_in_the_broker_read_as_the_gpu_has_them(open_sim):
    backend = open_sim(Topology("h100", (gpu_spec("H100-80GB", {"3g.40gb": 1, "4g.40gb": 1}),)))
    got = {
        d.profile: (d.memory_mib, text.memory(d.memory_mib)) for d in backend.inventory().devices
    }
    assert got == {"3g.40gb": (40448, "42.4 GB"), "4g.40gb": (40448, "42.4 GB")}
    whole = open_sim(Topology("h100-7g", (gpu_spec("H100-80GB", {"7g.80gb": 1}),)))
    (device,) = whole.inventory().devices
    assert (device.profile, device.memory_mib, text.memory(device.memory_mib)) == (
        "7g.80gb",
        81152,
        "85.0 GB",
    )


def _h100_with_slices(simulate) -> object:  # type: ignore[no-untyped-def]
    simulate(Topology("h100", (gpu_spec("H100-80GB", {"3g.40gb": 1, "2g.20gb": 1}),)))
    return pynvml.nvmlDeviceGetHandleByIndex(0)


def test_index_of_a_mig_handle_is_its_mig_index(simulate):
    """nvml.h, nvmlDeviceGetIndex: "When used with MIG device handles this API returns
    indices that can be passed to nvmlDeviceGetMigDeviceHandleByIndex"."""
    parent = _h100_with_slices(simulate)
    for i in range(2):
        handle = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, i)
        index = pynvml.nvmlDeviceGetIndex(handle)
        again = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, index)
        assert pynvml.nvmlDeviceGetUUID(again) == pynvml.nvmlDeviceGetUUID(handle)
    assert pynvml.nvmlDeviceGetIndex(parent) == 0


def test_backend_gives_slices_their_gpus_index(open_sim):
    backend = open_sim(
        Topology("two", (gpu_spec("H100-80GB"), gpu_spec("H100-80GB", {"3g.40gb": 2})))
    )
    slices = [d for d in backend.inventory().devices if d.kind == "mig"]
    assert [d.gpu_index for d in slices] == [1, 1]


def test_gpm_samples_mig_handles_and_gpus(simulate):
    """nvml.h, nvmlGpmSampleGet: "This API supports the device handle and MIG device
    handle"; a MIG device's sample is its GPU instance's, as nvmlGpmMigSampleGet's."""
    sim = simulate(Topology("two", (gpu_spec("H100-80GB", {"3g.40gb": 1}), gpu_spec("H100-80GB"))))
    parent = pynvml.nvmlDeviceGetHandleByIndex(0)
    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, 0)
    whole = pynvml.nvmlDeviceGetHandleByIndex(1)
    sim.set_load(str(pynvml.nvmlDeviceGetUUID(mig)), utilization=60, memory_utilization=20)
    sim.set_load(str(pynvml.nvmlDeviceGetUUID(whole)), utilization=30)
    for handle, expected in ((mig, 60.0), (whole, 30.0)):
        first, second = pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()
        try:
            pynvml.nvmlGpmSampleGet(handle, first)
            time.sleep(0.05)
            pynvml.nvmlGpmSampleGet(handle, second)
            graphics, _ = _gpm_metrics(first, second)
            assert graphics == pytest.approx(expected, abs=1)
        finally:
            pynvml.nvmlGpmSampleFree(first)
            pynvml.nvmlGpmSampleFree(second)


def _call(symbol: str, *args: object) -> int:
    return int(pynvml._nvmlGetFunctionPointer(symbol)(*args))


def test_versioned_profile_info_refuses_a_struct_without_its_version(simulate):
    """nvml.h: "The caller must set the ... version field ... prior to calling this
    function". (The installed pynvml sets it, in the v2 structs' constructors.)"""
    parent = _h100_with_slices(simulate)
    constant = pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE
    info = pynvml.c_nvmlGpuInstanceProfileInfo_v2_t()
    for version in (0, pynvml.nvmlComputeInstanceProfileInfo_v2):
        info.version = version
        got = _call("nvmlDeviceGetGpuInstanceProfileInfoV", parent, constant, ctypes.byref(info))
        assert got == pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(parent, constant)  # the V call
    assert (info.sliceCount, info.memorySizeMB, info.name) == (3, 40448, "MIG 3g.40gb")

    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, 0)
    gi = pynvml.nvmlDeviceGetGpuInstanceById(parent, pynvml.nvmlDeviceGetGpuInstanceId(mig))
    one = pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE
    shared = pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
    ci = pynvml.c_nvmlComputeInstanceProfileInfo_v2_t()
    ci.version = 0
    got = _call("nvmlGpuInstanceGetComputeInstanceProfileInfoV", gi, one, shared, ctypes.byref(ci))
    assert got == pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    assert pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, one, shared).sliceCount == 1


def test_backend_and_partitioner_use_the_v1_profile_calls(open_sim):
    backend = open_sim(Topology("h100", (gpu_spec("H100-80GB", {}),)))
    made = MigPartitioner(backend).create(backend.inventory().gpus[0].uuid, "3g.40gb", 0)
    assert (made.profile, made.memory_mib) == ("3g.40gb", 40448)


def test_a_4g_instance_offers_1_2_or_4_slice_compute_instances(simulate):
    """MIG user guide and go-nvml's H100/H200/A100 mocks: 1c, 2c and 4g on a 4g GPU
    instance; no 3-slice compute instance fits its placements."""
    simulate(Topology("h100", (gpu_spec("H100-80GB", {"4g.40gb": 1}),)))
    parent = pynvml.nvmlDeviceGetHandleByIndex(0)
    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, 0)
    gi = pynvml.nvmlDeviceGetGpuInstanceById(parent, pynvml.nvmlDeviceGetGpuInstanceId(mig))
    shared = pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
    offered = {}
    for slices in (1, 2, 3, 4, 7):
        constant = getattr(pynvml, f"NVML_COMPUTE_INSTANCE_PROFILE_{slices}_SLICE")
        try:
            info = pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, constant, shared, 1)
        except pynvml.NVMLError_NotSupported:
            continue
        offered[slices] = info.instanceCount
    assert offered == {1: 4, 2: 2, 4: 1}
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlGpuInstanceCreateComputeInstance(
            gi, pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE
        )
