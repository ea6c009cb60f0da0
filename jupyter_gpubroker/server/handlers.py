"""REST handlers of ``{base_url}gpubroker/api/v1/`` (described in ``api/openapi.yaml``).

Each handler parses, authorizes, calls the core and renders one of the shapes
in ``api/shapes.py``; none decides anything. Every method is authenticated
(``@web.authenticated``) and authorized (``@authorized``, resource
``gpubroker``). A caller is either a Jupyter user (the server's identity
provider) or a kernel presenting its kernel-scoped token in the
``X-GPUBroker-Token`` header, which may act only on that kernel's requests.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

from jupyter_server.auth.decorator import authorized
from jupyter_server.auth.identity import User
from jupyter_server.base.handlers import APIHandler
from tornado import web
from tornado.iostream import StreamClosedError

from ..api import API_PREFIX, TOKEN_HEADER
from ..api.shapes import (
    devices_json,
    event_json,
    lease_json,
    parse_iso,
    queue_json,
    request_json,
    samples_json,
)
from ..broker.core import QUOTA_BOUNDS, Event, Quota
from ..broker.errors import BrokerError, Forbidden, InvalidRequest, NotFound
from ..broker.models import Lease, Request, Size
from ..runtime import GPUBroker, Scope

SIZE_FIELDS = ("gpus", "profile", "min_memory_gb")
KERNEL_ID = re.compile(r"[A-Za-z0-9-]{1,64}")


class BrokerHandler(APIHandler):
    auth_resource = "gpubroker"
    scope: Scope

    @property
    def runtime(self) -> GPUBroker:
        return self.settings["gpubroker"]  # type: ignore[no-any-return]

    async def prepare(self) -> None:  # type: ignore[override]
        if not self.check_host():  # jupyter-server's DNS-rebinding guard, for kernel tokens too
            raise web.HTTPError(403, "the Host header does not name this server")
        token = self.request.headers.get(TOKEN_HEADER)
        if token is None:
            await super().prepare()
            user = self.current_user
            if user is not None:
                name = user.username if self.runtime.identity == "username" else self.runtime.owner
                self.scope = Scope(name)
            return
        # A custom header cannot be sent cross-site without a CORS preflight, so a
        # kernel token needs no XSRF check.
        scope = self.runtime.scope_of(token)
        if scope is None:
            raise web.HTTPError(403, "unknown or revoked GPU broker token")
        self.scope = scope
        self.current_user = self._jupyter_current_user = User(username=scope.user)

    @property
    def user(self) -> str:
        return self.scope.user

    @property
    def admin(self) -> bool:
        return self.scope.kernel_id is None and self.runtime.is_admin(self.user)

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

    # -- scoping helpers

    def own_request(self, request_id: str) -> Request:
        r = self.runtime.core.request(request_id, None if self.admin else self.user)
        self.check_kernel(r.owner)
        return r

    def own_lease(self, lease_id: str) -> Lease:
        lease = self.runtime.core.lease(lease_id, None if self.admin else self.user)
        self.check_kernel(self.runtime.core.request(lease.request_id).owner)
        return lease

    def require_user(self) -> None:
        if self.scope.kernel_id is not None:
            raise Forbidden("a kernel token cannot issue or revoke tokens")

    def check_kernel(self, owner: str) -> None:
        if self.scope.kernel_id is not None and owner != self.scope.kernel_id:
            raise Forbidden("a kernel token acts only on its own kernel's requests")

    def entries_by_id(self) -> dict[str, Any]:
        return {e.request.id: e for e in self.runtime.core.queue()}

    def with_lease(self, r: Request) -> dict[str, Any]:
        d = request_json(r, self.entries_by_id().get(r.id))
        d["lease"] = lease_json(self.runtime.core.lease(r.lease_id)) if r.lease_id else None
        return d


class MeHandler(BrokerHandler):
    @web.authenticated
    @authorized
    def get(self) -> None:
        self.reply({"user": self.user, "admin": self.admin, "kernel_id": self.scope.kernel_id})


class DevicesHandler(BrokerHandler):
    @web.authenticated
    @authorized
    def get(self) -> None:
        core = self.runtime.core
        holders = core.holders()
        owners = None
        if self.scope.kernel_id is not None:  # a kernel token sees only its kernel's ids
            owners = {x.request_id: core.request(x.request_id).owner for x in holders.values()}
        gpus = devices_json(
            core.inventory,
            self.runtime.readings(),
            holders,
            self.user,
            self.admin,
            kernel_id=self.scope.kernel_id,
            owners=owners,
            drains=core.drained(),
            vacating=core.vacating(),
        )
        self.reply({"gpus": gpus})


class DeviceMetricsHandler(BrokerHandler):
    @web.authenticated
    @authorized
    def get(self, uuid: str) -> None:
        """A GPU's or MIG slice's samples since ``since`` (default: the last hour)."""
        core, sampler = self.runtime.core, self.runtime.sampler
        if sampler is None or (uuid not in core.placer.gpus and uuid not in core.placer.devices):
            raise NotFound(f"no GPU or device {uuid!r}")
        now = core.clock.now()
        since = time_arg(self, "since")
        since = now - 3600.0 if since is None else since
        resolution, samples = sampler.samples.series(uuid, since, now)
        self.reply(samples_json(uuid, resolution, samples, sampler.samples.events(uuid, since)))


class QueueHandler(BrokerHandler):
    @web.authenticated
    @authorized
    def get(self) -> None:
        entries = self.runtime.core.queue()
        queue = queue_json(entries, self.user, self.admin, kernel_id=self.scope.kernel_id)
        self.reply({"queue": queue, "length": len(entries)})


class RequestsHandler(BrokerHandler):
    @web.authenticated
    @authorized
    def get(self) -> None:
        """My live requests (a kernel token: its kernel's)."""
        entries = self.entries_by_id()
        mine = [
            request_json(r, entries.get(r.id))
            for r in self.runtime.core.live_requests(None if self.admin else self.user)
            if self.scope.kernel_id in (None, r.owner)
        ]
        self.reply({"requests": mine})

    @web.authenticated
    @authorized
    def post(self) -> None:
        data = self.body()
        unknown = set(data) - {*SIZE_FIELDS, "job_class", "owner", "expected_duration_s", "groups"}
        if unknown:
            raise InvalidRequest(f"unknown field(s): {', '.join(sorted(unknown))}")
        size = Size(**{k: data[k] for k in SIZE_FIELDS if data.get(k) is not None})
        owner = data.get("owner", "")
        if self.scope.kernel_id is not None:
            owner = self.scope.kernel_id  # a kernel's requests are its own
        groups = data.get("groups", [])
        if not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
            raise InvalidRequest("'groups' must be a list of group names")
        groups = self.runtime.groups_for(self.user, groups)
        r = self.runtime.core.submit(
            self.user,
            size,
            groups=groups,
            job_class=data.get("job_class", "interactive"),
            owner=owner,
            expected_duration_s=data.get("expected_duration_s"),
        )
        self.reply(self.with_lease(r), 201)


class RequestHandler(BrokerHandler):
    @web.authenticated
    @authorized
    def get(self, request_id: str) -> None:
        self.reply(self.with_lease(self.own_request(request_id)))

    @web.authenticated
    @authorized
    def delete(self, request_id: str) -> None:
        r = self.own_request(request_id)
        self.reply(self.with_lease(self.runtime.core.cancel(r.id)))


class RequestRenewHandler(BrokerHandler):
    @web.authenticated
    @authorized
    def post(self, request_id: str) -> None:
        r = self.own_request(request_id)
        self.reply(self.with_lease(self.runtime.core.renew_request(r.id)))


class LeasesHandler(BrokerHandler):
    @web.authenticated
    @authorized
    def get(self) -> None:
        """Active leases: mine (a kernel token: its kernel's); an admin's: all."""
        core = self.runtime.core
        leases = [
            lease_json(x)
            for x in core.leases(None if self.admin else self.user)
            if self.scope.kernel_id in (None, core.request(x.request_id).owner)
        ]
        self.reply({"leases": leases})


class LeaseHandler(BrokerHandler):
    @web.authenticated
    @authorized
    def get(self, lease_id: str) -> None:
        self.reply(lease_json(self.own_lease(lease_id)))

    @web.authenticated
    @authorized
    def delete(self, lease_id: str) -> None:
        lease = self.own_lease(lease_id)
        self.reply(lease_json(self.runtime.core.release(lease.id)))


class RenewHandler(BrokerHandler):
    @web.authenticated
    @authorized
    def post(self, lease_id: str) -> None:
        lease = self.own_lease(lease_id)
        self.reply(lease_json(self.runtime.core.renew(lease.id)))


class UsageHandler(BrokerHandler):
    @web.authenticated
    @authorized
    def get(self) -> None:
        """GPU-hours by user, group, profile or class; a non-admin sees only their own."""
        by = self.get_argument("by", "user")
        since, until = (time_arg(self, k) for k in ("since", "until"))
        usage = self.runtime.core.usage(since, until, by)  # a bad 'by' is a 400 for anyone
        if not self.admin:
            if by != "user":
                raise Forbidden("only admins see usage grouped by anything but their own user")
            usage = {self.user: usage.get(self.user, 0.0)}
        self.reply({"by": by, "gpu_hours": usage})


def time_arg(handler: BrokerHandler, name: str) -> float | None:
    """An ISO 8601 query argument as UTC seconds (None when absent)."""
    value = handler.get_argument(name, None)
    if value is None:
        return None
    try:
        return parse_iso(value)
    except ValueError:
        raise InvalidRequest(f"'{name}' must be an ISO 8601 time, not {value!r}") from None


class QuotasHandler(BrokerHandler):
    @web.authenticated
    @authorized
    def get(self) -> None:
        quotas = [
            {"kind": kind, "name": name, **q.to_json()}
            for (kind, name), q in self.runtime.core.quotas().items()
            if self.admin or (kind, name) == ("user", self.user)
        ]
        self.reply({"quotas": quotas})


class QuotaHandler(BrokerHandler):
    def require_admin(self) -> None:
        if not self.admin:
            raise Forbidden("only admins change quotas")

    @web.authenticated
    @authorized
    def put(self, kind: str, name: str) -> None:
        self.require_admin()
        data = self.body()
        unknown = set(data) - set(QUOTA_BOUNDS)
        if unknown:
            raise InvalidRequest(f"unknown quota field(s): {', '.join(sorted(unknown))}")
        if all(v is None for v in data.values()):
            raise InvalidRequest(
                "a quota sets at least one of share, max_gpus or gpu_hours with period_s; "
                "DELETE it to go back to the defaults"
            )
        quota = Quota(**data)
        self.runtime.core.set_quota(kind, name, quota)
        self.reply({"kind": kind, "name": name, **quota.to_json()})

    @web.authenticated
    @authorized
    def delete(self, kind: str, name: str) -> None:
        self.require_admin()
        self.runtime.core.delete_quota(kind, name)
        self.set_status(204)
        self.finish()


class TokensHandler(BrokerHandler):
    """Kernel-scoped tokens, issued to a user's own kernel provisioners."""

    @web.authenticated
    @authorized
    def post(self) -> None:
        self.require_user()
        kernel_id = self.body().get("kernel_id")
        if not isinstance(kernel_id, str) or not KERNEL_ID.fullmatch(kernel_id):
            raise InvalidRequest("'kernel_id' must be a kernel id (letters, digits, '-')")
        self.reply({"token": self.runtime.issue_token(self.user, kernel_id)}, 201)


class TokenHandler(BrokerHandler):
    """The caller's tokens for one kernel."""

    @web.authenticated
    @authorized
    def delete(self, kernel_id: str) -> None:
        self.require_user()
        self.runtime.revoke_tokens(kernel_id, self.user)
        self.set_status(204)
        self.finish()


class EventsHandler(BrokerHandler):
    """Server-sent events: the caller's own events in full, and after each change the
    positions and ETAs of the caller's waiting requests."""

    keepalive_s = 15.0

    @web.authenticated
    @authorized
    async def get(self) -> None:
        self.set_header("Content-Type", "text/event-stream")
        self.set_header("Cache-Control", "no-cache")
        events: asyncio.Queue[Event | None] = asyncio.Queue()
        self._events = events
        unsubscribe = self.runtime.subscribe(events.put_nowait)
        try:
            await self._send({"kind": "hello", **self._positions()})
            while True:
                try:
                    event = await asyncio.wait_for(events.get(), self.keepalive_s)
                except asyncio.TimeoutError:
                    self.write(": keepalive\n\n")
                    await self.flush()
                    continue
                if event is None:  # the client went away
                    return
                if self._visible(event):
                    await self._send(event_json(event, self.user, self.admin))
                while not events.empty():  # coalesce a burst into one positions update
                    queued = events.get_nowait()
                    if queued is not None and self._visible(queued):
                        await self._send(event_json(queued, self.user, self.admin))
                await self._send({"kind": "positions", **self._positions()})
        except StreamClosedError:
            pass
        finally:
            unsubscribe()

    def on_connection_close(self) -> None:
        """Stop streaming at once rather than at the next event or keepalive."""
        events = getattr(self, "_events", None)
        if events is not None:
            events.put_nowait(None)

    def _visible(self, event: Event) -> bool:
        if self.scope.kernel_id is None:
            return True
        if event.request_id is None or event.user != self.user:
            return False
        return self.runtime.core.request(event.request_id).owner == self.scope.kernel_id

    def _positions(self) -> dict[str, Any]:
        entries = self.runtime.core.queue()
        return {
            "queue_length": len(entries),
            "requests": [
                request_json(e.request, e)
                for e in entries
                if e.request.user == self.user and self.scope.kernel_id in (None, e.request.owner)
            ],
        }

    async def _send(self, data: dict[str, Any]) -> None:
        self.write(f"data: {json.dumps(data)}\n\n")
        await self.flush()


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
        ("devices", DevicesHandler),
        (f"devices/{ident}/metrics", DeviceMetricsHandler),
        ("queue", QueueHandler),
        ("requests", RequestsHandler),
        (f"requests/{ident}", RequestHandler),
        (f"requests/{ident}/renew", RequestRenewHandler),
        ("leases", LeasesHandler),
        (f"leases/{ident}", LeaseHandler),
        (f"leases/{ident}/renew", RenewHandler),
        ("usage", UsageHandler),
        ("quotas", QuotasHandler),
        (f"quotas/{ident}/{ident}", QuotaHandler),
        ("events", EventsHandler),
        ("tokens", TokensHandler),
        (f"tokens/{ident}", TokenHandler),
    ]
    found = [(f"/{API_PREFIX}/{path}", handler) for path, handler in routes]
    return [*found, (f"/{API_PREFIX}(?:/.*)?", UnknownPathHandler)]
