"""Where a kernel provisioner finds its server's broker: embedded in the same process,
or central (remote mode).

Provisioners are created by jupyter_client with no reference to the server
extension; the extension registers here on start its running broker or the reason
it could not start it, or, in remote mode, the central broker it uses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..runtime import GPUBroker

if TYPE_CHECKING:
    from .reclaimer import ServerKernels


@dataclass(frozen=True)
class Remote:
    """The central broker of a server in remote mode, and the server's kernels (whose
    state the provisioners report with their renewals, and which they reclaim)."""

    url: str
    jupyter_token: str
    """The server user's own credential (their JupyterHub API token)."""
    kernels: ServerKernels


_current: GPUBroker | None = None
_why_not = ""
_remote: Remote | None = None


def set_current(runtime: GPUBroker | None, why_not: str = "") -> None:
    """``why_not``: with no broker, the sentence a GPU kernel's start fails with."""
    global _current, _why_not
    _current, _why_not = runtime, why_not


def current() -> GPUBroker | None:
    return _current


def why_not() -> str:
    """Why this process has no broker ("" when it never tried to start one)."""
    return _why_not


def set_remote(remote: Remote | None) -> None:
    global _remote
    _remote = remote


def remote() -> Remote | None:
    """The central broker this server uses instead of an embedded one (remote mode)."""
    return _remote


def unreachable_text(url: str, why: str, config: str = "c.GPUBrokerExtension") -> str:
    """What a central broker that does not answer means, for whoever asked through it
    (the API's relay, a GPU kernel's start)."""
    return (
        f"the GPU broker at {url.rstrip('/')} does not answer ({why}): check "
        f"{config}.broker_url (or $GPUBROKER_URL) and that the broker (the JupyterHub "
        "service) runs"
    )
