"""jupyter-server integration: the extension, its REST handlers and the GPU kernel provisioner."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .app import GPUBrokerExtension

__all__ = ["GPUBrokerExtension"]


def __getattr__(name: str) -> Any:
    """The extension on first use: the hub service imports ``server.handlers`` (tornado
    only) without loading jupyter-server."""
    if name == "GPUBrokerExtension":
        from .app import GPUBrokerExtension

        return GPUBrokerExtension
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
