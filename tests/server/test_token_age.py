"""Kernel tokens end once their kernel is gone. A central broker (a real ``jupyter
server`` with the extension, as the hub service is to its users' servers) and a user's
server in remote mode (another real one) with a GPU kernel: while the kernel runs, its
token outlives its maximum age many times over, renewed by the server; once the user's
server is killed with ``SIGKILL`` (no shutdown code revokes anything), the central
broker refuses the token within that age, however often it is used meanwhile (its own
calls renew nothing, and it cannot renew itself)."""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from live_server import TOKEN, LiveServer

from jupyter_gpubroker.api import API_PREFIX, TOKEN_HEADER
from jupyter_gpubroker.kernelspec import spec_for
from jupyter_gpubroker.wire.sizes import Size

pytestmark = pytest.mark.slow  # two servers and a kernel, seconds-long ages
MAX_AGE = 4.0
TICK = 0.5


@pytest.fixture
def central(tmp_path: Path) -> Iterator[LiveServer]:
    home = tmp_path / "central"
    home.mkdir()
    server = LiveServer(
        home,
        home / "state.sqlite",
        simulate="dgx-h100:1",
        kernel_token_max_age=MAX_AGE,
        tick_interval=TICK,
        lease_ttl=30.0,
    )
    server.start()
    yield server
    server.stop()


@pytest.fixture
def users_server(tmp_path: Path, central: LiveServer) -> Iterator[LiveServer]:
    """A user's server in remote mode with a one-GPU kernelspec, its user the central
    broker's owner (its token)."""
    home = tmp_path / "user"
    spec_dir = home / "data" / "kernels" / "gpu-1"
    spec_dir.mkdir(parents=True)
    _, spec = spec_for(Size(gpus=1))
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    server = LiveServer(
        home,
        home / "unused.sqlite",
        args=(
            f"--GPUBrokerExtension.broker_url={central.base}",
            f"--GPUBrokerExtension.jupyter_token={TOKEN}",
        ),
    )
    server.start()
    yield server
    server.kill()


def kernel_environ(kernel_id: str) -> tuple[int, dict[str, str]]:
    """The kernel's process and its environment, as /proc shows them."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            raw = (entry / "environ").read_bytes().decode(errors="replace")
            env = dict(v.split("=", 1) for v in raw.split("\0") if "=" in v)
            if env.get("GPUBROKER_KERNEL_ID") == kernel_id:
                return int(entry.name), env
    raise AssertionError(f"no process of kernel {kernel_id}")


def token_status(central: LiveServer, token: str, method: str = "GET", path: str = "me") -> int:
    conn = central.connection()
    try:
        conn.request(method, f"/{API_PREFIX}/{path}", headers={TOKEN_HEADER: token})
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def test_a_killed_servers_kernel_token_ends_within_its_maximum_age(
    central: LiveServer, users_server: LiveServer
) -> None:
    conn = users_server.connection()
    conn.request(
        "POST",
        "/api/kernels",
        body=json.dumps({"name": "gpu-1"}),
        headers={"Authorization": f"token {TOKEN}"},
    )
    response = conn.getresponse()
    assert response.status == 201, response.read()
    kernel_id = json.loads(response.read())["id"]
    conn.close()
    pid, env = kernel_environ(kernel_id)
    token = env["GPUBROKER_TOKEN"]
    try:
        _, leases = central.call("GET", "leases")
        assert [x["user"] for x in leases["leases"]] == [getpass.getuser()]  # its GPU, granted

        for _ in range(int(3 * MAX_AGE)):  # a live kernel keeps its token, renewed
            assert token_status(central, token) == 200
            time.sleep(1)

        users_server.kill()  # SIGKILL: its kernels' tokens are never revoked
        killed = time.monotonic()
        renew = f"tokens/{kernel_id}/renew"
        while token_status(central, token) == 200:  # used, as a leaked token would be
            assert token_status(central, token, "POST", renew) != 204  # it cannot renew itself
            assert time.monotonic() - killed < MAX_AGE + 2, "the token still works"
            time.sleep(0.2)
        assert token_status(central, token) == 403
        print(f"refused {time.monotonic() - killed:.1f} s after the kill")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def broker_config(broker_config: dict[str, Any]) -> dict[str, Any]:
    """The test server's own broker: the same short age and ticks as the central one."""
    return {**broker_config, "kernel_token_max_age": MAX_AGE, "tick_interval": TICK}


async def test_an_idle_kernel_of_the_embedded_broker_keeps_its_token(
    jp_serverapp: Any, gpu_kernelspec: Any, api: Any
) -> None:
    """A kernel that holds no GPU and calls nothing keeps its token many maximum ages
    over: its server runs it, and the embedded broker's tick renews it for that."""
    km = jp_serverapp.kernel_manager
    kernel_id = await km.start_kernel(kernel_name=gpu_kernelspec("on-demand", on_demand=True))
    try:
        token = km.get_kernel(kernel_id).provisioner._kernel_token
        await asyncio.sleep(3 * MAX_AGE)
        status, me = await api("GET", "me", headers={TOKEN_HEADER: token})
        assert (status, me["kernel_id"]) == (200, kernel_id)
    finally:
        await km.shutdown_kernel(kernel_id)
    status, _ = await api("GET", "me", headers={TOKEN_HEADER: token})
    assert status == 403  # revoked at its shutdown
