"""A cell running in a real kernel, and waiting for a condition (tests/suspend)."""

from __future__ import annotations

import asyncio
from typing import Any

from kernel_cells import execute


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
