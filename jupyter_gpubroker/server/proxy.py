"""The API of a server in remote mode: ``{base_url}gpubroker/api/v1/`` passed to the central
broker as this server's user.

A server whose environment names a central broker (``c.GPUBrokerExtension.broker_url``,
default ``$GPUBROKER_URL``: the JupyterHub service) runs no broker of its own, so that
the fronts of this server (the Lab panel, the CLI finding it with ``jupyter server
list``) still have one URL per server: each call the server authenticates and
authorizes (as every route of it) goes on to the central broker with the user's own
credential (``jupyter_token``, default ``$JUPYTERHUB_API_TOKEN``), and its answer comes
back as it is, status and body; the event stream is relayed message by message, with
its ids and ``Last-Event-ID`` resume. A central broker that does not answer is a 502
that names it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator
from typing import Any

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from tornado import web
from tornado.iostream import StreamClosedError

from ..api import API_PREFIX
from ..client import BrokerAPIError, BrokerClient, NoReply
from ..events import frame
from .registry import unreachable_text


class ProxyHandler(APIHandler):
    """Every method of every API path, relayed to the central broker."""

    auth_resource = "gpubroker"
    keepalive_s = 15.0

    def initialize(self, broker_url: str, jupyter_token: str) -> None:
        self.broker = BrokerClient(broker_url, token=jupyter_token)

    @web.authenticated
    @authorized
    async def get(self, path: str) -> None:
        if path == "events":
            await self._stream()
        else:
            await self._relay()

    @web.authenticated
    @authorized
    async def post(self, path: str) -> None:
        await self._relay()

    @web.authenticated
    @authorized
    async def put(self, path: str) -> None:
        await self._relay()

    @web.authenticated
    @authorized
    async def delete(self, path: str) -> None:
        await self._relay()

    @web.authenticated
    @authorized
    async def patch(self, path: str) -> None:
        await self._relay()

    def _path(self) -> str:
        """The path under the API prefix, with its query."""
        prefix = f"{self.base_url.rstrip('/')}/{API_PREFIX}/"
        return self.request.uri[len(prefix) :] if self.request.uri else ""

    async def _relay(self) -> None:
        try:
            response = await self.broker.fetch(
                self.request.method or "GET", self._path(), self.request.body or None
            )
        except (OSError, NoReply) as e:
            self._unreachable(e)
            return
        self.set_status(response.status_code)
        if response.content:
            self.set_header(
                "Content-Type", response.headers.get("Content-Type", "application/json")
            )
            self.write(response.content)
        self.finish()

    async def _stream(self) -> None:
        """The central broker's event stream, message by message; a keepalive comment
        when it is quiet. The query goes on as it came (``snapshot=true``: the panel's
        first stream starts with the whole picture). Its first message (a ``hello``, a
        ``snapshot`` or what a reconnect missed) decides the answer: until then a refusal
        is relayed as the JSON error it is."""
        last = self.request.headers.get("Last-Event-ID") or self.get_argument("last_event_id", None)
        events = self.broker.events(last or None, self.request.query)
        try:
            try:
                first = await self._next(events, keepalive=False)
            except (NoReply, OSError) as e:
                self._unreachable(e)
                return
            except BrokerAPIError as e:
                self._error(e.status, e.code, e.message)
                return
            self.set_header("Content-Type", "text/event-stream")
            self.set_header("Cache-Control", "no-cache")
            message: dict[str, Any] | None = first
            while message is not None:
                self.write(frame(message))
                await self.flush()
                message = await self._next(events)
        except (BrokerAPIError, OSError, StopAsyncIteration, StreamClosedError):
            pass  # the central stream or this client went away: the client reconnects
        finally:
            if self._pending is not None and not self._pending.done():
                self._pending.cancel()
                with contextlib.suppress(BaseException):
                    await self._pending
            await events.aclose()

    _pending: asyncio.Future[dict[str, Any]] | None = None

    async def _next(
        self, events: AsyncGenerator[dict[str, Any], None], keepalive: bool = True
    ) -> dict[str, Any] | None:
        """The stream's next message, writing a keepalive while it is quiet (once the
        stream's answer began); ``None`` once this client went away."""
        self._pending = asyncio.ensure_future(anext(events))
        wait = self.keepalive_s if keepalive else None
        while not (await asyncio.wait({self._pending}, timeout=wait))[0]:
            self.write(": keepalive\n\n")
            await self.flush()
        return None if self._pending.cancelled() else self._pending.result()

    def on_connection_close(self) -> None:
        """Close the central stream at once rather than at its next message."""
        if self._pending is not None:
            self._pending.cancel()

    def _unreachable(self, e: BaseException) -> None:
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        self._error(502, "broker_unreachable", unreachable_text(self.broker.url, why))

    def _error(self, status: int, code: str, message: str) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"error": code, "message": message}))


def proxy_handlers(
    broker_url: str, jupyter_token: str
) -> list[tuple[str, type[APIHandler], dict[str, str]]]:
    options = {"broker_url": broker_url, "jupyter_token": jupyter_token}
    return [(f"/{API_PREFIX}/?(.*)", ProxyHandler, options)]
