"""A suspended kernel restarted by its user through the server's kernel restart API (what
JupyterLab's "Restart Kernel" calls) while its next cell waits in the queue for its GPU.

What must happen: the restart makes a new process, so the suspension ends (its memory on
the host went with the old process) and the old process's waiting resume leaves the
queue; the new process asks for a GPU as any new kernel of its kernelspec does, and gets
one once free; nothing of the old process stays held: no checkpoint in the driver, no
request queued, no lease but the new process's."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from suspend_cells import Cell, driver_of, ended, granted, queued, until

from jupyter_gpubroker.wire.text import ENDED_RESTARTED

pytestmark = pytest.mark.slow  # real kernels, seconds-long timeouts


async def test_a_suspended_kernel_restarted_while_its_cell_waits_leaves_nothing_stranded(
    jp_serverapp: Any, jp_fetch: Any, api: Any, km: Any, simulator: Any, suspendable: Any
) -> None:
    kernel_id, pid, lease_id, gpu = suspendable
    _, other = await api("POST", "requests", {"gpus": 1, "holder": "other-kernel"})
    await ended(api, lease_id)  # suspended: the other request gets the GPU
    other = await until("the other request to get the GPU", granted(api, other["id"]))

    cell = Cell(km.get_kernel(kernel_id), "print(numbers)")  # its resume waits in the queue
    waiting = await until("the kernel to ask for its GPU again", queued(api, kernel_id))

    restart = asyncio.ensure_future(
        jp_fetch("api", "kernels", kernel_id, "restart", method="POST", body="{}")
    )

    async def over() -> dict[str, Any] | None:
        _, lease = await api("GET", f"leases/{lease_id}")
        return lease if lease["suspended"] is None else None

    lease = await until("the suspension to end", over)
    assert lease["reason"].endswith(f"on the host; {ENDED_RESTARTED}"), lease["reason"]
    _, resume = await api("GET", f"requests/{waiting['id']}")
    assert resume["state"] == "cancelled", resume  # the old process's resume left the queue
    assert driver_of(jp_serverapp).held() == {}  # no checkpoint kept for a gone process

    # The new process asks for a GPU as a new kernel does; it gets it once the other is done.
    await asyncio.sleep(1)
    assert not restart.done()  # the new process waits for a GPU: the other holds the only one
    await api("DELETE", f"leases/{other['lease']['id']}")
    response = await asyncio.wait_for(restart, 120)
    assert response.code == 200 and json.loads(response.body)["id"] == kernel_id
    cell.task.cancel()  # the old process never answers the cell it was sent
    cell.client.stop_channels()
    out = await Cell(
        km.get_kernel(kernel_id),
        "import os\nprint(os.getpid(), os.environ['GPUBROKER_LEASE_ID'], 'numbers' in dir())",
    ).result()
    new_pid, new_lease_id, kept = out.split()[-3:]
    assert int(new_pid) != pid and new_lease_id != lease_id and kept == "False", out
    _, new = await api("GET", f"leases/{new_lease_id}")
    assert new["state"] == "active" and new["devices"] == [gpu]
    assert simulator.process_memory(pid) == {}  # nothing of the old process
    _, listed = await api("GET", "requests")
    assert [r["state"] for r in listed["requests"] if r["holder"] == kernel_id] == ["granted"]
    _, leases = await api("GET", "leases")
    assert [x["id"] for x in leases["leases"] if x["state"] == "active"] == [new_lease_id]
