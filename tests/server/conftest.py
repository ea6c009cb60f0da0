"""A real jupyter-server with the extension on a simulated one-GPU MIG machine, real kernels
(the server fixtures are shared with tests/kernel, in tests/conftest.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager
from typing import Any

import pytest

from jupyter_gpubroker.api import API_PREFIX


@pytest.fixture(autouse=True)
def _listening(http_server_client: Any) -> None:
    """Serve the app on its port: provisioners reach the broker's API over HTTP."""


@pytest.fixture
def mps_dir() -> Iterator[str]:
    """Where the broker keeps its MPS daemons' pipes and logs (short: a socket's path
    has room for 108 bytes)."""
    with tempfile.TemporaryDirectory(prefix="mps", dir="/tmp") as d:
        yield d


@pytest.fixture
def extension_log() -> Iterator[list[logging.LogRecord]]:
    """What the extension logs at INFO or above from the server's start on (a filter: the
    server replaces the logger's handlers when it configures it)."""
    records: list[logging.LogRecord] = []

    def keep(record: logging.LogRecord) -> bool:
        if record.levelno >= logging.INFO:
            records.append(record)
        return True

    logger = logging.getLogger("GPUBrokerExtension")
    logger.addFilter(keep)
    yield records
    logger.removeFilter(keep)


@pytest.fixture
def extension(jp_serverapp: Any) -> Any:
    """The server's GPUBrokerExtension."""
    (point,) = jp_serverapp.extension_manager.extensions[
        "jupyter_gpubroker"
    ].extension_points.values()
    return point.app


@pytest.fixture
def broker_url(jp_http_port, jp_base_url) -> str:  # type: ignore[no-untyped-def]
    return f"http://localhost:{jp_http_port}{jp_base_url}{API_PREFIX}"


@pytest.fixture
def start_cli(jp_serverapp, broker_url):  # type: ignore[no-untyped-def]
    """Start `jupyter gpubroker ...` in a subprocess against the test server (or ``url``,
    with ``token``); no traceback may ever reach its stderr."""
    token = jp_serverapp.identity_provider.token

    async def start(*args: str, json_out: bool = True, url: str = "", token: str = token):  # type: ignore[no-untyped-def]
        argv = [sys.executable, "-m", "jupyter_gpubroker.cli", *args[:1]]
        argv += ["--url", url or broker_url, "--token", token]
        argv += [*(["--json"] if json_out else []), *args[1:]]
        return await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )

    return start


@pytest.fixture
def cli(start_cli):  # type: ignore[no-untyped-def]
    """Run `jupyter gpubroker ...` to its end: (exit status, JSON or text out, stderr)."""

    async def run(*args: str, json_out: bool = True, **where: str) -> tuple[int, object, str]:
        proc = await start_cli(*args, json_out=json_out, **where)
        out, err = await proc.communicate()
        text = out.decode()
        data = json.loads(text) if json_out and proc.returncode == 0 else text
        assert "Traceback" not in err.decode()
        return proc.returncode or 0, data, err.decode()

    return run


@pytest.fixture
def held() -> Callable[..., AbstractAsyncContextManager[list[dict[str, Any]]]]:
    """``held(api, n, **fields)``: ``n`` granted 1g.10gb requests (7 fill the GPU: the next
    one queues; ``fields``: more of the request, e.g. ``limit_s``), renewed every second
    so that they outlive their 4 s TTL however slowly a CLI starts."""
    return _held


@contextlib.asynccontextmanager
async def _held(api, n: int = 1, **fields: Any) -> AsyncIterator[list[dict[str, Any]]]:  # type: ignore[no-untyped-def]
    body = {"profile": "1g.10gb", **fields}
    granted = [(await api("POST", "requests", body))[1] for _ in range(n)]

    async def renew() -> None:
        while True:
            await asyncio.sleep(1)
            for r in granted:
                await api("POST", f"leases/{r['lease']['id']}/renew")

    renewing = asyncio.ensure_future(renew())
    try:
        yield granted
    finally:
        renewing.cancel()
