"""jupyter-gpubroker: a notebook-centric GPU broker for Jupyter.

The broker core lives in :mod:`jupyter_gpubroker.broker`; the NVML inventory
backends (real and simulated) in :mod:`jupyter_gpubroker.nvml`; the ``%gpu`` magic
(``%load_ext jupyter_gpubroker``) in :mod:`jupyter_gpubroker.kernel`.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"


def load_ipython_extension(ip: Any) -> None:
    """``%load_ext jupyter_gpubroker``: register ``%gpu`` (imported here, not at package
    import, which the server and every tool pay for)."""
    from .kernel.magic import load

    load(ip)


def _jupyter_server_extension_points() -> list[dict[str, object]]:
    from .server import GPUBrokerExtension

    return [{"module": "jupyter_gpubroker.server", "app": GPUBrokerExtension}]
