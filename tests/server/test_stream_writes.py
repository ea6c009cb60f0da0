"""How a window reaches the event streams' sockets: framed once for all of them, a big one
sent from one file in memory (``sendfile``), and what a socket does not take at once
buffered in order before the next window. Read back as a client reads them: the chunked
HTTP framing, the server-sent messages, their order."""

from __future__ import annotations

import asyncio
import os
import socket
from typing import Any

from tornado.iostream import IOStream

from jupyter_gpubroker.api import API_PREFIX
from jupyter_gpubroker.events import Chunk, frame
from jupyter_gpubroker.server import handlers
from jupyter_gpubroker.sse import parse_message


def window(first_id: int, end: int) -> Chunk:
    """Messages ``first_id`` to ``end`` (not included), of about a kilobyte each, as a
    window encodes them."""
    ids = range(first_id, end)
    messages = [{"v": 1, "id": i, "type": "granted", "data": "x" * 1000} for i in ids]
    return Chunk("".join(map(frame, messages)).encode())


def sendfile_calls(monkeypatch: Any) -> list[tuple[int, int]]:
    """(bytes asked, bytes sent) of each ``sendfile`` the writer makes."""
    calls: list[tuple[int, int]] = []
    real = os.sendfile

    def counted(out: int, in_: int, offset: int, count: int) -> int:
        try:
            sent = real(out, in_, offset, count)
        except BlockingIOError:
            sent = 0
            raise
        finally:
            calls.append((count, sent))
        return sent

    monkeypatch.setattr(os, "sendfile", counted)
    return calls


async def read_chunked(reader: asyncio.StreamReader, until: Any) -> list[dict[str, Any]]:
    """The messages of a chunked response's body, each chunk's size checked, until
    ``until(messages)``."""
    body, messages = b"", []
    while not until(messages):
        size = int((await asyncio.wait_for(reader.readuntil(b"\r\n"), 10))[:-2], 16)
        body += await reader.readexactly(size)
        assert await reader.readexactly(2) == b"\r\n"
        *frames, body = body.split(b"\n\n")
        messages += [m for f in frames if (m := parse_message(f.decode())) is not None]
    return messages


async def test_a_full_socket_gets_the_rest_of_a_window_before_the_next(monkeypatch):
    """The socket takes part of the first window; the rest waits in the stream's buffer,
    and the next window goes after it (not by ``sendfile``, which would overtake it)."""
    calls = sendfile_calls(monkeypatch)
    ours, theirs = socket.socketpair()
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    stream = IOStream(ours)
    first, second = window(1, 101), window(101, 201)
    handlers.EventsHandler._send(stream, first)
    handlers.EventsHandler._send(stream, second)
    assert len(calls) == 1 and 0 < calls[0][1] < calls[0][0]  # the first, in part
    reader, writer = await asyncio.open_connection(sock=theirs)
    messages = await read_chunked(reader, lambda ms: len(ms) == 200)
    assert [m["id"] for m in messages] == list(range(1, 201))
    writer.close()
    stream.close()


async def test_big_windows_reach_every_stream_whole_and_in_order(
    jp_serverapp, jp_http_port, jp_base_url, monkeypatch
):
    """A user's two fronts, which read only once four windows are over: both get every
    request's latest state, the same messages in the order of ids, in well-formed
    chunks; the windows went to the sockets from one file each."""
    calls = sendfile_calls(monkeypatch)
    team = jp_serverapp.web_app.settings["gpubroker_api"]
    owner = team.user_identity(jp_serverapp.web_app.settings["gpubroker"].owner)
    streams = []
    for _ in range(2):
        reader, writer = await asyncio.open_connection("127.0.0.1", jp_http_port)
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
    assert any(sent == asked for asked, sent in calls)
    for _, writer in streams:
        writer.close()
