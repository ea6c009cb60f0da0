"""A kernel on a MIG slice is not suspended (NVIDIA's checkpoint does not support MIG): it
gets the fallback, with the reason in its lease's end."""

from __future__ import annotations

from typing import Any

import pytest
from suspend_cells import until

pytestmark = pytest.mark.slow


@pytest.fixture
def broker_config(broker_config: dict[str, Any]) -> dict[str, Any]:
    return {**broker_config, "simulate": "dgx-h100-mig:1"}


async def test_a_mig_slice_is_shut_down_saying_why(
    gpu_kernelspec: Any, api: Any, km: Any, kernels: Any
) -> None:
    kernel_id = await kernels(kernel_name=gpu_kernelspec())
    _, leases = await api("GET", "leases")
    (lease,) = leases["leases"]
    assert lease["profile"] == "1g.10gb"

    async def gone() -> dict[str, Any] | None:
        _, now = await api("GET", f"leases/{lease['id']}")
        return now if now["state"] != "active" else None

    ended = await until("the lease to end", gone)
    assert ended["reason"].endswith(
        "not suspended: a MIG slice cannot be suspended: NVIDIA's checkpoint does not support MIG"
    )

    async def shut_down() -> bool:
        return kernel_id not in km

    await until("the kernel to be shut down", shut_down)
