"""REST handlers of ``{base_url}gpubroker/api/v1/`` (described in ``api/openapi.yaml``).

Thin adapters of the API layer (``api.rules.BrokerAPI``) to jupyter-server: each
handler parses its HTTP input, builds the caller's ``Identity`` from the server's
auth, calls the API and writes the answer; every rule of who may see or do what is
the API layer's. Every method is authenticated (``@web.authenticated``) and
authorized (``@authorized``, resource ``gpubroker``). A caller is either a Jupyter
user (the server's identity provider) or a kernel presenting its kernel-scoped
token in the ``X-GPUBroker-Token`` header.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from jupyter_server.auth.decorator import authorized
from jupyter_server.auth.identity import User
from jupyter_server.base.handlers import APIHandler
from tornado import web
from tornado.iostream import StreamClosedError

from ..api import API_PREFIX, TOKEN_HEADER
from ..api.identity import Identity
from ..api.rules import BrokerAPI
from ..broker.errors import BrokerError, InvalidRequest, NotFound
from ..runtime import Positions, Published


class BrokerHandler(APIHandler):
    auth_resource = "gpubroker"
    who: Identity

    @property
    def api(self) -> BrokerAPI:
        return self.settings["gpubroker_api"]  # type: ignore[no-any-return]

    async def prepare(self) -> None:  # type: ignore[override]
        if not self.check_host():  # jupyter-server's DNS-rebinding guard, for kernel tokens too
            raise web.HTTPError(403, "the Host header does not name this server")
        token = self.request.headers.get(TOKEN_HEADER)
        if token is None:
            await super().prepare()
            user = self.current_user
            if user is not None:
                self.who = self.api.user_identity(user.username)
            return
        # A custom header cannot be sent cross-site without a CORS preflight, so a
        # kernel token needs no XSRF check.
        who = self.api.token_identity(token)
        if who is None:
            raise web.HTTPError(403, "unknown or revoked GPU broker token")
        self.who = who
        self.current_user = self._jupyter_current_user = User(username=who.user)

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        if isinstance(exc, BrokerError):
            body = exc.to_json()
        else:
            message = getattr(exc, "log_message", None) or self._reason
            body = {"error": f"http_{status_code}", "message": message}
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(body))

    def _handle_request_exception(self, e: BaseException) -> None:
        if isinstance(e, BrokerError):
            self.send_error(e.status, exc_info=(type(e), e, e.__traceback__))
            return
        super()._handle_request_exception(e)  # type: ignore[arg-type]

    def body(self) -> dict[str, Any]:
        """The body's JSON object; an empty body, bytes that are not UTF-8 and JSON that
        is malformed or nested too deep are 400s."""
        if not self.request.body:
            raise InvalidRequest("the body is empty: send a JSON object")
        try:
            data = json.loads(self.request.body)
        except (ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError
            raise InvalidRequest(f"the body is not valid UTF-8 JSON: {e}") from None
        if not isinstance(data, dict):
            raise InvalidRequest("the body must be a JSON object")
        return data

    def reply(self, data: Any, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(data))


class MeHandler(BrokerHandler):
    @web.authenticated
    @authorized
    def get(self) -> None:
        self.reply(self.api.me(self.who))


class DevicesHandler(BrokerHandler):
    @web.authenticated
    @authorized
    def get(self) -> None:
        self.reply(self.api.devices(self.who))


class DeviceMetricsHandler(BrokerHandler):
    @web.authenticated
    @authorized
    def get(self, uuid: str) -> None:
        self.reply(self.api.device_metrics(self.who, uuid, self.get_argument("since", None)))


class QueueHandler(BrokerHandler):
    @web.authenticated
    @authorized
    def get(self) -> None:
        self.reply(self.api.queue(self.who))


class RequestsHandler(BrokerHandler):
    @web.authenticated
    @authorized
    def get(self) -> None:
        self.reply(self.api.requests(self.who))

    @web.authenticated
    @authorized
    def post(self) -> None:
        self.reply(self.api.submit(self.who, self.body()), 201)


class RequestHandler(BrokerHandler):
    @web.authenticated
    @authorized
    def get(self, request_id: str) -> None:
        self.reply(self.api.request(self.who, request_id))

    @web.authenticated
    @authorized
    def delete(self, request_id: str) -> None:
        self.reply(self.api.cancel(self.who, request_id))


class RequestRenewHandler(BrokerHandler):
    @web.authenticated
    @authorized
    def post(self, request_id: str) -> None:
        self.reply(self.api.renew_request(self.who, request_id))


class LeasesHandler(BrokerHandler):
    @web.authenticated
    @authorized
    def get(self) -> None:
        self.reply(self.api.leases(self.who))


class LeaseHandler(BrokerHandler):
    @web.authenticated
    @authorized
    def get(self, lease_id: str) -> None:
        self.reply(self.api.lease(self.who, lease_id))

    @web.authenticated
    @authorized
    def delete(self, lease_id: str) -> None:
        self.reply(self.api.release(self.who, lease_id))


class RenewHandler(BrokerHandler):
    @web.authenticated
    @authorized
    def post(self, lease_id: str) -> None:
        self.reply(self.api.renew(self.who, lease_id))


class KeepHandler(BrokerHandler):
    @web.authenticated
    @authorized
    def post(self, lease_id: str) -> None:
        self.reply(self.api.keep(self.who, lease_id))


class UsageHandler(BrokerHandler):
    @web.authenticated
    @authorized
    def get(self) -> None:
        since, until = (self.get_argument(k, None) for k in ("since", "until"))
        self.reply(self.api.usage(self.who, self.get_argument("by", "user"), since, until))


class QuotasHandler(BrokerHandler):
    @web.authenticated
    @authorized
    def get(self) -> None:
        self.reply(self.api.quotas(self.who))


class QuotaHandler(BrokerHandler):
    @web.authenticated
    @authorized
    def put(self, kind: str, name: str) -> None:
        self.reply(self.api.set_quota(self.who, kind, name, self.body()))

    @web.authenticated
    @authorized
    def delete(self, kind: str, name: str) -> None:
        self.api.delete_quota(self.who, kind, name)
        self.set_status(204)
        self.finish()


class TokensHandler(BrokerHandler):
    """Kernel-scoped tokens, issued to a user's own kernel provisioners."""

    @web.authenticated
    @authorized
    def post(self) -> None:
        self.reply(self.api.issue_token(self.who, self.body()), 201)


class TokenHandler(BrokerHandler):
    """The caller's tokens for one kernel."""

    @web.authenticated
    @authorized
    def delete(self, kernel_id: str) -> None:
        self.api.revoke_tokens(self.who, kernel_id)
        self.set_status(204)
        self.finish()


class OverviewHandler(BrokerHandler):
    @web.authenticated
    @authorized
    def get(self) -> None:
        self.reply(self.api.overview(self.who))


class EventsHandler(BrokerHandler):
    """Server-sent events with ids: the caller's own events in full and, when one of its
    waiting requests moves, its new positions; a reconnect with ``Last-Event-ID`` (or
    ``?last_event_id=``) gets what it missed, or a snapshot when that is gone."""

    keepalive_s = 15.0

    @web.authenticated
    @authorized
    async def get(self) -> None:
        last = self._last_event_id()
        self.set_header("Content-Type", "text/event-stream")
        self.set_header("Cache-Control", "no-cache")
        items: asyncio.Queue[str | None] = asyncio.Queue()
        self._items = items
        api, who = self.api, self.who

        def deliver(item: Published | Positions) -> None:
            """Decided at once, during the fan-out: the stream wakes only for what it
            sends, and a message every stream sends alike is encoded once."""
            seen = api.moved(who, item) if isinstance(item, Positions) else api.event(who, item)
            if seen is not None:
                items.put_nowait(_frame(seen))

        unsubscribe = api.runtime.subscribe(deliver)
        try:
            for message in api.resume(who, last):  # no await since subscribing: no gap
                self.write(_frame(message))
            await self.flush()
            while True:
                try:
                    item = await asyncio.wait_for(items.get(), self.keepalive_s)
                except asyncio.TimeoutError:
                    self.write(": keepalive\n\n")
                    await self.flush()
                    continue
                if item is None:  # the client went away
                    return
                self.write(item)
                while not items.empty():  # a burst goes out in one write
                    queued = items.get_nowait()
                    if queued is None:
                        return
                    self.write(queued)
                await self.flush()
        except StreamClosedError:
            pass
        finally:
            unsubscribe()

    def _last_event_id(self) -> int | None:
        text = self.request.headers.get("Last-Event-ID") or self.get_argument("last_event_id", None)
        if text is None or text == "":
            return None
        try:
            return int(text)
        except ValueError:
            raise InvalidRequest(
                f"Last-Event-ID must be the id of an event of this stream, not {text!r}; "
                "reconnect without it to start afresh"
            ) from None

    def on_connection_close(self) -> None:
        """Stop streaming at once rather than at the next event or keepalive."""
        items = getattr(self, "_items", None)
        if items is not None:
            items.put_nowait(None)


_encoded: tuple[dict[str, Any], str] | None = None
"""The last message encoded: during a fan-out, every stream that sees an event alike
gets the same message object (``api.rules.event``), one after another."""


def _frame(message: dict[str, Any]) -> str:
    """A message as one server-sent event: its ``id:`` line and its JSON."""
    global _encoded
    if _encoded is None or _encoded[0] is not message:
        _encoded = (message, f"id: {message['id']}\ndata: {json.dumps(message)}\n\n")
    return _encoded[1]


class UnknownPathHandler(BrokerHandler):
    """Any other path under the API prefix: the API's JSON 404 (403 without a valid
    credential), not Jupyter's HTML page."""

    async def prepare(self) -> None:  # type: ignore[override]
        await super().prepare()
        if self.current_user is None:
            raise web.HTTPError(403)
        raise NotFound(f"no API path {self.request.path!r}; see the API document, openapi.yaml")


def handlers() -> list[tuple[str, type[BrokerHandler]]]:
    """URL patterns (relative to the server's base URL) and their handlers."""
    ident = r"([^/]+)"  # any segment: the handler says what is wrong with it (400, 404)
    routes = [
        ("me", MeHandler),
        ("overview", OverviewHandler),
        ("devices", DevicesHandler),
        (f"devices/{ident}/metrics", DeviceMetricsHandler),
        ("queue", QueueHandler),
        ("requests", RequestsHandler),
        (f"requests/{ident}", RequestHandler),
        (f"requests/{ident}/renew", RequestRenewHandler),
        ("leases", LeasesHandler),
        (f"leases/{ident}", LeaseHandler),
        (f"leases/{ident}/renew", RenewHandler),
        (f"leases/{ident}/keep", KeepHandler),
        ("usage", UsageHandler),
        ("quotas", QuotasHandler),
        (f"quotas/{ident}/{ident}", QuotaHandler),
        ("events", EventsHandler),
        ("tokens", TokensHandler),
        (f"tokens/{ident}", TokenHandler),
    ]
    found = [(f"/{API_PREFIX}/{path}", handler) for path, handler in routes]
    return [*found, (f"/{API_PREFIX}(?:/.*)?", UnknownPathHandler)]
