"""Server-sent events as they arrive: a response read chunk by chunk and the messages in
it. ``BrokerClient.events`` opens the connection itself (tornado's HTTP client cannot
abort a streaming fetch); this is what it reads with."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from tornado.http1connection import HTTP1Connection
from tornado.httputil import (
    HTTPHeaders,
    HTTPMessageDelegate,
    RequestStartLine,
    ResponseStartLine,
)


class StreamedResponse(HTTPMessageDelegate):
    """A response read as it arrives: its status, then its body chunk by chunk."""

    def __init__(self) -> None:
        self.code: int | None = None
        """The status, once the headers arrived (before any chunk)."""
        self.reason = ""
        self.chunks: asyncio.Queue[bytes | None] = asyncio.Queue()
        """The body so far; ``None`` once it ended (``error`` says if it broke)."""
        self.error: Exception | None = None

    async def read(self, connection: HTTP1Connection) -> None:
        try:
            await connection.read_response(self)
        except Exception as e:  # the connection broke: the stream ends with this error
            self.error = e
        finally:
            self.chunks.put_nowait(None)

    def headers_received(
        self, start_line: RequestStartLine | ResponseStartLine, headers: HTTPHeaders
    ) -> None:
        assert isinstance(start_line, ResponseStartLine)
        self.code, self.reason = start_line.code, start_line.reason

    def data_received(self, chunk: bytes) -> None:
        self.chunks.put_nowait(chunk)


def parse_message(frame: str) -> dict[str, Any] | None:
    """One server-sent message's JSON (``None`` for a comment, such as a keepalive)."""
    data = [line[5:].lstrip() for line in frame.splitlines() if line.startswith("data:")]
    return json.loads("\n".join(data)) if data else None
