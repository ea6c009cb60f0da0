"""What a GPU server starts with (``hub_spawner/environment.py``), without a hub."""

from __future__ import annotations

from hub_spawner.environment import (
    LEASE_ENV,
    broker_scopes,
    gpu_env,
    server_holder,
    start_path,
    start_timeout,
    wants_gpu,
)
from hub_spawner.hubauth import USE_SCOPE


def test_a_granted_server_sees_its_devices_and_shares_its_lease() -> None:
    held = {"request_id": "r-1", "lease_id": "l-1", "devices": ["MIG-a", "MIG-b"], "ttl_s": 60}
    assert gpu_env(held) == {
        "CUDA_VISIBLE_DEVICES": "MIG-a,MIG-b",
        "NVIDIA_VISIBLE_DEVICES": "MIG-a,MIG-b",
        LEASE_ENV: "l-1",
    }


def test_a_cpu_only_or_waiting_server_sees_no_gpu() -> None:
    assert gpu_env(None) == {"CUDA_VISIBLE_DEVICES": ""}
    assert gpu_env({"request_id": "r-1"}) == {"CUDA_VISIBLE_DEVICES": ""}


def test_an_engine_names_the_devices_its_own_way() -> None:
    held = {"lease_id": "l-2", "devices": ["GPU-x"]}
    assert gpu_env(held, lambda devices: {"SLOTS": str(devices)}) == {
        "SLOTS": "['GPU-x']",
        LEASE_ENV: "l-2",
    }


def test_a_server_is_named_at_the_broker_by_its_user_and_name() -> None:
    assert server_holder("ann") == "server:ann"
    assert server_holder("ann", "gpu1") == "server:ann:gpu1"
    assert start_path("ann") == "users/ann/server"
    assert start_path("ann%20b", "my%20gpu") == "users/ann%20b/servers/my%20gpu"


def test_only_a_gpu_server_waits_for_the_queue_too() -> None:
    assert wants_gpu({"profile": "1g.10gb"}) and not wants_gpu({}) and not wants_gpu(None)
    assert not wants_gpu({"gpus": "x"})  # malformed: start refuses it at once
    assert start_timeout(60, 3600, True) == 3660 and start_timeout(60, 3600, False) == 60


def test_the_spawners_token_reaches_the_broker_and_nothing_else() -> None:
    assert broker_scopes("gpubroker") == ["access:services!service=gpubroker", USE_SCOPE]
