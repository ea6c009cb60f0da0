"""A share's kernel is never suspended (NVIDIA documents no checkpoint of MPS clients):
with ``reclaim_action = "suspend"`` an idle share on a simulated L40S lent as shares, or
whole or shared, is shut down, its lease's end saying why; the devices the fronts read
(the admin page, ``status``) say the same of the GPU before anything is reclaimed."""

from __future__ import annotations

from typing import Any

import pytest
from suspend_cells import until

from jupyter_gpubroker.cli.status import idle_reclaim_lines

pytestmark = pytest.mark.slow

WHY = "a share cannot be suspended: NVIDIA documents no checkpoint of MPS clients"


@pytest.fixture(params=["shared", "both"])
def broker_config(broker_config: dict[str, Any], request: Any) -> dict[str, Any]:
    """The GPU lent as shares only, or whole or shared."""
    return {**broker_config, "simulate": "l40s-4:1", "sharing": request.param, "mps_control": ""}


async def test_an_idle_share_is_shut_down_saying_why(
    gpu_kernelspec: Any, api: Any, km: Any, kernels: Any
) -> None:
    kernel_id = await kernels(kernel_name=gpu_kernelspec("gpu-share", share_gb=8))
    (lease,) = (await api("GET", "leases"))[1]["leases"]
    assert lease["share"]["mechanism"] == "watched"
    (gpu,) = (await api("GET", "devices"))[1]["gpus"]
    (device,) = gpu["devices"]
    if gpu["sharing"]["mode"] == "shared":
        assert device["idle_reclaim"] == {"action": "shutdown", "reason": WHY}
        assert idle_reclaim_lines([gpu]) == [f"Idle kernels on GPU 0 are shut down: {WHY}."]
    else:  # a whole lease's kernel here is suspended, a share's is not
        unproven = "c.GPUBroker.reclaim_action is 'suspend' (not proven)"
        assert device["idle_reclaim"] == {"action": "suspend", "reason": f"{unproven}; {WHY}"}
        assert idle_reclaim_lines([gpu]) == [
            f"Idle kernels on GPU 0 are suspended: {unproven}; {WHY}."
        ]

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
