"""The jupyter-server extension: an embedded broker and its REST API.

Auto-enabled on install (``jupyter-config/``). On start it builds the broker
from ``c.GPUBroker.*`` (state in the Jupyter data dir by default), serves the
API under ``{base_url}gpubroker/api/v1/`` and runs the broker's tick on the
server's event loop. Kernels started with the ``gpubroker-provisioner`` find
the broker through ``current()``. Idle reclaim watches and acts on this server's
kernels; the broker's Prometheus metrics join the server's own at ``/metrics``.
"""

from __future__ import annotations

import prometheus_client
from jupyter_server.extension.application import ExtensionApp
from jupyter_server.utils import url_path_join

from .. import __version__
from ..api import API_PREFIX
from ..runtime import GPUBroker
from . import registry
from .handlers import handlers
from .reclaimer import ServerKernels


class GPUBrokerExtension(ExtensionApp):
    name = "jupyter_gpubroker"
    description = "A notebook-centric GPU broker: fair-share queueing of GPUs and MIG slices."
    version = __version__
    load_other_extensions = True

    def initialize_settings(self) -> None:
        self.gpubroker = GPUBroker(parent=self)
        self.gpubroker.api_url = url_path_join(self.serverapp.connection_url, API_PREFIX)
        core = self.gpubroker.start()
        registry.set_current(self.gpubroker)
        self.settings["gpubroker"] = self.gpubroker
        self.kernels = ServerKernels(self.serverapp.kernel_manager, core.clock, self.log)
        self.gpubroker.attach_kernels(self.kernels)
        if self.gpubroker.metrics is not None:  # served by the server's own /metrics
            self.gpubroker.metrics.register(prometheus_client.REGISTRY)
        self.gpubroker.start_ticking()

    def initialize_handlers(self) -> None:
        self.handlers.extend(handlers())

    async def stop_extension(self) -> None:
        registry.set_current(None)
        self.kernels.close()
        self.gpubroker.stop()
