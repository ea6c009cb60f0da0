"""Two users' kernels share one GPU without MIG, each held to its share by MPS: a real
jupyter-server with the embedded broker on a simulated L40S, the simulated MPS control
daemons the broker runs (real processes), real kernels started over HTTP as their users.
A third share that would pass the GPU's memory waits with its place in the queue; a
kernel past its own limit fails as CUDA does under MPS, and the other runs on."""

from __future__ import annotations

import json
from typing import Any

import pytest
from test_security import TokenUsers

SHARE = {"share_gb": 20}


@pytest.fixture
def jp_server_config(jp_server_config: dict[str, Any], mps_dir: str) -> dict[str, Any]:
    return {
        **jp_server_config,
        "ServerApp": {**jp_server_config["ServerApp"], "identity_provider_class": TokenUsers},
        "GPUBroker": {
            **jp_server_config["GPUBroker"],
            "simulate": "l40s-4:1",
            "sharing": "shared",
            "mps_dir": mps_dir,
            "identity": "username",
            "owner": "root-owner",
            "lease_ttl": 120.0,
        },
    }


@pytest.fixture
def jp_auth_header() -> dict[str, str]:
    return {}


def as_user(name: str) -> dict[str, str]:
    return {"Authorization": f"token {name}-token"}


async def start_kernel(jp_fetch: Any, user: str, name: str) -> str:
    """A kernel started over HTTP by ``user``: charged to them."""
    reply = await jp_fetch(
        "api", "kernels", method="POST", body=json.dumps({"name": name}), headers=as_user(user)
    )
    return str(json.loads(reply.body)["id"])


ENV = (
    "import os, json; print(json.dumps({k: os.environ.get(k) for k in ("
    "'CUDA_VISIBLE_DEVICES', 'CUDA_MPS_PIPE_DIRECTORY', 'CUDA_MPS_LOG_DIRECTORY', "
    "'CUDA_MPS_PINNED_DEVICE_MEM_LIMIT')}))"
)
OVER = (
    "from jupyter_gpubroker.enforce.mpsim import OutOfMemory, cuda_malloc\n"
    "cuda_malloc(15000)\n"
    "try:\n    cuda_malloc(8000)\nexcept OutOfMemory as e:\n    print('refused:', e)\n"
    "print('still running with', cuda_malloc(1000), 'MiB')\n"
)


async def test_two_users_kernels_share_one_gpu_each_held_to_its_share(
    jp_serverapp, jp_fetch, gpu_kernelspec, api, run_in_kernel
):
    name = gpu_kernelspec("gpu-share", **SHARE)
    alice = await start_kernel(jp_fetch, "alice", name)
    bob = await start_kernel(jp_fetch, "bob", name)
    mkm = jp_serverapp.kernel_manager
    env = {k: json.loads(await run_in_kernel(mkm.get_kernel(k), ENV)) for k in (alice, bob)}
    assert env[alice]["CUDA_VISIBLE_DEVICES"] == env[bob]["CUDA_VISIBLE_DEVICES"]
    assert env[alice]["CUDA_MPS_PIPE_DIRECTORY"] != env[bob]["CUDA_MPS_PIPE_DIRECTORY"]
    for k in (alice, bob):
        assert env[k]["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=19074M"  # 20 GB in MiB

    # alice's kernel goes over its 20 GB: its allocation fails, bob's runs on
    out = await run_in_kernel(mkm.get_kernel(alice), OVER)
    assert out.splitlines() == [
        "refused: CUDA error: out of memory",
        "still running with 16000 MiB",
    ]
    ok = "from jupyter_gpubroker.enforce.mpsim import cuda_malloc\nprint(cuda_malloc(19000))"
    assert await run_in_kernel(mkm.get_kernel(bob), ok) == "19000"

    # a third 20 GB share would pass the GPU's 48.3 GB: it waits, and says where
    status, waiting = await api("POST", "requests", SHARE, headers=as_user("carol"))
    assert status == 201 and waiting["state"] == "queued"
    assert waiting["place"] == "position 1 of 1, nothing ahead"
    _, mine = await api("GET", "leases", headers=as_user("alice"))
    (lease,) = mine["leases"]
    assert lease["share"]["text"] == "20.0 GB of GPU 0, enforced by MPS"

    await mkm.shutdown_kernel(alice)  # its share frees: carol's is granted
    _, after = await api("GET", f"requests/{waiting['id']}", headers=as_user("carol"))
    assert after["state"] == "granted"
    await mkm.shutdown_kernel(bob)
