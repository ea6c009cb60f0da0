"""The ``slurm`` fixture: the real cluster ``.ci/slurm-up`` starts on this machine
(``slurm_cluster.py``). Without it the tests are skipped, except in CI (``CI=true``), where
that is a failure. Each test leaves the cluster as it found it: its jobs cancelled, its
drained nodes resumed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from slurm_cluster import NODES, UP, cleanup

# the API document's checker (tests/server/openapi_check.py), for the engine's replies
sys.path.append(str(Path(__file__).resolve().parents[1] / "server"))


@pytest.fixture(scope="session")
def slurm_cluster() -> None:
    if shutil.which("sinfo") is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"Slurm is not installed: {UP}")
        pytest.skip(f"Slurm is not installed: {UP}")
    listed = subprocess.run(["sinfo", "-h", "-N", "-o", "%N"], capture_output=True, text=True)
    if listed.returncode != 0 or set(NODES) - set(listed.stdout.split()):
        why = f"no test cluster with nodes {', '.join(NODES)} answers: {UP}"
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)


@pytest.fixture
def slurm(slurm_cluster: None) -> Iterator[None]:
    """The cluster, idle, and left idle after the test."""
    cleanup()
    yield
    cleanup()
