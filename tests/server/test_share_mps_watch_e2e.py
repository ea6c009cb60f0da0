"""MPS holds only its clients, so the broker watches MPS shares through NVML too: a real
jupyter-server on a simulated L40S with the simulated MPS daemons the broker runs (real
processes), two real kernels each holding 8 GB of the GPU under MPS. One kernel's
process drops the MPS pipe directory from its environment before CUDA starts: no daemon
answers it, so CUDA runs it without MPS, and NVML lists it in its compute query but not
in its MPS query. That kernel is warned, then reclaimed and shut down; the MPS client
beside it runs on untouched."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest


@pytest.fixture
def broker_config(broker_config: dict[str, Any], mps_dir: str) -> dict[str, Any]:
    return {
        **broker_config,
        "simulate": "l40s-4:1",
        "sharing": "shared",
        "mps_dir": mps_dir,
        "simulate_kernel_memory": 4 * 1024,  # within the share: only leaving MPS is at fault
        "sample_interval": 0.25,
        "over_share_grace": 1.0,
        "lease_ttl": 60.0,
    }


def leaves_mps(jp_kernel_dir: Any, name: str) -> str:
    """A copy of kernelspec ``name`` whose kernel unsets ``CUDA_MPS_PIPE_DIRECTORY``
    before it starts, as a user's wrapper script might."""
    spec = json.loads((jp_kernel_dir / name / "kernel.json").read_text())
    spec["argv"] = ["env", "-u", "CUDA_MPS_PIPE_DIRECTORY", *spec["argv"]]
    (jp_kernel_dir / f"{name}-nompc").mkdir()
    (jp_kernel_dir / f"{name}-nompc" / "kernel.json").write_text(json.dumps(spec))
    return f"{name}-nompc"


async def test_a_kernel_outside_mps_is_warned_then_reclaimed_its_neighbour_runs_on(
    jp_serverapp, jp_kernel_dir, gpu_kernelspec, api
):
    mkm = jp_serverapp.kernel_manager
    name = gpu_kernelspec("gpu-share", share_gb=8)
    client = await mkm.start_kernel(kernel_name=name)
    (first,) = (await api("GET", "leases"))[1]["leases"]
    escaped = await mkm.start_kernel(kernel_name=leaves_mps(jp_kernel_dir, name))
    (second,) = [x for x in (await api("GET", "leases"))[1]["leases"] if x["id"] != first["id"]]
    assert {first["share"]["mechanism"], second["share"]["mechanism"]} == {"mps"}

    async def state(lease: dict[str, Any]) -> dict[str, Any]:
        return (await api("GET", f"leases/{lease['id']}"))[1]

    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30
    seen = await state(second)
    while seen["state"] == "active":
        assert loop.time() < deadline, seen
        await asyncio.sleep(0.1)
        seen = await state(second)
    assert seen["state"] == "reclaimed"
    assert seen["reason"] == "uses GPU 0 outside MPS, so nothing holds it to its share of 8.0 GB"
    while escaped in mkm:
        assert loop.time() < deadline, "the kernel outside MPS was not shut down"
        await asyncio.sleep(0.1)
    # the MPS client within its share is neither warned nor touched
    kept = await state(first)
    assert (kept["state"], kept["reclaim_cause"]) == ("active", None)
    assert kept["share"]["used_mib"] == 4 * 1024
    assert client in mkm
