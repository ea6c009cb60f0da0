"""The jupyter-server extension: an embedded broker and its REST API.

Auto-enabled on install (``jupyter-config/``). On start it builds the broker
from ``c.GPUBroker.*`` (state in the Jupyter data dir by default), serves the
API under ``{base_url}gpubroker/api/v1/`` and runs the broker's tick on the
server's event loop. Kernels started with the ``gpubroker-provisioner`` find the
broker through ``current()``. A broker that cannot start (its state file corrupt,
too new or in use by another server) leaves the server running with every API
route answering 503 with the reason, and GPU kernel starts failing with it. Idle
reclaim watches and acts on this server's kernels; the broker's Prometheus metrics
join the server's own at ``/metrics``.
"""

from __future__ import annotations

import prometheus_client
from jupyter_server.extension.application import ExtensionApp
from jupyter_server.utils import url_path_join

from .. import __version__
from ..api import API_PREFIX
from ..api.rules import BrokerAPI
from ..broker.errors import BrokerError
from ..nvml import NvmlUnavailable, TopologyError
from ..runtime import GPUBroker
from . import registry
from .handlers import handlers
from .reclaimer import ServerKernels
from .unavailable import unavailable_handlers


class GPUBrokerExtension(ExtensionApp):
    name = "jupyter_gpubroker"
    description = "A notebook-centric GPU broker: fair-share queueing of GPUs and MIG slices."
    version = __version__
    load_other_extensions = True

    def initialize_settings(self) -> None:
        self.gpubroker = GPUBroker(parent=self)
        self.gpubroker.api_url = url_path_join(self.serverapp.connection_url, API_PREFIX)
        self.kernels: ServerKernels | None = None
        self.why_not = ""
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
        self.handlers.extend(unavailable_handlers(self.why_not) if self.why_not else handlers())

    async def stop_extension(self) -> None:
        registry.set_current(None)
        if self.kernels is not None:
            self.kernels.close()
            self.gpubroker.stop()
