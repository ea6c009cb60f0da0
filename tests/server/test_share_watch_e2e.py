"""Where nothing enforces a share (no MPS on the host, a driver before r615), the broker
watches it: a real jupyter-server on a simulated L40S, a real kernel holding 8 GB of the
GPU whose process NVML lists with 12 GB. It is warned ("over its share"), then reclaimed
after the grace, and its kernel shut down; the lease says all along what holds it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families


@pytest.fixture
def broker_config(broker_config: dict[str, Any]) -> dict[str, Any]:
    return {
        **broker_config,
        "simulate": "l40s-4:1",
        "sharing": "shared",
        "mps_control": "",  # no MPS here: only the watch holds a share
        "simulate_kernel_memory": 12 * 1024,  # NVML lists the kernel with 12 GiB, 12.8 GB
        "sample_interval": 0.25,
        "over_share_grace": 1.0,
        "lease_ttl": 60.0,
    }


async def test_a_kernel_over_its_share_is_warned_then_reclaimed(
    jp_serverapp, jp_fetch, gpu_kernelspec, api
):
    mkm = jp_serverapp.kernel_manager
    kid = await mkm.start_kernel(kernel_name=gpu_kernelspec("gpu-share", share_gb=8))
    _, leases = await api("GET", "leases")
    (lease,) = leases["leases"]
    assert lease["share"]["text"] == (
        "8.0 GB of GPU 0, not enforced: a kernel that goes over is stopped"
    )
    assert "no nvidia-cuda-mps-control on this host" in lease["share"]["why"]
    assert lease["share"]["env"] == {}

    async def state() -> dict[str, Any]:
        return (await api("GET", f"leases/{lease['id']}"))[1]

    deadline = asyncio.get_running_loop().time() + 20
    seen = await state()
    while seen["reclaim_cause"] != "over_share" and seen["state"] == "active":
        assert asyncio.get_running_loop().time() < deadline, seen
        await asyncio.sleep(0.1)
        seen = await state()
    assert seen["share"]["used_mib"] == 12 * 1024
    scraped = (await jp_fetch("metrics")).body.decode()
    shares = {
        (x.name, x.labels["lease_id"], x.labels["gpu"]): x.value
        for family in text_string_to_metric_families(scraped)
        for x in family.samples
        if x.name.startswith("gpubroker_share_")
    }
    assert shares == {
        ("gpubroker_share_memory_bytes", lease["id"], "0"): lease["share"]["memory_mib"] * 2**20,
        ("gpubroker_share_memory_used_bytes", lease["id"], "0"): 12 * 2**30,
        # its process has no load: NVML has no sample of it, so it used none of the GPU
        ("gpubroker_share_utilization_percent", lease["id"], "0"): 0.0,
    }
    while seen["state"] == "active":
        assert asyncio.get_running_loop().time() < deadline, seen
        await asyncio.sleep(0.1)
        seen = await state()
    assert seen["state"] == "reclaimed"
    # what it did, alone: the reclaim action (suspend) is for idle kernels, not this
    assert seen["reason"] == "uses 12.8 GB of GPU 0, over its share of 8.0 GB"
    while kid in mkm:
        assert asyncio.get_running_loop().time() < deadline, "the kernel was not shut down"
        await asyncio.sleep(0.1)
