"""A real jupyter-server with the extension on a simulated one-GPU MIG machine, real kernels
(the server fixtures are shared with tests/kernel, in tests/conftest.py)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(autouse=True)
def _listening(http_server_client: Any) -> None:
    """Serve the app on its port: provisioners reach the broker's API over HTTP."""


@pytest.fixture
def extension_log() -> Iterator[list[logging.LogRecord]]:
    """What the extension logs at INFO or above from the server's start on (a filter: the
    server replaces the logger's handlers when it configures it)."""
    records: list[logging.LogRecord] = []

    def keep(record: logging.LogRecord) -> bool:
        if record.levelno >= logging.INFO:
            records.append(record)
        return True

    logger = logging.getLogger("GPUBrokerExtension")
    logger.addFilter(keep)
    yield records
    logger.removeFilter(keep)


@pytest.fixture
def extension(jp_serverapp: Any) -> Any:
    """The server's GPUBrokerExtension."""
    (point,) = jp_serverapp.extension_manager.extensions[
        "jupyter_gpubroker"
    ].extension_points.values()
    return point.app
