"""The notebook side of the broker: the ``%gpu`` magic and its widgets.

Like every other front it reaches the broker only through the HTTP API
(``BrokerClient``), with the kernel-scoped token the GPU provisioner injects.
"""

from __future__ import annotations

NO_GPUS_ENV = "GPUBROKER_NO_GPUS"
"""Set by a server without GPUs for its kernels: what ``%gpu`` says there."""


class GpuError(Exception):
    """A ``%gpu`` command that failed for a reason the user can act on.

    IPython shows ``_render_traceback_`` instead of a traceback: one readable line.
    """

    def _render_traceback_(self) -> list[str]:
        return [str(self)]
