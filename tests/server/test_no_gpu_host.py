"""A host without GPUs (no NVIDIA driver, nothing configured: a laptop, a hub image
shared by CPU and GPU servers): the server stays quiet and says so plainly everywhere."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest

from jupyter_gpubroker.kernel import NO_GPUS_ENV

NO_GPUS = "this server has no GPUs: its host has no NVIDIA driver"


@pytest.fixture
def host(tmp_path: Path) -> Path:
    """A fake host's / (``host_root``): no /proc/driver/nvidia, no /dev/nvidia*."""
    (tmp_path / "host" / "dev").mkdir(parents=True)
    (tmp_path / "host" / "dev" / "null").touch()
    return tmp_path / "host"


@pytest.fixture
def jp_server_config(
    jp_server_config: dict[str, Any],
    host: Path,
    extension_log: list[logging.LogRecord],
    gpu_kernelspec: Any,
) -> dict[str, Any]:
    gpu_kernelspec()  # installed, as in a hub image shared by CPU and GPU servers
    return {**jp_server_config, "GPUBrokerExtension": {"host_root": str(host)}}


@pytest.fixture
def broker_config(broker_config: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in broker_config.items() if k != "simulate"}


async def test_a_host_without_gpus_says_so_once_as_info(
    extension_log: list[logging.LogRecord],
    jp_serverapp: Any,
    api: Any,
    broker_config: dict[str, Any],
) -> None:
    (record,) = extension_log
    assert (record.levelname, record.getMessage()) == (
        "INFO",
        f"GPU broker: {NO_GPUS}; to try it on simulated GPUs, set "
        "c.GPUBroker.simulate = 'dgx-h100-mig' (or $GPUBROKER_SIMULATE)",
    )
    assert not Path(broker_config["state_file"]).exists()  # nothing written either
    status, reply = await api("GET", "overview")  # what the Lab panel shows
    assert (status, reply["message"]) == (503, NO_GPUS)


async def test_a_host_without_gpus_offers_no_gpu_kernelspec(jp_fetch: Any) -> None:
    specs = json.loads((await jp_fetch("api", "kernelspecs")).body)["kernelspecs"]
    assert "gpu-1g" not in specs and "python3" in specs


async def test_gpu_in_a_kernel_of_a_host_without_gpus_says_so(
    jp_serverapp: Any, run_in_kernel: Any
) -> None:
    km = jp_serverapp.kernel_manager
    kernel_id = await km.start_kernel(kernel_name="python3")
    try:
        out = await run_in_kernel(km.get_kernel(kernel_id), "%load_ext jupyter_gpubroker\n%gpu")
    finally:
        await km.shutdown_kernel(kernel_id, now=True)
    assert out == f"%gpu status: {NO_GPUS}"


async def test_stopping_forgets_the_hosts_sentence(jp_serverapp: Any, extension: Any) -> None:
    assert os.environ[NO_GPUS_ENV] == NO_GPUS
    await extension.stop_extension()
    assert NO_GPUS_ENV not in os.environ
    assert "gpu-1g" not in jp_serverapp.kernel_spec_manager.allowed_kernelspecs
