"""Fixtures of the UI tests: the built extension (built here with npm if missing), a Lab
(``lab_server.Lab``) and Debian's Chromium on it through Playwright (no browser download).
Only outside CI may a missing toolchain or browser skip these tests."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest
from lab_server import BUILT, CHROMIUM, ROOT, TOKEN, Lab
from live_hub import Hub


def _unavailable(why: str) -> NoReturn:
    if os.environ.get("CI"):
        pytest.fail(f"{why}; CI runs the UI tests, so it must be there")
    pytest.skip(why)


@pytest.fixture(scope="session")
def built_extension() -> Path:
    """The extension's build output, built now from labextension/ if it is missing."""
    if not (BUILT / "package.json").exists():
        if shutil.which("npm") is None:
            _unavailable("the JupyterLab extension is not built and npm is not installed")
        for step in (["npm", "ci", "--no-audit", "--no-fund"], ["npm", "run", "build:prod"]):
            subprocess.run(step, cwd=ROOT / "labextension", check=True)
    return BUILT


@pytest.fixture
def lab_config() -> dict[str, Any]:
    """``c.GPUBroker`` options of the Lab under test."""
    return {}


@pytest.fixture
def lab(tmp_path: Path, built_extension: Path, lab_config: dict[str, Any]) -> Iterator[Lab]:
    server = Lab(tmp_path, built_extension, lab_config)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    """Where a test's screenshots go: ``$GPUBROKER_SCREENSHOTS`` (``docs`` for the docs'
    pictures), else the test's own directory."""
    where = Path(os.environ.get("GPUBROKER_SCREENSHOTS") or tmp_path)
    where.mkdir(parents=True, exist_ok=True)
    return where


@pytest.fixture
def hub(tmp_path: Path, proxy: None) -> Iterator[Hub]:
    """A real hub on one H100 in seven slices whose users' servers are GPU servers (the
    simple GPU spawner); leases nobody renews outlive a test."""
    running = Hub(
        tmp_path / "hub",
        spawner="hub_spawner.spawner.SimpleGPUBrokerSpawner",
        extra_config="c.SimpleGPUBrokerSpawner.gpu_wait_timeout = 600",
        lease_ttl=900,  # the holders' leases, never renewed, outlive the test
    )
    running.home.mkdir()
    with running.running():
        yield running


@pytest.fixture
def browser() -> Iterator[Any]:
    """Debian's Chromium through Playwright (no browser download)."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("playwright is not installed (pip install -e '.[test]')")
    if not Path(CHROMIUM).exists():
        _unavailable(f"no Chromium at {CHROMIUM} (Debian: apt-get install chromium)")
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def page(lab: Lab, browser: Any) -> Iterator[Any]:
    """Chromium on the Lab, its token in the first URL."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(f"{lab.url}/lab?token={TOKEN}&reset")
    try:
        yield page
    finally:
        page.screenshot(path=str(lab.tmp / "last.png"))
