"""Suspend end to end on the simulated checkpoint driver: a real jupyter-server, a real GPU
kernel started through the provisioner. The idle kernel is suspended (its memory leaves
the GPU in NVML's eyes), the waiting request gets the GPU, the kernel's next cell waits in
the queue with its position shown, then runs in the same process with its variables."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import Cell, until

from jupyter_gpubroker.wire.text import SUSPENDED_TEXT

pytestmark = pytest.mark.slow  # real kernels, seconds-long timeouts
KERNEL_MIB = 4096


async def start_suspendable(jp_serverapp: Any, gpu_kernelspec: Any, api: Any) -> Any:
    """A GPU kernel holding ``KERNEL_MIB`` on its GPU (as CUDA in it would), with a
    variable set: (kernel id, its pid, its lease, its GPU)."""
    km = jp_serverapp.kernel_manager
    kernel_id = await km.start_kernel(kernel_name=gpu_kernelspec("gpu-1", gpus=1))
    printed = await Cell(
        km.get_kernel(kernel_id),
        "import os\nnumbers = [1, 2, 3]\nprint(os.getpid(), os.environ['GPUBROKER_LEASE_ID'])",
    ).result()
    pid_text, lease_id = printed.split()
    _, lease = await api("GET", f"leases/{lease_id}")
    (gpu,) = lease["devices"]
    simulator = jp_serverapp.web_app.settings["gpubroker"].backend.simulator
    simulator.add_process(gpu, int(pid_text), KERNEL_MIB, follow=True)
    return kernel_id, int(pid_text), lease_id, gpu


async def ended(api: Any, lease_id: str) -> dict[str, Any]:
    async def gone() -> dict[str, Any] | None:
        _, now = await api("GET", f"leases/{lease_id}")
        return now if now["state"] != "active" else None

    return await until(f"lease {lease_id} to end", gone)  # type: ignore[no-any-return]


async def test_an_idle_kernel_is_suspended_and_resumes_on_its_next_cell(
    jp_serverapp: Any, gpu_kernelspec: Any, api: Any
) -> None:
    km = jp_serverapp.kernel_manager
    simulator = jp_serverapp.web_app.settings["gpubroker"].backend.simulator
    kernel_id, pid, lease_id, gpu = await start_suspendable(jp_serverapp, gpu_kernelspec, api)
    try:
        _, other = await api("POST", "requests", {"gpus": 1, "owner": "other-kernel"})
        assert other["state"] == "queued"

        lease = await ended(api, lease_id)
        assert lease["state"] == "reclaimed"
        assert lease["suspended"] == {"host_mib": KERNEL_MIB, "text": SUSPENDED_TEXT}
        assert lease["reason"].startswith("idle for")
        assert lease["reason"].endswith("suspended, its 4.0 GiB of GPU memory on the host")
        assert simulator.process_memory(pid) == {}  # NVML lists nothing on the GPU
        assert kernel_id in km  # the kernel runs on, on the CPU

        async def granted(request_id: str) -> dict[str, Any] | None:
            _, r = await api("GET", f"requests/{request_id}")
            return r if r["state"] == "granted" else None

        other = await until("the other request to get the GPU", lambda: granted(other["id"]))
        assert other["lease"]["devices"] == [gpu]

        # The next cell waits in the queue, its position shown in the cell.
        cell = Cell(km.get_kernel(kernel_id), "print(sum(numbers), os.getpid())")

        async def resume_request() -> dict[str, Any] | None:
            _, listed = await api("GET", "requests")
            mine = [r for r in listed["requests"] if r["owner"] == kernel_id]
            return mine[0] if mine and mine[0]["state"] == "queued" else None

        waiting = await until("the kernel to ask for its GPU again", resume_request)
        assert waiting["position"] == 1 and waiting["gpus"] == 1

        async def shown() -> bool:
            return "position 1" in cell.text

        await until("the cell to show its place in the queue", shown)
        assert f"This kernel is {SUSPENDED_TEXT}: waiting for one GPU" in cell.text
        assert not cell.task.done()

        await api("DELETE", f"leases/{other['lease']['id']}")  # the other kernel is done
        out = await cell.result()
        assert out.endswith(f"Resumed on {gpu}.\n6 {pid}"), out  # same process, same variables
        assert simulator.process_memory(pid) == {gpu: KERNEL_MIB}
        _, resumed = await api("GET", f"leases/{lease_id}")
        assert resumed["suspended"] is None
    finally:
        await km.shutdown_kernel(kernel_id)
