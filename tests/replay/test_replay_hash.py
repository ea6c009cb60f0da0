"""benchmarks/replay_hash.py: the fingerprint that shows a refactoring changes no
scheduling decision must be the same on every run of the same code and differ when the
decisions do; a missing trace is said plainly."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PHILLY = Path(__file__).parent / "data" / "philly_vc_jobs_first2000.csv"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "benchmarks/replay_hash.py", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )


def test_the_same_replay_gives_the_same_hashes_and_another_order_another():
    first, again = (run("--trace", str(PHILLY), "--jobs", "300", "--json") for _ in range(2))
    assert first.returncode == 0, first.stderr
    hashes = json.loads(first.stdout)["philly"]
    assert hashes == json.loads(again.stdout)["philly"]
    assert set(hashes) == {"broker", "slurm", "fcfs"}
    assert hashes["fcfs"] != hashes["broker"]  # FCFS starts these jobs in another order


def test_a_missing_trace_is_said_and_nothing_is_replayed(tmp_path):
    missing = tmp_path / "philly_vc_jobs.csv"
    done = run("--trace", str(missing))
    assert done.returncode != 0
    assert done.stdout == ""
    assert done.stderr.strip() == f"The trace {missing} is missing: nothing was replayed."
