"""GPU kernels with jupyter-server's pending kernels: the start request returns at once and
the kernel waits in the broker's queue while the server stays responsive."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

ENV = "import os; print(os.environ['CUDA_VISIBLE_DEVICES'])"


@pytest.fixture
def jp_server_config(jp_server_config: dict[str, Any]) -> dict[str, Any]:
    return {**jp_server_config, "AsyncMappingKernelManager": {"use_pending_kernels": True}}


async def test_a_pending_gpu_kernel_waits_in_the_queue_then_starts(
    jp_serverapp, jp_fetch, gpu_kernelspec, api, run_in_kernel
):
    leases = []
    for _ in range(7):  # every slice taken
        _, r = await api("POST", "requests", {"profile": "1g.10gb", "holder": "batch-job"})
        leases.append(r["lease"])

    reply = await asyncio.wait_for(
        jp_fetch("api", "kernels", method="POST", body=json.dumps({"name": gpu_kernelspec()})),
        10,  # returns at once although no slice is free
    )
    kernel = json.loads(reply.body)
    assert kernel["execution_state"] == "starting"

    async def queued() -> list[dict[str, Any]]:
        _, q = await api("GET", "queue")
        return q["queue"]

    for _ in range(100):
        if entries := await queued():
            break
        await asyncio.sleep(0.1)
    assert [(e["position"], e["holder"]) for e in entries] == [(1, kernel["id"])]

    await api("DELETE", f"leases/{leases[3]['id']}")
    km = jp_serverapp.kernel_manager
    await asyncio.wait_for(km.get_kernel(kernel["id"]).ready, 60)
    device = await run_in_kernel(km.get_kernel(kernel["id"]), ENV)
    assert device == leases[3]["devices"][0]  # the slice that was freed
