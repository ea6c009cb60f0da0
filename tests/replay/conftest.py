"""Fixtures of the replay tests: tiny CSV traces written on the spot (excerpts of the
public traces are committed in ``data/``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

WriteTrace = Callable[[str, Sequence[str]], Path]


@pytest.fixture
def write_trace(tmp_path: Path) -> WriteTrace:
    """Write a header line and rows to a CSV file; returns its path."""

    def write(header: str, rows: Sequence[str], name: str = "trace.csv") -> Path:
        path = tmp_path / name
        path.write_text("\n".join([header, *rows]) + "\n")
        return path

    return write
