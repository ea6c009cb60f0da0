"""Fixtures of the replay tests: tiny CSV traces written on the spot, and where the
public traces live (``$GPUBROKER_TRACES``, else ``../shared/data/traces`` beside the
checkout, else ``/work/shared/data/traces``)."""

from __future__ import annotations

import os
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


def _traces_dir() -> Path | None:
    here = Path(__file__).resolve().parents[2]
    for candidate in (
        os.environ.get("GPUBROKER_TRACES"),
        here.parent / "shared" / "data" / "traces",
    ):
        if candidate and (Path(candidate) / "philly_vc_jobs.csv").is_file():
            return Path(candidate)
    return None


@pytest.fixture(scope="session")
def traces_dir() -> Path:
    found = _traces_dir()
    if found is None:  # CI and every checkout of this project have ../shared beside them
        pytest.fail(
            "the public traces are not in ../shared/data/traces: set GPUBROKER_TRACES to the "
            "folder holding philly_vc_jobs.csv and openb_pod_list_default.csv"
        )
    return found
