"""Where a kernel provisioner finds the broker embedded in its own server process.

Provisioners are created by jupyter_client with no reference to the server
extension; the extension registers its running broker here on start.
"""

from __future__ import annotations

from ..runtime import GPUBroker

_current: GPUBroker | None = None


def set_current(runtime: GPUBroker | None) -> None:
    global _current
    _current = runtime


def current() -> GPUBroker | None:
    return _current
