"""The broker as a JupyterHub service: one broker for every user of a hub.

``jupyter gpubroker service`` (or ``python -m hub_spawner.service``), listed in
``c.JupyterHub.services`` with a ``command`` and a ``url``, is one process holding the
broker's state file and the machine's NVML inventory (``runtime.GPUBroker``, configured
as ``c.GPUBroker.*`` from ``--config FILE`` and the command line). It serves the same
API as the server extension, with the same handlers (``server.handlers``), under
``$JUPYTERHUB_SERVICE_PREFIX`` + ``api/v1/`` (``/services/gpubroker/api/v1/``), and
the hub pages (``pages``): "My GPUs" at the prefix (the Services menu's link), the
admin page at ``admin``.

Who is calling, and what they may do (``HubHost``), all from the hub:
- a browser, through the hub's OAuth (the service's cookie; a call that changes
  anything also sends the ``_xsrf`` cookie's value as ``X-XSRFToken``), or a hub API
  token (``Authorization: token ...``: a user's, or the ``$JUPYTERHUB_API_TOKEN`` of
  their single-user server), which must also grant access to this service;
- the user is the hub's user name, the groups the hub's groups plus
  ``c.GPUBroker.user_groups``'; ``custom:gpubroker:use`` is needed to use the broker
  at all, and ``custom:gpubroker:admin`` makes an admin (``c.GPUBroker.admin_users``
  plays no part here);
- a kernel's token (``X-GPUBroker-Token``) acts as in a Jupyter server: for its user,
  on its own kernel's requests; its user's hub groups are read from the hub.

SIGTERM or SIGINT (how the hub stops it) closes the connections, stops the broker and
releases the state file; a killed service restarts from the file with its leases and
the kernels' tokens intact, started again at once by its supervisor (``supervisor``,
whose socket it then serves on; without one, by the hub at its next poll). A service
whose broker cannot run (a config error, another broker on the file, no driver) does
not exit, which would take the hub down at its start: it logs why, answers every call
with a 503 that says it (to users of the broker; as the embedded server does), and
tries again every ``retry_interval`` seconds with its config file read anew, so it
recovers by itself once the cause is gone. Only a service the hub started wrongly (no
service URL) exits 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import signal
import socket
import sys
import time
from copy import deepcopy
from pathlib import Path
from typing import Any, cast
from urllib.parse import quote, urlsplit

from jupyterhub.services.auth import HubOAuth, HubOAuthCallbackHandler, HubOAuthenticated
from jupyterhub.utils import url_path_join
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import CollectorRegistry
from tornado import web
from tornado.httpclient import AsyncHTTPClient, HTTPClientError
from tornado.httpserver import HTTPServer
from traitlets import Bool, TraitError, Unicode
from traitlets.config import Application

from jupyter_gpubroker import __version__
from jupyter_gpubroker.api import TOKEN_HEADER
from jupyter_gpubroker.api.identity import Identity
from jupyter_gpubroker.api.rules import BrokerAPI
from jupyter_gpubroker.nvml import NvmlUnavailable, TopologyError
from jupyter_gpubroker.runtime import GPUBroker
from jupyter_gpubroker.server.handlers import broker_errors, handlers
from jupyter_gpubroker.wire.errors import BrokerError
from jupyter_gpubroker.wire.sizes import RESOLUTION
from jupyter_gpubroker.wire.traits import Seconds

from .hubauth import (
    ADMIN_SCOPE,
    API_PATH,
    USE_SCOPE,
    HubAuthFromSettings,
    check_user,
    has_scope,
    hub_identity,
    require_use,
)
from .pages import UnavailablePage, page_handlers
from .supervisor import passed_socket

METRICS_SCOPE = "read:metrics"


class HubHost(HubAuthFromSettings, HubOAuthenticated, web.RequestHandler):
    """The hub service host of ``server.handlers``: the caller from HubAuth (token or
    cookie with XSRF), or a kernel token; the broker is theirs to use with the use scope."""

    @broker_errors
    async def prepare(self) -> None:
        kernel = self.kernel_caller()
        api: BrokerAPI = self.api
        if kernel is not None:
            groups = await self.settings["hub_groups"].of(kernel.user)
            self.who = api.identify(kernel.user, kernel.kernel_id, groups)
            self.current_user = {"name": kernel.user, "kind": "kernel"}
            return
        model = await self.hub_auth.get_user(self, sync=False)
        if not model:  # an API call is refused, never redirected to a login page
            raise web.HTTPError(
                403,
                "no valid hub credential: send a hub API token (Authorization: token ...), or "
                f"log in through the hub at {self.hub_auth.base_url} (then a call that changes "
                "anything sends the _xsrf cookie's value as X-XSRFToken)",
            )
        check_user(model, self.hub_scopes)
        self.who = hub_identity(api, model)
        self.current_user = model

    async def authorize(self) -> None:
        user = self.current_user
        if user["kind"] == "kernel":  # issued to a user who held the use scope
            return
        require_use(user)


class CallbackHandler(HubAuthFromSettings, HubOAuthCallbackHandler):
    """The end of the hub's OAuth login."""


class UnavailableHost(HubAuthFromSettings, HubOAuthenticated, web.RequestHandler):
    """Every route while the broker cannot run: 503 with why to users of the broker (the
    reason may name local files), a plain 503 to a kernel's token (it cannot be checked
    without the broker), 403 to anyone else."""

    async def prepare(self) -> None:
        why = self.settings["unavailable"]
        if self.request.headers.get(TOKEN_HEADER):
            why = "The GPU broker is not running just now; the hub's admin can see why in its log."
        else:
            model = await self.hub_auth.get_user(self, sync=False)
            if not model or not has_scope(model, USE_SCOPE):
                raise web.HTTPError(403, "no hub credential that may use the GPU broker")
        self.set_status(503)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"error": "broker_unavailable", "message": why}))

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"error": f"http_{status_code}", "message": self._reason}))


class MetricsHandler(HubAuthFromSettings, HubOAuthenticated, web.RequestHandler):
    """``/metrics``: the broker's Prometheus families, as the embedded server serves them,
    to a hub token with the hub's ``read:metrics`` scope, as the hub serves its own; to
    anyone when ``authenticate_prometheus`` is off."""

    async def get(self) -> None:
        if self.settings["authenticate_prometheus"]:
            model = await self.hub_auth.get_user(self, sync=False)
            if not model or not has_scope(model, METRICS_SCOPE):
                self.set_status(403)
                self.finish(
                    f"metrics need a hub token with the {METRICS_SCOPE} scope "
                    "(c.JupyterHub.load_roles), or "
                    "c.GPUBrokerService.authenticate_prometheus = False\n"
                )
                return
        self.set_header("Content-Type", CONTENT_TYPE_LATEST)
        self.write(generate_latest(self.settings["metrics_registry"]))


SERVICE_ACTOR = "services/{name}"
"""How the audit log names the service when it acts on leases itself: the hub's own name
for it (a '/' no hub user name holds)."""


async def release_stopped_servers(
    api: BrokerAPI, service: Identity, hub_auth: HubOAuth, log: Any, tries: int = 30
) -> list[str]:
    """Release the leases of hub servers that do not run (a hub stops its service before
    its servers, whose give-back then finds no broker), at once rather than a TTL later,
    through the API as ``service`` (``service_identity``): each release is audited with
    its reason (``AdminRules.release_stopped_server``). The hub is asked with the service's
    token (``read:servers``), each user up to ``tries`` times a second apart while it
    starts; a user it never answers for, or refuses, keeps the lease, to expire as before,
    and the log says so. Under an engine (Slurm, Kubernetes) the engine's own view of its
    jobs and pods releases them, with that cause, so nothing is done here. Returns the
    released lease ids."""
    if api.runtime.engine is not None:
        return []
    held = api.server_leases(service)
    released = []
    for user in sorted({x["user"] for x in held}):
        running = await _running_servers(hub_auth, user, log, tries)
        if running is None:
            continue
        for x in held:
            if x["user"] == user and x["server"] not in running:
                try:
                    api.release_stopped_server(service, x["lease_id"])
                except BrokerError as e:  # ended meanwhile (its server gave it back)
                    log.info("GPU broker service: %s not released: %s", x["lease_id"], e.message)
                    continue
                log.info(
                    "GPU broker service: released %s of server %s (not running)",
                    x["lease_id"],
                    x["server"],
                )
                released.append(x["lease_id"])
    return released


async def _running_servers(hub_auth: HubOAuth, user: str, log: Any, tries: int) -> set[str] | None:
    """The names of ``user``'s running servers (``user``, ``user:name``), as the hub says;
    None, with a log line naming the user, where the hub does not tell."""
    url = url_path_join(hub_auth.api_url, "users", quote(user, safe=""))
    for _ in range(tries):  # the hub may still be starting
        try:
            response = await AsyncHTTPClient().fetch(
                url, headers={"Authorization": f"token {hub_auth.api_token}"}, raise_error=False
            )
        except OSError:
            await asyncio.sleep(1)
            continue
        break
    else:
        log.warning(
            "GPU broker service: the hub did not answer for %s's servers (%d tries): their "
            "GPUs are released only as their leases expire",
            user,
            tries,
        )
        return None
    if response.code == 404:
        return set()
    servers = json.loads(response.body).get("servers") if response.code == 200 else None
    if servers is None:
        log.warning(
            "GPU broker service: cannot read %s's servers from the hub (%s): grant the "
            "service read:servers; their GPUs are released only as their leases expire",
            user,
            response.code,
        )
        return None
    return {f"{user}:{n}" if n else user for n in servers}


def service_identity(api: BrokerAPI) -> Identity:
    """The service itself, as the API sees its own routines: an admin, named in the
    audit log as the hub names it (``SERVICE_ACTOR``)."""
    name = os.environ.get("JUPYTERHUB_SERVICE_NAME") or "gpubroker"
    return api.identify(SERVICE_ACTOR.format(name=name), admin=True)


class HubGroups:
    """The hub groups of users seen only through a kernel token (a hub credential's user
    model carries them): read with the service's own token (``read:users:groups``),
    kept ``max_age`` seconds; the last known (or none) when the hub does not answer."""

    def __init__(self, hub_auth: HubOAuth, log: Any, max_age: float = 60.0) -> None:
        self.hub_auth, self.log, self.max_age = hub_auth, log, max_age
        self._known: dict[str, tuple[float, list[str]]] = {}

    async def of(self, user: str) -> list[str]:
        now = time.monotonic()
        at, groups = self._known.get(user, (-self.max_age, []))
        if now - at < self.max_age:
            return groups
        url = url_path_join(self.hub_auth.api_url, "users", quote(user, safe=""))
        try:
            response = await AsyncHTTPClient().fetch(
                url, headers={"Authorization": f"token {self.hub_auth.api_token}"}
            )
            groups = list(json.loads(response.body).get("groups") or [])
        except (HTTPClientError, OSError, ValueError) as e:
            self.log.warning("GPU broker: cannot read %s's hub groups (%s)", user, e)
            return groups
        self._known[user] = (now, groups)
        return groups


class GPUBrokerService(Application):
    """``jupyter gpubroker service``: the broker API as a hub-managed service."""

    name = "jupyter-gpubroker-service"
    version = __version__
    description = (
        "Run the GPU broker as a JupyterHub service (list it in c.JupyterHub.services with "
        "this command and a url); configure it with c.GPUBroker.* in --config."
    )
    classes = [GPUBroker, HubOAuth]
    aliases = {
        "config": "GPUBrokerService.config_file",
        "simulate": "GPUBroker.simulate",
        "state-file": "GPUBroker.state_file",
        "log-level": "Application.log_level",
    }

    config_file = Unicode("", help="A Python config file setting c.GPUBroker.*.").tag(config=True)
    cookie_secret_file = Unicode(
        "",
        help="File holding the secret that signs the service's login cookies, created (mode "
        "0600) if missing, so logins outlive a restart; default <state file>.cookie_secret.",
    ).tag(config=True)
    stop_timeout = Seconds(
        10.0, 0.0, 3600.0, help="Seconds open connections (event streams) get to close on SIGTERM."
    ).tag(config=True)
    retry_interval = Seconds(
        30.0,
        RESOLUTION,
        86400.0,
        help="Seconds between tries to start a broker that could not run (its config file "
        "is read again before each), meanwhile every call is answered with a 503 saying why.",
    ).tag(config=True)
    authenticate_prometheus = Bool(
        True,
        help="Whether /metrics needs a hub token with read:metrics (as the hub's own "
        "c.JupyterHub.authenticate_prometheus); False serves it to anyone who reaches it.",
    ).tag(config=True)

    _listener: socket.socket | None = None
    """The listening socket passed by socket activation (``supervisor``), if any."""

    def initialize(self, argv: list[str] | None = None) -> None:
        super().initialize(argv)
        if self.config_file and not Path(self.config_file).is_file():
            self.log.critical(
                "GPU broker service not started: no config file %s: fix --config", self.config_file
            )
            self.exit(1)
        self._from_command_line = deepcopy(self.config)
        self._read_config_file()

    def _read_config_file(self) -> None:
        if self.config_file:  # the command line wins over the file
            self.load_config_file(self.config_file)
            self.update_config(self._from_command_line)

    def start(self) -> None:
        try:
            asyncio.run(self.serve())
        except ServiceError as e:
            self.log.critical("GPU broker service not started: %s", e)
            self.exit(1)

    async def serve(self) -> None:
        url, prefix = _from_hub("JUPYTERHUB_SERVICE_URL"), _from_hub("JUPYTERHUB_SERVICE_PREFIX")
        try:
            self._listener = passed_socket()
        except ValueError as e:
            raise ServiceError(str(e)) from None
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stopping.set)
        while not stopping.is_set():
            try:
                broker = self._start_broker(url, prefix)
            except ServiceError as e:
                self.log.error(
                    "GPU broker service: the broker cannot run: %s; every call is answered "
                    "with this, and the service tries again in %s s",
                    e,
                    f"{self.retry_interval:g}",
                )
                app = self._app(
                    prefix,
                    [
                        (url_path_join(prefix, API_PATH, ".*"), UnavailableHost),
                        (url_path_join(prefix, "metrics"), UnavailableHost),
                        (url_path_join(prefix, ".*"), UnavailablePage),
                    ],
                    unavailable=str(e),
                    cookie_secret=secrets.token_bytes(32),  # a login of these minutes only
                )
                await self._listen(app, url, stopping, self.retry_interval)
                self._read_config_file()
                continue
            try:
                await self._serve(broker, url, prefix, stopping)
            finally:
                broker.stop()

    def _start_broker(self, url: str, prefix: str) -> GPUBroker:
        """The broker started; ``ServiceError`` says why it cannot run."""
        if "identity" in self.config.GPUBroker and self.config.GPUBroker.identity != "username":
            raise ServiceError(
                "c.GPUBroker.identity = 'owner' would make every hub user one user: remove it, "
                "the service always names callers by their hub user name"
            )
        if self.config.GPUBroker.get("admin_users"):
            self.log.warning(
                "c.GPUBroker.admin_users plays no part under the hub: grant %s in "
                "c.JupyterHub.load_roles instead",
                ADMIN_SCOPE,
            )
        try:
            # its users' servers run as their own accounts unless the config says otherwise
            account = self.config.GPUBroker.get("holder_account", "user")
            broker = GPUBroker(parent=self, identity="username", holder_account=account)
            broker.api_url = url_path_join(url, prefix, API_PATH)
            broker.start()
        except (BrokerError, NvmlUnavailable, TopologyError) as e:
            raise ServiceError(getattr(e, "message", None) or str(e)) from None
        except TraitError as e:
            raise ServiceError(f"a setting of c.GPUBroker is wrong: {e}") from None
        return broker

    def _app(self, prefix: str, routes: list[Any], **settings: Any) -> web.Application:
        """The service's application: ``routes``, the hub's OAuth callback, its logging."""
        return web.Application(
            [(url_path_join(prefix, "oauth_callback"), CallbackHandler), *routes],
            hub_auth=HubOAuth(parent=self, base_url=prefix),
            log_function=self._log_request,
            **settings,
        )

    async def _listen(
        self, app: web.Application, url: str, stopping: asyncio.Event, for_s: float | None = None
    ) -> None:
        """Serve ``app`` at ``url`` (on the socket the supervisor or systemd passed, if
        any) until ``stopping`` (or ``for_s`` seconds), then close the open connections
        (event streams) within ``stop_timeout``."""
        server = HTTPServer(app, xheaders=True)
        if self._listener is not None:  # a copy: stopping this server leaves the socket open
            listener = socket.socket(fileno=os.dup(self._listener.fileno()))
            listener.setblocking(False)
            server.add_socket(listener)
        else:
            where = urlsplit(url)
            server.listen(where.port or 80, where.hostname or "127.0.0.1")
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stopping.wait(), for_s)
        server.stop()
        try:
            await asyncio.wait_for(server.close_all_connections(), self.stop_timeout)
        except asyncio.TimeoutError:
            self.log.warning("GPU broker service: connections still open; stopping anyway")

    async def _serve(
        self, broker: GPUBroker, url: str, prefix: str, stopping: asyncio.Event
    ) -> None:
        app = self._app(
            prefix,
            [
                *handlers(HubHost, root=url_path_join(prefix, API_PATH)),
                (url_path_join(prefix, "metrics"), MetricsHandler),
                *page_handlers(prefix),
            ],
            gpubroker=broker,
            gpubroker_api=BrokerAPI(broker),
            authenticate_prometheus=self.authenticate_prometheus,
            metrics_registry=self._metrics_registry(broker),
            cookie_secret=self._cookie_secret(broker.state_file),
        )
        app.settings["hub_groups"] = HubGroups(app.settings["hub_auth"], self.log)
        broker.start_ticking()
        self.log.info("GPU broker service: the API at %s", broker.api_url)
        api: BrokerAPI = app.settings["gpubroker_api"]
        reconciling = asyncio.ensure_future(
            release_stopped_servers(api, service_identity(api), app.settings["hub_auth"], self.log)
        )
        try:
            await self._listen(app, url, stopping)
        finally:
            self.log.info("GPU broker service: stopping")
            reconciling.cancel()

    @staticmethod
    def _metrics_registry(broker: GPUBroker) -> CollectorRegistry:
        """The broker's metrics alone: the service has no host metrics of its own."""
        registry = CollectorRegistry(auto_describe=True)
        if broker.metrics is not None:
            broker.metrics.register(registry)
        return registry

    def _cookie_secret(self, state_file: str) -> bytes:
        if state_file == ":memory:" and not self.cookie_secret_file:
            return secrets.token_bytes(32)
        path = Path(self.cookie_secret_file or f"{state_file}.cookie_secret").expanduser()
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return path.read_bytes().strip()
        except OSError as e:
            raise ServiceError(
                f"cannot create the cookie secret file {path} ({e.strerror}): set "
                "c.GPUBrokerService.cookie_secret_file to a writable path"
            ) from None
        secret = secrets.token_hex(32).encode()
        with os.fdopen(fd, "wb") as f:
            f.write(secret)
        return secret

    def _log_request(self, handler: web.RequestHandler) -> None:
        status = handler.get_status()
        if status < 400 and cast(int, self.log_level) > logging.DEBUG:  # traitlets keeps a number
            return  # a success is debug output: below the level shown, make no record of it
        log = self.log.warning if status >= 400 else self.log.debug
        request = handler.request  # its path only: a query may carry a token
        log("%d %s %s %.1fms", status, request.method, request.path, 1000 * request.request_time())


class ServiceError(Exception):
    """Why the service cannot run, in one sentence."""


def _from_hub(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise ServiceError(
            f"${name} is not set: the service is started by JupyterHub, listed in "
            "c.JupyterHub.services with its command and url (see docs/hub.md)"
        )
    return value


def main(argv: list[str] | None = None) -> int:
    GPUBrokerService.launch_instance(argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
