"""Another user's request that names my kernel as its holder, on a multi-user embedded
server (``c.GPUBroker.identity = "username"``): a kernel id is no secret, yet what comes
of that request is that user's alone. My suspended kernel (started by the server, so its
owner's, alice's) stays suspended, its memory on the host, and its next cell resumes it
on a GPU of its own; the reclaim of their lease does not shut my kernel down. Users log
in with test_security's identity provider (alice-token, bob-token)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from suspend_cells import KERNEL_MIB, Cell, driver_of, ended, until
from test_security import TokenUsers

from jupyter_gpubroker.server.reclaimer import NOTICE_S
from jupyter_gpubroker.wire.text import suspended_text

pytestmark = pytest.mark.slow  # real kernels, seconds-long timeouts
OWNER = "alice"  # the server's owner: its kernels are hers, and so are the test's calls
BOB = {"Authorization": "token bob-token"}  # another user of the same server


@pytest.fixture
def jp_server_config(jp_server_config: dict[str, Any]) -> dict[str, Any]:
    return {
        **jp_server_config,
        "ServerApp": {**jp_server_config["ServerApp"], "identity_provider_class": TokenUsers},
        "GPUBroker": {**jp_server_config["GPUBroker"], "identity": "username", "owner": OWNER},
    }


@pytest.fixture
def jp_auth_header() -> dict[str, str]:
    return {"Authorization": "token alice-token"}


async def test_another_users_request_naming_my_suspended_kernel_leaves_it_suspended(
    jp_serverapp: Any, api: Any, km: Any, simulator: Any, suspendable: Any
) -> None:
    kernel_id, pid, lease_id, gpu = suspendable
    lease = await ended(api, lease_id)
    assert lease["user"] == OWNER and lease["suspended"] is not None, lease["reason"]
    assert lease["suspended"]["kernel_id"] == kernel_id

    status, asked = await api("POST", "requests", {"gpus": 1, "holder": kernel_id}, headers=BOB)
    assert status == 201, asked

    async def granted() -> Any:
        _, r = await api("GET", f"requests/{asked['id']}", headers=BOB)
        return r if r["state"] == "granted" else None

    theirs = await until("bob's grant", granted)
    assert theirs["lease"]["devices"] == [gpu]  # the one GPU, which my kernel left
    status, mine = await api("GET", f"leases/{lease_id}", headers=BOB)
    assert status == 403  # not his to see

    async def restored() -> bool:  # what the old broker did within a sampling pass or two
        return ("restore", pid) in driver_of(jp_serverapp).calls

    with pytest.raises(AssertionError, match="timed out"):
        await until("a restore onto bob's GPU", restored, timeout=2.0)
    _, mine = await api("GET", f"leases/{lease_id}")
    assert mine["suspended"]["text"] == suspended_text(KERNEL_MIB)  # still suspended
    assert simulator.process_memory(pid) == {}  # its memory still on the host
    assert driver_of(jp_serverapp).held() == {pid: {gpu: KERNEL_MIB}}
    _, overview = await api("GET", "overview")
    assert [x["id"] for x in overview["suspended"]] == [lease_id]
    _, bobs = await api("GET", "overview", headers=BOB)
    assert bobs["suspended"] == []
    _, held = await api("GET", f"leases/{theirs['lease']['id']}", headers=BOB)
    assert held["state"] == "active" and held["suspended"] is None

    # bob gives his GPU back; my kernel's next cell resumes it there, with its variables
    await api("DELETE", f"leases/{theirs['lease']['id']}", headers=BOB)
    out = await Cell(km.get_kernel(kernel_id), "print(sum(numbers), os.getpid())").result()
    assert out.endswith(f"Resumed on {gpu}.\n6 {pid}"), out
    assert simulator.process_memory(pid) == {gpu: KERNEL_MIB}


async def test_the_reclaim_of_another_users_lease_naming_my_kernel_leaves_my_kernel_alone(
    api: Any, km: Any, kernels: Any, gpu_kernelspec: Any
) -> None:
    """Bob's lease, held in the name of my kernel, is reclaimed when idle and cannot be
    suspended (no process of his was named): its fallback, shutdown, is not carried out on
    my kernel, which is not his."""
    kernel_id = await kernels(kernel_name=gpu_kernelspec("on-demand", on_demand=True))
    status, theirs = await api("POST", "requests", {"gpus": 1, "holder": kernel_id}, headers=BOB)
    assert status == 201 and theirs["state"] == "granted", theirs

    async def reclaimed() -> Any:
        _, lease = await api("GET", f"leases/{theirs['lease']['id']}", headers=BOB)
        return lease if lease["state"] == "reclaimed" else None

    lease = await until("bob's lease to be reclaimed", reclaimed)
    assert lease["reason"].endswith("; not suspended: the kernel never named its process")
    assert lease["on_reclaim"] == "shutdown"
    await asyncio.sleep(NOTICE_S + 2)  # when the old broker had shut my kernel down
    assert kernel_id in km
    out = await Cell(km.get_kernel(kernel_id), "print('still here')").result()
    assert out == "still here"
