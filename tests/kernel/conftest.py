"""Notebooks executed (nbclient) in real kernels of the test server (tests/conftest.py).

Each kernel is started by the server's kernel manager, through the GPU provisioner
where a test needs the broker, and driven by nbclient through that manager; every
comm message a cell receives is kept, so tests read the widgets' state models.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import nbformat
import pytest
from jupyter_server.utils import url_path_join
from nbclient import NotebookClient

from jupyter_gpubroker.api import API_PREFIX


class RecordingClient(NotebookClient):  # type: ignore[misc]
    """nbclient that also keeps every comm message each cell receives."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.comms: dict[int, list[dict[str, Any]]] = defaultdict(list)

    def handle_comm_msg(self, outs: Any, msg: dict[str, Any], cell_index: int) -> None:
        self.comms[cell_index].append(msg)
        super().handle_comm_msg(outs, msg, cell_index)


@dataclass
class Executed:
    """An executed notebook and the comm messages of each of its cells."""

    nb: Any
    comms: dict[int, list[dict[str, Any]]] = field(default_factory=dict)

    def outputs(self, cell: int) -> list[dict[str, Any]]:
        return list(self.nb.cells[cell].outputs)

    def text(self, cell: int) -> str:
        """What a cell shows without widgets: its streams, errors and text/plain data."""
        parts = []
        for out in self.outputs(cell):
            if out["output_type"] == "stream":
                parts.append(out["text"])
            elif out["output_type"] == "error":
                parts.append("\n".join(out["traceback"]))
            elif "text/plain" in out.get("data", {}):
                parts.append(out["data"]["text/plain"])
        return "\n".join(parts).strip()

    def stdout(self, cell: int) -> str:
        """What the cell printed."""
        return "".join(o["text"] for o in self.outputs(cell) if o.get("name") == "stdout").strip()

    def states(self, cell: int, key: str = "position") -> list[dict[str, Any]]:
        """Successive states of the widget models (opened in this cell) that have ``key``."""
        models: dict[str, dict[str, Any]] = {}
        seen: list[dict[str, Any]] = []
        for msg in self.comms.get(cell, []):
            data, comm_id = msg["content"].get("data", {}), msg["content"]["comm_id"]
            if "state" not in data:
                continue
            models[comm_id] = {**models.get(comm_id, {}), **data["state"]}
            if key in models[comm_id]:
                seen.append(dict(models[comm_id]))
        return seen


Run = Callable[..., Awaitable[Executed]]


@pytest.fixture
def notebook(jp_serverapp: Any) -> Run:
    """Execute cells (or a notebook) top to bottom in a running kernel of the server."""

    async def run(
        kernel_id: str, *cells: str, nb: Any = None, allow_errors: bool = True
    ) -> Executed:
        nb = nb or nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
        km = jp_serverapp.kernel_manager.get_kernel(kernel_id)
        client = RecordingClient(nb, km=km, timeout=60, allow_errors=allow_errors)
        try:
            await client.async_execute()
        finally:
            if client.kc is not None:
                client.kc.stop_channels()
        return Executed(nb, dict(client.comms))

    return run


@pytest.fixture
def kernel(
    jp_serverapp: Any, gpu_kernelspec: Callable[..., str], http_server_client: Any
) -> Callable[..., Awaitable[str]]:
    """Start a kernel of the server (served on its port: kernels reach the broker's API
    over HTTP): by default an on-demand GPU kernel (the broker's URL and a kernel token,
    %gpu loaded, no GPU); ``name`` another kernelspec."""

    async def start(name: str | None = None) -> str:
        name = name or gpu_kernelspec("gpu-on-demand", on_demand=True)
        return str(await jp_serverapp.kernel_manager.start_kernel(kernel_name=name))

    return start


@pytest.fixture
def broker_config(broker_config: dict[str, Any]) -> dict[str, Any]:
    """Leases of a minute: no kernel test is about expiry (tests/server/test_kernels.py
    is), and the other workload's leases (``fill``) must outlast a starved event loop,
    which a loaded CI machine gives the renewals below for seconds at a time."""
    return {**broker_config, "lease_ttl": 60.0}


@pytest.fixture
def fill(
    api: Callable[..., Awaitable[Any]], request: pytest.FixtureRequest
) -> Callable[[int], Awaitable[list[str]]]:
    """Take ``n`` of the seven 1g.10gb slices for another workload, which keeps renewing
    them (however slow the machine, they do not expire under the test); returns the lease
    ids. A lease the test releases is simply no longer renewed."""

    async def renew(leases: list[str]) -> None:
        while True:
            await asyncio.sleep(1)
            for lease in leases:
                await api("POST", f"leases/{lease}/renew")

    async def take(n: int = 7) -> list[str]:
        leases = []
        for _ in range(n):
            status, r = await api("POST", "requests", {"profile": "1g.10gb", "holder": "batch-job"})
            assert status == 201 and r["state"] == "granted", r
            leases.append(r["lease"]["id"])
        request.addfinalizer(asyncio.ensure_future(renew(leases)).cancel)
        return leases

    return take


async def until(predicate: Callable[[], Awaitable[Any]], timeout: float = 20.0) -> Any:
    """Poll an async predicate until it returns something truthy."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not (value := await predicate()):
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.1)
    return value


@pytest.fixture
def wait_until() -> Callable[..., Awaitable[Any]]:
    return until


@pytest.fixture
def broker_env(jp_serverapp: Any, http_server_client: Any) -> dict[str, str]:
    """What a plain kernel or a terminal needs to reach the served broker: its URL and
    the server's Jupyter token."""
    return {
        "GPUBROKER_URL": url_path_join(jp_serverapp.connection_url, API_PREFIX),
        "GPUBROKER_JUPYTER_TOKEN": jp_serverapp.identity_provider.token,
    }
