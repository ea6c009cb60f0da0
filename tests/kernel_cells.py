"""Running a cell in a real kernel from a test that shares its event loop with the server."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


async def execute(
    client: Any, code: str, hook: Callable[[dict[str, Any]], None], timeout: float = 60.0
) -> None:
    """Run ``code``, handing each of its output messages to ``hook``, until the kernel is
    idle again. Not ``execute_interactive``: in older jupyter-clients (8.3, the declared
    minimum) it polls zmq without yielding, which blocks the loop, and with it the server
    that a GPU kernel calls before each cell."""
    msg_id = client.execute(code)
    deadline = time.monotonic() + timeout
    while True:
        msg = await client.get_iopub_msg(timeout=max(deadline - time.monotonic(), 0.1))
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return
        hook(msg)


def one_line_error(executed: Any, cell: int) -> str:
    """The cell failed with exactly one readable line, no traceback."""
    errors = [o for o in executed.outputs(cell) if o["output_type"] == "error"]
    assert len(errors) == 1, executed.outputs(cell)
    (line,) = errors[0]["traceback"]
    assert "\n" not in line and "Traceback" not in line and "File " not in line
    return str(line)
