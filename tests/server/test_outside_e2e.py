"""Use outside the broker, end to end on a real jupyter-server with a real GPU kernel.

The kernel (root's, the server's owner) starts a GPU program as another OS user
(``nobody``): it descends from the kernel the provisioner named with its renewal, so it
is the kernel's lease's. A program ``nobody`` starts from a terminal on the same slice
is outside use: the API shows it in words, the audit log records it and, under the
``stop`` policy, it is terminated after the grace, while the kernel's program runs on.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
from typing import Any

import pytest
from openapi_check import validate

pytestmark = [
    pytest.mark.slow,  # a real kernel, sampling passes
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run as another user"),
]
NOBODY = 65534


@pytest.fixture
def broker_config(broker_config: dict[str, Any]) -> dict[str, Any]:
    return {
        **broker_config,
        "sample_interval": 0.25,
        "outside_use": "stop",
        "outside_use_grace": 2.0,
        "lease_ttl": 30.0,
    }


async def until(what: str, predicate: Any, timeout: float = 30.0) -> Any:
    deadline = asyncio.get_running_loop().time() + timeout
    while not (found := await predicate()):
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)
    return found


async def test_a_kernels_own_program_is_its_lease_and_a_terminals_is_stopped(
    jp_serverapp: Any, gpu_kernelspec: Any, api: Any, run_in_kernel: Any
) -> None:
    runtime = jp_serverapp.web_app.settings["gpubroker"]
    km = jp_serverapp.kernel_manager
    kernel_id = await km.start_kernel(kernel_name=gpu_kernelspec())
    stray, child = None, 0
    try:
        kernel_pid = km.get_kernel(kernel_id).provisioner.pid
        (lease,) = runtime.core.leases()
        device = lease.devices[0]

        async def named() -> bool:
            return runtime.sampler.outside.holder_pids.get(lease.id) == kernel_pid

        await until("the provisioner to name the kernel's process", named)
        child = int(
            await run_in_kernel(
                km.get_kernel(kernel_id),
                "import subprocess\n"
                "p = subprocess.Popen(['sleep', '600'], user=65534)\n"
                "print(p.pid)",
            )
        )
        sim = runtime.backend.simulator
        sim.add_process(device, child, follow=True)
        stray = subprocess.Popen(["sleep", "600"], user=NOBODY)  # "from a terminal"
        sim.add_process(device, stray.pid, follow=True)

        async def outside() -> Any:
            _, devices = await api("GET", "devices")
            found = [d for g in devices["gpus"] for d in g["devices"] if d["uuid"] == device]
            return found[0] if found[0]["outside"] else None

        seen = await until("the outside use to show", outside)
        validate(seen, "#/components/schemas/Device", "a device in use outside the broker")
        label = seen["label"]
        assert [o["pid"] for o in seen["outside"]] == [stray.pid]  # not the kernel's child
        assert seen["outside"][0]["text"].startswith(
            f"{label}: in use outside the broker by nobody, pid {stray.pid}, for "
        )
        assert seen["drained"]["cause"] == "outside"
        _, audit = await api("GET", "audit")
        assert [(a["actor"], a["action"], a["target"]) for a in audit["audit"]][-1:] == [
            ("nobody", "outside_use", device)
        ]

        async def stopped() -> bool:
            return stray.poll() is not None

        await until("the stray program to be stopped", stopped)
        assert stray.returncode == -signal.SIGTERM
        os.kill(child, 0)  # the kernel's own program runs on

        async def undrained() -> bool:
            return device not in runtime.core.drained()

        await until("the slice to take grants again", undrained)
        _, usage = await api("GET", "usage", by="job_class")
        validate(usage, "#/components/schemas/Usage", "usage with unbrokered use")
        assert usage["gpu_hours"]["unbrokered"] > 0
    finally:
        if stray is not None and stray.poll() is None:
            stray.kill()
        if child:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
        await km.shutdown_kernel(kernel_id)


async def test_the_kernel_is_named_before_its_start_returns(
    jp_serverapp: Any, gpu_kernelspec: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The renewal that names the kernel's process is part of its start, not of a
    heartbeat that follows: a kernel in a confined server can open its GPU, and its
    programs are its lease's, before its first cell runs."""
    from jupyter_gpubroker.server.provisioner import GPUProvisioner

    runtime = jp_serverapp.web_app.settings["gpubroker"]
    named_at_start: list[int | None] = []
    post_launch = GPUProvisioner.post_launch

    async def watched(self: GPUProvisioner, **kwargs: Any) -> None:
        await post_launch(self, **kwargs)
        assert self.lease is not None
        named_at_start.append(runtime.sampler.outside.holder_pids.get(self.lease["id"]))

    monkeypatch.setattr(GPUProvisioner, "post_launch", watched)
    km = jp_serverapp.kernel_manager
    kernel_id = await km.start_kernel(kernel_name=gpu_kernelspec())
    try:
        assert named_at_start == [km.get_kernel(kernel_id).provisioner.pid]
    finally:
        await km.shutdown_kernel(kernel_id)


async def test_a_renewal_naming_another_users_process_is_refused_and_it_stays_outside_use(
    jp_serverapp: Any, api: Any
) -> None:
    """The server's owner (root) names as its lease's holder a process of ``nobody`` that
    computes on the lease's slice: a 400 that says whose the process is, and the process
    stays outside use, seen, reported and stopped, as any other."""
    runtime = jp_serverapp.web_app.settings["gpubroker"]
    status, request = await api("POST", "requests", {"profile": "1g.10gb", "holder": "script"})
    assert status == 201
    lease, (device,) = request["lease"], request["lease"]["devices"]
    stray = subprocess.Popen(["sleep", "600"], user=NOBODY)
    try:
        runtime.backend.simulator.add_process(device, stray.pid, follow=True)
        status, reply = await api("POST", f"leases/{lease['id']}/renew", {"holder_pid": stray.pid})
        validate(reply, "#/components/schemas/Error", "the refused renewal")
        assert (status, reply) == (
            400,
            {
                "error": "not_your_process",
                "message": f"process {stray.pid} belongs to nobody, not to root",
            },
        )
        _, now = await api("GET", f"leases/{lease['id']}")
        assert now["holder_pid"] is None and now["expires_at"] == lease["expires_at"]

        async def outside() -> Any:
            _, devices = await api("GET", "devices")
            found = [d for g in devices["gpus"] for d in g["devices"] if d["uuid"] == device]
            return found[0]["outside"]

        assert [o["pid"] for o in await until("the outside use to show", outside)] == [stray.pid]

        async def stopped() -> bool:
            return stray.poll() is not None

        await until("the process to be stopped", stopped)
        assert stray.returncode == -signal.SIGTERM
    finally:
        if stray.poll() is None:
            stray.kill()
        stray.wait()
