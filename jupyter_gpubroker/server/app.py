"""The jupyter-server extension: an embedded broker and its REST API, or the way to a
central one.

Auto-enabled on install (``jupyter-config/``). On start it builds the broker
from ``c.GPUBroker.*`` (state in the Jupyter data dir by default), serves the
API under ``{base_url}gpubroker/api/v1/`` and runs the broker's tick on the
server's event loop. Kernels started with the ``gpubroker-provisioner`` find the
broker through ``registry.current()``. A broker that cannot start (its state file
corrupt, too new or in use by another server, its GPUs managed by another broker)
leaves the server running with every API route answering 503 with the reason, and
GPU kernel starts failing with it. Idle reclaim watches and acts on this server's
kernels; the broker's Prometheus metrics join the server's own at ``/metrics``.

Remote mode (``broker_url``, default ``$GPUBROKER_URL``: a JupyterHub service
every user's server shares): no broker here, no state file, no GPU lock. The
provisioner, ``%gpu`` and the CLI use the central broker with the user's own
credential, this server's API route relays to it (``proxy``), and the
provisioners (and ``%gpu``) report their kernels' state with each renewal; the
server follows the central broker's events and carries out its reclaims on its
kernels (``reclaimer.carry_out_reclaims``). A server with a GPU of its own (the hub's GPU
spawner) reports all its kernels' activity with its lease, every
``server_report_interval`` seconds, for the central broker to cull it when idle
(``reclaimer.report_server_activity``).
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import prometheus_client
from jupyter_server.extension.application import ExtensionApp
from jupyter_server.utils import url_path_join
from tornado.ioloop import IOLoop
from traitlets import Float, TraitError, Unicode, default, validate

from .. import __version__
from ..api import API_PREFIX
from ..api.rules import BrokerAPI
from ..broker.clock import SystemClock
from ..broker.errors import BrokerError
from ..client import SERVER_LEASE_ENV, URL_ENV, BrokerClient, user_token_from_env
from ..nvml import NvmlUnavailable, TopologyError
from ..runtime import GPUBroker
from . import registry
from .handlers import handlers
from .proxy import proxy_handlers
from .reclaimer import ServerKernels, carry_out_reclaims, report_server_activity
from .unavailable import unavailable_handlers


class GPUBrokerExtension(ExtensionApp):
    name = "jupyter_gpubroker"
    description = "A notebook-centric GPU broker: fair-share queueing of GPUs and MIG slices."
    version = __version__
    load_other_extensions = True

    broker_url = Unicode(
        help=f"API URL of a central GPU broker (the JupyterHub service, e.g. "
        f"http://127.0.0.1:8000/services/gpubroker/api/v1) this server uses instead of "
        f"embedding one: remote mode. Default ${URL_ENV}; empty: the embedded broker.",
    ).tag(config=True)

    @default("broker_url")
    def _default_broker_url(self) -> str:
        return os.environ.get(URL_ENV, "")

    jupyter_token = Unicode(
        help="The credential this server's user has at broker_url, whom its kernels are "
        "charged to (default $GPUBROKER_JUPYTER_TOKEN, else $JUPYTERHUB_API_TOKEN, the one "
        "a hub gives each user's server).",
    ).tag(config=True)

    @default("jupyter_token")
    def _default_jupyter_token(self) -> str:
        return user_token_from_env()

    server_report_interval = Float(
        30.0,
        help=f"Seconds between this server's reports of its kernels' activity to the central "
        f"broker, when it holds a GPU of its own (${SERVER_LEASE_ENV}, set by the hub's GPU "
        "spawner): how soon the broker sees a server go idle or become busy again.",
    ).tag(config=True)

    @validate("server_report_interval")
    def _positive(self, proposal: dict[str, Any]) -> float:
        value = float(proposal["value"])
        if not value > 0:
            raise TraitError(f"server_report_interval must be positive, not {value}")
        return value

    def initialize_settings(self) -> None:
        self.gpubroker = GPUBroker(parent=self)
        self.gpubroker.api_url = url_path_join(self.serverapp.connection_url, API_PREFIX)
        self.kernels: ServerKernels | None = None
        self.why_not = ""
        self._tasks: list[asyncio.Task[None]] = []
        if self.broker_url:
            kernels = ServerKernels(self.serverapp.kernel_manager, SystemClock(), self.log)
            self.kernels = kernels
            registry.set_remote(registry.Remote(self.broker_url, self.jupyter_token, kernels))
            self.log.info("GPU broker: none here; this server uses %s", self.broker_url)
            central = BrokerClient(self.broker_url, token=self.jupyter_token)

            server_lease = os.environ.get(SERVER_LEASE_ENV)

            def follow() -> None:
                self._tasks.append(asyncio.ensure_future(carry_out_reclaims(central, kernels)))
                if server_lease:
                    report = report_server_activity(
                        central, server_lease, kernels, self.server_report_interval
                    )
                    self._tasks.append(asyncio.ensure_future(report))

            IOLoop.current().add_callback(follow)
            return
        try:
            core = self.gpubroker.start()
        except (BrokerError, NvmlUnavailable, TopologyError) as e:
            # Serve on, loudly: the API answers 503 with this sentence, GPU kernels fail
            # with it, and the log says it once as an error.
            self.why_not = getattr(e, "message", None) or str(e)
            self.log.error("GPU broker not started: %s", self.why_not)
            registry.set_current(None, self.why_not)
            return
        registry.set_current(self.gpubroker)
        self.settings["gpubroker"] = self.gpubroker
        self.settings["gpubroker_api"] = BrokerAPI(self.gpubroker)
        self.kernels = ServerKernels(self.serverapp.kernel_manager, core.clock, self.log)
        self.gpubroker.attach_kernels(self.kernels)
        if self.gpubroker.metrics is not None:  # served by the server's own /metrics
            self.gpubroker.metrics.register(prometheus_client.REGISTRY)
        self.gpubroker.start_ticking()

    def initialize_handlers(self) -> None:
        if self.broker_url:
            self.handlers.extend(proxy_handlers(self.broker_url, self.jupyter_token))
        elif self.why_not:
            self.handlers.extend(unavailable_handlers(self.why_not))
        else:
            self.handlers.extend(handlers())

    async def stop_extension(self) -> None:
        registry.set_current(None)
        registry.set_remote(None)
        for task in self._tasks:
            task.cancel()
        if self.kernels is not None:
            self.kernels.close()
            self.gpubroker.stop()
