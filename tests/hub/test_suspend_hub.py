"""Suspend and resume through the hub service, end to end: a real hub and proxy, the broker
service on two simulated whole H100s with the simulated checkpoint driver, and a real GPU
kernel of alice's single-user server, driven through the proxy as JupyterLab drives it.
The service lists each kernel that names its process on its GPU with 4 GiB
(``simulate_kernel_memory``), as NVML lists a kernel that used CUDA.

alice's kernel, idle, is suspended by the service: its lease ends with its memory on the
host and the kernel runs on. Her next cell resumes it, in the same process, with her
variables."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from live_hub import Hub, ServerKernel, wait_for

from jupyter_gpubroker.kernelspec import install, spec_for
from jupyter_gpubroker.wire.sizes import Size

pytestmark = pytest.mark.hub
GPU = spec_for(Size(gpus=1))[0]


@pytest.fixture(scope="module")
def hub_options(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    machine = tmp_path_factory.mktemp("machine") / "two-h100.yaml"
    machine.write_text(
        yaml.safe_dump(
            {
                "version": "v1",
                "simulate": {"gpu-model": "H100-80GB", "gpu-count": 2},
                "mig-configs": {"whole": [{"devices": "all", "mig-enabled": False}]},
            }
        )
    )
    return {
        "simulate": str(machine),
        "holder_account": "broker",  # the example's spawner runs servers as the hub's user
        "reclaim_action": "suspend",
        "simulate_kernel_memory": 4096,
        "sample_interval": 0.25,
        "idle_timeout": 3.0,
        "grace": 1.0,
        "stalled_timeout": 0.0,
        "lease_ttl": 120.0,
    }


@pytest.fixture(scope="module")
def alice(hub: Hub) -> Iterator[str]:
    """alice's hub API token, her server started with a whole-GPU kernelspec installed."""
    token = hub.user("alice")
    install(Size(gpus=1), "interactive", prefix=str(hub.home / "users" / "alice" / ".local"))
    hub.start_server("alice")
    yield token
    hub.stop_server("alice")


def test_an_idle_kernel_of_a_hub_users_server_is_suspended_and_a_cell_resumes_it(
    hub: Hub, alice: str
) -> None:
    kernel = ServerKernel(hub, "alice", alice, GPU)
    try:
        printed = kernel.run(
            "import os\nnumbers = [1, 2, 3]\nprint(os.getpid(), os.environ['GPUBROKER_LEASE_ID'])"
        )
        pid, lease_id = printed.split()

        def suspended() -> dict[str, Any] | None:
            lease: dict[str, Any] = hub.ok(alice, "GET", f"leases/{lease_id}")
            return lease if lease["suspended"] is not None else None

        lease = wait_for("alice's kernel to be suspended", suspended, timeout_s=60, log=hub.log)
        assert lease["state"] == "reclaimed", lease
        assert lease["suspended"]["text"] == (
            "suspended, its 4.2 GB of GPU memory on the host: its next cell resumes it"
        )
        assert lease["suspended"]["kernel_id"] == kernel.id
        assert [x["id"] for x in hub.ok(alice, "GET", "overview")["suspended"]] == [lease_id]
        assert kernel.alive()  # the kernel runs on, on the CPU

        shown = kernel.run("print(os.getpid(), numbers)")
        assert shown.splitlines()[-1] == f"{pid} [1, 2, 3]", shown  # the same process, resumed
        over = hub.ok(alice, "GET", f"leases/{lease_id}")
        assert over["suspended"] is None and over["reason"].startswith("idle for"), over
        assert "resumed, its GPU memory back on the GPU" in over["reason"], over
        assert hub.ok(alice, "GET", "overview")["suspended"] == []
        active = [x for x in hub.ok(alice, "GET", "leases")["leases"] if x["state"] == "active"]
        assert len(active) == 1 and active[0]["id"] != lease_id  # the resume's own lease
    finally:
        kernel.shutdown()
