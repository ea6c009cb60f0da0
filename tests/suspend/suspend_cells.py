"""A cell running in a real kernel, a GPU kernel that can be suspended, and waiting for a
condition (tests/suspend)."""

from __future__ import annotations

import asyncio
from typing import Any

from kernel_cells import execute

KERNEL_MIB = 4096
"""What a suspendable kernel holds on its GPU, as CUDA in it would."""


class Cell:
    """A cell running in a kernel, with everything it shows (printed text, displayed text,
    errors) as it comes."""

    def __init__(self, km: Any, code: str) -> None:
        self.client = km.client()
        self.client.start_channels()
        self.out: list[str] = []
        self.task = asyncio.ensure_future(self._run(code))

    async def _run(self, code: str) -> None:
        await self.client.wait_for_ready(timeout=60)

        def hook(msg: dict[str, Any]) -> None:
            content = msg["content"]
            if msg["msg_type"] == "stream":
                self.out.append(content["text"])
            elif msg["msg_type"] in ("display_data", "execute_result"):
                self.out.append(content["data"].get("text/plain", "") + "\n")
            elif msg["msg_type"] == "error":
                self.out.append("\n".join(content["traceback"]))

        await execute(self.client, code, hook, timeout=120)

    @property
    def text(self) -> str:
        return "".join(self.out)

    async def shows(self, text: str) -> bool:
        """Whether the cell has shown ``text`` yet (a predicate for ``until``)."""
        return text in self.text

    async def result(self) -> str:
        try:
            await asyncio.wait_for(self.task, 120)
        finally:
            self.client.stop_channels()
        return self.text.strip()


async def until(what: str, predicate: Any, timeout: float = 30.0) -> Any:
    deadline = asyncio.get_running_loop().time() + timeout
    while not (found := await predicate()):
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)
    return found


async def use_gpu(jp_serverapp: Any, api: Any, kernel_id: str) -> Any:
    """Set a variable in a GPU kernel and list its process on its GPU with
    ``KERNEL_MIB``: (kernel id, its pid, its lease, its GPU)."""
    km = jp_serverapp.kernel_manager
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


def granted(api: Any, request_id: str) -> Any:
    """A predicate for ``until``: the request, once granted."""

    async def found() -> dict[str, Any] | None:
        _, r = await api("GET", f"requests/{request_id}")
        return r if r["state"] == "granted" else None

    return found


def queued(api: Any, kernel_id: str) -> Any:
    """A predicate for ``until``: the kernel's request, once it waits in the queue."""

    async def found() -> dict[str, Any] | None:
        _, listed = await api("GET", "requests")
        mine = [r for r in listed["requests"] if r["holder"] == kernel_id]
        return mine[0] if mine and mine[0]["state"] == "queued" else None

    return found


def driver_of(jp_serverapp: Any) -> Any:
    """The simulated checkpoint driver of the server's broker (faults are injected there)."""
    return jp_serverapp.web_app.settings["gpubroker"].suspender.suspender.driver
