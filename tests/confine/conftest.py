"""The confinement tests' fixtures: a scratch GPU machine confining with cgroup v1 or v2,
and the processes of nobody that probe it."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cgroup_versions import require
from confine_boxes import Box, Probe, empty, new_box

from jupyter_gpubroker.confine import DeviceConfinement


@pytest.fixture
def scratch() -> Iterator[Path]:
    top = Path(tempfile.mkdtemp(prefix="gpubroker-confine-"))
    top.chmod(0o755)  # nobody looks in
    try:
        yield top
    finally:
        shutil.rmtree(top)


@pytest.fixture(params=["v1", "v2"])
def make_box(request: pytest.FixtureRequest, scratch: Path) -> Iterator[Callable[[str], Box]]:
    """Boxes confining with cgroup v1 or v2, and at the end (their probes stopped first)
    no cgroup left of the test's."""
    made: list[Box] = []
    require(request.param)
    root = DeviceConfinement(cgroup=request.param).cgroups
    before = {p for p in root.root.glob("*") if p.is_dir()}

    def make(simulate: str) -> Box:
        made.append(new_box(scratch, simulate, request.param))
        return made[-1]

    yield make
    for box in made:
        box.backend.close()
    for left in {p for p in root.root.glob("*") if p.is_dir()} - before:
        empty(left)


@pytest.fixture
def probes() -> Iterator[Callable[[Callable[[], None]], Probe]]:
    started: list[Probe] = []

    def start(join: Callable[[], None]) -> Probe:
        started.append(Probe(join))
        return started[-1]

    yield start
    for probe in started:
        probe.stop()
