"""The broker's one HTTP API: its rules (``rules.BrokerAPI``, given an ``identity.Identity``),
its JSON shapes (``shapes``) and its description (``openapi.yaml``)."""

API_PREFIX = "gpubroker/api/v1"
TOKEN_HEADER = "X-GPUBroker-Token"
"""Header carrying a kernel-scoped token (``GPUBROKER_TOKEN`` in a kernel's environment)."""
