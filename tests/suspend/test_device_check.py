"""docs/suspend.md's check on a GPU runs as the page shows it: on a machine that cannot
suspend it says why in one JSON object and exits 2; on one that can, every run keeps its
pattern and leaves its GPU free while suspended."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COMMAND = "python benchmarks/device_suspend.py --json"


def test_the_gpu_check_runs_as_docs_suspend_shows_it() -> None:
    assert f"\n    {COMMAND}\n" in (ROOT / "docs" / "suspend.md").read_text()
    _, *args = shlex.split(COMMAND)
    done = subprocess.run(
        [sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    result = json.loads(done.stdout)
    if result["ran"]:
        assert done.returncode == 0, done.stdout
        assert [
            r.get("pattern_intact") and r.get("gpu_free_while_suspended") for r in result["runs"]
        ] == [
            True,
            True,
        ]
    else:
        assert done.returncode == 2, done.stderr
        assert result["why"] and "Error" not in result["why"] and "Traceback" not in done.stderr
