"""Requests and leases belong to live holders, end to end on a real server: a waiting
client renews its request and withdraws it when it gives up; an abandoned request expires;
a reclaimed slice goes to the next holder only once the old kernel's process left it."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from typing import Any

import pytest
from openapi_check import validate

from jupyter_gpubroker.api import API_PREFIX
from jupyter_gpubroker.client import BrokerClient

pytestmark = pytest.mark.slow  # real kernels and CLI processes, seconds-long timeouts


@pytest.fixture
def broker_config(broker_config: dict[str, Any]) -> dict[str, Any]:
    return {
        **broker_config,
        "sample_interval": 0.25,
        "idle_timeout": 2.0,
        "grace": 1.0,
        "stalled_timeout": 0.0,
        "lease_ttl": 60.0,  # the other leases are not renewed: they must not expire meanwhile
        "reclaim_action": "revoke",  # the reclaimed kernel keeps running, device open
    }


async def until(what: str, predicate: Any, timeout: float = 30.0) -> Any:
    deadline = asyncio.get_running_loop().time() + timeout
    while not (found := await predicate()):
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)
    return found


async def fill(api: Any, slices: int = 7) -> list[str]:
    """Take ``slices`` of the seven 1g.10gb slices; their lease ids."""
    leases = []
    for _ in range(slices):
        _, r = await api("POST", "requests", {"profile": "1g.10gb", "holder": "batch-job"})
        assert r["state"] == "granted"
        leases.append(r["lease"]["id"])
    return leases


@pytest.fixture
def start_cli(jp_serverapp: Any, jp_http_port: int, jp_base_url: str) -> Any:
    """Start `jupyter gpubroker <command> ...` against the test server; the process."""
    url = f"http://localhost:{jp_http_port}{jp_base_url}{API_PREFIX}"
    token = jp_serverapp.identity_provider.token

    async def start(command: str, *args: str) -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            *[sys.executable, "-m", "jupyter_gpubroker.cli", command, "--url", url],
            *["--token", token, *args],
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )

    return start


def cli_request(runtime: Any) -> dict[str, Any]:
    """The one request the CLI made, from the state file."""
    (r,) = runtime.core.store.db.query("SELECT id, state FROM requests WHERE owner='cli'")
    return r


# ------------------------------------------------------------ requests


@pytest.fixture
def short_lived(jp_serverapp: Any) -> Any:
    """The runtime, where a queued request lives 1 s without renewal."""
    runtime = jp_serverapp.web_app.settings["gpubroker"]
    runtime.core.config.request_ttl_s = 1.0
    return runtime


async def test_a_request_nobody_renews_expires_and_is_granted_to_nobody(
    short_lived: Any, api: Any
) -> None:
    held = await fill(api)
    _, left = await api("POST", "requests", {"profile": "1g.10gb"})  # its client died
    assert left["state"] == "queued" and left["ttl_s"] == 1.0 and left["expires_at"]

    async def expired() -> Any:
        _, r = await api("GET", f"requests/{left['id']}")
        return r if r["state"] == "expired" else None

    gone = await until("the request to expire", expired)
    assert "stopped renewing" in gone["reason"]
    await api("DELETE", f"leases/{held[0]}")
    _, leases = await api("GET", "leases")
    assert len(leases["leases"]) == 6  # the freed slice went to nobody


async def test_a_waiting_client_keeps_its_request_alive_past_the_ttl(
    short_lived: Any, api: Any
) -> None:
    runtime, held = short_lived, await fill(api)
    client = BrokerClient(
        runtime.api_url, kernel_token=runtime.issue_token(runtime.owner, "k-wait")
    )
    r = await client.submit(profile="1g.10gb")
    waiting = asyncio.ensure_future(client.wait_for_grant(r["id"], 30))
    await asyncio.sleep(3.0)  # three TTLs in the queue
    assert not waiting.done()
    _, now = await api("GET", f"requests/{r['id']}")
    assert now["state"] == "queued" and now["expires_at"] > r["expires_at"]  # ISO, UTC
    await api("DELETE", f"leases/{held[0]}")
    granted = await asyncio.wait_for(waiting, 10)
    assert granted["state"] == "granted" and granted["id"] == r["id"]


async def test_the_cli_withdraws_its_request_when_it_times_out(
    jp_serverapp: Any, api: Any, start_cli: Any
) -> None:
    runtime = jp_serverapp.web_app.settings["gpubroker"]
    held = await fill(api)
    cli = await start_cli("request", "1g.10gb", "--timeout", "1")
    _, err = await cli.communicate()
    assert cli.returncode == 1
    assert "was granted within 1 s" in err.decode() and "withdrawn" in err.decode()
    assert cli_request(runtime)["state"] == "cancelled"
    await api("DELETE", f"leases/{held[0]}")
    _, leases = await api("GET", "leases")
    assert len(leases["leases"]) == 6  # nothing was granted to the CLI that left


async def test_the_cli_withdraws_its_request_on_ctrl_c(
    jp_serverapp: Any, api: Any, start_cli: Any
) -> None:
    runtime = jp_serverapp.web_app.settings["gpubroker"]
    await fill(api)
    cli = await start_cli("request", "1g.10gb")

    async def queued() -> bool:
        _, q = await api("GET", "queue")
        return bool(q["length"])

    await until("the CLI's request to queue", queued)
    cli.send_signal(signal.SIGINT)
    await asyncio.wait_for(cli.communicate(), 30)
    assert cli_request(runtime)["state"] == "cancelled"


# ------------------------------------------------------------ handing a slice over


async def reclaimed_kernel(jp_serverapp: Any, gpu_kernelspec: Any, api: Any) -> Any:
    """A GPU kernel whose process holds its slice open, reclaimed for idleness (and
    revoked: it keeps running), with a request waiting for the slice; returns
    (kernel id, pid, the reclaimed lease, the waiting request)."""
    runtime = jp_serverapp.web_app.settings["gpubroker"]
    km = jp_serverapp.kernel_manager
    await fill(api, 6)
    kernel_id = await km.start_kernel(kernel_name=gpu_kernelspec())
    pid = km.get_kernel(kernel_id).provisioner.pid
    (lease,) = [
        x for x in runtime.core.leases() if runtime.core.request(x.request_id).holder == kernel_id
    ]
    runtime.backend.simulator.add_process(lease.devices[0], pid, 500, follow=True)
    _, waiting = await api("POST", "requests", {"profile": "1g.10gb", "holder": "next"})
    assert waiting["state"] == "queued"

    async def reclaimed() -> Any:
        _, now = await api("GET", f"leases/{lease.id}")
        return now if now["state"] == "reclaimed" else None

    return kernel_id, pid, await until("the idle kernel's reclaim", reclaimed), waiting


async def test_a_reclaimed_slice_waits_for_the_old_kernel_to_exit(
    jp_serverapp: Any, gpu_kernelspec: Any, api: Any
) -> None:
    km = jp_serverapp.kernel_manager
    kernel_id, pid, old, waiting = await reclaimed_kernel(jp_serverapp, gpu_kernelspec, api)
    try:
        await asyncio.sleep(1.0)  # ticks pass, the old process still runs on the slice
        _, r = await api("GET", f"requests/{waiting['id']}")
        assert r["state"] == "queued" and kernel_id in km
        _, devices = await api("GET", "devices")
        (slice_,) = [d for d in devices["gpus"][0]["devices"] if d["uuid"] == old["devices"][0]]
        validate(slice_, "#/components/schemas/Device", "a vacating slice")
        assert slice_["holder"] is None and slice_["vacating"]["pids"] == [pid]
    finally:
        await km.shutdown_kernel(kernel_id)

    async def granted() -> Any:
        _, r = await api("GET", f"requests/{waiting['id']}")
        return r if r["state"] == "granted" else None

    r = await until("the next request's grant", granted)
    assert r["lease"]["devices"] == old["devices"]


async def test_a_slice_the_old_kernel_never_lets_go_of_is_drained_naming_it(
    jp_serverapp: Any, gpu_kernelspec: Any, api: Any
) -> None:
    runtime = jp_serverapp.web_app.settings["gpubroker"]
    runtime.core.config.vacate_timeout_s = 1.0
    km = jp_serverapp.kernel_manager
    kernel_id, pid, old, waiting = await reclaimed_kernel(jp_serverapp, gpu_kernelspec, api)
    try:

        async def drained() -> Any:
            return runtime.core.drained().get(old["devices"][0])

        reason, _ = await until("the slice to be drained", drained)
        assert f"process {pid}" in reason
        _, r = await api("GET", f"requests/{waiting['id']}")
        assert r["state"] == "queued"
    finally:
        await km.shutdown_kernel(kernel_id)


# ------------------------------------------------------------ release logging


async def test_a_users_own_release_is_no_lost_lease_in_the_server_log(
    jp_serverapp: Any, gpu_kernelspec: Any, run_in_kernel: Any
) -> None:
    runtime = jp_serverapp.web_app.settings["gpubroker"]
    runtime.core.config.lease_ttl_s = 3.0  # the kernel's heartbeat comes every second
    km = jp_serverapp.kernel_manager
    kernel_id = await km.start_kernel(kernel_name=gpu_kernelspec())
    provisioner = km.get_kernel(kernel_id).provisioner
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    provisioner.log.addHandler(handler)
    try:
        (lease,) = runtime.core.leases()
        out = await run_in_kernel(km.get_kernel(kernel_id), "%gpu release")
        assert "Traceback" not in out
        renews_every = lease.ttl_s / 3

        async def noted() -> Any:
            return [r for r in records if f"GPU lease {lease.id}" in r.getMessage()]

        (record,) = await until("the heartbeat to notice", noted, timeout=renews_every + 10)
        assert record.levelno == logging.INFO and "gave its GPU lease" in record.getMessage()
        assert not [r for r in records if "lost its GPU lease" in r.getMessage()]
    finally:
        provisioner.log.removeHandler(handler)
        await km.shutdown_kernel(kernel_id)
