"""A running broker: the core plus its hardware, state file, tokens and heartbeat.

``GPUBroker`` is the one traitlets-configured object (``c.GPUBroker.*``) that every
host of the broker starts: the jupyter-server extension (embedded, the default) and,
under JupyterHub, the broker service. It builds the core from configuration, runs its
periodic ``tick`` and sampling pass (whose latest readings ``GET devices`` and
``/metrics`` both show), issues the kernel-scoped tokens (kept hashed in the state
file), and feeds the core's events to its bus (``events``), which the live streams
follow. It decides nothing itself: every decision is the core's, every rule of the API
is ``api.rules``'.
"""

from .gpubroker import GPUBroker
from .inventory import NvmlInventory

__all__ = ["GPUBroker", "NvmlInventory"]
