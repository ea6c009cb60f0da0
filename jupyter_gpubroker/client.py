"""A client of the broker's HTTP API, for everything that is not the server itself.

The kernel provisioner, the CLI and the ``%gpu`` magic all talk to the broker
through this one class, whether the broker is embedded in their own Jupyter
server or runs as a JupyterHub service: the API is the same.

Auth: a Jupyter token (``Authorization: token ...``) acts as its user; a
kernel-scoped token (``X-GPUBroker-Token``) acts only on its kernel's requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import ssl
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any
from urllib.parse import urlencode, urlsplit

from tornado.http1connection import HTTP1Connection, HTTP1ConnectionParameters
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest, HTTPResponse
from tornado.httputil import HTTPHeaders, RequestStartLine
from tornado.tcpclient import TCPClient

from .api import TOKEN_HEADER
from .sse import StreamedResponse, parse_message
from .wire.text import duration, request_ended, size_text

URL_ENV = "GPUBROKER_URL"
TOKEN_ENV = "GPUBROKER_TOKEN"
JUPYTER_TOKEN_ENV = "GPUBROKER_JUPYTER_TOKEN"
HUB_TOKEN_ENV = "JUPYTERHUB_API_TOKEN"
SERVER_LEASE_ENV = "GPUBROKER_SERVER_LEASE"
"""A server with a GPU of its own (the hub's GPU spawner) names its lease here; its kernels
share that reservation instead of asking again."""


def user_token_from_env() -> str:
    """The user's own credential for ``$GPUBROKER_URL``: ``$GPUBROKER_JUPYTER_TOKEN``, else
    the JupyterHub API token a hub gives each user's server (and its terminals)."""
    return os.environ.get(JUPYTER_TOKEN_ENV) or os.environ.get(HUB_TOKEN_ENV, "")


TERMINAL = ("released", "cancelled", "expired", "reclaimed", "refused")
NOTICES = ("promise_broken",)
"""Events about a waiting request whose ``message`` its waiter is told."""


class BrokerAPIError(Exception):
    """The broker answered with an error (``code`` and ``message`` from its JSON); not
    ``answered``: the reply was not the broker's JSON (a proxy's page, a timeout)."""

    def __init__(self, status: int, code: str, message: str, answered: bool = True) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message
        self.answered = answered


NO_REPLY = 599
"""tornado's status for a call that got no reply at all (a timeout, a dropped connection);
``NoReply`` names it."""


class NoReply(BrokerAPIError):
    """The call got no reply at all: a timeout, or a connection that dropped."""

    def __init__(self, message: str) -> None:
        super().__init__(NO_REPLY, "no_reply", message, answered=False)


class GrantTimeout(Exception):
    """No grant within the time allowed (the request was withdrawn); carries the last
    queue position."""

    def __init__(self, request: dict[str, Any], waited: float) -> None:
        self.request, self.waited = request, waited
        pos = request.get("position")
        where = f"still at position {pos} in the queue" if pos else "still waiting"
        super().__init__(
            f"no GPU ({size_text(request)}) was granted within {duration(waited)}: {where}; "
            "the request was withdrawn"
        )


def kernel_report(execution_state: str, last_activity: float) -> dict[str, Any]:
    """A kernel's state as a lease renewal reports it (``BrokerClient.renew``'s ``kernel``):
    ``idle`` or ``busy``, and when it last started or finished running code."""
    return {
        "execution_state": execution_state,
        "last_activity": datetime.fromtimestamp(last_activity, timezone.utc).isoformat(),
    }


@dataclass(frozen=True)
class Lost:
    """Why ``keep_alive`` stopped keeping a lease or a queued request alive."""

    cause: str
    """``gone``: it ended at the broker (404, 409: expired, reclaimed, released);
    ``refused``: the broker will not let this caller renew it (403, another 4xx);
    ``unreachable``: no renewal got through for a whole TTL."""
    message: str


RETRY_S = 0.5
"""First wait before renewing (or calling) again after a network error; it doubles."""
RETRY_ENV = "GPUBROKER_RETRY_S"
RETRY_FOR_S = 120.0
"""How long a call keeps trying a broker that does not answer: the default lease TTL,
more than a hub takes to start its crashed service again."""


def transient(error: Exception) -> bool:
    """A failure that says nothing of the call, only that the broker did not answer: no
    connection, a timeout, or a 502/503/504 without the broker's JSON error (the hub's
    proxy in front of a service that is down or restarting). The broker's own 503 ("not
    started": another broker holds the state file) is an answer."""
    if isinstance(error, OSError):
        return True
    if not isinstance(error, BrokerAPIError):
        return False
    return isinstance(error, NoReply) or (error.status in (502, 503, 504) and not error.answered)


async def keep_alive(
    renew: Callable[[str], Awaitable[dict[str, Any]]],
    held: dict[str, Any],
    *,
    request: bool = False,
    alive: Callable[[], Awaitable[bool]] | None = None,
    now: bool = False,
) -> Lost | None:
    """Renew ``held`` (a lease, or a queued request when ``request``) every third of its
    TTL with ``renew`` (``BrokerClient.renew`` or ``renew_request``), the first time at
    once with ``now`` (a holder that went unrenewed for a while, e.g. a restarted hub):
    the one heartbeat of the provisioner, the spawner, the ``%gpu`` magic and
    ``jupyter gpubroker run``, with one policy.

    Returns why it stopped, once: ``Lost`` when it is gone (404, 409) or refused (403 and
    any other 4xx, never retried), or when network errors and 5xx, retried with a
    backoff, kept every renewal out for a whole TTL; ``None`` when a request left the
    queue (granted or ended) or ``alive`` says its holder is gone. Cancel it to stop.
    """
    loop = asyncio.get_running_loop()
    ttl = float(held["ttl_s"])
    renewed, wait, retry = loop.time(), 0.0 if now else ttl / 3, RETRY_S
    while True:
        await asyncio.sleep(max(0.0, min(wait, renewed + ttl - loop.time())))
        if alive is not None and not await alive():
            return None
        try:  # a client's call retries an absent broker itself: not past this TTL
            reply = await asyncio.wait_for(
                renew(held["id"]), max(RETRY_S, renewed + ttl - loop.time())
            )
        except asyncio.TimeoutError:
            return Lost("unreachable", "the GPU broker did not answer for a whole lease")
        except BrokerAPIError as e:
            if e.status < 500:
                return Lost("gone" if e.status in (404, 409) else "refused", e.message)
            why = e.message
        except OSError as e:
            why = e.strerror or str(e)
        else:
            if request and reply["state"] != "queued":
                return None
            ttl = float(reply.get("ttl_s") or ttl)
            renewed, wait, retry = loop.time(), ttl / 3, RETRY_S
            continue
        if loop.time() - renewed >= ttl:
            return Lost("unreachable", why)
        wait, retry = min(retry, ttl / 3), retry * 2


class BrokerClient:
    def __init__(
        self,
        url: str,
        token: str = "",
        kernel_token: str = "",
        timeout: float = 30.0,
        retry_for: float | None = None,
        on_retry: Callable[[str], None] | None = None,
    ) -> None:
        """``token``: a Jupyter token; ``kernel_token``: a token the broker issued (a
        kernel's ``GPUBROKER_TOKEN``). One of them, or
        neither on an open server. ``retry_for``: seconds a call keeps trying while the
        broker does not answer (``transient``); default ``$GPUBROKER_RETRY_S``, else
        ``RETRY_FOR_S``; ``on_retry(why)`` hears of the first retry of each call."""
        if not url:
            raise ValueError(f"no broker URL: set {URL_ENV} or pass --url")
        self.url = url.rstrip("/") + "/"
        self.token, self.kernel_token, self.timeout = token, kernel_token, timeout
        if retry_for is None:
            retry_for = float(os.environ.get(RETRY_ENV) or RETRY_FOR_S)
        self.retry_for, self.on_retry = retry_for, on_retry

    @classmethod
    def from_env(cls) -> BrokerClient:
        """Inside a GPU kernel: the URL and kernel token the provisioner injected. Elsewhere
        (a plain kernel, a terminal) the user's own token will do (``user_token_from_env``)."""
        return cls(
            os.environ.get(URL_ENV, ""),
            token=user_token_from_env(),
            kernel_token=os.environ.get(TOKEN_ENV, ""),
        )

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json", "Content-Type": "application/json"}
        if self.kernel_token:
            headers[TOKEN_HEADER] = self.kernel_token
        elif self.token:
            headers["Authorization"] = f"token {self.token}"
        return headers

    async def call(
        self, method: str, path: str, body: dict[str, Any] | None = None, **query: Any
    ) -> Any:
        """One API call; while the broker does not answer (``transient``) it is tried
        again, the pause doubling from ``RETRY_S`` up to 5 s, for ``retry_for`` seconds.
        Every call is safe to repeat: a submit names its request (``submit``'s ``id``)."""
        q = {k: v for k, v in query.items() if v is not None}
        data = None if body is None and method != "POST" else json.dumps(body or {}).encode()
        loop = asyncio.get_running_loop()
        deadline, pause, retried = loop.time() + self.retry_for, RETRY_S, False
        while True:
            try:
                response = await self.fetch(method, path + (f"?{urlencode(q)}" if q else ""), data)
            except HTTPClientError as e:  # no reply (a timeout)
                error: Exception = _api_error(e)
            except OSError as e:
                error = e
            else:
                if response.code < 400:
                    return json.loads(response.body) if response.body else None
                error = _error_of(response.code, response.body or b"", response.reason)
            if not transient(error) or loop.time() + pause > deadline:
                raise error
            if not retried and self.on_retry is not None:
                self.on_retry(_why(error))
            await asyncio.sleep(pause)
            pause, retried = min(2 * pause, 5.0), True

    async def fetch(self, method: str, path: str, body: bytes | None = None) -> HTTPResponse:
        """One call's raw response, whatever its status (``path`` may carry a query); raises
        ``OSError`` or ``HTTPClientError`` (``NO_REPLY``) when no answer came."""
        request = HTTPRequest(
            self.url + path,
            method=method,
            headers=self._headers(),
            body=body,
            request_timeout=self.timeout,
            allow_nonstandard_methods=True,
        )
        return await AsyncHTTPClient().fetch(request, raise_error=False)

    # -- the API, one method an endpoint

    async def me(self) -> dict[str, Any]:
        return await self.call("GET", "me")  # type: ignore[no-any-return]

    async def overview(self) -> dict[str, Any]:
        return await self.call("GET", "overview")  # type: ignore[no-any-return]

    async def quotas(self) -> list[dict[str, Any]]:
        """Every quota an admin sees; a user's own."""
        return (await self.call("GET", "quotas"))["quotas"]  # type: ignore[no-any-return]

    async def devices(self) -> list[dict[str, Any]]:
        return (await self.call("GET", "devices"))["gpus"]  # type: ignore[no-any-return]

    async def queue(self) -> list[dict[str, Any]]:
        return (await self.call("GET", "queue"))["queue"]  # type: ignore[no-any-return]

    async def submit(self, **fields: Any) -> dict[str, Any]:
        """Queue a request, under an ``id`` chosen here: a submit tried again after its
        answer was lost gets the request the first try queued, not a second one."""
        body = {"id": "r-" + secrets.token_hex(12), **fields}
        body = {k: v for k, v in body.items() if v is not None}
        return await self.call("POST", "requests", body)  # type: ignore[no-any-return]

    async def requests(self) -> list[dict[str, Any]]:
        return (await self.call("GET", "requests"))["requests"]  # type: ignore[no-any-return]

    async def request(self, request_id: str) -> dict[str, Any]:
        return await self.call("GET", f"requests/{request_id}")  # type: ignore[no-any-return]

    async def cancel(self, request_id: str, reason: str | None = None) -> dict[str, Any]:
        """Withdraw (or release) a request; an admin may cancel anyone's, with a reason."""
        return await self.call("DELETE", f"requests/{request_id}", reason=reason)  # type: ignore[no-any-return]

    async def change_class(
        self, request_id: str, job_class: str, reason: str | None = None
    ) -> dict[str, Any]:
        body = {"job_class": job_class, **({"reason": reason} if reason else {})}
        return await self.call("PATCH", f"requests/{request_id}", body)  # type: ignore[no-any-return]

    async def renew_request(self, request_id: str) -> dict[str, Any]:
        return await self.call("POST", f"requests/{request_id}/renew")  # type: ignore[no-any-return]

    async def leases(self) -> list[dict[str, Any]]:
        return (await self.call("GET", "leases"))["leases"]  # type: ignore[no-any-return]

    async def lease(self, lease_id: str) -> dict[str, Any]:
        return await self.call("GET", f"leases/{lease_id}")  # type: ignore[no-any-return]

    async def renew(
        self, lease_id: str, kernel: dict[str, Any] | None = None, holder_pid: int | None = None
    ) -> dict[str, Any]:
        """Renew a lease; ``kernel``: its kernel's execution state (``execution_state``,
        ``last_activity``), for a broker that does not run the kernel to judge it idle;
        ``holder_pid``: the process holding it on the broker's machine (the kernel, the
        server), whose children on its devices are the lease's, not outside use."""
        body: dict[str, Any] = {} if kernel is None else {"kernel": kernel}
        if holder_pid is not None:
            body["holder_pid"] = holder_pid
        return await self.call("POST", f"leases/{lease_id}/renew", body or None)  # type: ignore[no-any-return]

    async def extend(self, lease_id: str, seconds: float) -> dict[str, Any]:
        """More time on a lease's time limit: the lease as extended; refused (409, with
        the broker's reason) where that would delay a start promised to a waiting request
        or pass the class's maximum."""
        return await self.call("POST", f"leases/{lease_id}/extend", {"seconds": seconds})  # type: ignore[no-any-return]

    async def release(self, lease_id: str) -> dict[str, Any]:
        return await self.call("DELETE", f"leases/{lease_id}")  # type: ignore[no-any-return]

    async def usage(self, **query: Any) -> dict[str, Any]:
        return await self.call("GET", "usage", **query)  # type: ignore[no-any-return]

    # -- admins

    async def drain(self, uuid: str, reason: str) -> dict[str, Any]:
        return await self.call("POST", f"devices/{uuid}/drain", {"reason": reason})  # type: ignore[no-any-return]

    async def undrain(self, uuid: str, reason: str | None = None) -> dict[str, Any]:
        return await self.call("DELETE", f"devices/{uuid}/drain", reason=reason)  # type: ignore[no-any-return]

    async def reclaims(self, **query: Any) -> list[dict[str, Any]]:
        return (await self.call("GET", "reclaims", **query))["reclaims"]  # type: ignore[no-any-return]

    async def audit(self, **query: Any) -> list[dict[str, Any]]:
        """The whole audit log matching ``query`` (``since``, ``actor``), page by page."""
        records: list[dict[str, Any]] = []
        after = None
        while True:
            page = await self.call("GET", "audit", after=after, **query)
            records += page["audit"]
            after = page["next_after"]
            if after is None:
                return records

    async def alerts(self, **query: Any) -> dict[str, Any]:
        """``{active, history, next_before}``: the active health alerts and one page
        (``limit``, ``before``) of the ended ones (admins only)."""
        return await self.call("GET", "alerts", **query)  # type: ignore[no-any-return]

    async def issue_kernel_token(self, kernel_id: str) -> dict[str, Any]:
        """``{token, user, kernel_id}``: a token for one kernel, acting for ``user``."""
        return await self.call("POST", "tokens", {"kernel_id": kernel_id})  # type: ignore[no-any-return]

    async def revoke_kernel_token(self, kernel_id: str) -> None:
        await self.call("DELETE", f"tokens/{kernel_id}")

    async def events(
        self, last_event_id: int | str | None = None
    ) -> AsyncGenerator[dict[str, Any], None]:
        """The server-sent event stream, one decoded message (``{v, id, type, at, data}``)
        at a time; from after ``last_event_id`` when given (what a reconnect missed, or a
        ``snapshot`` when the broker no longer has it).

        Closing the iterator (or cancelling the task that reads it) closes the connection
        at once, so the server drops the subscription. Tornado's HTTP client cannot abort
        a streaming fetch, hence a connection of our own.
        """
        url = urlsplit(self.url + "events")
        tls = url.scheme == "https"
        stream = await TCPClient().connect(
            url.hostname or "localhost",
            url.port or (443 if tls else 80),
            ssl_options=ssl.create_default_context() if tls else None,
            timeout=self.timeout,
        )
        response, reading = StreamedResponse(), None
        try:
            connection = HTTP1Connection(
                stream, True, HTTP1ConnectionParameters(no_keep_alive=True)
            )
            headers = HTTPHeaders({**self._headers(), "Host": url.netloc})
            headers["Accept"] = "text/event-stream"
            if last_event_id is not None:
                headers["Last-Event-ID"] = str(last_event_id)
            await connection.write_headers(RequestStartLine("GET", url.path, "HTTP/1.1"), headers)
            connection.finish()
            reading = asyncio.ensure_future(response.read(connection))
            buffer = b""
            while (chunk := await response.chunks.get()) is not None:
                buffer += chunk
                while response.code is not None and response.code < 400 and b"\n\n" in buffer:
                    frame, buffer = buffer.split(b"\n\n", 1)
                    message = parse_message(frame.decode())
                    if message is not None:
                        yield message
            if response.code is not None and response.code >= 400:
                raise _error_of(response.code, buffer, response.reason)
            if response.error is not None:
                raise response.error
        finally:
            stream.close()
            if reading is not None:
                reading.cancel()

    async def follow(
        self, pause: float = RETRY_S, opened: Callable[[], Awaitable[None]] | None = None
    ) -> AsyncGenerator[dict[str, Any], None]:
        """``events`` for as long as it is read: a lost stream (network errors, 5xx, the
        server closing it) is reopened with the last id seen, after a pause that doubles
        up to 30 s, so nothing is missed (the broker sends a ``snapshot`` instead when it
        no longer has what was). A refusal (4xx) is raised. ``opened`` is awaited when
        each connection's first message arrives, before it: what no replay carries (the
        devices' readings, sent as they change) is read again then."""
        last: int | None = None
        wait = pause
        while True:
            try:
                async with contextlib.aclosing(self.events(last)) as events:
                    first = True
                    async for message in events:
                        if first and opened is not None:
                            await opened()
                        first, last, wait = False, message.get("id", last), pause
                        yield message
            except BrokerAPIError as e:
                if e.status < 500:
                    raise
            except OSError:
                pass
            await asyncio.sleep(wait)
            wait = min(2 * wait, 30.0)

    async def wait_for_grant(
        self,
        request_id: str,
        timeout: float,
        on_wait: Callable[[dict[str, Any], dict[str, int], int], None] | None = None,
        *,
        keep_on_cancel: bool = False,
        on_notice: Callable[[str], None] | None = None,
    ) -> dict[str, Any]:
        """The request once granted (with its ``lease``), following the event stream and
        renewing the request meanwhile (a waiter that dies stops renewing: its request
        expires instead of being granted to nobody). The request is read when the stream
        starts (or restarts from a snapshot) and once granted; positions come with the
        events (``on_wait(request, ahead by class, queue length)`` for each that names
        it), and a reconnect resumes the stream where it broke. ``on_notice`` hears what
        the broker says to the waiter in a sentence (a promised start it cannot keep).

        Giving up withdraws the request: after ``timeout`` seconds (``GrantTimeout``) or
        when the wait is cancelled (Ctrl-C, an abandoned kernel start), unless
        ``keep_on_cancel`` (a holder that withdraws it itself, and takes it up again after
        its own restart: the hub's GPU spawner). Raises
        ``BrokerAPIError`` if the request ends without a grant.
        """
        loop = asyncio.get_running_loop()
        start = loop.time()

        async def follow() -> dict[str, Any]:
            async with contextlib.aclosing(self.follow()) as events:
                async for message in events:
                    kind, data = message["type"], message["data"]
                    told = kind in NOTICES and data.get("request_id") == request_id
                    if on_notice is not None and told and data.get("message"):
                        on_notice(data["message"])
                    if on_wait is not None and kind in ("hello", "positions"):
                        mine = [r for r in data["requests"] if r["id"] == request_id]
                        if mine:
                            on_wait(mine[0], data["ahead"][request_id], data["queue_length"])
                    if kind in ("hello", "snapshot") or (
                        kind == "granted" and data.get("request_id") == request_id
                    ):
                        r = await self.request(request_id)
                        if r["state"] == "granted":
                            return r
                        if r["state"] != "queued":
                            raise BrokerAPIError(
                                409, r["state"], request_ended(r["state"], r["reason"])
                            )
                    elif kind in TERMINAL and data.get("request_id") == request_id:
                        raise BrokerAPIError(409, kind, request_ended(kind, data["reason"]))
            raise AssertionError("follow() ends only with an error")

        renewing = asyncio.ensure_future(self._keep_queued(request_id))
        try:
            return await asyncio.wait_for(follow(), timeout)
        except asyncio.TimeoutError:
            last = await self.request(request_id)
            await self._withdraw(request_id)
            raise GrantTimeout(last, loop.time() - start) from None
        except asyncio.CancelledError:
            if not keep_on_cancel:
                await self._withdraw(request_id)
            raise
        except BaseException:
            await self._withdraw(request_id)
            raise
        finally:
            renewing.cancel()

    async def _keep_queued(self, request_id: str) -> None:
        """Renew a queued request until it leaves the queue (``keep_alive``)."""
        with contextlib.suppress(BrokerAPIError, OSError):  # the wait itself will say why
            await keep_alive(self.renew_request, await self.request(request_id), request=True)

    async def _withdraw(self, request_id: str) -> None:
        """Cancel a request that is no longer waited for (or release it, granted meanwhile)."""
        with contextlib.suppress(BrokerAPIError, OSError):
            await self.cancel(request_id)


def _why(error: Exception) -> str:
    """A failed call's cause in words: the broker's message, or the system's."""
    if isinstance(error, OSError):
        return error.strerror or str(error)
    return getattr(error, "message", None) or str(error)


def _api_error(e: HTTPClientError) -> BrokerAPIError:
    return _error_of(e.code, e.response.body if e.response is not None else b"", str(e))


def _error_of(code: int, body: bytes, fallback: str) -> BrokerAPIError:
    if code == NO_REPLY:
        return NoReply(fallback)
    try:
        data = json.loads(body)
        return BrokerAPIError(
            code, data.get("error", "error"), data.get("message", fallback), "error" in data
        )
    except (ValueError, AttributeError, TypeError):
        return BrokerAPIError(code, f"http_{code}", fallback, answered=False)
