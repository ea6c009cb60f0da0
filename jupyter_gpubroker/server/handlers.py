"""REST handlers of the broker API (described in ``api/openapi.yaml``), for every host.

Thin adapters of the API layer (``api.rules.BrokerAPI``) to tornado: each handler parses
its HTTP input, calls the API with the caller's ``Identity`` and writes the answer; every
rule of who may see or do what is the API layer's. The handlers and the route table are
written once, as mixins, and bound by ``handlers(host)`` to a host's request handler,
which says only who the caller is (``prepare`` sets ``who``) and whether the caller may
use the broker at all (``authorize``, run by ``@authorized``): the jupyter-server's
``server.host.JupyterHost`` (the server's identity provider and authorizer, resource
``gpubroker``), the hub service's in ``hub_spawner.service`` (HubAuth and the
``custom:gpubroker:*`` scopes). This module imports tornado and the API layer only, so
the hub service loads no jupyter-server. Every method is authenticated
(``@web.authenticated``) and authorized (``@authorized``). In both hosts a kernel
presenting its kernel-scoped token in the ``X-GPUBroker-Token`` header acts for its user
on its own kernel's requests.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tornado import web
from tornado.iostream import StreamClosedError

from ..api import API_PREFIX, TOKEN_HEADER
from ..api.identity import Identity
from ..api.rules import BrokerAPI, only
from ..events import Chunk, frame
from ..wire.errors import BrokerError, InvalidRequest, NotFound

if TYPE_CHECKING:  # the handlers are mixins of a host's request handler
    _Handler = web.RequestHandler
else:
    _Handler = object


def broker_errors(method: Callable[..., Any]) -> Callable[..., Any]:
    """Run ``method`` with a broker error (``BrokerError``) raised as tornado's
    ``HTTPError`` of its own status, never a 500; the error is its cause, which the
    host's ``write_error`` renders (``broker_error``: JSON here, a page on the hub's)."""

    @functools.wraps(method)
    async def checked(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            result = method(self, *args, **kwargs)
            return await result if inspect.isawaitable(result) else result
        except BrokerError as e:
            raise web.HTTPError(e.status) from e

    return checked


def broker_error(exc: BaseException | None) -> BrokerError | None:
    """The broker error an ``HTTPError`` of ``broker_errors`` stands for (else None)."""
    cause = exc.__cause__ if isinstance(exc, web.HTTPError) else None
    return cause if isinstance(cause, BrokerError) else None


def authorized(method: Callable[..., Any]) -> Callable[..., Any]:
    """Run the host's ``authorize`` (may this authenticated caller use the broker with
    this HTTP method?) before ``method``, with broker errors as their statuses."""

    @functools.wraps(method)
    async def checked(self: Any, *args: Any, **kwargs: Any) -> Any:
        await self.authorize()
        result = method(self, *args, **kwargs)
        return await result if inspect.isawaitable(result) else result

    return broker_errors(checked)


class BrokerHandler(_Handler):
    """What every handler shares, whatever its host: the API, the caller, JSON in and
    out, errors as the API's ``{error, message}``."""

    who: Identity

    @property
    def api(self) -> BrokerAPI:
        return self.settings["gpubroker_api"]  # type: ignore[no-any-return]

    def kernel_caller(self) -> Identity | None:
        """The kernel whose token the request carries (``None``: no kernel token). A
        custom header cannot be sent cross-site without a CORS preflight, so a kernel
        token needs no XSRF check."""
        token = self.request.headers.get(TOKEN_HEADER)
        if token is None:
            return None
        who = self.api.token_identity(token)
        if who is None:
            raise web.HTTPError(403, "unknown or revoked GPU broker token (or its kernel is gone)")
        return who

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        error = broker_error(exc)
        if error is not None:
            body = error.to_json()
        else:
            message = getattr(exc, "log_message", None) or self._reason
            body = {"error": f"http_{status_code}", "message": message}
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(body))

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

    def reason(self) -> Any:
        """An admin's optional ``reason``: the query's or the body's (``{"reason": ...}``
        and nothing else), not both: a body that is not that is a 400, never ignored."""
        reason = self.get_query_argument("reason", None)  # a form body is no place for it
        if not self.request.body:
            return reason
        body = self.body()
        only(body, {"reason"})
        if reason is not None:
            raise InvalidRequest("give the reason in the query or in the body, not both")
        return body.get("reason")

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


class DrainHandler(BrokerHandler):
    """An admin's drain of a GPU or device."""

    @web.authenticated
    @authorized
    def post(self, uuid: str) -> None:
        self.reply(self.api.drain(self.who, uuid, self.body()))

    @web.authenticated
    @authorized
    def delete(self, uuid: str) -> None:
        self.reply(self.api.undrain(self.who, uuid, self.reason()))


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
    def patch(self, request_id: str) -> None:
        self.reply(self.api.change_request(self.who, request_id, self.body()))

    @web.authenticated
    @authorized
    def delete(self, request_id: str) -> None:
        self.reply(self.api.cancel(self.who, request_id, self.reason()))


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
        self.reply(self.api.renew(self.who, lease_id, self.body() if self.request.body else None))


class ExtendHandler(BrokerHandler):
    @web.authenticated
    @authorized
    def post(self, lease_id: str) -> None:
        self.reply(self.api.extend(self.who, lease_id, self.body()))


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


class LimitsHandler(BrokerHandler):
    @web.authenticated
    @authorized
    def get(self) -> None:
        self.reply(self.api.limits(self.who))


class LimitHandler(BrokerHandler):
    @web.authenticated
    @authorized
    def put(self, kind: str, name: str) -> None:
        self.reply(self.api.set_limits(self.who, kind, name, self.body()))

    @web.authenticated
    @authorized
    def delete(self, kind: str, name: str) -> None:
        self.api.delete_limits(self.who, kind, name)
        self.set_status(204)
        self.finish()


class ReclaimsHandler(BrokerHandler):
    @web.authenticated
    @authorized
    def get(self) -> None:
        user, since, until = (self.get_argument(k, None) for k in ("user", "since", "until"))
        self.reply(self.api.reclaims(self.who, user, since, until))


class ForecastHandler(BrokerHandler):
    @web.authenticated
    @authorized
    def get(self) -> None:
        weeks, tests = (self.get_argument(k, None) for k in ("weeks", "backtest_weeks"))
        self.reply(self.api.forecast(self.who, weeks, tests))


class WhatIfHandler(BrokerHandler):
    """What-if replays of the recorded requests: the caller waits for its own replay,
    which runs in a worker thread while the event loop serves everyone else."""

    @web.authenticated
    @authorized
    def get(self) -> None:
        self.reply(self.api.whatif_state(self.who))

    @web.authenticated
    @authorized
    async def post(self) -> None:
        self.reply(await asyncio.wrap_future(self.api.whatif(self.who, self.body())))


class AuditHandler(BrokerHandler):
    @web.authenticated
    @authorized
    def get(self) -> None:
        args = (self.get_argument(k, None) for k in ("since", "actor", "after", "limit"))
        self.reply(self.api.audit(self.who, *args))


class AlertsHandler(BrokerHandler):
    @web.authenticated
    @authorized
    def get(self) -> None:
        limit, before = (self.get_argument(k, None) for k in ("limit", "before"))
        self.reply(self.api.alerts(self.who, limit, before))


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


class TokenRenewHandler(BrokerHandler):
    """The kernel's server says it runs: the caller's tokens for it live on."""

    @web.authenticated
    @authorized
    def post(self, kernel_id: str) -> None:
        self.api.renew_tokens(self.who, kernel_id)
        self.set_status(204)
        self.finish()


class OverviewHandler(BrokerHandler):
    @web.authenticated
    @authorized
    def get(self) -> None:
        self.reply(self.api.overview(self.who))


class EventsHandler(BrokerHandler):
    """Server-sent events with ids (``api.streams``): the caller's own events in full,
    positions, devices and readings, written once per window; a reconnect with
    ``Last-Event-ID`` (or ``?last_event_id=``) gets what it missed, or a snapshot when
    that is gone."""

    @web.authenticated
    @authorized
    async def get(self) -> None:
        last = self._last_event_id()
        self.set_header("Content-Type", "text/event-stream")
        self.set_header("Cache-Control", "no-cache")
        self._closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        snapshot = self._flag("snapshot")
        start, leave = self.api.follow(
            self.who, last_event_id=last, write=self._write, snapshot=snapshot
        )
        try:
            self.write("".join(map(frame, start)))
            await self.flush()
            await self._closed  # the windows' chunks and keepalives come in ``_write``
        except StreamClosedError:
            pass
        finally:
            leave()

    def _write(self, chunk: Chunk) -> None:
        """A window's messages (or a keepalive), encoded once for the stream's audience
        (all its streams share the bytes), through the handler's own output: tornado
        frames and compresses it as the host's settings say. A connection that closed
        meanwhile takes nothing (``on_connection_close`` ends the stream)."""
        if self._closed.done():
            return
        self.write(chunk)
        self.flush()

    def _flag(self, name: str) -> bool:
        value = self.get_argument(name, "false")
        if value not in ("true", "false", "1", "0"):
            raise InvalidRequest(f"'{name}' must be true or false, not {value!r}")
        return value in ("true", "1")

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
        """Stop streaming at once rather than at the next window or keepalive."""
        closed = getattr(self, "_closed", None)
        if closed is not None and not closed.done():
            closed.set_result(None)


class UnknownPathHandler(BrokerHandler):
    """Any other path under the API prefix: the API's JSON 404 (403 without a valid
    credential), not Jupyter's HTML page."""

    @broker_errors
    async def prepare(self) -> None:
        await super().prepare()  # type: ignore[misc]  # the host's, async
        if self.current_user is None:
            raise web.HTTPError(403)
        raise NotFound(f"no API path {self.request.path!r}; see the API document, openapi.yaml")


Route = tuple[str, type[web.RequestHandler]]


def handlers(host: type[web.RequestHandler], root: str = f"/{API_PREFIX}") -> list[Route]:
    """URL patterns under ``root`` (the API's path on its host: relative to the server's
    base URL here) and their handlers, bound to ``host``."""
    ident = r"([^/]+)"  # any segment: the handler says what is wrong with it (400, 404)
    routes = [
        ("me", MeHandler),
        ("overview", OverviewHandler),
        ("devices", DevicesHandler),
        (f"devices/{ident}/metrics", DeviceMetricsHandler),
        (f"devices/{ident}/drain", DrainHandler),
        ("queue", QueueHandler),
        ("requests", RequestsHandler),
        (f"requests/{ident}", RequestHandler),
        (f"requests/{ident}/renew", RequestRenewHandler),
        ("leases", LeasesHandler),
        (f"leases/{ident}", LeaseHandler),
        (f"leases/{ident}/renew", RenewHandler),
        (f"leases/{ident}/extend", ExtendHandler),
        (f"leases/{ident}/keep", KeepHandler),
        ("usage", UsageHandler),
        ("quotas", QuotasHandler),
        (f"quotas/{ident}/{ident}", QuotaHandler),
        ("limits", LimitsHandler),
        (f"limits/{ident}/{ident}", LimitHandler),
        ("reclaims", ReclaimsHandler),
        ("audit", AuditHandler),
        ("forecast", ForecastHandler),
        ("whatif", WhatIfHandler),
        ("alerts", AlertsHandler),
        ("events", EventsHandler),
        ("tokens", TokensHandler),
        (f"tokens/{ident}", TokenHandler),
        (f"tokens/{ident}/renew", TokenRenewHandler),
    ]
    root = root.rstrip("/")
    found = [(f"{root}/{path}", _bind(handler, host)) for path, handler in routes]
    return [*found, (f"{root}(?:/.*)?", _bind(UnknownPathHandler, host))]


def _bind(handler: type[BrokerHandler], host: type[web.RequestHandler]) -> type[web.RequestHandler]:
    """``handler`` on ``host``: its methods first, then the host's request handler."""
    return type(handler.__name__, (handler, host), {"__module__": host.__module__})
