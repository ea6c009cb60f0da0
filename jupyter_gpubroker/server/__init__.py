"""jupyter-server integration: the extension, its REST handlers and the GPU kernel provisioner."""

from .app import GPUBrokerExtension

__all__ = ["GPUBrokerExtension"]
