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
from pathlib import Path
from typing import Any

import prometheus_client
import pynvml
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_server.extension.application import ExtensionApp
from jupyter_server.utils import url_path_join
from tornado.ioloop import IOLoop
from traitlets import TraitError, Unicode, default

from .. import __version__
from ..api import API_PREFIX
from ..api.rules import BrokerAPI
from ..broker.clock import SystemClock
from ..client import SERVER_LEASE_ENV, URL_ENV, BrokerClient, user_token_from_env
from ..kernel import NO_GPUS_ENV
from ..nvml import SIMULATE_ENV, NvmlUnavailable, TopologyError
from ..runtime import GPUBroker
from ..wire.errors import BrokerError
from ..wire.sizes import RESOLUTION
from ..wire.traits import Seconds
from . import registry
from .handlers import handlers
from .host import JupyterHost
from .proxy import proxy_handlers
from .reclaimer import ServerKernels, carry_out_reclaims, report_server_activity
from .unavailable import NO_GPUS, unavailable_handlers

GPU_PROVISIONER = "gpubroker-provisioner"


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

    server_report_interval = Seconds(
        30.0,
        RESOLUTION,
        3600.0,
        help=f"Seconds between this server's reports of its kernels' activity to the central "
        f"broker, when it holds a GPU of its own (${SERVER_LEASE_ENV}, set by the hub's GPU "
        "spawner): how soon the broker sees a server go idle or become busy again.",
    ).tag(config=True)

    host_root = Unicode(
        "/",
        help="Where this host's /proc and /dev are looked at for an NVIDIA kernel driver "
        "(/proc/driver/nvidia, /dev/nvidia*): on a host with neither, which has no GPUs, the "
        "embedded broker stays off without an error. Tests point it at a fake host.",
    ).tag(config=True)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # The server may stop the extension before loading it (another extension's failed
        # start, a bad server setting): stop_extension then finds nothing to stop.
        self.gpubroker: GPUBroker | None = None
        self.kernels: ServerKernels | None = None
        self.why_not = ""
        self._tasks: list[asyncio.Task[None]] = []
        self._loaded = False
        self._hidden: tuple[KernelSpecManager, set[str]] | None = None
        """The server's kernelspecs and those it allowed before the GPU ones were hidden."""

    def initialize_settings(self) -> None:
        if self._loaded:
            self.log.warning(
                "GPU broker: this server has loaded the extension already; loading it again "
                "changes nothing"
            )
            return
        self._loaded = True
        serverapp = self.serverapp
        assert serverapp is not None  # linked before loading
        if self.broker_url:
            kernels = ServerKernels(serverapp.kernel_manager, SystemClock(), self.log)
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
            gpubroker = self.gpubroker = GPUBroker(parent=self)
        except TraitError as e:  # a bad c.GPUBroker value
            self._not_started(str(e))
            return
        gpubroker.api_url = url_path_join(serverapp.connection_url, API_PREFIX)
        driver = nvidia_driver(Path(self.host_root))
        if not driver and not gpubroker.simulate and gpubroker.on_this_machine:
            # A laptop, or a hub image shared by CPU and GPU servers: nothing is wrong.
            self.log.info(
                "GPU broker: %s; to try it on simulated GPUs, set "
                "c.GPUBroker.simulate = 'dgx-h100-mig' (or $%s)",
                NO_GPUS,
                SIMULATE_ENV,
            )
            self._not_started(NO_GPUS, error=False)
            os.environ[NO_GPUS_ENV] = NO_GPUS  # what %gpu says in this server's kernels
            if serverapp.kernel_spec_manager is not None:
                self._hide_gpu_kernelspecs(serverapp.kernel_spec_manager)
            return
        try:
            core = gpubroker.start()
        except (BrokerError, NvmlUnavailable, TopologyError) as e:
            why = getattr(e, "message", None) or str(e)
            if driver and isinstance(e, NvmlUnavailable):  # not "no driver": the library
                why = nvml_broken(e.__cause__ or e)
            self._not_started(why)
            return
        except pynvml.NVMLError as e:
            self._not_started(nvml_broken(e))
            return
        registry.set_current(gpubroker)
        self.settings["gpubroker"] = gpubroker
        self.settings["gpubroker_api"] = BrokerAPI(gpubroker)
        single = gpubroker.owner if gpubroker.identity == "owner" else None  # every caller
        self.kernels = ServerKernels(serverapp.kernel_manager, core.clock, self.log, single)
        gpubroker.attach_kernels(self.kernels)
        if gpubroker.metrics is not None:  # served by the server's own /metrics
            try:
                gpubroker.metrics.register(prometheus_client.REGISTRY)
            except ValueError:  # a second server in this process: the registry is global
                self.log.warning(
                    "GPU broker: another GPU broker in this process serves its metrics at "
                    "/metrics; this one's are not counted there"
                )
        gpubroker.start_ticking()

    def _not_started(self, why: str, error: bool = True) -> None:
        """Serve on: the API answers 503 with this sentence, GPU kernels fail with it, and
        the log says it once (as an error, unless the host simply has no GPUs)."""
        self.why_not = why
        if error:
            self.log.error("GPU broker not started: %s", why)
        registry.set_current(None, why)

    def _hide_gpu_kernelspecs(self, specs: KernelSpecManager) -> None:
        """Offer no kernelspec whose kernels would wait for a GPU this server cannot have
        (those installed when the server starts)."""
        gpu = {
            name for name, found in specs.get_all_specs().items() if _waits_for_gpu(found["spec"])
        }
        if gpu:
            allowed = set(specs.allowed_kernelspecs)
            self._hidden = (specs, allowed)
            specs.allowed_kernelspecs = (allowed or set(specs.find_kernel_specs())) - gpu

    def initialize_handlers(self) -> None:
        if self.handlers:  # loaded twice: the first load's routes stand
            return
        if self.broker_url:
            self.handlers.extend(proxy_handlers(self.broker_url, self.jupyter_token))
        elif self.why_not:
            self.handlers.extend(unavailable_handlers(self.why_not))
        else:
            self.handlers.extend(handlers(JupyterHost))

    async def stop_extension(self) -> None:
        for task in self._tasks:
            task.cancel()
        if self.kernels is not None:
            self.kernels.close()
        if self.gpubroker is not None:
            self.gpubroker.stop()
        if self._hidden is not None:
            specs, allowed = self._hidden
            specs.allowed_kernelspecs = allowed
            self._hidden = None
        if self._loaded:  # not before loading: the registry may be another server's
            self._loaded = False
            registry.set_current(None)
            registry.set_remote(None)
            if self.why_not == NO_GPUS:
                os.environ.pop(NO_GPUS_ENV, None)


def _waits_for_gpu(spec: dict[str, Any]) -> bool:
    provisioner = spec.get("metadata", {}).get("kernel_provisioner", {})
    return bool(provisioner.get("provisioner_name") == GPU_PROVISIONER)


def nvidia_driver(root: Path) -> bool:
    """Is an NVIDIA kernel driver loaded on the host whose / is ``root``?"""
    return (root / "proc/driver/nvidia").exists() or any((root / "dev").glob("nvidia*"))


def nvml_broken(e: BaseException) -> str:
    """A host with the NVIDIA driver whose NVML does not work: what the admin must check."""
    return (
        f"the NVIDIA driver is loaded but its management library (NVML) does not work ({e}): "
        "check that libnvidia-ml.so.1 is on the library path (in a container, start it with "
        "the NVIDIA container runtime) and that its version matches the driver's (nvidia-smi)"
    )
