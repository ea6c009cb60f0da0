"""The ``hub`` fixture: one real JupyterHub with the broker service per test module
(``live_hub.Hub``), with the ``c.GPUBroker`` options a module's ``hub_options`` fixture
returns. Without configurable-http-proxy the tests are skipped, except in CI
(``CI=true``), where that is a failure (the ``proxy`` fixture, for a module that starts a
``Hub`` of its own)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from live_hub import Hub, require_proxy


@pytest.fixture(scope="module")
def proxy() -> None:
    require_proxy()


@pytest.fixture(scope="module")
def hub_options() -> dict[str, Any]:
    """The service's ``c.GPUBroker`` options beyond ``Hub``'s own (a module overrides it)."""
    return {}


@pytest.fixture(scope="module")
def hub(
    tmp_path_factory: pytest.TempPathFactory, proxy: None, hub_options: dict[str, Any]
) -> Iterator[Hub]:
    running = Hub(tmp_path_factory.mktemp("hub"), **hub_options)
    try:
        running.start()
        yield running
    finally:
        running.stop()
