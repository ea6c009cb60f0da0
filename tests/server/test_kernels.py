"""Real kernels started through ``gpubroker-provisioner`` on a simulated 7-slice H100."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator

import pytest

from jupyter_gpubroker.server.provisioner import GPUProvisioner


@pytest.fixture
def jp_server_config(jp_server_config):
    # A killed kernel must stay dead for the lease to lapse (no auto-restart).
    jp_server_config["KernelManager"] = {"autorestart": False}
    return jp_server_config


ENV = "import os; print(os.environ['CUDA_VISIBLE_DEVICES'], os.environ['GPUBROKER_LEASE_ID'])"


async def until(predicate, timeout: float = 30.0, every: float = 0.1):  # type: ignore[no-untyped-def]
    """Poll an async predicate until it returns something truthy."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        value = await predicate()
        if value:
            return value
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        await asyncio.sleep(every)


@contextlib.asynccontextmanager
async def filled_but_one(api) -> AsyncIterator[list[str]]:  # type: ignore[no-untyped-def]
    """Six of the seven slices taken by another workload, which renews its leases every
    second (they outlive the 4 s TTL however slowly a kernel starts); their lease ids."""
    leases = []
    for _ in range(6):
        status, r = await api("POST", "requests", {"profile": "1g.10gb", "holder": "batch-job"})
        assert status == 201 and r["state"] == "granted"
        leases.append(r["lease"]["id"])

    async def renewing() -> None:
        while True:
            await asyncio.sleep(1)
            for lease_id in leases:
                await api("POST", f"leases/{lease_id}/renew", {})

    workload = asyncio.ensure_future(renewing())
    try:
        yield leases
    finally:
        workload.cancel()


async def test_kernel_runs_on_its_granted_slice(jp_serverapp, gpu_kernelspec, api, run_in_kernel):
    mkm = jp_serverapp.kernel_manager
    kid = await mkm.start_kernel(kernel_name=gpu_kernelspec())
    device, lease_id = (await run_in_kernel(mkm.get_kernel(kid), ENV)).split()

    _, leases = await api("GET", "leases")
    (lease,) = leases["leases"]
    assert device.startswith("MIG-") and lease["devices"] == [device] and lease["id"] == lease_id
    _, req = await api("GET", f"requests/{lease['request_id']}")
    assert req["holder"] == kid and req["profile"] == "1g.10gb"

    await mkm.shutdown_kernel(kid)
    _, leases = await api("GET", "leases")
    assert leases["leases"] == []
    _, req = await api("GET", f"requests/{lease['request_id']}")
    assert req["state"] == "released"


async def test_full_machine_queues_the_next_kernel_until_one_shuts_down(
    jp_serverapp, gpu_kernelspec, api, run_in_kernel
):
    mkm = jp_serverapp.kernel_manager
    name = gpu_kernelspec()
    async with filled_but_one(api):
        first = await mkm.start_kernel(kernel_name=name)
        first_device, _ = (await run_in_kernel(mkm.get_kernel(first), ENV)).split()

        starting = asyncio.ensure_future(mkm.start_kernel(kernel_name=name))

        async def waiting_at_front():
            _, q = await api("GET", "queue")
            return q["queue"] if q["length"] == 1 and q["queue"][0]["position"] == 1 else None

        (entry,) = await until(waiting_at_front)
        assert entry["mine"] and entry["profile"] == "1g.10gb" and not starting.done()

        await mkm.shutdown_kernel(first)
        second = await asyncio.wait_for(starting, 30)
        second_device, _ = (await run_in_kernel(mkm.get_kernel(second), ENV)).split()
        assert second_device == first_device  # it got exactly the freed slice
        _, q = await api("GET", "queue")
        assert q["length"] == 0


async def test_restart_keeps_the_slice(jp_serverapp, gpu_kernelspec, run_in_kernel):
    mkm = jp_serverapp.kernel_manager
    kid = await mkm.start_kernel(kernel_name=gpu_kernelspec())
    before = await run_in_kernel(mkm.get_kernel(kid), ENV)
    await mkm.restart_kernel(kid)
    after = await run_in_kernel(mkm.get_kernel(kid), ENV)
    assert after == before


async def test_killed_kernel_loses_its_slice_within_the_lease_ttl(
    jp_serverapp, gpu_kernelspec, api, run_in_kernel
):
    mkm = jp_serverapp.kernel_manager
    kid = await mkm.start_kernel(kernel_name=gpu_kernelspec())
    await run_in_kernel(mkm.get_kernel(kid), ENV)
    _, leases = await api("GET", "leases")
    (lease,) = leases["leases"]
    async with filled_but_one(api):
        status, waiting = await api("POST", "requests", {"profile": "1g.10gb"})
        assert waiting["state"] == "queued" and waiting["position"] == 1

        os.kill(mkm.get_kernel(kid).provisioner.pid, signal.SIGKILL)
        killed_at = asyncio.get_running_loop().time()

        async def granted():
            _, r = await api("GET", f"requests/{waiting['id']}")
            return r if r["state"] == "granted" else None

        r = await until(granted, timeout=15)
        assert r["lease"]["devices"] == lease["devices"]
        assert asyncio.get_running_loop().time() - killed_at < 4.0 + 2.0  # TTL + one tick + slack
        _, old = await api("GET", f"leases/{lease['id']}")
        assert old["state"] == "expired"


async def test_start_that_waits_too_long_fails_with_its_position(jp_serverapp, gpu_kernelspec, api):
    mkm = jp_serverapp.kernel_manager
    for _ in range(7):
        await api("POST", "requests", {"profile": "1g.10gb"})
    name = gpu_kernelspec("gpu-impatient", gpu="1g.10gb", wait_timeout=0.5)
    with pytest.raises(RuntimeError, match="still at position 1 in the queue"):
        await mkm.start_kernel(kernel_name=name)
    _, q = await api("GET", "queue")
    assert q["length"] == 0  # the withdrawn request does not linger


async def test_memory_kernelspec_gets_the_smallest_fitting_slice(
    jp_serverapp, gpu_kernelspec, api, run_in_kernel
):
    mkm = jp_serverapp.kernel_manager
    kid = await mkm.start_kernel(kernel_name=gpu_kernelspec("gpu-mem", min_memory_gb=5))
    device, _ = (await run_in_kernel(mkm.get_kernel(kid), ENV)).split()
    _, leases = await api("GET", "leases")
    assert leases["leases"][0]["devices"] == [device] and device.startswith("MIG-")


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"gpu": "1g.10gb"}, {"profile": "1g.10gb"}),
        ({"gpus": 2}, {"gpus": 2}),
        ({"min_memory_gb": 20.0}, {"min_memory_gb": 20.0}),
    ],
)
def test_kernelspec_config_maps_to_one_size(config, expected):
    assert GPUProvisioner(kernel_id="k", kernel_spec=None, **config).size() == expected


@pytest.mark.parametrize("config", [{}, {"gpu": "1g.10gb", "gpus": 1}])
def test_kernelspec_config_must_name_exactly_one_size(config):
    with pytest.raises(ValueError, match="exactly one of 'gpu'"):
        GPUProvisioner(kernel_id="k", kernel_spec=None, **config).size()


async def test_on_demand_kernel_starts_at_once_with_no_gpu_and_a_token(
    jp_serverapp, gpu_kernelspec, api, run_in_kernel
):
    mkm = jp_serverapp.kernel_manager
    kid = await mkm.start_kernel(kernel_name=gpu_kernelspec("gpu-on-demand", on_demand=True))
    out = await run_in_kernel(
        mkm.get_kernel(kid),
        "import os; e = os.environ; print(repr(e['CUDA_VISIBLE_DEVICES']), "
        "e['GPUBROKER_KERNEL_ID'], e['GPUBROKER_TOKEN'][:4], 'GPUBROKER_LEASE_ID' in e)",
    )
    assert out == f"'' {kid} gpb_ False"
    _, requests = await api("GET", "requests")
    assert requests["requests"] == []


async def test_restart_and_shutdown_give_back_the_kernels_other_requests(
    jp_serverapp, gpu_kernelspec, api, run_in_kernel
):
    """What %gpu asked for in a kernel goes with the kernel process; the provisioner's own
    grant survives a restart only."""
    mkm = jp_serverapp.kernel_manager
    kid = await mkm.start_kernel(kernel_name=gpu_kernelspec())
    _, own = await api("GET", "leases")
    (own,) = own["leases"]

    async def kernels_others() -> list[dict]:
        _, held = await api("POST", "requests", {"profile": "1g.10gb", "holder": kid})
        for _ in range(5):
            await api("POST", "requests", {"profile": "1g.10gb", "holder": "batch-job"})
        _, waiting = await api("POST", "requests", {"profile": "1g.10gb", "holder": kid})
        assert (held["state"], waiting["state"]) == ("granted", "queued")
        return [held, waiting]

    async def states(requests: list[dict]) -> list[str]:
        return [(await api("GET", f"requests/{r['id']}"))[1]["state"] for r in requests]

    others = await kernels_others()
    await mkm.restart_kernel(kid)
    assert await states(others) == ["released", "cancelled"]
    assert await states([{"id": own["request_id"]}]) == ["granted"]

    _, held = await api("POST", "requests", {"profile": "1g.10gb", "holder": kid})
    await mkm.shutdown_kernel(kid)
    assert await states([held, {"id": own["request_id"]}]) == ["released", "released"]


def test_the_deprecated_broker_token_still_configures_the_jupyter_token(caplog) -> None:
    from traitlets.config import Config

    c = Config()
    c.GPUProvisioner.broker_token = "hub-token"
    provisioner = GPUProvisioner(kernel_id="k1", config=c)
    assert provisioner.jupyter_token == "hub-token"
    assert "set GPUProvisioner.jupyter_token" in caplog.text


async def test_a_kernel_in_a_server_with_its_own_gpu_shares_it(
    jp_serverapp, gpu_kernelspec, api, run_in_kernel, monkeypatch
):
    """The hub's GPU spawner names the server's lease: a GPU kernel asks for nothing more."""
    monkeypatch.setenv("GPUBROKER_SERVER_LEASE", "l-server")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-the-servers")
    mkm = jp_serverapp.kernel_manager
    kid = await mkm.start_kernel(kernel_name=gpu_kernelspec())
    code = "import os; print(os.environ['CUDA_VISIBLE_DEVICES'])"
    assert await run_in_kernel(mkm.get_kernel(kid), code) == "MIG-the-servers"
    assert (await api("GET", "requests"))[1]["requests"] == []
    await mkm.shutdown_kernel(kid)
