"""Remote mode: a user's server whose environment names a central broker runs none of its
own. The central broker here is another real ``jupyter server`` process with the extension
(the same API as the hub service, token auth), its owner ``alice``: the user whose token
the user's server holds. Real kernels, started by the user's server, through its
provisioner."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jupyter_server.utils import url_path_join
from live_server import TOKEN, LiveServer
from test_kernels import until

from jupyter_gpubroker.api import API_PREFIX
from jupyter_gpubroker.client import HUB_TOKEN_ENV, JUPYTER_TOKEN_ENV, URL_ENV, BrokerClient

ENV = "import os; print(os.environ['CUDA_VISIBLE_DEVICES'], os.environ['GPUBROKER_URL'])"


@pytest.fixture
def central_options() -> dict[str, Any]:
    return {}


@pytest.fixture
def central(tmp_path: Path, central_options: dict[str, Any]) -> Iterator[LiveServer]:
    home = tmp_path / "central"
    home.mkdir()
    server = LiveServer(home, home / "state.sqlite", **{"owner": "alice", **central_options})
    server.start()
    yield server
    server.stop()


@pytest.fixture
def central_token() -> str:
    return TOKEN


@pytest.fixture
def jp_server_config(
    jp_server_config: dict[str, Any], central: LiveServer, central_token: str
) -> dict[str, Any]:
    """The user's server: in remote mode, with alice's token at the central broker."""
    return {
        **jp_server_config,
        "GPUBrokerExtension": {"broker_url": central.base, "jupyter_token": central_token},
        "KernelManager": {"autorestart": False},
    }


def central_api(central: LiveServer) -> BrokerClient:
    return BrokerClient(central.base, token=TOKEN)


async def test_a_gpu_kernel_takes_its_slice_from_the_central_broker_as_its_user(
    jp_serverapp: Any,
    gpu_kernelspec: Any,
    run_in_kernel: Any,
    central: LiveServer,
    broker_config: dict[str, Any],
) -> None:
    mkm = jp_serverapp.kernel_manager
    kid = await mkm.start_kernel(kernel_name=gpu_kernelspec())
    km = mkm.get_kernel(kid)
    device, url = (await run_in_kernel(km, ENV)).split()

    broker = central_api(central)
    (lease,) = await broker.leases()
    assert lease["devices"] == [device] and device.startswith("MIG-")
    assert lease["user"] == "alice"  # charged to the user whose token the server holds
    assert (await broker.request(lease["request_id"]))["holder"] == kid
    assert url.rstrip("/") == central.base  # the kernel's %gpu talks to the central broker directly

    # %gpu in that kernel works unchanged: it sees its grant, and gives it back
    shown = await run_in_kernel(km, 'lease = %gpu status\nprint(lease["id"], lease["devices"])')
    assert shown == f"{lease['id']} {[device]}"
    await run_in_kernel(km, "%gpu release")
    assert await broker.leases() == []

    await mkm.shutdown_kernel(kid)
    assert not Path(broker_config["state_file"]).exists()  # the user's server kept no state


async def test_the_servers_api_relays_to_the_central_broker(api: Any, central: LiveServer) -> None:
    anonymous = {"Authorization": ""}  # no credential of the user's server: nothing relayed
    status, _ = await api("POST", "requests", {"profile": "1g.10gb"}, headers=anonymous)
    assert status == 403 and await central_api(central).requests() == []
    status, me = await api("GET", "me")
    assert (status, me["user"]) == (200, "alice")
    status, r = await api("POST", "requests", {"profile": "1g.10gb", "holder": "panel"})
    assert status == 201 and r["state"] == "granted"
    (lease,) = await central_api(central).leases()
    assert lease["id"] == r["lease"]["id"]  # the central broker's lease
    status, reply = await api("POST", f"leases/{lease['id']}/renew", {"kernel": "busy"})
    assert status == 400 and reply["error"] == "invalid_request"  # its refusals, as they are
    status, reply = await api("PATCH", f"requests/{r['id']}", {"job_class": "batch"})
    assert status == 409 and reply["error"] == "conflict"  # every method: an admin's too
    status, gone = await api("DELETE", f"requests/{r['id']}")
    assert status == 200 and gone["state"] == "released"


async def test_the_servers_event_stream_relays_the_central_one(
    jp_serverapp: Any, api: Any, central: LiveServer
) -> None:
    mine = BrokerClient(
        url_path_join(jp_serverapp.connection_url, API_PREFIX),
        token=jp_serverapp.identity_provider.token,
    )
    async with contextlib.aclosing(mine.events()) as events:
        hello = await anext(events)
        assert hello["type"] == "hello"
        status, r = await api("POST", "requests", {"profile": "1g.10gb", "holder": "panel"})
        # queued then granted within one window: the latest state of the request wins
        granted = await anext(e async for e in events if e["data"].get("request_id"))
        assert (granted["type"], granted["data"]["request_id"]) == ("granted", r["id"])
        assert hello["id"] < granted["id"]
    async with contextlib.aclosing(mine.events(last_event_id=granted["id"])) as events:
        await api("DELETE", f"requests/{r['id']}")
        resumed = await anext(events)  # what this reconnect missed, after the last id it saw
        assert (resumed["type"], resumed["data"]["request_id"]) == ("released", r["id"])


async def test_the_relayed_stream_starts_with_the_snapshot_the_panel_asks_for(
    jp_serverapp: Any, jp_http_port: int, central: LiveServer
) -> None:
    """The Lab panel's first stream, as its browser asks for it (``?snapshot=true``):
    through the user's server it starts with the whole picture, as the central broker
    shows it to the user, not with a ``hello`` the panel cannot render from."""
    held = await central_api(central).submit(profile="1g.10gb", holder="training")
    reader, writer = await asyncio.open_connection("127.0.0.1", jp_http_port)
    path = url_path_join(jp_serverapp.base_url, API_PREFIX, "events")
    writer.write(
        f"GET {path}?snapshot=true HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: token {jp_serverapp.identity_provider.token}\r\n\r\n".encode()
    )
    try:
        await asyncio.wait_for(reader.readuntil(b"data: "), 10)
        first = json.loads(await asyncio.wait_for(reader.readline(), 10))
    finally:
        writer.close()
    assert first["type"] == "snapshot"
    assert [r["id"] for r in first["data"]["requests"]] == [held["id"]]
    assert first["data"]["me"]["user"] == "alice"


async def test_the_cli_in_a_hub_users_terminal_uses_the_central_broker_as_that_user(
    central: LiveServer, tmp_path: Path
) -> None:
    """A hub user's terminal has what the hub gave the server: the broker's URL and the
    user's API token; no --url, no --token."""
    env = {**os.environ, URL_ENV: central.base, HUB_TOKEN_ENV: TOKEN}
    env.pop(JUPYTER_TOKEN_ENV, None)
    show = "import os; print(os.environ['CUDA_VISIBLE_DEVICES'])"
    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "jupyter_gpubroker.cli", "run", "1g.10gb", "--"),
        *(sys.executable, "-c", show),
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    assert out.decode().strip().startswith("MIG-")
    usage = await central_api(central).usage()
    assert usage["gpu_hours"]["alice"] > 0  # charged to the token's user


async def test_a_central_broker_that_does_not_answer_is_named(
    api: Any, central: LiveServer
) -> None:
    central.kill()
    status, reply = await api("GET", "queue")
    assert status == 502 and reply["error"] == "broker_unreachable"
    assert reply["message"] == (
        f"the GPU broker at {central.base} does not answer (Connection refused): check "
        "c.GPUBrokerExtension.broker_url (or $GPUBROKER_URL) and that the broker (the "
        "JupyterHub service) runs"
    )


@pytest.mark.parametrize("central_token", ["not-alices-token"])
async def test_a_refused_credential_fails_the_kernel_start_saying_what_to_check(
    jp_serverapp: Any, gpu_kernelspec: Any, central: LiveServer, monkeypatch: Any
) -> None:
    monkeypatch.setenv("GPUBROKER_RETRY_S", "0")  # its central broker is down for good
    with pytest.raises(RuntimeError) as refused:
        await jp_serverapp.kernel_manager.start_kernel(kernel_name=gpu_kernelspec())
    assert str(refused.value).startswith(
        f"the GPU broker at {central.base} refused this server's credential ("
    )
    assert str(refused.value).endswith(
        "): check c.GPUBrokerExtension.jupyter_token (default $GPUBROKER_JUPYTER_TOKEN, else "
        "$JUPYTERHUB_API_TOKEN)"
    )
    central.kill()
    with pytest.raises(RuntimeError) as unreachable:
        await jp_serverapp.kernel_manager.start_kernel(kernel_name=gpu_kernelspec())
    assert str(unreachable.value).startswith(f"the GPU broker at {central.base} does not answer")


@pytest.mark.slow
@pytest.mark.parametrize(
    "central_options",
    [
        {
            "sample_interval": 0.25,
            "idle_timeout": 2.0,
            "grace": 2.0,
            "stalled_timeout": 0.0,
            "lease_ttl": 3.0,  # renewed every second, each renewal with the kernel's state
        }
    ],
)
@pytest.mark.parametrize("how", ["kernelspec", "%gpu"])
async def test_an_idle_kernel_is_reclaimed_by_the_central_broker_and_shut_down_by_its_server(
    jp_serverapp: Any, gpu_kernelspec: Any, run_in_kernel: Any, central: LiveServer, how: str
) -> None:
    """Its lease taken by the provisioner (renewed by it), or in the notebook (renewed by
    the kernel): each renewal says the kernel is idle, and since when."""
    mkm = jp_serverapp.kernel_manager
    if how == "kernelspec":
        kid = await mkm.start_kernel(kernel_name=gpu_kernelspec())
        await run_in_kernel(mkm.get_kernel(kid), "x = 1")
    else:
        kid = await mkm.start_kernel(kernel_name=gpu_kernelspec("on-demand", on_demand=True))
        await run_in_kernel(mkm.get_kernel(kid), "lease = %gpu request 1g.10gb")
    broker = central_api(central)
    (lease,) = await broker.leases()

    async def reclaimed() -> dict[str, Any] | None:
        held = await broker.lease(lease["id"])
        return held if held["state"] != "active" else None

    ended = await until(reclaimed, timeout=60)
    assert ended["state"] == "reclaimed" and ended["reason"].startswith("idle")
    await until(lambda: asyncio.sleep(0, kid not in mkm), timeout=60)  # shut down by its server
