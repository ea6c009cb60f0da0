"""How windows reach the event streams' sockets: each encoded once for an audience,
written through tornado's own output, and what a socket does not take at once buffered in
order before the next window. Read back as a client reads them: the chunked HTTP framing,
the server-sent messages, their order."""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

from jupyter_gpubroker.api import API_PREFIX


def parse(frame: bytes) -> dict[str, Any] | None:
    """A server-sent message's JSON (``None`` for a comment, such as a keepalive)."""
    data = [line[5:].strip() for line in frame.split(b"\n") if line.startswith(b"data:")]
    return json.loads(b"\n".join(data)) if data else None


async def read_chunked(reader: asyncio.StreamReader, until: Any) -> list[dict[str, Any]]:
    """The messages of a chunked response's body, each chunk's size checked, until
    ``until(messages)``."""
    body, messages = b"", []
    while not until(messages):
        size = int((await asyncio.wait_for(reader.readuntil(b"\r\n"), 10))[:-2], 16)
        body += await reader.readexactly(size)
        assert await reader.readexactly(2) == b"\r\n"
        *frames, body = body.split(b"\n\n")
        messages += [m for f in frames if (m := parse(f)) is not None]
    return messages


async def test_big_windows_reach_every_stream_whole_and_in_order(
    jp_serverapp, jp_http_port, jp_base_url
):
    """A user's two fronts, with small receive buffers, which read only once four windows
    are over (the server's socket takes part of them, tornado keeps the rest): both get
    every request's latest state, the same messages in the order of ids, in well-formed
    chunks."""
    team = jp_serverapp.web_app.settings["gpubroker_api"]
    owner = team.user_identity(jp_serverapp.web_app.settings["gpubroker"].owner)
    streams = []
    for _ in range(2):
        small = socket.socket()
        small.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        small.connect(("127.0.0.1", jp_http_port))
        reader, writer = await asyncio.open_connection(sock=small)
        writer.write(
            f"GET {jp_base_url}{API_PREFIX}/events HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: token {jp_serverapp.identity_provider.token}\r\n\r\n".encode()
        )
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        assert b"Transfer-Encoding: chunked" in head
        await read_chunked(reader, lambda ms: ms)  # its hello
        streams.append((reader, writer))
    ended = []
    for _ in range(4):  # four windows of 20 requests ended: about 30 kB each
        for _ in range(20):
            r = team.submit(owner, {"profile": "1g.10gb", "owner": "nb"})
            team.cancel(owner, r["id"])
            ended.append(r["id"])
        await asyncio.sleep(jp_serverapp.web_app.settings["gpubroker"].events.fanout.window_s)

    def done(messages: list[dict[str, Any]]) -> bool:
        return {m["data"].get("request_id") for m in messages} >= set(ended)

    seen = [await read_chunked(reader, done) for reader, _ in streams]
    for messages in seen:
        ends = [m for m in messages if m["data"].get("request_id") in ended]
        assert [m["data"]["request_id"] for m in ends] == ended
        assert all(m["data"]["request"]["state"] == "released" for m in ends)
        assert [m["id"] for m in messages] == sorted(m["id"] for m in messages)
    assert [m["id"] for m in seen[0]] == [m["id"] for m in seen[1]]
    for _, writer in streams:
        writer.close()
