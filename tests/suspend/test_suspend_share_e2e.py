"""A share's kernel is never suspended (NVIDIA documents no checkpoint of MPS clients):
with ``reclaim_action = "suspend"`` an idle share on a simulated L40S lent as shares is
shut down, its lease's end saying why; the devices the fronts read (the Lab panel, the
admin page, ``status``) say the same of the GPU before anything is reclaimed."""

from __future__ import annotations

from typing import Any

import pytest
from suspend_cells import until

from jupyter_gpubroker.cli.status import idle_reclaim_lines

pytestmark = pytest.mark.slow

WHY = "a share cannot be suspended: NVIDIA documents no checkpoint of MPS clients"


@pytest.fixture
def broker_config(broker_config: dict[str, Any]) -> dict[str, Any]:
    return {**broker_config, "simulate": "l40s-4:1", "sharing": "shared", "mps_control": ""}


async def test_an_idle_share_is_shut_down_saying_why(
    gpu_kernelspec: Any, api: Any, km: Any, kernels: Any
) -> None:
    kernel_id = await kernels(kernel_name=gpu_kernelspec("gpu-share", share_gb=8))
    (lease,) = (await api("GET", "leases"))[1]["leases"]
    assert lease["share"]["mechanism"] == "watched"
    (gpu,) = (await api("GET", "devices"))[1]["gpus"]
    (device,) = gpu["devices"]
    assert device["idle_reclaim"] == {"action": "shutdown", "reason": WHY}
    assert idle_reclaim_lines([gpu]) == [f"Idle kernels on GPU 0 are shut down: {WHY}."]

    async def gone() -> dict[str, Any] | None:
        _, now = await api("GET", f"leases/{lease['id']}")
        return now if now["state"] != "active" else None

    ended = await until("the lease to end", gone)
    assert ended["state"] == "reclaimed"
    assert ended["reason"].endswith(f"; not suspended: {WHY}")
    assert ended["suspended"] is None

    async def shut_down() -> bool:
        return kernel_id not in km

    await until("the kernel to be shut down", shut_down)
