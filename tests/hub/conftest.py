"""The ``hub`` fixture: one real JupyterHub with the broker service per test module
(``live_hub.Hub``). Without configurable-http-proxy the tests are skipped, except in CI
(``CI=true``), where that is a failure (the ``proxy`` fixture, for a module that starts a
``Hub`` of its own)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest
from live_hub import Hub

PROXY = "configurable-http-proxy"


@pytest.fixture(scope="module")
def proxy() -> None:
    if shutil.which(PROXY) is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{PROXY} is not on PATH: .ci/run installs it with npm")
        pytest.skip(f"{PROXY} is not on PATH: npm install -g {PROXY}")


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory, proxy: None) -> Iterator[Hub]:
    running = Hub(tmp_path_factory.mktemp("hub"))
    try:
        running.start()
        yield running
    finally:
        running.stop()
