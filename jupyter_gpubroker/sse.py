"""The broker's server-sent events as they arrive: one decoded message at a time from a
streaming httpx response, framed by httpx-sse (any of the line ends the SSE format
allows: ``\\n``, ``\\r\\n``, ``\\r``). ``BrokerClient.events`` opens the response."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncGenerator
from typing import Any

import httpx
from httpx_sse import EventSource


async def messages(response: httpx.Response) -> AsyncGenerator[dict[str, Any], None]:
    """Each message's JSON (``{v, id, type, at, data}``); comments (keepalives) give none."""
    async with contextlib.aclosing(EventSource(response).aiter_sse()) as events:
        async for event in events:
            if event.data:
                yield json.loads(event.data)
