"""The broker's one HTTP API: its JSON shapes (``shapes``) and description (``openapi.yaml``)."""

API_PREFIX = "gpubroker/api/v1"
TOKEN_HEADER = "X-GPUBroker-Token"
"""Header carrying a kernel-scoped token (``GPUBROKER_TOKEN`` in a kernel's environment)."""
