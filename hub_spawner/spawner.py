"""GPU servers under JupyterHub: a spawner that reserves a GPU or MIG slice at the broker
service for the whole single-user server, and says why a server waits.

``GPUBrokerSpawnerMixin`` goes in front of any spawner (``GPUBrokerSpawner`` is the ready
one over LocalProcessSpawner, ``c.JupyterHub.spawner_class = "gpubroker"``). Its
``user_options`` name a size in the API's own fields (``gpus``, ``profile`` or
``min_memory_gb``, ``job_class`` and the time limit ``limit_s``; none: a CPU-only server,
started at once), from the options form or POSTed to the hub's REST API alike. ``start``
checks them, submits them to the broker and waits for the grant, ``progress()`` showing the
queue position, the requests ahead, the ETA and the reason as the broker's events move
them; then the server starts with the devices in ``CUDA_VISIBLE_DEVICES`` /
``NVIDIA_VISIBLE_DEVICES``, and its kernels share them (``GPUBROKER_SERVER_LEASE``). The
hub renews the lease while the server lives; ``stop`` and a ``poll`` that finds the server
dead give it back; the lease is in ``get_state``, so a restarted hub keeps renewing it.
Each poll also reads the lease: its warning (idleness, or its time limit with an Extend
that opens "My GPUs") shows on the hub's pages, and a lease the broker ended stops the
server (``culling``). A queued start's request is in the state as soon as it is made; a
hub restarted meanwhile starts the server again, and the start re-attaches to its request
by its holder (``server:<user>``), keeping its place in the queue.

Where the hub runs as root, the server's process joins a device cgroup between fork and
exec that lets it open its grant's NVIDIA device nodes and no other (``make_preexec_fn``;
``jupyter_gpubroker.confine``, configured as ``c.DeviceConfinement``), so unsetting
``CUDA_VISIBLE_DEVICES`` gains it nothing; the cgroup goes when the server stops.

Whose request it is: the spawner runs in the hub, so it calls the broker with a hub API
token *of the server's user* that it makes itself (``User.new_api_token``), with only the
scopes to reach and use the broker (``access:services!service=...``,
``custom:gpubroker:use``), which the hub grants only if the user holds them. The service
names the caller from that token, so every request is charged to that user and can never
act for anyone else. The token never leaves the hub process (it is neither in the state nor
in the server's environment); a restarted hub makes a new one, and ``stop`` revokes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jupyterhub import orm
from jupyterhub.spawner import LocalProcessSpawner, SimpleLocalProcessSpawner
from jupyterhub.utils import url_escape_path, url_path_join
from tornado.httpclient import AsyncHTTPClient, HTTPRequest
from traitlets import Unicode, default
from traitlets.config import Configurable

from jupyter_gpubroker.client import NO_REPLY, BrokerAPIError, BrokerClient, Lost, keep_alive
from jupyter_gpubroker.confine import ConfinementError, DeviceConfinement
from jupyter_gpubroker.wire.sizes import MAX_DURATION_S, RESOLUTION
from jupyter_gpubroker.wire.text import size_text
from jupyter_gpubroker.wire.traits import Seconds

from . import reservation
from ._compat import SpawnException
from .culling import lease_notice, stopped_text
from .environment import (
    broker_scopes,
    device_env,
    gpu_env,
    server_holder,
    start_path,
    start_timeout,
    wants_gpu,
)
from .hubauth import API_PATH, USE_SCOPE
from .options import gpu_request, options_from_form, waiting_message
from .reservation import GIVE_BACK_RETRY_S, NotReserved


class SpawnError(SpawnException):
    """A start the spawner refuses or gives up on, read by its user as its sentence alone.

    JupyterHub shows a failed start's ``jupyterhub_message`` where it has one, else
    ``str(exc)``, which for a ``SpawnException`` is "400 SpawnException(reason=...): ..."
    (JupyterHub 6: the spawn page's "Error: ...", the progress's "Spawn failed: ...", the
    REST API's answer). Both are the sentence here; the reason label still goes to the
    hub's metrics."""

    @property
    def jupyterhub_message(self) -> str:
        return str(self.message)

    def __str__(self) -> str:
        return str(self.message)


@contextlib.contextmanager
def _as_spawn_error() -> Iterator[None]:
    """A reservation that fails fails the start, with the same sentence."""
    try:
        yield
    except NotReserved as e:
        raise SpawnError(e.message, reason=e.reason, status_code=e.status) from None


def _bad_options(e: ValueError) -> SpawnException:
    """Options the broker would refuse, in one sentence, from the form or the REST API."""
    return SpawnError(f"Cannot start the server: {e}.", reason="user_options", status_code=400)


if TYPE_CHECKING:  # the spawner it goes in front of (JupyterHub ships no types: Any)
    from jupyterhub.spawner import Spawner as _Spawner
else:
    _Spawner = Configurable


class GPUBrokerSpawnerMixin(_Spawner):
    """Reserve a GPU or MIG slice for the whole server at the GPU broker service (see the
    module's docstring). Put it before the spawner class it extends."""

    gpubroker_service = Unicode(
        "gpubroker", help="The name of the GPU broker's service in c.JupyterHub.services."
    ).tag(config=True)
    gpubroker_url = Unicode(
        "",
        help="The broker API's URL as the hub reaches it; default: the service's own url "
        "and prefix (c.JupyterHub.services), plus api/v1.",
    ).tag(config=True)
    gpu_wait_timeout = Seconds(
        3600.0,
        0.0,
        MAX_DURATION_S,
        help="Seconds a server waits in the broker's queue before its request is withdrawn "
        "(the user is told their position). It comes on top of start_timeout, which "
        "stays the time the server itself has to start once its GPU is granted.",
    ).tag(config=True)

    gpu_expected_duration = Seconds(
        None,
        RESOLUTION,
        MAX_DURATION_S,
        allow_none=True,
        help="Seconds a GPU server is expected to hold its GPU, sent with its request "
        "(expected_duration_s) so that the queue's ETA for those waiting behind it has a "
        "range on a broker with no history yet; the user's own expected_duration_s option "
        "wins, and a time limit (limit_s, the form's 'For N hours') supersedes both. None: "
        "the broker's own estimate.",
    ).tag(config=True)

    start_timeout: int
    """The hub's (``Spawner.start_timeout``), which a GPU server's start extends."""

    _gpu: dict[str, Any] | None = None
    """The server's reservation: ``request_id``, and once granted ``lease_id``, ``devices``
    and ``ttl_s``; in the hub's state while the server runs."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._server_start_timeout = self.start_timeout
        self._token = ""
        self._renewing: asyncio.Task[None] | None = None
        self._progress: list[dict[str, Any]] = []
        self._progressed = asyncio.Event()
        self._wants_gpu = False
        self._why_waiting = ""
        self._resuming = False
        """A start the hub's restart interrupted (its request in the state loaded), until
        it is taken up again."""
        self._resumed: asyncio.Task[None] | None = None
        self.gpu_notice = ""
        """What the hub's pages say of this server's GPU: an idle warning, or why the
        server was stopped (``culling.gpu_announcement``)."""
        self.gpu_extend = ""
        """The lease warned for its time limit, which the notice offers to extend."""
        self._cgroup = ""
        """The device cgroup the server runs in (``confine``), while it runs."""

    # -- the broker, as the server's user

    @property
    def _broker_url(self) -> str:
        if self.gpubroker_url:
            return self.gpubroker_url
        service = (self.user.settings.get("services") or {}).get(self.gpubroker_service)
        if service is None or not service.url:
            raise SpawnError(
                f"no GPU broker service {self.gpubroker_service!r} with a url in "
                "c.JupyterHub.services: add it, or set c.GPUBrokerSpawner.gpubroker_url",
                reason="gpubroker_config",
                status_code=503,
            )
        return str(url_path_join(service.url, service.prefix, API_PATH))

    @property
    def gpu_pages_url(self) -> str:
        """The broker service's "My GPUs" page (its prefix), where its user extends a
        time limit; empty without the service."""
        service = (self.user.settings.get("services") or {}).get(self.gpubroker_service)
        return str(service.prefix) if service is not None and service.url else ""

    def _client(self, retry_for: float | None = None) -> BrokerClient:
        """The broker as the server's user; its calls wait out a service restarting for
        ``retry_for`` seconds (``BrokerClient``'s default: the lease TTL)."""
        if not self._token:
            self._token = self._new_token()
        return BrokerClient(self._broker_url, token=self._token, retry_for=retry_for)

    @property
    def _token_note(self) -> str:
        return f"gpubroker spawner of {self._log_name}"

    def _new_token(self) -> str:
        """A hub API token of the server's user that reaches and uses the broker, and
        nothing else; one a hub that died left behind is revoked first."""
        self._revoke_token()
        scopes = broker_scopes(self.gpubroker_service)
        try:
            return str(self.user.new_api_token(note=self._token_note, scopes=scopes))
        except (ValueError, KeyError):
            raise SpawnError(
                f"{self.user.name} may not use the GPU broker: ask a hub admin to grant "
                f"{USE_SCOPE} and access:services!service={self.gpubroker_service} "
                "(c.JupyterHub.load_roles), or start a server without a GPU",
                reason="gpubroker_scope",
                status_code=403,
            ) from None

    def _revoke_token(self, note: str = "") -> None:
        """Revoke the spawner's hub tokens of the user that carry ``note`` (default: the
        broker's)."""
        db = self.user.db
        for token in db.query(orm.APIToken).filter_by(
            user_id=self.user.orm_user.id, note=note or self._token_note
        ):
            db.delete(token)
        db.commit()
        if not note:
            self._token = ""

    # -- the spawner's lifecycle

    @default("options_form")
    def _gpu_options_form(self) -> Any:
        async def form(spawner: GPUBrokerSpawnerMixin) -> str:
            return await spawner._render_options_form()

        return form

    @default("options_from_form")
    def _gpu_options_from_form(self) -> Any:
        def parse(form: dict[str, list[str]]) -> dict[str, Any]:
            try:
                return options_from_form(form)
            except ValueError as e:
                raise _bad_options(e) from None

        return parse

    async def _render_options_form(self) -> str:
        """The form, live from the broker; CPU only, saying why, when it cannot be read."""
        try:
            return (await reservation.choices(self._client())).form()
        except (BrokerAPIError, OSError, SpawnException) as e:
            why = escape(getattr(e, "message", None) or getattr(e, "log_message", None) or str(e))
            return (
                '<input type="hidden" name="gpu_kind" value="cpu">'
                f"<p>A CPU-only server: the GPU broker cannot be asked now ({why}).</p>"
            )

    @default("apply_user_options")
    def _check_user_options(self) -> Any:
        """Refuse malformed options before anything starts (JupyterHub 5.3's hook);
        ``start`` checks them again for a deployment that sets its own hook."""

        def check(spawner: GPUBrokerSpawnerMixin, options: dict[str, Any]) -> None:
            spawner._gpu_request(options)

        return check

    def _gpu_request(self, options: dict[str, Any]) -> dict[str, Any] | None:
        try:
            request = gpu_request(options)
        except ValueError as e:
            raise _bad_options(e) from None
        if request is not None and self.gpu_expected_duration is not None:
            request.setdefault("expected_duration_s", self.gpu_expected_duration)
        return request

    def run_pre_spawn_hook(self) -> Any:
        """Give a GPU server's start the queue's wait too (the hub reads start_timeout once
        start is called), after the deployment's own hook."""
        ran = super().run_pre_spawn_hook()
        self._wants_gpu = wants_gpu(self.user_options)
        self._progress.clear()
        self._resuming = False
        self.gpu_notice = self.gpu_extend = ""
        self.start_timeout = start_timeout(
            self._server_start_timeout, self.gpu_wait_timeout, self._wants_gpu
        )
        return ran

    async def start(self) -> Any:
        body = self._gpu_request(self.user_options)
        if body is None:
            self._gpu = None
            return await super().start()
        client, holder = self._client(), server_holder(self.user.name, self.name)
        with _as_spawn_error():
            request, again = await reservation.ask(client, body, holder)
            if again:
                self.log.info("%s takes up its GPU request %s again", self._log_name, request["id"])
            self._gpu = reservation.held(request)
            self._save_state()
            if request["state"] == "queued":
                self._why_waiting = await reservation.why_waiting(client, request)
                self._waiting(request, {}, request.get("position") or 0)
                try:
                    request = await reservation.granted(
                        client, request, self.gpu_wait_timeout, self._waiting, self._report
                    )
                except NotReserved:
                    self._gpu = None
                    raise
        self._gpu = reservation.held(request)
        self._report(f"Granted {size_text(request)}: {', '.join(self._gpu['devices'])}", 60)
        self._keep_lease()
        try:
            return await super().start()
        except BaseException:
            await self._give_back()
            raise

    def _resume(self) -> None:
        """Start the server again as its user asked, through the hub's REST API (the one
        way a start gets its pending page, progress and proxy route): the start the hub's
        restart interrupted. It re-attaches to its request (``reservation.ask``)."""
        if self._resumed is None or self._resumed.done():
            options = dict(self.user_options or {})
            self._resumed = asyncio.ensure_future(self._start_again(options))

    async def _start_again(self, options: dict[str, Any]) -> None:
        path = start_path(self.user.escaped_name, url_escape_path(self.name) if self.name else "")
        note = f"gpubroker resumes {self._log_name}"
        token = self.user.new_api_token(
            note=note, scopes=[f"servers!server={self.user.name}/{self.name}"], expires_in=600
        )
        request = HTTPRequest(
            url_path_join(self.hub.api_url, path),
            method="POST",
            body=json.dumps(options),
            headers={"Authorization": f"token {token}"},
        )
        why = "the hub did not answer"
        try:
            for _ in range(120):  # once the hub's startup is over, and its broker service's
                try:
                    await self._client(retry_for=0).me()  # this loop is the retry
                    response = await AsyncHTTPClient().fetch(request, raise_error=False)
                except BrokerAPIError as e:
                    why = e.message
                    if e.status < 500:
                        break
                except (OSError, SpawnException) as e:
                    why = str(e)
                else:
                    if response.code < 400:
                        return
                    why = f"{response.code} {response.body.decode(errors='replace')[:200]}"
                    if response.code != NO_REPLY:  # the hub did not answer: try again
                        break
                await asyncio.sleep(1)
            self.log.warning(
                "Could not start %s again after the hub's restart (%s): its GPU request "
                "expires unless its user starts it",
                self._log_name,
                why,
            )
        finally:
            self._revoke_token(note)

    def make_preexec_fn(self, name: str) -> Any:
        """LocalProcessSpawner's child joins the server's device cgroup first, as root
        before it becomes the user, so the server never runs able to open a GPU device
        node beyond its grant (``jupyter_gpubroker.confine``; c.DeviceConfinement)."""
        start = super().make_preexec_fn(name)
        self._unconfine()  # one a start the hub's restart interrupted left
        confinement = DeviceConfinement(parent=self)
        try:
            devices = (self._gpu or {}).get("devices", [])
            path = confinement.server(self.user.name, self.name, devices)
        except ConfinementError as e:
            raise SpawnError(
                f"Cannot start the server confined to its GPU devices: {e}.",
                reason="gpu_confine",
                status_code=500,
            ) from None
        if path is None:
            return start
        self._cgroup = str(path)
        join = confinement.joiner(path)

        def preexec() -> None:
            join()
            if start is not None:
                start()

        return preexec

    def _unconfine(self) -> None:
        """The server stopped: its device cgroup goes (``DeviceConfinement.release``)."""
        path, self._cgroup = self._cgroup, ""
        if path:
            try:
                DeviceConfinement(parent=self).release(Path(path))
            except (ConfinementError, OSError) as e:
                self.log.warning("Could not remove %s's device cgroup: %s", self._log_name, e)

    def get_env(self) -> dict[str, str]:
        return {**super().get_env(), **gpu_env(self._gpu, self._device_env)}

    def _device_env(self, devices: list[str] | None) -> dict[str, str]:
        """The environment that confines the server to its granted ``devices`` (``None``: a
        CPU-only server, which sees no GPU a kernel could use without asking the broker).
        On one machine the spawner names them; an engine that enforces placement itself
        (Kubernetes' device plugin) sets them in the container instead."""
        return device_env(devices)

    async def poll(self) -> int | None:
        """The server's process, and its lease at the broker: a lease that ended (an idle
        server's, reclaimed) stops the server; a warning shows on the hub's pages."""
        status: int | None = await super().poll()
        if status is None and self._gpu and self._gpu.get("lease_id"):
            self._resuming = False
            self._keep_lease(now=self._renewing is None)  # a restarted hub renews at once
            if not self._spawn_pending and await self._lease_ended():
                status = await super().poll()
        if status is not None and not self._spawn_pending:  # not a start still waiting
            if self._resuming:  # a start the hub's restart interrupted: take it up again
                self._resume()
                return status
            await self._give_back()
            self._revoke_token()
        return status

    async def stop(self, now: bool = False) -> None:
        await super().stop(now)
        if self._resuming:  # the restarted hub cleans up the start it takes up again
            return
        await self._give_back()
        self._revoke_token()

    def get_state(self) -> dict[str, Any]:
        """The reservation, and the notice the user's next visit shows (the hub forgets
        a stopped server's spawner)."""
        state: dict[str, Any] = super().get_state()
        if self._gpu:
            state["gpubroker"] = dict(self._gpu)
        if self.gpu_notice:
            state["gpubroker_notice"] = self.gpu_notice
        if self._cgroup:
            state["gpubroker_cgroup"] = self._cgroup
        return state

    def load_state(self, state: dict[str, Any]) -> None:
        super().load_state(state)
        self._gpu = state.get("gpubroker")
        self.gpu_notice = state.get("gpubroker_notice", "")
        self._cgroup = state.get("gpubroker_cgroup", "")
        self._resuming = bool(self._gpu)  # until a poll finds the server running

    def _save_state(self) -> None:
        """Commit the state now, not once ``start`` returns: a queued start's request
        survives a restart of the hub."""
        if self.orm_spawner is not None and self.db is not None:
            self.orm_spawner.state = self.get_state()
            self.db.commit()

    # -- the lease

    def _keep_lease(self, now: bool = False) -> None:
        """Renew the lease while the server lives (``keep_alive``), ``now`` first (a
        restarted hub: the lease went unrenewed while it was down); a lease the broker
        ended (expired meanwhile, reclaimed) stops the server."""
        if self._renewing is not None and not self._renewing.done():
            return
        assert self._gpu is not None
        held = {"id": self._gpu["lease_id"], "ttl_s": self._gpu["ttl_s"]}
        client = self._client()

        async def renew_lease(lease_id: str) -> dict[str, Any]:
            # a local server's process: what it starts on the GPU is the lease's
            pid = (
                self.pid if isinstance(self, LocalProcessSpawner) and (self.pid or 0) > 1 else None
            )
            return await client.renew(lease_id, holder_pid=pid, log=self.log)

        async def renew() -> None:
            lost = await keep_alive(renew_lease, held, now=now)
            if lost is not None:
                await self._lost(lost)

        self._renewing = asyncio.ensure_future(renew())

    async def _lease_ended(self) -> bool:
        """Read the lease: a pending warning becomes the hub's notice; an ended lease stops
        the server (True)."""
        assert self._gpu is not None
        try:  # at once: the hub polls before it stops a server, and waits for the poll
            lease = await self._client(retry_for=0).lease(self._gpu["lease_id"])
        except (BrokerAPIError, OSError, SpawnException) as e:
            self.log.debug("Cannot read %s's GPU lease: %s", self._log_name, e)
            return False  # keep_alive decides what an unanswered renewal means
        if lease["state"] == "active":
            self.gpu_notice, self.gpu_extend = lease_notice(lease)
            return False
        await self._lost(Lost("gone", f"lease {lease['state']}"), lease)
        return True

    async def _lost(self, lost: Lost, lease: dict[str, Any] | None = None) -> None:
        """The lease ended at the broker (reclaimed, expired, released by an admin): stop
        the server, saying why on the hub's pages."""
        if self._gpu is None:  # stopped already (the poll and a renewal both saw it end)
            return
        lease_id = self._gpu.get("lease_id")
        if lease is None and lease_id:
            with contextlib.suppress(BrokerAPIError, OSError, SpawnException):
                lease = await self._client().lease(lease_id)
        self.log.warning(
            "%s lost its GPU lease %s (%s): stopping it",
            self._log_name,
            lease_id,
            lease["reason"] if lease else lost.message,
        )
        self.gpu_notice, self.gpu_extend = stopped_text(lease, lost.message), ""
        self._gpu = None
        renewing, self._renewing = self._renewing, None
        if renewing is not None and renewing is not asyncio.current_task():
            renewing.cancel()
        await super().stop(now=True)
        self._unconfine()

    async def _give_back(self) -> None:
        """Release the lease (or withdraw the request), stop renewing it, and remove the
        server's device cgroup."""
        self._unconfine()
        if self._renewing is not None:
            if self._renewing is not asyncio.current_task():
                self._renewing.cancel()
            self._renewing = None
        held, self._gpu = self._gpu, None
        if not held:
            return
        try:
            why = await reservation.give_back(self._client(retry_for=GIVE_BACK_RETRY_S), held)
        except SpawnException as e:  # no token or no broker service: unrenewed, it expires
            why = f"{e.message}: it returns to the queue once its lease expires"
        if why:
            self.log.warning("Could not give %s's GPU back: %s", self._log_name, why)

    # -- progress

    def _report(self, message: str, progress: int = 20) -> None:
        if self._progress and self._progress[-1]["message"] == message:
            return  # the queue moved, this start's words did not: no second line in its log
        self._progress.append({"progress": progress, "message": message})
        self._progressed.set()
        self._progressed = asyncio.Event()

    def _waiting(self, request: dict[str, Any], ahead: dict[str, int], length: int) -> None:
        self._report(waiting_message(request, ahead, length, self._why_waiting))

    async def progress(self) -> Any:
        """The broker's story of this start (queue position, ETA, the grant), live, then
        the spawner's own; the hub stops reading it once the start ends."""
        seen = 0
        while self._wants_gpu:
            for event in self._progress[seen:]:
                yield event
            seen = len(self._progress)
            if not self._spawn_pending or (self._gpu or {}).get("lease_id"):
                break
            changed = self._progressed
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(changed.wait(), 30)
        async for event in super().progress():
            yield event


class GPUBrokerSpawner(GPUBrokerSpawnerMixin, LocalProcessSpawner):
    """LocalProcessSpawner with a GPU reserved at the broker (``"gpubroker"``)."""


class SimpleGPUBrokerSpawner(GPUBrokerSpawnerMixin, SimpleLocalProcessSpawner):
    """SimpleLocalProcessSpawner (every server as the hub's OS user: demos and tests)
    with a GPU reserved at the broker (``"gpubroker-simple"``)."""


__all__ = [
    "GPUBrokerSpawner",
    "GPUBrokerSpawnerMixin",
    "SimpleGPUBrokerSpawner",
]
