"""The ``hub`` fixture: one real JupyterHub with the broker service per test module
(``live_hub.Hub``), with the ``c.GPUBroker`` options a module's ``hub_options`` fixture
returns; it needs configurable-http-proxy (the ``proxy`` fixture, tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from live_hub import Hub


@pytest.fixture(scope="module")
def hub_options() -> dict[str, Any]:
    """The service's ``c.GPUBroker`` options beyond ``Hub``'s own, and its ``spawner`` and
    ``extra_config`` (a module overrides it)."""
    return {}


@pytest.fixture(scope="module")
def hub(
    tmp_path_factory: pytest.TempPathFactory, proxy: None, hub_options: dict[str, Any]
) -> Iterator[Hub]:
    running = Hub(tmp_path_factory.mktemp("hub"), **hub_options)
    with running.running():
        yield running
