"""A client of the broker's HTTP API, for everything that is not the server itself.

The kernel provisioner, the CLI and the ``%gpu`` magic all talk to the broker
through this one class, whether the broker is embedded in their own Jupyter
server or runs as a JupyterHub service: the API is the same.

Auth: a Jupyter token (``Authorization: token ...``) acts as its user; a
kernel-scoped token (``X-GPUBroker-Token``) acts only on its kernel's requests.

Transport: httpx, under any asyncio loop (tornado's, in a server), so calls and event
streams alike take the environment's proxies (``HTTP_PROXY``, ``HTTPS_PROXY``,
``NO_PROXY``) and CA bundle (``SSL_CERT_FILE``, ``SSL_CERT_DIR``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import secrets
import ssl
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any
from urllib.parse import urlencode

import httpx

from . import pidns
from .api import TOKEN_HEADER
from .sse import messages
from .wire.errors import NotYourProcess
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
"""The status of a call that got no reply at all (a timeout, a dropped connection), as
tornado's HTTP client gives it too; ``NoReply`` names it."""


class NoReply(BrokerAPIError):
    """The call got no reply at all: a timeout, or a connection that dropped."""

    def __init__(self, message: str) -> None:
        super().__init__(NO_REPLY, "no_reply", message, answered=False)


@functools.cache
def _tls() -> ssl.SSLContext:
    """The system's CA bundle, or the one ``SSL_CERT_FILE`` or ``SSL_CERT_DIR`` names
    (OpenSSL reads them), made once for every call (loading it costs milliseconds)."""
    return ssl.create_default_context()


def _http() -> httpx.AsyncClient:
    """A client for one call or stream, closed with it, in the loop that runs it (a CLI
    runs several loops in turn): the environment's proxies apply to it."""
    return httpx.AsyncClient(verify=_tls(), trust_env=True, follow_redirects=True)


def _no_answer(e: httpx.TransportError, timeout: float) -> Exception:
    """What a call that got no answer raises: the system's error where there was one (a
    refused connection, an unknown host), else ``NoReply`` in words."""
    cause: BaseException | None = e
    while cause is not None and not (isinstance(cause, OSError) and cause.errno is not None):
        group = getattr(cause, "exceptions", None)  # each address tried failed: the first's
        cause = group[0] if group else cause.__cause__ or cause.__context__
    if isinstance(cause, OSError) and cause.errno is not None:
        # the system's words for it, not asyncio's "Connect call failed ('host', port)"
        words = os.strerror(cause.errno) if cause.errno > 0 else cause.strerror
        return OSError(cause.errno, words or str(cause))
    if isinstance(e, httpx.TimeoutException):
        return NoReply(f"the GPU broker did not answer within {duration(timeout)}")
    return NoReply(f"the connection to the GPU broker broke ({str(e).rstrip('.') or 'no reply'})")


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
        self._foreign_holders: set[str] = set()
        """Leases whose renewals the broker refused to name this holder process for."""

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
            except (NoReply, OSError) as e:
                error: Exception = e
            else:
                if response.status_code < 400:
                    return response.json() if response.content else None
                error = _error_of(response.status_code, response.content, response.reason_phrase)
            if not transient(error) or loop.time() + pause > deadline:
                raise error
            if not retried and self.on_retry is not None:
                self.on_retry(_why(error))
            await asyncio.sleep(pause)
            pause, retried = min(2 * pause, 5.0), True

    async def fetch(self, method: str, path: str, body: bytes | None = None) -> httpx.Response:
        """One call's raw response, whatever its status (``path`` may carry a query); raises
        ``OSError`` or ``NoReply`` when no answer came."""
        try:
            async with _http() as http:
                return await http.request(
                    method,
                    self.url + path,
                    headers=self._headers(),
                    content=body,
                    timeout=self.timeout,
                )
        except httpx.TransportError as e:
            raise _no_answer(e, self.timeout) from e

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
        self,
        lease_id: str,
        kernel: dict[str, Any] | None = None,
        holder_pid: int | None = None,
        log: logging.Logger | logging.LoggerAdapter[Any] | None = None,
    ) -> dict[str, Any]:
        """Renew a lease; ``kernel``: its kernel's execution state (``execution_state``,
        ``last_activity``), for a broker that does not run the kernel to judge it idle;
        ``holder_pid``: the process holding it on the broker's machine (the kernel, the
        server), whose children on its devices are the lease's, not outside use; named
        with this process's pid namespace, which the pid counts in. Where the broker
        refuses that process as not the lease user's (a broker on another machine, or one
        whose users have no account there), the lease is renewed without it from then on,
        and ``log`` says why, once."""
        body: dict[str, Any] = {} if kernel is None else {"kernel": kernel}
        path = f"leases/{lease_id}/renew"
        if holder_pid is not None and lease_id not in self._foreign_holders:
            holder: dict[str, Any] = {"holder_pid": holder_pid}
            if namespace := pidns.own():
                holder["pid_namespace"] = namespace
            try:
                return await self.call("POST", path, {**body, **holder})  # type: ignore[no-any-return]
            except BrokerAPIError as e:
                if e.code != NotYourProcess.code:
                    raise
                self._foreign_holders.add(lease_id)
                if log is not None:
                    log.warning(
                        "GPU lease %s is renewed without naming its process: %s",
                        lease_id,
                        e.message,
                    )
        return await self.call("POST", path, body or None)  # type: ignore[no-any-return]

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

    async def drain(self, uuid: str, reason: str, move: bool = False) -> dict[str, Any]:
        body = {"reason": reason, "move": True} if move else {"reason": reason}
        return await self.call("POST", f"devices/{uuid}/drain", body)  # type: ignore[no-any-return]

    async def undrain(self, uuid: str, reason: str | None = None) -> dict[str, Any]:
        return await self.call("DELETE", f"devices/{uuid}/drain", reason=reason)  # type: ignore[no-any-return]

    async def forecast(self, **query: Any) -> dict[str, Any]:
        return await self.call("GET", "forecast", **query)  # type: ignore[no-any-return]

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
        """``{token, user, kernel_id, max_age_s}``: a token for one kernel, acting for
        ``user``, that ends ``max_age_s`` after its last renewal."""
        return await self.call("POST", "tokens", {"kernel_id": kernel_id})  # type: ignore[no-any-return]

    async def revoke_kernel_token(self, kernel_id: str) -> None:
        await self.call("DELETE", f"tokens/{kernel_id}")

    async def renew_kernel_token(self, kernel_id: str) -> None:
        """The kernel still runs: its tokens (this credential's user's) live on."""
        await self.call("POST", f"tokens/{kernel_id}/renew")

    async def events(
        self, last_event_id: int | str | None = None, query: str = ""
    ) -> AsyncGenerator[dict[str, Any], None]:
        """The server-sent event stream, one decoded message (``{v, id, type, at, data}``)
        at a time; from after ``last_event_id`` when given (what a reconnect missed, or a
        ``snapshot`` when the broker no longer has it). ``query``: the stream's query as
        the API takes it (``snapshot=true``: start with the whole picture).

        Closing the iterator (or cancelling the task that reads it) closes the connection
        at once (the stream's own client goes with it), so the server drops the
        subscription. Between messages it may stay quiet (keepalives come every 15 s),
        so only connecting is timed.
        """
        headers = {**self._headers(), "Accept": "text/event-stream"}
        if last_event_id is not None:
            headers["Last-Event-ID"] = str(last_event_id)
        url = self.url + "events" + (f"?{query}" if query else "")
        timeout = httpx.Timeout(self.timeout, read=None)
        try:
            async with (
                _http() as http,
                http.stream("GET", url, headers=headers, timeout=timeout) as response,
            ):
                if response.status_code >= 400:
                    body = await response.aread()
                    raise _error_of(response.status_code, body, response.reason_phrase)
                async with contextlib.aclosing(messages(response)) as stream:
                    async for message in stream:
                        yield message
        except httpx.TransportError as e:
            raise _no_answer(e, self.timeout) from e

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
