"""A real jupyter-server with the extension on one simulated whole H100, reclaim action
``suspend`` with seconds-long timeouts, and real GPU kernels (tests/conftest.py)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from suspend_cells import use_gpu

sys.path.append(str(Path(__file__).resolve().parents[1] / "server"))  # openapi_check

Kernel = tuple[str, int, str, str]
"""A suspendable kernel: (kernel id, its pid, its lease, its GPU)."""


@pytest.fixture(autouse=True)
def _listening(http_server_client: Any) -> None:
    """Serve the app on its port: provisioners reach the broker's API over HTTP."""


@pytest.fixture
def broker_config(broker_config: dict[str, Any]) -> dict[str, Any]:
    return {
        **broker_config,
        "simulate": "dgx-h100:1",
        "reclaim_action": "suspend",
        "sample_interval": 0.25,
        "idle_timeout": 4.0,  # longer than a kernel's start and first cell on a busy machine
        "grace": 1.0,
        "stalled_timeout": 0.0,
        "lease_ttl": 60.0,  # the other leases are not renewed: they must not expire meanwhile
    }


@pytest.fixture
def km(jp_serverapp: Any) -> Any:
    """The server's kernel manager."""
    return jp_serverapp.kernel_manager


@pytest.fixture
def simulator(jp_serverapp: Any) -> Any:
    """The simulated machine under the server's broker (NVML's view of its GPUs)."""
    return jp_serverapp.web_app.settings["gpubroker"].backend.simulator


@pytest.fixture
def kernels(
    km: Any, jp_asyncio_loop: asyncio.AbstractEventLoop
) -> Iterator[Callable[..., Awaitable[str]]]:
    """Start a kernel as ``km.start_kernel`` does, returning its id; each one still running
    at the test's end is shut down then."""
    started: list[str] = []

    async def start(**kwargs: Any) -> str:
        kernel_id: str = await km.start_kernel(**kwargs)
        started.append(kernel_id)
        return kernel_id

    yield start
    for kernel_id in started:
        if kernel_id in km:
            jp_asyncio_loop.run_until_complete(km.shutdown_kernel(kernel_id))


@pytest.fixture
def suspendables(
    jp_serverapp: Any, gpu_kernelspec: Any, api: Any, kernels: Any
) -> Callable[[], Awaitable[Kernel]]:
    """Start a GPU kernel holding ``KERNEL_MIB`` on its GPU (as CUDA in it would), with a
    variable set: (kernel id, its pid, its lease, its GPU). Shut down at the test's end."""

    async def start() -> Kernel:
        kernel_id = await kernels(kernel_name=gpu_kernelspec("gpu-1", gpus=1))
        return await use_gpu(jp_serverapp, api, kernel_id)  # type: ignore[no-any-return]

    return start


@pytest.fixture
def suspendable(
    suspendables: Callable[[], Awaitable[Kernel]], jp_asyncio_loop: asyncio.AbstractEventLoop
) -> Kernel:
    """A suspendable kernel started for the test (``suspendables``)."""
    return jp_asyncio_loop.run_until_complete(suspendables())
