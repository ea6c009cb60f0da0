"""Fixtures shared by every test package."""

from __future__ import annotations

import pynvml
import pytest


@pytest.fixture
def no_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make loading libnvidia-ml fail, as on a machine without an NVIDIA driver
    (so the no-driver paths are tested the same way on a GPU machine)."""

    def missing(name: str) -> None:
        raise OSError(f"{name}: cannot open shared object file: No such file or directory")

    monkeypatch.setattr(pynvml, "CDLL", missing)


pytest_plugins = ["pytest_jupyter.jupyter_server"]
