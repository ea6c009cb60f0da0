"""``benchmarks/outside_use.py`` runs and measures what it says: 64 devices, 500 real
processes listed on them, the 20 outside the broker seen, both passes timed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [
    pytest.mark.slow,  # 500 real processes
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run as another user"),
]


def test_the_benchmark_times_both_passes_over_500_processes(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run(
        [sys.executable, "benchmarks/outside_use.py", "--passes", "2", "--json", str(out)],
        cwd=ROOT,
        env=env,
        check=True,
        timeout=300,
    )
    result = json.loads(out.read_text())
    assert (result["devices"], result["processes"], result["outside_seen"]) == (64, 500, 20)
    assert result["pass_with_matching_ms"] > 0 and result["pass_without_matching_ms"] > 0
    assert result["ratio"] == result["pass_with_matching_ms"] / result["pass_without_matching_ms"]
