"""wire/text.py against the table of cases the Lab panel's format.ts is tested against too
(``formatter_cases.json``): the two formatters of sizes, lease sizes, durations, memory and ETAs say
the same words, row by row."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jupyter_gpubroker.api.shapes import parse_iso
from jupyter_gpubroker.wire.text import duration, eta_text, lease_size, memory, size_text

CASES = json.loads((Path(__file__).parent / "formatter_cases.json").read_text())


def rows(kind: str) -> Any:
    return pytest.mark.parametrize("row", CASES[kind], ids=[r["case"] for r in CASES[kind]])


@pytest.fixture
def table_clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The clock the table's texts are read by (its ``timezone``), then this machine's."""
    monkeypatch.setenv("TZ", CASES["timezone"])
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@rows("sizes")
def test_sizes(row: dict[str, Any]) -> None:
    assert size_text(row["request"]) == row["text"]


@rows("lease_sizes")
def test_lease_sizes(row: dict[str, Any]) -> None:
    assert lease_size(row["lease"]) == row["text"]


@rows("durations")
def test_durations(row: dict[str, Any]) -> None:
    assert duration(row["seconds"]) == row["text"]


@rows("memory")
def test_memory(row: dict[str, Any]) -> None:
    assert memory(row["mib"]) == row["text"]


@rows("etas")
def test_etas(row: dict[str, Any], table_clock: None) -> None:
    assert eta_text(row["estimate"], parse_iso(CASES["now"])) == row["text"]
