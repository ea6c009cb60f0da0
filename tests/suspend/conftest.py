"""A real jupyter-server with the extension on one simulated whole H100, reclaim action
``suspend`` with seconds-long timeouts, and real GPU kernels (tests/conftest.py)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.append(str(Path(__file__).resolve().parents[1] / "server"))  # openapi_check


@pytest.fixture(autouse=True)
def _listening(http_server_client: Any) -> None:
    """Serve the app on its port: provisioners reach the broker's API over HTTP."""


@pytest.fixture
def broker_config(broker_config: dict[str, Any]) -> dict[str, Any]:
    return {
        **broker_config,
        "simulate": "dgx-h100:1",
        "reclaim_action": "suspend",
        "sample_interval": 0.25,
        "idle_timeout": 4.0,  # longer than a kernel's start and first cell on a busy machine
        "grace": 1.0,
        "stalled_timeout": 0.0,
        "lease_ttl": 60.0,  # the other leases are not renewed: they must not expire meanwhile
    }
