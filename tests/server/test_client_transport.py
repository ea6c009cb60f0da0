"""``BrokerClient``'s transport where deployments differ: a forward proxy named in the
environment (a real one, proxy.py, in a process of its own) carries its calls and its
event stream, and closing the stream there still ends the broker's subscription; a
stream whose lines end in CRLF, as the SSE format allows, reads the same as one in LF."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from live_server import free_port
from tornado import web
from tornado.httpserver import HTTPServer

from jupyter_gpubroker.client import BrokerClient
from jupyter_gpubroker.server import handlers

SLICE = {"profile": "1g.10gb"}


@pytest.fixture
def forward_proxy(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """proxy.py on a free port: its URL and its log (one access line per request)."""
    port, log = free_port(), tmp_path / "proxy.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "proxy", "--hostname", "127.0.0.1", "--port", str(port)]
            + ["--num-workers", "1", "--num-acceptors", "1"],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        for _ in range(200):
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                break
            assert proc.poll() is None, log.read_text()
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}", log
    finally:
        proc.terminate()
        proc.wait(10)


async def test_calls_and_the_event_stream_go_through_the_environments_proxy(
    jp_serverapp: Any, forward_proxy: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, log = forward_proxy
    monkeypatch.setenv("HTTP_PROXY", url)
    for name in ("NO_PROXY", "no_proxy", "http_proxy"):
        monkeypatch.delenv(name, raising=False)
    via: list[tuple[str, str | None]] = []  # what reached the broker, and through whom
    for handler, method in ((handlers.EventsHandler, "get"), (handlers.RequestsHandler, "post")):
        real = getattr(handler, method)

        async def seen(self: Any, *a: Any, _real: Any = real, **k: Any) -> Any:
            via.append((self.request.method, self.request.headers.get("Via")))
            return await _real(self, *a, **k)

        monkeypatch.setattr(handler, method, seen)
    runtime = jp_serverapp.web_app.settings["gpubroker"]
    client = BrokerClient(runtime.api_url, token=jp_serverapp.identity_provider.token)
    async with contextlib.aclosing(client.events()) as events:
        hello = await asyncio.wait_for(anext(events), 10)
        assert hello["type"] == "hello" and runtime.events.subscribers == 1
        mine = await client.submit(**SLICE)
        granted = await asyncio.wait_for(
            anext(e async for e in events if e["data"].get("request_id") == mine["id"]), 10
        )
        assert granted["type"] == "granted"
    for _ in range(100):  # closed through the proxy: the broker lets the stream go
        if not runtime.events.subscribers:
            break
        await asyncio.sleep(0.05)
    assert runtime.events.subscribers == 0
    assert [m for m, _ in via] == ["GET", "POST"], log.read_text()
    assert all(v is not None and "proxy.py" in v for _, v in via), via


class CRLFStream(web.RequestHandler):
    """A server whose event stream ends its lines in CRLF: a comment, two messages, the
    second split between its CR and its LF."""

    async def get(self) -> None:
        self.set_header("Content-Type", "text/event-stream")
        one = {"v": 1, "id": 1, "type": "hello", "data": {}}
        two = {"v": 1, "id": 2, "type": "positions", "data": {"queue_length": 0}}
        self.write(f": keepalive\r\n\r\nid: 1\r\ndata: {json.dumps(one)}\r\n\r\n")
        await self.flush()
        self.write(f"id: 2\r\ndata: {json.dumps(two)}\r")
        await self.flush()
        await asyncio.sleep(0.1)
        self.write("\n\r\n")
        await self.flush()
        await asyncio.Event().wait()  # open until the client goes


async def test_crlf_frames_read_as_lf_ones() -> None:
    port = free_port()
    server = HTTPServer(web.Application([(r"/api/events", CRLFStream)]))
    server.listen(port, "127.0.0.1")
    try:
        client = BrokerClient(f"http://127.0.0.1:{port}/api")
        async with contextlib.aclosing(client.events()) as events:
            got = [await asyncio.wait_for(anext(events), 5) for _ in range(2)]
        assert [(m["id"], m["type"]) for m in got] == [(1, "hello"), (2, "positions")]
        assert got[1]["data"] == {"queue_length": 0}
    finally:
        server.stop()
