"""jupyter-gpubroker: a notebook-centric GPU broker for Jupyter.

The broker core lives in :mod:`jupyter_gpubroker.broker`; the NVML inventory
backends (real and simulated) in :mod:`jupyter_gpubroker.nvml`.
"""

__version__ = "0.1.0"


def _jupyter_server_extension_points() -> list[dict[str, object]]:
    from .server import GPUBrokerExtension

    return [{"module": "jupyter_gpubroker.server", "app": GPUBrokerExtension}]
