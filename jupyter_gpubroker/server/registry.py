"""Where a kernel provisioner finds the broker embedded in its own server process.

Provisioners are created by jupyter_client with no reference to the server
extension; the extension registers its running broker here on start, or the
reason it could not start it.
"""

from __future__ import annotations

from ..runtime import GPUBroker

_current: GPUBroker | None = None
_why_not = ""


def set_current(runtime: GPUBroker | None, why_not: str = "") -> None:
    """``why_not``: with no broker, the sentence a GPU kernel's start fails with."""
    global _current, _why_not
    _current, _why_not = runtime, why_not


def current() -> GPUBroker | None:
    return _current


def why_not() -> str:
    """Why this process has no broker ("" when it never tried to start one)."""
    return _why_not
