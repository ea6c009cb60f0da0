"""A real jupyter-server with the extension on a simulated one-GPU MIG machine, real kernels
(the server fixtures are shared with tests/kernel, in tests/conftest.py)."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture(autouse=True)
def _listening(http_server_client: Any) -> None:
    """Serve the app on its port: provisioners reach the broker's API over HTTP."""
